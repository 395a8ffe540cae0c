"""Setting a run up: everything the search needs, resolved once, in one object.

    s = start(cfg, given, stop, log, say)   # Start: task, device, clients, run directory, evaluator, s_0

In order: which run this is (new, resumed from its directory, or a replay of a recording) and its task;
the device (--device, else the task's) and whether it is there; the LLM clients (models.Role over
llm.Client for --model a,b... and --secondary-model, or a replay's recorded replies) and one probe call per
model; the dollars earlier sessions spent; the Ray cluster (--ray), checked before anything slow; the run
directory (made, or reopened with the resume recorded); then the evaluator, which brings the reference up
on the device and measures s_0 within --reference-limit seconds. A resumed run keeps its s_0, a replay
takes the recording's.

Each problem a user can fix raises SetupError with one line saying what and how; a resumed run with
nothing left to do raises Finished with the line that says so. Until the run directory exists nothing is
written; from then on Ctrl-C or SIGTERM leaves it resumable.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from driver import llm_check, models, replay, stopping, transcript
from driver import rundir as rundir_mod
from driver.cli import Config, load_task, resume_config
import llm
import tasks


@dataclass
class Start:
    """What start() resolved: the search is built from this and nothing else."""
    cfg: Config                       # the options (a resume's: the saved ones, with what it may change)
    task: tasks.Task
    device: str                       # "cuda" or "cpu": --device, else the task's
    rd: rundir_mod.RunDir             # made, or reopened for a resume
    evaluator: object                 # evaluate_kernel.Evaluator, ray_evaluator.RayEvaluator or a replay's
    s0: float                         # the reference's runtime in ms
    llm_main: object                  # models.Role (or a replay's recorded replies)
    llm_cheap: object | None          # the secondary model's, None when there is none
    book: transcript.Transcript       # the transcript, holding the probes' records
    state: dict | None = None         # a resume's checkpoint
    recording: replay.Recording | None = None
    facts: dict | None = None         # the recording's device facts (else the search reads the device)

    def close(self) -> None:
        """The evaluator's workers stopped, the run directory's temporary files removed."""
        try:
            self.evaluator.close()
        finally:
            self.rd.remove_leftovers()


class SetupError(Exception):
    """Something the user must provide or fix before a run can start; the message says what and how."""


class Finished(Exception):
    """A resumed run with nothing left to do; the message says so and how to go on (nothing was changed)."""


def start(cfg: Config, given: set[str], stop: stopping.StopRequest, log: RunLog | None = None,
          say=print) -> Start:
    """Resolves the run (module docstring); `given` are the options typed (what a resume may change)."""
    cfg, task, rd, config, state, recording, changes = _which_run(cfg, given)
    device = cfg.device or task.device
    check_device(device, task)
    book = transcript.Transcript()
    llm_main, llm_cheap = recording.clients() if recording else make_clients(cfg)
    spend = getattr(llm_main, "spend", None)   # models.Spend: prices, the ledger, --budget-usd
    if spend is not None and cfg.resume:       # the dollars of earlier sessions count against the cap
        spend.restore(rd.read_spend())
        if spend.stop_reason():   # nothing probed, measured or written
            raise Finished(f"{rd.path}: {spend.stop_reason()}; nothing was changed ({go_on(rd.path, spend)})")
    if spend is not None and spend.note:
        say(spend.note)
    for client, role in ((llm_main, "main"), (llm_cheap, "secondary")):
        for one in client.each() if client is not None and not recording else []:   # every model answers
            llm_check.probe(book.recorder(one, role=role, stage="setup", purpose="probe"), role, one.origin)
    for record in recording.probes() if recording else []:   # as the recording's counts include them
        book.add(record)
    owns_ray = connect_ray(cfg, device, log) if cfg.ray else False   # before the directory and s_0
    stop.install()   # ray.init replaces the SIGTERM handler with one that exits at once
    if cfg.resume:
        rd = rundir_mod.RunDir(rd.path, Path(cfg.eval_cache) if cfg.eval_cache else None)
        rd.remove_leftovers()
        record_resume(rd, config, cfg, changes, state)
    else:
        rd = new_run_dir(cfg, task, device)
    if spend is not None:
        spend.attach(rd.save_spend)
    if log is not None:
        log.attach(rd)
    # From here on the run directory exists: Ctrl-C or SIGTERM leaves it resumable.
    try:
        evaluator, measured = measure_reference(lambda: make_evaluator(cfg, task, device, rd, owns_ray), rd, task,
                                                cfg, device, say)
    except KeyboardInterrupt:
        stopping.exit_after(stop, rd.remove_leftovers, continue_with(cfg, rd.path))
    except SetupError as e:
        raise SetupError(f"{e} (the run directory {rd.path} is kept; after fixing this, "
                         f"continue with --resume {rd.path})") from None
    if recording:   # the search sees the recording's s_0 and results; this machine's go beside them
        evaluator = recording.evaluator(evaluator, lambda line: print(f"run.py: {line}", file=sys.stderr))
        say(f"replaying {recording.path}: s_0 {recording.s0:.4g} ms as recorded (measured here: "
            f"{measured:.4g} ms); every LLM reply from its transcript")
    s0 = state["baseline_ms"] if state else recording.s0 if recording else measured
    return Start(cfg, task, device, rd, evaluator, s0, llm_main, llm_cheap, book, state, recording,
                 recording.facts if recording else None)


def go_on(path: Path, spend: models.Spend) -> str:
    """How to go on after the dollar budget ran out: the budget the next round needs."""
    need = spend.total + spend.forecast()
    return f"to go on: python run.py --resume {path} --budget-usd X, with X above {models.usd(need)}"


# ----------------------------------------------------------------------------- the steps, in start()'s order

def continue_with(cfg: Config, path) -> str:
    """What an interrupted run says to do next: resume it, or, for a replay (which cannot be resumed),
    replay it again."""
    if cfg.replay:
        return f"a replay cannot be resumed: run python run.py --replay {cfg.replay} again"
    return f"continue with: python run.py --resume {path}"


def _which_run(cfg: Config, given: set[str]):
    """A new run, a resumed one (its saved options, task and checkpoint) or a replay (the recording's task
    and options); a new run's directory is checked before anything slow, and an existing one stays untouched.
    Returns cfg, task, rd (a resume's, else None), config, state, recording, changes."""
    if cfg.resume:
        rd = rundir_mod.RunDir.open(Path(cfg.resume))
        config = rd.read_config()
        cfg, changes = resume_config(config["config"], cfg, given)
        if cfg.replay:
            raise SetupError(f"--resume {rd.path}: a replay cannot be resumed; run --replay {cfg.replay} again")
        task, note = rd.saved_task(config)
        state = rd.load_checkpoint(warn=lambda line: print(line, file=sys.stderr))
        finished = nothing_to_add(state, cfg, rd.path)
        if finished:   # nothing measured or probed; best.py, if a stop came between it and the checkpoint
            if state.get("best_py") and rd.write_best_text(state["best_py"]):
                finished = finished.replace("nothing was changed", "best.py was brought up to date with the "
                                            "last checkpoint (a stop had come between them), nothing else changed")
            raise Finished(finished)
        if note:
            print(f"run.py: note: {note}", file=sys.stderr)
        return cfg, task, rd, config, state, None, changes
    recording = None
    if cfg.replay:   # the recording's task and options; its LLM replies, s_0, device facts and results
        recording = replay.Recording.open(Path(cfg.replay))
        cfg = recording.config(cfg, given)
        task = recording.task
    else:
        task = load_task(cfg.task)
    rundir_mod.RunDir.check_new(Path(cfg.out) if cfg.out else rundir_mod.default_path(task.name))
    return cfg, task, None, None, None, recording, {}


def new_run_dir(cfg: Config, task: tasks.Task, device: str) -> rundir_mod.RunDir:
    """The run directory of a new run, with its reference copy and config.json; made whole or not at all
    (a Ctrl-C while it is made leaves no directory that is not a run)."""
    path = Path(cfg.out) if cfg.out else rundir_mod.default_path(task.name)
    existed = path.exists()
    rd = rundir_mod.RunDir.create(path, task.name, Path(cfg.eval_cache) if cfg.eval_cache else None)
    try:
        cfg.out = str(rd.path)
        rd.save_reference(task)
        rd.write_config({"config": dataclasses.asdict(cfg), "task": rundir_mod.task_settings(task),
                         "reference_sha256": rundir_mod.sha256(task.reference_src), "device": device,
                         "hardware": rundir_mod.hardware_name(device), "versions": rundir_mod.versions(device),
                         "started": time.strftime("%Y-%m-%d %H:%M:%S"), "resumes": []})
    except BaseException:
        for child in rd.path.iterdir():   # all ours: the directory was missing or empty
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        if not existed:
            rd.path.rmdir()
        raise
    return rd


def record_resume(rd: rundir_mod.RunDir, config: dict, cfg: Config, changes: dict, state: dict | None) -> None:
    """Options changed on resume go into config.json (the new values, and a list of resumes) and events."""
    at = state["round"] if state else 0
    entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "round": at,
             "changes": {k: {"from": old, "to": new} for k, (old, new) in changes.items()}}
    config = dict(config, config=dataclasses.asdict(cfg), resumes=config.get("resumes", []) + [entry])
    rd.write_config(config)
    if state:
        rd.truncate_events(state["events"])
    elif rd.events_path.exists():
        rd.truncate_events(0)   # interrupted before round 0: start the events again
    rd.event("resume", **entry)
    if state:
        state["events"] = rd.events_written


