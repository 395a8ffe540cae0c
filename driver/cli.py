"""run.py's command line: the options, their checks, and what a resumed run may change.

    cfg = parse_args(argv)          # every option checked; a bad one exits 2 with one line, no traceback
    given = given_options(argv)     # what the user typed, for --resume

Everything is checked here, before a directory is made or anything is measured: counts are >= 1, the
momentum decay beta is in (0, 1), eps_rel, alpha, budgets and tolerances are > 0, a target speedup is > 1,
GPU indices exist, and the task is a built-in name or a readable KernelBench problem file (a missing path, a
directory, a binary file, a syntax error and a file without Model/get_inputs/get_init_inputs each get their
own message). `load_task` turns the checked name into a tasks.Task.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
from dataclasses import dataclass

from driver import models
import momentum
import tasks

VERSION = "0.1.0"


@dataclass
class Config:
    task: str = "conv_groupnorm"
    islands: int = 2
    generations: int = 50
    model: str | None = None
    provider: str | None = None
    base_url: str | None = None
    secondary_model: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    model_choice: str = "weights"
    price: list[str] | None = None
    budget_usd: float | None = None
    device: str | None = None
    gpus: str | None = None
    seed: int = 0
    out: str | None = None
    resume: str | None = None
    eval_cache: str | None = None
    beta: float = momentum.BETA
    eps_rel: float = momentum.THRESHOLD
    freeze: int = 15
    alpha: float = momentum.POWER_ALPHA
    k_idea: int = 5
    k_hyp: int = 20
    proposals: int = 3
    repairs: int = 2
    head_to_head: int = 2        # ranking.HEAD_TO_HEAD_ROUNDS
    target_speedup: float | None = None
    token_budget: int | None = None
    max_llm_failures: int = 5
    reference_limit: float = 300.0
    timing_s: float | None = None
    rtol: float | None = None
    atol: float | None = None
    l2_tol: float | None = None
    allow_tf32: bool = False
    quiet: bool = False
    report: str | None = None
    replay: str | None = None
    ray: str | None = None
    ray_cpus: int = 1
    ray_actors: int | None = None


# What --resume may change (the search state does not depend on it), and why the rest may not.
RESUME_MAY_CHANGE = ("model", "model_choice", "price", "budget_usd", "base_url", "provider", "secondary_model",
                     "temperature", "max_output_tokens", "gpus", "ray", "ray_cpus", "ray_actors", "generations",
                     "token_budget", "max_llm_failures", "reference_limit", "timing_s", "eval_cache", "quiet",
                     "resume")
# What a replay may be given besides --replay; everything else is the recording's.
REPLAY_OPTIONS = ("replay", "out", "quiet", "reference_limit")
RESUME_REFUSES = {
    "task": "the checkpoint's programs and scores belong to the saved task",
    "device": "the saved scores were measured on the saved device",
    "islands": "the checkpoint holds the saved number of islands",
    "out": "the run directory is the one given to --resume",
}
# Anything else (seed, beta, eps_rel, freeze, alpha, K_idea, K_hyp, proposals, repairs, target, tolerances,
# TF32) shaped the saved state: changing it would make the resumed run a different search.
RESUME_STATE_REASON = "it shaped the saved search state; start a new run to change it"


def parse_args(argv: list[str] | None = None) -> Config:
    parser = _parser()
    ns = parser.parse_args(argv)
    cfg = Config(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(Config)})
    try:
        check_combination(given_options(argv), cfg)
        if cfg.resume is None and cfg.report is None:
            check_task(cfg.task)
    except UsageError as e:
        parser.error(str(e))
    return cfg


def check_combination(given: set[str], cfg: Config) -> None:
    """Raise UsageError for options that cannot go together (`given`: the options typed; on --resume the
    saved ones count too, so this runs again on the merged configuration)."""
    if cfg.report is not None and given - {"report"}:
        raise UsageError(f"--report DIR only draws DIR/report.html and takes no other option; drop "
                         + ", ".join(_flag(n) for n in sorted(given - {"report"})))
    if cfg.resume is not None and "out" in given:
        raise UsageError(f"--resume {cfg.resume} continues the run in its own directory; drop --out "
                         "(to start a new run elsewhere, leave out --resume)")
    if cfg.ray is None and cfg.resume is None:
        extra = sorted(n for n in ("ray_cpus", "ray_actors") if n in given)
        if extra:
            raise UsageError(f"{_flag(extra[0])} works only with --ray (evaluation on a Ray cluster)")
    if cfg.ray is not None and cfg.gpus is not None:
        raise UsageError("--gpus picks this machine's GPUs; with --ray every GPU of the cluster gets an actor "
                         "(use --ray-actors to use fewer)")
    if cfg.device == "cpu" and cfg.gpus is not None:
        raise UsageError("--gpus picks GPUs, but --device cpu runs the candidates on the CPU; drop one")
    if cfg.model:
        try:
            weights = models.parse_models(cfg.model)
        except ValueError as e:
            raise UsageError(f"--model {e}") from None
        if cfg.model_choice == "ucb" and "=" in cfg.model:
            raise UsageError(f"--model-choice ucb chooses by improvement per dollar, not by weights: drop the "
                             f"weights from --model {cfg.model} (or use --model-choice weights)")
        if len(weights) == 1 and "=" in cfg.model:
            raise UsageError(f"--model {cfg.model}: a weight needs several models (a=0.7,b=0.3)")


def given_options(argv: list[str] | None = None) -> set[str]:
    """The options the user typed (not defaults): a resumed run keeps its saved configuration."""
    return set(vars(_parser(argparse.SUPPRESS).parse_args(argv)))


def resume_config(saved: dict, cfg: Config, given: set[str]) -> tuple[Config, dict]:
    """The saved configuration with the options the user typed again; returns it and {option: (old, new)}
    for what changed. Raises UsageError for a change that would corrupt the saved state."""
    known = {f.name for f in dataclasses.fields(Config)}
    merged = {**dataclasses.asdict(Config()), **{k: v for k, v in saved.items() if k in known}}
    changes = {}
    for name in sorted(given):
        new, old = getattr(cfg, name), merged.get(name)
        if name == "price":   # prices given again add to the saved ones (a model's latest price wins)
            new = list({models.parse_price(p)[0]: p for p in (old or []) + (new or [])}.values())
        if name in ("resume", "out") or new == old:
            continue
        if name not in RESUME_MAY_CHANGE:
            why = RESUME_REFUSES.get(name, RESUME_STATE_REASON)
            raise UsageError(f"--resume: {_flag(name)} cannot change from {old!r} to {new!r}: {why}")
        changes[name] = (old, new)
        merged[name] = new
    merged["resume"] = cfg.resume
    merged["out"] = cfg.resume
    resumed = Config(**merged)
    check_combination(set(), dataclasses.replace(resumed, resume=None, out=None))
    return resumed, changes


class UsageError(Exception):
    """A wrong option or argument; main prints it as one line and exits 2."""


def load_task(name: str) -> tasks.Task:
    """The task for a checked name: a built-in task, else a KernelBench problem file."""
    check_task(name)
    return tasks.get(name) if name in tasks.names() else tasks.load(name)


def check_task(name: str) -> None:
    """Raise UsageError with the one reason `name` is neither a task name nor a usable problem file."""
    if name in tasks.names():
        return
    known = ", ".join(tasks.names())
    if not os.path.exists(name):
        looks_like_path = os.sep in name or name.endswith(".py")
        close = difflib.get_close_matches(name, tasks.names(), n=1, cutoff=0.6) if not looks_like_path else []
        if close:
            raise UsageError(f"--task {name}: no task of that name; did you mean {close[0]}?")
        raise UsageError(f"--task {name}: " + ("no such file" if looks_like_path else "no task of that name")
                         + f" (built-in tasks: {known}; or give the path of a KernelBench problem file)")
    if os.path.isdir(name):
        raise UsageError(f"--task {name}: is a directory; give a KernelBench problem file (.py) inside it")
    try:
        with open(name, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError(f"--task {name}: cannot read it ({e.strerror})") from None
    try:
        src = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--task {name}: not a text file (not UTF-8); give a KernelBench problem .py file") \
            from None
    if "\0" in src:
        raise UsageError(f"--task {name}: not a text file (it contains NUL bytes)")
    try:
        tasks.check_reference_source(src, origin=name)
    except ValueError as e:
        reason = str(e).removeprefix(f"{name}: ")
        raise UsageError(f"--task {name}: {reason}") from None


def check_gpus(text: str) -> list[int]:
    """Comma-separated indices of GPUs this machine has."""
    try:
        indices = [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of GPU indices, "
                                         "e.g. 0 or 0,1") from None
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
        raise argparse.ArgumentTypeError(f"{text!r}: indices must be distinct and >= 0")
    count = _cuda_count()
    missing = [i for i in indices if i >= count]
    if missing:
        raise argparse.ArgumentTypeError(
            f"no GPU {', '.join(map(str, missing))}: this machine has "
            + (f"GPUs 0-{count - 1}" if count > 1 else "GPU 0" if count == 1 else "no CUDA GPU visible"))
    return indices


# ----------------------------------------------------------------------------- parser

def _parser(default=None) -> argparse.ArgumentParser:
    p = _OneLineParser(argument_default=default, prog="run.py", epilog=EPILOG, formatter_class=_HelpFormatter,
                       description="PACEvolve: LLM-driven evolutionary search for faster GPU kernels "
                                   "(python run.py --task conv_groupnorm --islands 2 --model gemini-2.5-pro).")
    group = p

    def a(*names, **kw):
        if "type" in kw and "metavar" not in kw:
            kw["metavar"] = "N" if kw["type"] in (int, _count, _non_negative_int) else "X"
        if default is argparse.SUPPRESS:
            kw["default"] = argparse.SUPPRESS   # only what was typed shows up
            if "type" in kw:
                kw["type"] = str   # values were checked by the real parse; only names matter here
        group.add_argument(*names, **kw)

    p.add_argument("--version", action=_Version, help="print the version (code, Python, PyTorch) and exit")
    group = p.add_argument_group("task")
    a("--task", default=Config.task,
      help=f"built-in task name ({', '.join(tasks.names())}) or a KernelBench problem file path")
    a("--device", choices=["cuda", "cpu"], help="where candidates run (default: the task's own)")
    a("--rtol", type=_positive, help="elementwise relative tolerance (default: the task's)")
    a("--atol", type=_positive, help="elementwise absolute tolerance, times RMS(ref) (default: the task's)")
    a("--l2-tol", type=_positive, help="relative L2 error tolerance (default: the task's)")
    a("--allow-tf32", action="store_true",
      help="let the reference and the candidates use TF32 (bounds loosen accordingly)")

    group = p.add_argument_group("LLM", "A hosted model needs its key in the environment (below); a local "
                                        "OpenAI-compatible server needs --base-url and --model only.")
    a("--model", help="main LLM (idea generation, selection and code), e.g. gemini-2.5-pro, gpt-5, "
                      "claude-sonnet-4-5, or any model a local OpenAI-compatible server serves; several as "
                      "a,b (each call draws one, equally likely) or a=0.7,b=0.3 (by weight), or see "
                      "--model-choice (default: $PACEVOLVE_MODEL)")
    a("--model-choice", choices=models.CHOICES, default=Config.model_choice,
      help="with several --model models: weights (each call draws one by weight) or ucb (a bandit that "
           "favours the models whose candidates improve on their parents most per dollar)")
    a("--provider", choices=["openai", "gemini", "anthropic"],
      help="API family (default: guessed from the model name or --base-url)")
    a("--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), "
                         "http://localhost:11434/v1 (Ollama) (default: $OPENAI_BASE_URL, else the provider's API)")
    a("--secondary-model", help="cheaper LLM for classification, summaries and pruning "
                                "(the paper used Gemini 2.5 Flash); same provider settings (default: --model)")
    a("--temperature", type=_non_negative, help="sampling temperature (default: the provider's)")
    a("--max-output-tokens", type=_count, help="output token limit per LLM call (default: the provider's)")
    a("--max-llm-failures", type=_count, default=Config.max_llm_failures,
      help="stop the run after this many LLM calls in a row failed (across islands; calls that "
           "succeeded on a retry do not count)")
    a("--token-budget", type=_count, help="stop after this many LLM tokens, prompt and output (default: no limit)")
    a("--budget-usd", type=_positive, metavar="DOLLARS",
      help="a hard cap on the LLM bill: no call starts that could take the spend past it; the run stops "
           "cleanly and resumes with a higher cap (needs a price for every model; default: no limit)")
    a("--price", action="append", type=_price, metavar="MODEL=IN/OUT",
      help="US dollars per million input/output tokens of MODEL, e.g. gpt-5=1.25/10 (repeatable; a resume "
           "adds to the saved ones); wins "
           f"over {models.PRICES_FILE.name}, which lists common models (dated: check it). A local server costs 0")

    group = p.add_argument_group("search", "Islands, Algorithm 2 (momentum, backtracking, crossover) and HCM.")
    a("--islands", type=_count, default=Config.islands, help="number of islands searching concurrently")
    a("--generations", type=_count, default=Config.generations, help="generations per island")
    a("--seed", type=int, default=Config.seed, help="seed for every random choice of the search")
    a("--beta", type=_fraction, default=Config.beta, help="momentum decay beta (§3.2), 0 < beta < 1")
    a("--eps-rel", type=_positive, default=Config.eps_rel, help="stagnation threshold eps_rel (§3.2), > 0")
    a("--freeze", type=_count, default=Config.freeze,
      help="generations after the start or an intervention before the next one may fire")
    a("--alpha", type=_positive, default=Config.alpha, help="power-law exponent of backtracking, > 0")
    a("--target-speedup", type=_speedup,
      help="speedup (> 1) at which the gap counts as closed: r = s_0 / S (default: r = 0 ms)")
    a("--k-idea", type=_count, default=Config.k_idea, help="idea cap K_idea (Algorithm 1)")
    a("--k-hyp", type=_count, default=Config.k_hyp, help="hypotheses per idea before summary, K_hyp")
    a("--proposals", type=_count, default=Config.proposals, help="ideas proposed per generation")
    a("--repairs", type=_non_negative_int, default=Config.repairs,
      help="LLM repairs of a failing candidate within one generation")
    a("--head-to-head", type=_non_negative_int, default=Config.head_to_head,
      help="when a candidate leads an island's or the run's best by less than the measured noise (or the "
           "evaluator reports none), measure both N more times, alternately, before the title changes "
           "hands; 0 trusts single measurements")

    group = p.add_argument_group("evaluation")
    a("--gpus", type=_gpus, metavar="IDS",
      help="comma-separated GPU indices for evaluation, e.g. 0,1 (default: all visible)")
    a("--eval-cache", metavar="DIR", help="shared store of evaluations keyed by task, device and source, so "
                                          "runs re-use each other's verdicts (default: the run's evals/)")
    a("--reference-limit", type=_positive, default=Config.reference_limit, metavar="SECONDS",
      help="stop at once if measuring the reference takes longer than this")
    a("--timing-s", type=_positive, metavar="SECONDS", help="time each candidate at most this long once its "
      "speedup's 95%% interval has not narrowed to 0.5%% (GPU) or 2%% (CPU) (default: 10 on a GPU, 2 on the "
      "CPU); shorter is faster and less sure, and every result states its interval")

    group = p.add_argument_group("output")
    a("--out", metavar="DIR", help="run directory, new or empty (default: runs/<task>-<time>-<random>)")
    a("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint; "
      f"{_flags(RESUME_MAY_CHANGE[:-1])} may change")
    a("--report", metavar="DIR", help="write DIR/report.html for any run directory (finished, running "
                                      "or killed) and exit; takes no other option")
    a("--replay", metavar="DIR", help="run the search recorded in DIR again, every LLM reply taken from "
      "DIR/transcript.jsonl (no API key, no network); candidates are evaluated again here and their verdicts "
      f"compared with the recording; {_flags(REPLAY_OPTIONS[1:])} may be given")
    a("--quiet", action="store_true", help="no per-generation progress lines")

    group = p.add_argument_group("cluster", "Evaluation on a Ray cluster (pip install -r requirements-ray.txt).")
    a("--ray", metavar="ADDRESS", help="evaluate on a Ray cluster, one actor per GPU: auto (the cluster "
      "this machine belongs to), ray://HEAD:10001, or local (a Ray instance on this machine alone)")
    a("--ray-cpus", type=_count, default=Config.ray_cpus,
      help="with --ray and a CPU task: CPUs each evaluation actor asks Ray for")
    a("--ray-actors", type=_count, help="with --ray: at most this many evaluation actors (default: one "
                                        "per GPU of the cluster, or per --ray-cpus CPUs for a CPU task)")
    return p


EPILOG = """environment:
  GEMINI_API_KEY, GOOGLE_API_KEY   key for Gemini models (--model gemini-...)
  OPENAI_API_KEY                   key for OpenAI models, sent as a bearer token to any --base-url too
  ANTHROPIC_API_KEY                key for Anthropic models (--model claude-...)
  OPENAI_BASE_URL                  an OpenAI-compatible server, when --base-url is not given
  PACEVOLVE_MODEL                  the main model, when neither --model nor --base-url is given