def check_device(device: str, task: tasks.Task) -> None:
    if device != "cuda":
        return
    import torch
    if torch.cuda.is_available():
        return
    other = []
    if task.name != "conv_groupnorm_small":
        other.append("try the search on the CPU with `--task conv_groupnorm_small` (a small CPU task)")
    if task.name not in tasks.names():   # built-in GPU tasks are too large for a CPU
        other.append("run this problem on the CPU with `--device cpu` if it is small enough")
    raise SetupError(
        f"the task {task.name} runs on a CUDA GPU, but PyTorch sees none (torch {torch.__version__}, CUDA "
        f"build: {torch.version.cuda or 'no'}). Run on a machine with an NVIDIA GPU and a CUDA build of "
        "PyTorch" + (", or " + ", or ".join(other) if other else "") + ".")


def make_clients(cfg: Config):
    """The main and secondary LLMs as models.Role (the secondary None when not configured), sharing one
    models.Spend: the prices (--price, a local server's 0, prices.txt) and --budget-usd. Each client carries
    `origin`, where its model and URL came from (an option or a variable), for the fixes the probe suggests."""
    model_origin = "--model"
    if not cfg.model and not cfg.base_url:
        cfg.model = os.environ.get("PACEVOLVE_MODEL")
        model_origin = "PACEVOLVE_MODEL"
    if not cfg.model:
        raise SetupError(
            "no LLM configured: pass --model (e.g. --model gemini-2.5-pro with GEMINI_API_KEY set, "
            "--model gpt-5 with OPENAI_API_KEY, --model claude-sonnet-4-5 with ANTHROPIC_API_KEY), "
            "or a local OpenAI-compatible server with --base-url http://localhost:8000/v1 --model NAME")
    try:
        weights = models.parse_models(cfg.model)
    except ValueError as e:
        raise SetupError(f"{model_origin} {e}") from None
    kw = {}
    if cfg.temperature is not None:
        kw["temperature"] = cfg.temperature
    if cfg.max_output_tokens is not None:
        kw["max_output_tokens"] = cfg.max_output_tokens
    main = {name: _client(cfg, name, model_origin, kw) for name in weights}
    cheap = {cfg.secondary_model: _client(cfg, cfg.secondary_model, "--secondary-model", kw)} \
        if cfg.secondary_model else {}
    prices, note = _prices(cfg, main, cheap)
    spend = models.Spend(prices, cfg.budget_usd, cfg.max_output_tokens)
    spend.note = note
    main_role = models.Role("main", main, models.make_choice(cfg.model_choice, weights), spend, cfg.seed)
    cheap_role = models.Role("secondary", cheap, models.Weighted({cfg.secondary_model: 1.0}), spend, cfg.seed) \
        if cheap else None
    return main_role, cheap_role


def _client(cfg: Config, model: str, origin: str, kw: dict):
    try:
        client = llm.Client.from_env(model, provider=cfg.provider, base_url=cfg.base_url, **kw)
    except llm.AuthError as e:
        raise SetupError(f"cannot set up the LLM client for {model!r}: {e}") from None
    except ValueError:
        raise SetupError(f"cannot tell which API serves the model {model!r}: pass --provider (openai, "
                         "gemini or anthropic), or --base-url for an OpenAI-compatible server") from None
    env_url = (os.environ.get("OPENAI_BASE_URL") or "").rstrip("/")
    url = ("--base-url" if cfg.base_url else
           "OPENAI_BASE_URL" if env_url and client.base_url == env_url else "")
    client.origin = llm_check.Origin(model=origin, base_url=url)
    return client


def _prices(cfg: Config, main: dict, cheap: dict) -> tuple[dict, str]:
    """Each model's price (None: unknown, counted in tokens only) and a line saying where each came from; a
    dollar budget, or the bandit, with a model whose price is unknown is a SetupError."""
    try:
        date, table = models.read_prices(models.PRICES_FILE.read_text())
    except (OSError, ValueError) as e:
        raise SetupError(f"{models.PRICES_FILE}: {e}") from None
    given = dict(models.parse_price(p) for p in cfg.price or [])
    prices = {m: models.price_of(m, c.base_url, table, given) for m, c in {**cheap, **main}.items()}
    unknown = [m for m, p in prices.items() if p is None]
    bad = next((m for m in main if m in unknown), None) if cfg.model_choice == "ucb" and len(main) > 1 else None
    if unknown and cfg.budget_usd:
        why, bad = f"--budget-usd {cfg.budget_usd:g}: the price of {unknown[0]} is unknown, so its calls cannot " \
                   "be counted in dollars", unknown[0]
    elif bad:
        why = f"--model-choice ucb weighs improvement per dollar, but the price of {bad} is unknown"
    if bad:
        raise SetupError(f"{why}; give it with --price {bad}=IN/OUT (US dollars per million input/output "
                         f"tokens) or add it to {models.PRICES_FILE.name}")
    clients = {**cheap, **main}
    free = {m for m, p in prices.items() if p == models.Price(0, 0) and models.is_local(clients[m].base_url)
            and m not in given}
    if len(free) == len(prices) and not cfg.budget_usd:
        return prices, ""   # local servers alone: nothing to pay, nothing to say
    parts = [f"{m} {p if p is not None else '?'} (" + ("--price" if m in given else "local server" if m in free
             else "unknown: counted in tokens only" if p is None else f"{models.PRICES_FILE.name} of {date}") + ")"
             for m, p in prices.items()]
    unused = sorted(set(given) - set(prices))
    return prices, ("LLM prices, US$ per million input/output tokens: " + ", ".join(parts)
                    + (f"; budget {models.usd(cfg.budget_usd)}" if cfg.budget_usd else "")
                    + (f"; --price for {', '.join(unused)}: no such model in this run" if unused else "")
                    + (f" (check {models.PRICES_FILE.name}'s prices: they change)"
                       if any(m not in given and m not in free and p is not None for m, p in prices.items()) else ""))