exit codes:
  0    done (or a resumed run that had nothing left to do)
  2    a set-up problem: a wrong option, file, key, server or cluster (one line says which)
  3    stopped: --max-llm-failures LLM calls in a row failed (resumable)
  4    stopped: the evaluator itself failed (resumable once fixed)
  5    a replay left its recording (a prompt differs from the recorded one)
  130  interrupted by Ctrl-C (SIGINT); 143 terminated by SIGTERM (both resumable: --resume DIR; a replay
       is run again instead)

examples:
  python run.py --replay examples/conv_groupnorm_small      # no GPU, no key: a recorded search, re-evaluated
  python run.py --task conv_groupnorm --islands 2 --model gemini-2.5-pro --secondary-model gemini-2.5-flash
  python run.py --task conv_groupnorm_small --base-url http://localhost:8000/v1 --model NAME   # CPU, local LLM
  python run.py --resume runs/conv_groupnorm-20261123-005912-1a2b3c
  python run.py --report runs/conv_groupnorm-20261123-005912-1a2b3c
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default once: stated in its help, or appended when it is a real value (not None,
    not a switch's False); the epilog keeps its layout."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" not in text and action.default is not None and action.default is not False
                and action.default is not argparse.SUPPRESS and action.option_strings and action.nargs != 0):
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text, width, indent):
        if "\n" in text:   # the epilog: laid out by hand
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