def make_evaluator(cfg: Config, task: tasks.Task, device: str, rd: rundir_mod.RunDir, owns_ray: bool = False):
    import evaluate_kernel
    kw = {"device": device, "allow_tf32": cfg.allow_tf32, "log_dir": str(rd.logs)}
    if cfg.timing_s is not None:
        kw["timing_s"] = cfg.timing_s
    if device == "cuda" and cfg.gpus:
        kw["gpus"] = [int(g) for g in cfg.gpus.split(",")]
    kw.update({n: getattr(cfg, n) for n in ("rtol", "atol", "l2_tol") if getattr(cfg, n) is not None})
    folder = rundir_mod.task_settings(task).get("file")
    if folder:   # a problem file may import a module beside it
        kw["import_dirs"] = [os.path.dirname(folder)]
    if cfg.ray:
        return _ray_evaluator(cfg, task, kw, owns_ray)
    try:
        return evaluate_kernel.Evaluator.for_task(task, **kw)
    except RuntimeError as e:
        raise SetupError(f"the reference does not start on {device}: {_reference_problem(e)}") from None


def connect_ray(cfg: Config, device: str, log: "RunLog | None" = None) -> bool:
    """--ray: Ray installed, its cluster reached (or started, for `local`) and able to hold an evaluation
    actor, checked before the run directory is made and the reference measured. Ray's own log lines go to
    the run's log. Returns True when Ray was started here (it is shut down with the evaluator)."""
    try:
        from driver import ray_evaluator
    except ImportError as e:
        raise SetupError(f"--ray needs Ray, which is not installed here ({e}): pip install -r "
                         "requirements-ray.txt, or run without --ray") from None
    if log is not None:
        log.adopt("ray")
    started = False
    try:
        started = ray_evaluator.connect(cfg.ray)
        ray_evaluator.check_capacity(device, cfg.ray_cpus, cfg.ray_actors)
    except ray_evaluator.ClusterError as e:
        if started:
            ray_evaluator.ray.shutdown()
        raise SetupError(f"--ray {cfg.ray}: {e}") from None
    if log is not None:
        log.adopt("ray")   # ray.init may have set its handlers up again
    return started


def _ray_evaluator(cfg: Config, task: tasks.Task, kw: dict, owns_ray: bool = False):
    """The evaluator of --ray: actors on the cluster's GPUs (or CPUs), the same interface as a local one."""
    try:
        from driver import ray_evaluator
    except ImportError as e:
        raise SetupError(f"--ray needs Ray, which is not installed here ({e}): pip install -r "
                         "requirements-ray.txt, or run without --ray") from None
    try:
        return ray_evaluator.RayEvaluator.for_task(task, address=cfg.ray, cpus_per_actor=cfg.ray_cpus,
                                              max_actors=cfg.ray_actors, owns_ray=owns_ray, **kw)
    except ray_evaluator.ClusterError as e:
        raise SetupError(f"--ray {cfg.ray}: {e}") from None
    except RuntimeError as e:
        raise SetupError(f"the reference does not start on the Ray cluster: {_reference_problem(e)}") from None


def measure_reference(make_evaluator, rd: rundir_mod.RunDir, task: tasks.Task, cfg: Config, device: str,
                      say) -> tuple[object, float]:
    """Starts the evaluator (`make_evaluator()`, which brings up the reference on this device and measures
    it) and returns it with s_0, all within --reference-limit seconds; s_0 is stored with the evaluations
    for re-use."""
    key = "baseline-" + hashlib.sha256(
        "\0".join([task.reference_src, device, str(cfg.allow_tf32)]).encode()).hexdigest()[:16]
    cached = rd.load_eval(key)
    say(f"measuring the reference on {rundir_mod.hardware_name(device)} (limit {cfg.reference_limit:g} s) ...")
    result: dict = {}

    def measure():
        try:
            result["evaluator"] = make_evaluator()
            result["ms"] = cached["baseline_ms"] if cached else result["evaluator"].baseline_ms()
        except Exception as e:   # reported below, on the main thread
            result["error"] = e

    worker = threading.Thread(target=measure, daemon=True)
    t0 = time.time()
    worker.start()
    worker.join(cfg.reference_limit)
    if worker.is_alive():
        meant_for_gpu = device == "cpu" and task.device == "cuda" and task.name in tasks.names()
        hint = " (this task is meant for a GPU)" if meant_for_gpu else "; raise --reference-limit if expected"
        raise SetupError(f"the reference took longer than --reference-limit {cfg.reference_limit:g} s "
                         f"on {rundir_mod.hardware_name(device)}{hint}")
    if "error" in result:
        if "evaluator" in result:
            result["evaluator"].close()
        err = result["error"]
        if isinstance(err, SetupError):
            raise err
        raise SetupError(f"the reference does not run on {device}: {_reference_problem(err)}")
    evaluator, ms = result["evaluator"], result["ms"]
    # the protocol's self-check when the evaluator reports it (the reference timed as a candidate: ~1x)
    info = evaluator.baseline_info() if callable(getattr(evaluator, "baseline_info", None)) else {}
    check = (f"; timed as a candidate it reads {info['self_check']:.3f}x" if info.get("self_check") else "")
    say(f"reference: {ms:.4g} ms per call{check} (started and measured in {time.time() - t0:.1f} s)")
    if info.get("cores_note"):
        say(f"note: {info['cores_note']}")
    if not cached:
        rd.store_eval(key, {"baseline_ms": ms})
    return evaluator, ms