class _Version(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def version_text() -> str:
    """pacevolve's version, the commit of this checkout when it is a git clone, Python and PyTorch."""
    import platform
    import subprocess
    from importlib import metadata
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return (f"pacevolve {VERSION}" + (f" (git {commit})" if commit else "")
            + f", Python {platform.python_version()}, PyTorch {torch}")


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{_did_you_mean(self, message)} "
                     "(python run.py --help lists the options)\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """'; did you mean --islands?' for a misspelt option, or a misspelt choice of one."""
    flags = [s for action in parser._actions for s in action.option_strings]
    unknown = re.match(r"unrecognized arguments: (\S+)", message)
    if unknown:
        word = unknown.group(1).split("=")[0]
        close = difflib.get_close_matches(word, flags, n=3, cutoff=0.5) if word.startswith("-") else []
        # a typo keeps the start of the word: --gens is --generations rather than the shorter --gpus
        close.sort(key=lambda f: -len(os.path.commonprefix([f, word])))
        return f"; did you mean {close[0]}?" if close else ""
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        options = re.findall(r"'([^']*)'", choice.group(2))
        close = difflib.get_close_matches(choice.group(1), options, n=1, cutoff=0.5)
        return f"; did you mean {close[0]}?" if close else ""
    return ""


def _checked(convert, test, what: str):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {what}")
        return value
    parse.__name__ = what   # argparse names the type in some messages
    return parse


_count = _checked(int, lambda v: v >= 1, "an integer >= 1")
_non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0")
_positive = _checked(float, lambda v: v > 0 and v != float("inf"), "a number > 0")
_non_negative = _checked(float, lambda v: v >= 0, "a number >= 0")
_fraction = _checked(float, lambda v: 0 < v < 1, "a number with 0 < beta < 1")
_speedup = _checked(float, lambda v: v > 1 and v != float("inf"), "a speedup > 1")


def _price(text: str) -> str:
    try:
        models.parse_price(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _gpus(text: str) -> str:
    check_gpus(text)
    return text


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flags(names) -> str:
    """--a, --b and --c"""
    flags = [_flag(n) for n in names]
    return ", ".join(flags[:-1]) + " and " + flags[-1] if len(flags) > 1 else "".join(flags)


def _cuda_count() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0