def _reference_problem(err: Exception) -> str:
    """One line from the reference worker's error: a missing module by name, else the error itself."""
    text = str(err)
    missing = re.search(r"No module named '([^']+)'", text)
    if missing:
        return (f"it imports {missing.group(1)!r}, which is not installed here (pip install it, or put the "
                "module beside the problem file)")
    text = text.removeprefix("the reference itself failed to run: ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in text:   # the exception is the traceback's last line
        lines = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)][-1:] or lines
    line = " ".join(lines[:1]) or type(err).__name__
    return line[:300] + (" ..." if len(line) > 300 else "")


def nothing_to_add(state: dict | None, cfg: Config, path) -> str:
    """For a resumed run with nothing left to do, the line that says so (else ""): every generation done,
    or the token budget spent, with the option that would let it go on."""
    if not state:
        return ""
    done = state["round"]
    if done >= cfg.generations:
        return (f"{path} is finished: {done} of {cfg.generations} generations done, nothing to add; nothing "
                f"was changed (to go on: python run.py --resume {path} --generations N, N > {done})")
    usage = state.get("usage") or {}
    tokens = sum(int(u.get("prompt_tokens", 0)) + int(u.get("completion_tokens", 0))
                 for u in usage.values() if isinstance(u, dict))
    if cfg.token_budget and tokens >= cfg.token_budget:
        return (f"{path} has spent its token budget ({tokens:,} of {cfg.token_budget:,} tokens), nothing to "
                f"add; nothing was changed (to go on: python run.py --resume {path} --token-budget N, "
                f"N > {tokens})")
    return ""


class RunLog:
    """The run's own log, logs/run.log: warnings of the libraries a run uses (Ray, PyTorch, urllib3) and
    Python's warnings go there, not to the console. Records made before the run directory exists are kept
    in memory and written once it does (dropped if it never does: the one-line message says it all)."""

    def __init__(self):
        self._held: list[logging.LogRecord] = []
        self._file: logging.Handler | None = None
        self.handler = _Forward(self)
        self._adopted: dict[str, tuple[list, bool]] = {}
        root = logging.getLogger()
        self._root_level = root.level
        root.addHandler(self.handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        logging.captureWarnings(True)

    def adopt(self, name: str) -> None:
        """Route the logger `name` (one that prints on its own handlers, like Ray's) into this log."""
        logger = logging.getLogger(name)
        self._adopted.setdefault(name, (list(logger.handlers), logger.propagate))
        logger.handlers = [self.handler]
        logger.propagate = False

    def attach(self, rd: rundir_mod.RunDir) -> None:
        rd.logs.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(rd.logs / "run.log", delay=True)   # made by the first record
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for record in self._held:
            handler.handle(record)
        self._held.clear()
        self._file = handler

    def close(self) -> None:
        logging.captureWarnings(False)
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self._root_level)
        for name, (handlers, propagate) in self._adopted.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        if self._file is not None:
            self._file.close()
            self._file = None


class _Forward(logging.Handler):
    def __init__(self, log: RunLog):
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "llm" and record.levelno >= logging.WARNING:
            # the LLM client's retries are this run's own news: on the console, as before
            sys.stderr.write(record.getMessage() + "\n")
        if self.log._file is not None:
            self.log._file.handle(record)
        elif len(self.log._held) < 1000:
            self.log._held.append(record)
