"""Tests for evaluate_kernel: CPU pipeline end to end (CI), plus GPU-marked tests for the CUDA paths.

One Evaluator per module (reference worker start-up and the baseline are paid once); the C++ candidates
are built concurrently in one fixture because each cold build costs ~10-30 s on a 2-core machine.
"""
from __future__ import annotations

import json
import subprocess
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evaluate_kernel import build as eval_build
from evaluate_kernel import device as eval_device
from evaluate_kernel import protocol as eval_protocol
from evaluate_kernel import worker as eval_worker
import evaluate_kernel as ek

HERE = Path(__file__).parent / "candidates_cpu"
REF = (HERE / "reference_small.py").read_text()
HONEST = (HERE / "honest_torch.py").read_text()
HONEST_CPP = (HERE / "honest_cpp.py").read_text()


def variant(forward_body: str, extra_init: str = "", header: str = "") -> str:
    """A candidate = honest __init__ plus the given forward body (indented 8 spaces)."""
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F
{header}

class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self.groups, self.eps = groups, eps
{extra_init}
    def forward(self, x):
{forward_body}
'''


HONEST_BODY = '''        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + t * (t + 3.0) / 6.0, dim=1, keepdim=True)'''


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    os.environ["PACEVOLVE_TEST_API_KEY"] = "sk-must-not-leak"
    e = ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path_factory.mktemp("evalcache")),
                     max_pairs=10, timing_s=1.5, run_timeout_s=60, build_timeout_s=300)
    yield e
    e.close()
    os.environ.pop("PACEVOLVE_TEST_API_KEY", None)


SEGV_CPP = HONEST_CPP.replace('name="fused_tail_cpp"', 'name="segv_cpp"').replace(
    "return out;\n}", "if (N > 0) { volatile float* bad = nullptr; *bad = 1.0f; }\n    return out;\n}")
BROKEN_CPP = HONEST_CPP.replace("float mx = -INFINITY;", "float mx = -INFINITY\n            int oops = ;")


@pytest.fixture(scope="module")
def cpp_results(ev):
    """Build and run the C++ candidates side by side (also exercises concurrent evaluate calls)."""
    srcs = {"ok": HONEST_CPP, "broken": BROKEN_CPP, "segv": SEGV_CPP}
    with ThreadPoolExecutor(3) as pool:
        futures = {k: pool.submit(ev.evaluate, s) for k, s in srcs.items()}
        out = {k: f.result() for k, f in futures.items()}
    out["again"] = ev.evaluate(HONEST_CPP)
    return out


# ------------------------------------------------------------------------------------------ happy paths
EXPANDED_REF = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x * y


def get_inputs():
    return [torch.randn(16, 1).expand(16, 64), torch.randn(16, 64)]


def get_init_inputs():
    return []
"""


def test_a_task_whose_inputs_share_memory_is_evaluated(tmp_path):
    """get_inputs() returning an expanded tensor: the reference worker raised while laying out the
    timing's inputs, so no candidate of such a task could be evaluated."""
    with ek.Evaluator(EXPANDED_REF, device="cpu", cache_dir=str(tmp_path), max_pairs=4, timing_s=1.0) as e:
        r = e.evaluate(EXPANDED_REF.replace("class Model", "class ModelNew"))
    assert r.status == "ok", r.message


def test_correct_pytorch_candidate_is_ok_with_speedup_near_one(ev):
    r = ev.evaluate(HONEST)
    assert r.status == "ok", r.message
    assert r.correct and r.runtime_ms > 0 and r.baseline_ms > 0
    assert 0.25 < r.speedup < 4.0  # CPU timings here are bimodal per process (see report)
    assert len(r.details["trials"]) >= 3 and all(t["ok"] for t in r.details["trials"])
    dists = {t["dist"] for t in r.details["trials"]}
    assert {"own", "scaled", "negated", "zero_mean", "per_sample"} <= dists
    assert any(t["perturbed"] for t in r.details["trials"])
    for key in ("compile_s", "time_s", "device", "torch", "source_hash", "timing", "speedup_ci", "noise"):
        assert key in r.details
    t = r.details["timing"]
    assert 1 <= t["pairs"] == len(t["ratios"]) <= 10 and len(t["batches_cand_ms"]) == t["pairs"] + 1
    low, high = r.details["speedup_ci"]
    assert low <= r.speedup <= high and r.details["noise"] == pytest.approx((high - low) / 2 / r.speedup)
    assert r.details["timed_checks"] and all(c["ok"] for c in r.details["timed_checks"])


def test_baseline_is_cached(ev):
    b1 = ev.baseline_ms()
    t0 = time.monotonic()
    assert ev.baseline_ms() == b1
    assert time.monotonic() - t0 < 0.5


def test_cpp_candidate_ok(cpp_results):
    r = cpp_results["ok"]
    assert r.status == "ok", r.message
    assert r.details["compile_s"] > 0.5


def test_identical_source_not_rebuilt(cpp_results):
    r = cpp_results["again"]
    assert r.status == "ok", r.message
    assert r.details["compile_s"] == 0.0 and r.details.get("build_cached")   # its wall time: bench_eval


def test_runner_loads_the_built_library_without_asking_ninja(ev, cpp_results):
    """With the shared precompiled header gone (another program's load_inline deletes it), ninja would
    rebuild main.o inside the timed runner; the runner imports the builder's library instead."""
    import torch
    gch = Path(torch.__file__).parent / "include" / "torch" / "extension.h.gch"
    moved = gch.with_suffix(".gch.test-moved")
    if gch.exists():
        gch.rename(moved)
    try:
        r = ev.evaluate(HONEST_CPP)
    finally:
        if moved.exists():
            moved.rename(gch)
    assert r.status == "ok", r.message
    assert r.details["phases"]["load"] < 1.0, r.details["phases"]


def test_the_evaluator_says_when_each_start_up_step_ended(ev):
    """Where a first verdict waits: seconds from the constructor's call to the end of each step."""
    s = ev.start_s
    assert {"setup", "devices"} <= set(s) and 0 <= s["setup"] <= s["devices"], s
    assert "baseline" not in s or s["baseline"] >= s["devices"]
    assert 0 < ev.devices[0].start_s["reference_worker"] <= s["devices"], (ev.devices[0].start_s, s)
    if ev.fork_server == "on":
        assert s["fork_server"] > 0


def test_a_results_trials_are_split_into_the_first_the_others_and_the_outputs_written(cpp_results):
    r = cpp_results["again"]
    split = r.details["trials_split_s"]
    assert set(split) == {"first", "others", "outputs_written"} and min(split.values()) >= 0, split
    assert abs(sum(split.values()) - r.details["phases"]["trials"]) < 0.005, (split, r.details["phases"])


def test_cpp_compile_error_reports_first_error(cpp_results):
    r = cpp_results["broken"]
    assert r.status == "compile_error"
    assert "error" in r.message and "candidate line" in r.message
    assert "compiler_output" in r.details


def test_segfault_is_runtime_error_and_next_evaluation_works(ev, cpp_results):
    r = cpp_results["segv"]
    assert r.status == "runtime_error"
    assert "SIGSEGV" in r.message
    assert ev.evaluate(HONEST).status == "ok"


# ------------------------------------------------------------------------------------------ failures
def test_wrong_candidate_is_incorrect_with_useful_message(ev):
    r = ev.evaluate(HONEST.replace("dim=1, keepdim=True)", "dim=1, keepdim=True) * 1.001"))
    assert r.status == "incorrect" and not r.correct
    assert "trial 0" in r.message and "worst at index" in r.message and "expected" in r.message
    assert r.runtime_ms is None


@pytest.mark.parametrize("src, fragment", [
    ("import torch\nclass ModelNew(torch.nn.Module:\n    pass\n", "SyntaxError"),
    ("import torch\nclass Other(torch.nn.Module):\n    pass\n", "ModelNew"),
])
def test_invalid(src, fragment):
    r = ek.evaluate(REF, src, device="cpu")  # screened before anything starts
    assert r.status == "invalid" and fragment in r.message


def test_runtime_exception_names_candidate_line(ev):
    r = ev.evaluate(variant("        return self.conv(x).view(3, -1, 7)"))
    assert r.status == "runtime_error"
    assert "candidate line" in r.message and "RuntimeError" in r.message


def test_os_exit_is_runtime_error(ev):
    r = ev.evaluate(variant("        import os\n        os._exit(3)"))
    assert r.status == "runtime_error" and "code 3" in r.message


def test_infinite_loop_is_timeout(tmp_path):
    with ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path), run_timeout_s=5, max_pairs=4, timing_s=1.0) as e:
        t0 = time.monotonic()
        r = e.evaluate(variant("        while True:\n            x = x + 1"))
        assert r.status == "timeout" and "5 s" in r.message, r.message
        assert time.monotonic() - t0 < 40
        assert e.evaluate(HONEST).status == "ok"  # the evaluator survives


def test_the_time_budget_never_stops_the_timing_at_a_single_pair(tmp_path):
    """A budget spent before the interval means anything (a slow task) is overrun up to min_pairs counted
    pairs: one pair's interval is a point, and its noise would be a best-of-n search's profit."""
    with ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path), min_pairs=3, max_pairs=10,
                      timing_s=0.001) as e:
        r = e.evaluate(HONEST)
        assert r.status == "ok", r.message
        assert 3 <= r.details["timing"]["pairs"] < 10, r.details["timing"]["pairs"]
        low, high = r.details["speedup_ci"]
        assert low < high


SLOW_REF = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        y = x
        for _ in range(48):
            y = torch.relu(y) * 1.0
        return torch.relu(x) + 0.0 * y
def get_inputs():
    return [torch.randn(64, 4096)]
def get_init_inputs():
    return []
"""
WRONG_BEYOND = """
import time
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.last, self.k = 0.0, 0
    def forward(self, x):
        now = time.perf_counter()
        self.k = 0 if now - self.last > 0.002 else self.k + 1   # a batch's calls come back to back
        self.last = now
        return torch.relu(x) + (1.0 if self.k >= LIMIT else 0.0)
"""


def test_a_faster_candidates_calls_beyond_the_references_batch_are_checked_too(tmp_path):
    """Each side's batch lasts about batch_ms of its own calls, so a faster candidate's holds more calls
    than the reference's; the reference's batch runs the checked calls' sets whichever they are, so a
    candidate right only for as many calls as the reference's batch holds is caught."""
    with ek.Evaluator(SLOW_REF, device="cpu", cache_dir=str(tmp_path), min_pairs=6, max_pairs=12,
                      run_timeout_s=60) as e:
        honest = e.evaluate(WRONG_BEYOND.replace("LIMIT", "10**9"))
        assert honest.status == "ok", honest.message
        t = honest.details["timing"]
        assert t["calls_per_batch"] > 3 * t["calls_per_reference_batch"], t
        r = e.evaluate(WRONG_BEYOND.replace("LIMIT", str(t["calls_per_reference_batch"])))
        assert r.status == "incorrect" and "timed call" in r.message, r.message


def test_a_reference_death_is_the_candidate_s_whose_turn_it_was(ev, monkeypatch):
    """The reference worker's death rejects the candidate whose turn on the device it was (its process may
    have caused it, and a restart must never hide that), and only that one: a death before its turn (while
    it was built, or waited behind another) was not its doing, and it is judged on a fresh reference."""
    import signal
    from evaluate_kernel import evaluation
    dev = ev.devices[0]
    assert ev.evaluate(HONEST).status == "ok"
    os.kill(dev.ref.proc.pid, signal.SIGKILL)   # between turns: nobody's
    dev.ref.proc.wait(timeout=30)
    r = ev.evaluate(HONEST)
    assert r.status == "ok", r.message
    drive = evaluation.Evaluation._drive

    def dies_in_the_turn(self, prepare):
        result = drive(self, prepare)
        os.kill(self.dev.ref.proc.pid, signal.SIGKILL)
        self.dev.ref.proc.wait(timeout=30)
        return result
    monkeypatch.setattr(evaluation.Evaluation, "_drive", dies_in_the_turn)
    r = ev.evaluate(HONEST)
    assert r.status == "rejected" and "reference worker died" in r.message, r.message
    monkeypatch.setattr(evaluation.Evaluation, "_drive", drive)
    assert ev.evaluate(HONEST).status == "ok"


def test_input_modification_is_rejected(ev):
    body = HONEST_BODY.replace("        return ", "        out = ") + "\n        x.zero_()\n        return out"
    r = ev.evaluate(variant(body))
    assert r.status == "rejected" and "modified" in r.message


def test_output_cached_across_calls_is_incorrect(ev):
    body = ('        if self.cache is None:\n' + HONEST_BODY.replace("        return ", "            self.cache = ")
            .replace("        x_conv", "            x_conv").replace("        t =", "            t =") +
            '\n        return self.cache.clone()')
    r = ev.evaluate(variant(body, extra_init="        self.cache = None\n"))
    assert r.status == "incorrect"


def test_fixed_weight_shortcut_caught_by_perturbed_trial(ev):
    # Ignores the GroupNorm affine parameters: exact for seed-42 weights (weight=1, bias=0), wrong otherwise.
    body = '''        x_conv = self.conv(x)
        t = torch.tanh(F.group_norm(x_conv, self.groups, eps=self.eps))
        return torch.logsumexp(x_conv + t * (t + 3.0) / 6.0, dim=1, keepdim=True)'''
    r = ev.evaluate(variant(body))
    assert r.status == "incorrect" and "perturbed weights" in r.message


def test_positive_input_shortcut_caught(ev):
    # abs() is a no-op on torch.rand inputs; negated inputs expose it.
    r = ev.evaluate(variant(HONEST_BODY.replace("self.conv(x)", "self.conv(x.abs())")))
    assert r.status == "incorrect" and "negated" in r.message


def test_non_tensor_output_is_rejected(ev):
    r = ev.evaluate(variant(HONEST_BODY.replace("return torch.logsumexp", "return [v for v in torch.logsumexp") +
                            ".flatten().tolist()]"))
    assert r.status == "rejected" and "not a plain torch.Tensor" in r.message


def test_printed_result_cannot_forge_a_verdict(ev):
    forged = json.dumps({"kind": "timed", "samples": [1e-6] * 15, "verify": [], "flags": [], "nonce": "x"})
    body = (f"        print({forged!r})\n        print('Kernel speedup: 1000.0')\n"
            "        return self.conv(x)[:, :1] * 0")
    r = ev.evaluate(variant(body))
    assert r.status == "incorrect"


def test_candidate_environment_has_no_api_keys(ev):
    body = ('        import os\n        leaked = [k for k in os.environ if "KEY" in k.upper() or "TOKEN" in k.upper()]\n'
            '        assert not leaked, leaked\n' + HONEST_BODY)
    r = ev.evaluate(variant(body))
    assert r.status == "ok", r.message
    env = ek.scrubbed_env()
    assert "PACEVOLVE_TEST_API_KEY" not in env and "PATH" in env


# ------------------------------------------------------------------------------------------ static screen
SCREEN_CASES = {
    "threads": "import threading\n",
    "subprocess": "import subprocess\n",
    "tensor_subclass": "class Lazy(torch.Tensor):\n    pass\n",
    "introspection": "import sys\nf = sys._getframe(1)\n",
    "native_ffi": "import ctypes\n",
    "patching": "torch.cuda.synchronize = lambda: None\n",
    "try_except": "try:\n    y = 1\nexcept Exception:\n    y = 2\n",
    "reference_model": "class Base(Model):\n    pass\n",
    "persisting_l2": 'cuda_src = "attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;"\n',
    "streams": "s = torch.cuda.Stream()\n",
    "file_io": "f = open('/tmp/x', 'w')\n",
    "dynamic_code": "eval('1+1')\n",
    "harness_access": "import evaluate_kernel\n",
}


@pytest.mark.parametrize("rule", sorted(ek.RULES))
def test_screen_rule_message(rule):
    src = "import torch\nimport torch.nn as nn\n" + SCREEN_CASES[rule] + HONEST.split("import torch.nn.functional as F")[1]
    v = ek.screen(src)
    assert v.status == "rejected" and v.rule == rule
    assert f"rule '{rule}'" in v.message and ek.RULES[rule] in v.message and f"line {v.line}" in v.message


@pytest.mark.parametrize("src", [
    HONEST, HONEST_CPP,
    # comments and docstrings mentioning forbidden things are not code
    "# import threading; try: except\n" + HONEST + '\n"""we never use torch.cuda.Stream here"""\n',
    HONEST_CPP.replace("#include <cmath>", "#include <cmath>\n// std::thread is not used here"),
    HONEST + "\nassert True\nif torch.cuda.is_available():\n    pass\n",
])
def test_screen_accepts_honest_code(src):
    assert ek.screen(src).status == "ok", ek.screen(src).message


def test_screen_more_patterns():
    cases = ['cpp = "std::thread t(work); t.detach();"', "import torch as T\nT.allclose = None",
             "setattr(torch, 'allclose', None)", "import os\nos.environ['X'] = '1'", "x = __import__('os')",
             'cu = "cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);"', "import gc\n", "from inspect import stack",
             "with torch.cuda.stream(s):\n    pass", "torch.backends.cudnn.allow_tf32 = True",
             # the attribute rules spelt as strings (twentieth red team: frames walked by getattr)
             "import sys\nf = getattr(sys, '_getframe')(1)", "g = getattr(f, 'f_locals')", "h = getattr(f, f'f_back')",
             "import sys\nm = getattr(sys, 'modules')", "import sys\nm = sys.__dict__['modules']",
             "b = hasattr(x, 'f_code')", "s = getattr(torch.cuda, 'Stream')()", "g = getattr(f, f'f_{name}')",
             # the environment: only a few keys, and by no other spelling
             "import os\nos.environ.setdefault('LD_PRELOAD', 'x')", "import os\nos.environ.__setitem__('X', '1')",
             "import os\ndel os.environ['OMP_NUM_THREADS']", "import os\nos.environ[key] = '1'",
             "torch.backends.cuda.matmul.allow_tf32 = True", "import sys\nsetattr(sys, name, None)",
             'cpp = "std::thread t(work);"', 'cpp = "#pragma omp task\\nwork();"', "torch.backends.cudnn.allow_tf32 = x",
             # computed names anywhere but on self reach modules, frames and __builtins__ (twenty-first red team)
             "self.s = getattr(torch, 'sy' + 's')", "f = getattr(self.s, '_get' + 'frame')(1)",
             "import torch.nn.functional as F\nb = getattr(F, '__buil' + 'tins__')",
             "torch.backends.cuda.matmul.allow_tf32, _ = True, 0",
             "for torch.backends.cudnn.allow_tf32 in (True,):\n    pass", "torch.set_float32_matmul_precision('medium')",
             # the module table by another spelling (forty-fourth red team: the harness's batch step replaced)
             "from sys import modules", "from sys import modules as m", "import sys as s\nm = s.modules"]
    for c in cases:
        assert ek.screen("import torch\n" + c + "\nclass ModelNew(torch.nn.Module):\n    pass\n").status == "rejected", c


def test_screen_accepts_common_honest_spellings():
    """Found refused by the screen in a sweep of honest candidates: layers registered and looked up on the
    model by computed names, cuDNN's autotuner, a few environment variables an extension build or a thread
    count reads, full-precision settings."""
    cases = ["for i in range(3):\n    setattr(self, f'act{i}', torch.nn.ReLU())", "y = getattr(self, self.first)(x)",
             "torch.backends.cudnn.benchmark = True", "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'",
             "import os\nos.environ.setdefault('OMP_NUM_THREADS', '1')", "torch.set_float32_matmul_precision('highest')",
             "torch.backends.cuda.matmul.allow_tf32 = False",
             'cpp = "#include <thread>\\nint n = std::thread::hardware_concurrency();"',
             'cpp = "#pragma omp taskloop\\nfor (int i = 0; i < n; ++i) y[i] = x[i];"']
    for c in cases:
        v = ek.screen("import torch\n" + c + "\nclass ModelNew(torch.nn.Module):\n    pass\n")
        assert v.status == "ok", (c, v.message)


def test_failure_messages_say_what_an_honest_program_can_do_about_them():
    from evaluate_kernel import readout, verdict
    r = verdict.failure({"kind": "error", "where": "forward",
                         "error": "InductorError: PermissionError: [Errno 1] Operation not permitted"}, {})
    assert r.status == "runtime_error" and "torch.compile" in r.message and "load_inline" in r.message
    r = verdict.failure({"kind": "error", "where": "forward",
                         "error": "PermissionError: [Errno 1] Operation not permitted [candidate line 18]"}, {})
    assert r.status == "runtime_error" and "may not start processes on the CPU" in r.message
    assert r.message.endswith("Operation not permitted [candidate line 18]")
    same = "calls 0 and 1 returned outputs in the same memory: return a new tensor from every call"
    assert any(m in same for m in readout.HONEST_MISTAKES)
    assert verdict.forged({}, same, honest_mistake=True).message == "rejected: " + same
    assert verdict.forged({}, "the runner answered 'x' out of turn").message.endswith("(forged result)")


def test_rules_are_documented():
    doc = ek.rules_markdown()
    assert all(f"`{r}`" in doc for r in ek.RULES)


# ------------------------------------------------------------------------------------------ pieces
def test_evalresult_json_round_trip():
    r = ek.EvalResult("ok", True, 1.5, 3.0, 2.0, "fine", {"trials": [{"rel_l2": 1e-7}], "flags": []})
    back = ek.EvalResult.from_dict(json.loads(r.to_json()))
    assert back == r
    assert set(ek.STATUSES) >= {r.status}


def test_half_precision_outputs_are_held_to_their_own_resolution():
    """A bf16 affine computed in fp32 and rounded once differs from the reference's two roundings by an ulp
    on about a quarter of the elements (relative L2 0.003, found refused in a sweep of honest candidates);
    an error of a few ulps everywhere still fails, and fp32 outputs keep the given tolerances."""
    import torch
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(64, 256, generator=g) for _ in range(3))
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    ref = xb * wb + bb                                              # two roundings
    once = (xb.float() * wb.float() + bb.float()).bfloat16()        # one
    assert not torch.equal(ref, once)
    assert ek.compare_outputs([once], [ref], 1e-4, 1e-4, 1e-5)["ok"]
    assert not ek.compare_outputs([(ref.float() * 1.05).bfloat16()], [ref], 1e-4, 1e-4, 1e-5)["ok"]
    assert not ek.compare_outputs([once.float()], [ref.float() + 1e-3], 1e-4, 1e-4, 1e-5)["ok"]


def test_tolerance_scales_with_output_magnitude():
    import torch
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, generator=g, dtype=torch.float64).float() * 100
    ref[:16] = torch.linspace(-1e-4, 1e-4, 16)  # outputs near zero
    near_zero_err = ref.clone()
    near_zero_err[:16] += 1.5e-3  # huge relative error there, tiny against RMS(ref) ~ 100
    r = ek.compare_outputs([near_zero_err], [ref], 1e-4, 1e-4, 1e-5)
    assert r["ok"], r
    off = ref * (1 + 1e-3)  # uniformly 1e-3 relative off: relative L2 = 1e-3 > 1e-5
    r = ek.compare_outputs([off], [ref], 1e-4, 1e-4, 1e-5)
    assert not r["ok"] and "relative L2" in r["reason"]
    zeros = torch.zeros_like(ref) + 1e-6  # degenerate output: fails however small the reference is
    assert not ek.compare_outputs([zeros], [ref * 1e-8], 1e-4, 1e-4, 1e-5)["ok"]
    nan = ref.clone()
    nan[5] = float("nan")
    assert "non-finite" in ek.compare_outputs([nan], [ref], 1e-4, 1e-4, 1e-5)["reason"]
    assert "shape" in ek.compare_outputs([ref[:10]], [ref], 1e-4, 1e-4, 1e-5)["reason"]
    assert "dtype" in ek.compare_outputs([ref.double()], [ref], 1e-4, 1e-4, 1e-5)["reason"]


def test_compiler_output_is_trimmed_and_mapped():
    src = "x = 1\ncpp = '''\nint f() {\n    return 1 +;\n}\n'''\n"
    log = ("[1/2] c++ -c main.cpp\nFAILED: main.o\n/tmp/ext/main.cpp:5:15: error: expected primary-expression "
           "before ';' token\n    5 |     return 1 +;\n      |               ^\nninja: build stopped\n")
    msg = ek.trim_compiler_output(log, src)
    assert "candidate line 4" in msg and "expected primary-expression" in msg


def test_nvcc_errors_are_mapped_to_candidate_lines():
    src = 'cuda_src = r"""\n__global__ void k(float* x) {\n    float s = 0.f\n    int oops = ;\n}\n"""\n'
    log = ('[1/3] nvcc -c cuda.cu\nFAILED: cuda.cuda.o\n/tmp/ext/cuda.cu(7): error: expected a ";"\n'
           '      int oops = ;\n      ^\n\n/tmp/ext/cuda.cu(7): error: expected an expression\n      int oops = ;\n'
           '                 ^\n\n2 errors detected in the compilation of "/tmp/ext/cuda.cu".\nninja: build stopped\n')
    msg = ek.trim_compiler_output(log, src)
    assert msg.splitlines()[0] == 'candidate line 4 (cuda.cu:7): error: expected a ";"  `int oops = ;`', msg
    assert len(msg.splitlines()) == 2 and "/tmp/ext" not in msg


def test_arch_list():
    assert ek.arch_list_for((9, 0)) == "9.0a"
    assert ek.arch_list_for((8, 0)) == "8.0"


def test_for_task_reads_task_attributes(tmp_path):
    from types import SimpleNamespace
    task = SimpleNamespace(reference_src=REF, device="cpu", rtol=2e-4, atol=3e-4, l2_tol=4e-5, flops=1.0)
    with ek.Evaluator.for_task(task, cache_dir=str(tmp_path)) as e:
        assert (e.rtol, e.atol, e.l2_tol, e.flops, e.device) == (2e-4, 3e-4, 4e-5, 1.0, "cpu")


def test_unknown_option_rejected():
    with pytest.raises(TypeError):
        ek.Evaluator(REF, device="cpu", not_an_option=1)


# ------------------------------------------------------------------------------------------ light headers
class _FakeCppExtension:
    """Stands in for torch.utils.cpp_extension: load_inline records its flags and fails on request."""

    def __init__(self, fail_light: bool):
        self.JIT_EXTENSION_VERSIONER = type("V", (), {})()
        self.JIT_EXTENSION_VERSIONER.entries = {}
        self.fail_light, self.calls, self.cflags = fail_light, [], []

    def load_inline(self, **kw):
        light = any(f.startswith("-I") for f in kw["extra_cuda_cflags"] + kw.get("extra_cflags", []))
        self.calls.append((list(kw["extra_cuda_cflags"]), "ext" in self.JIT_EXTENSION_VERSIONER.entries))
        self.cflags.append((list(kw.get("extra_cflags", [])), kw.get("use_pch")))
        self.JIT_EXTENSION_VERSIONER.entries["ext"] = "built once"
        if light and self.fail_light:
            raise RuntimeError("Error building extension 'ext'")
        return "module"


CU_SOURCE = "#include <torch/types.h>\ntorch::Tensor twice(torch::Tensor x) { return x * 2; }\n"


@pytest.mark.parametrize("fail_light", [False, True])
def test_light_headers_first_then_the_real_header(tmp_path, capsys, fail_light):
    ce = _FakeCppExtension(fail_light)
    cfg, record = {"light_headers": True}, {}
    module = eval_build._build_light(ce, ce.load_inline, (), {"extra_cuda_cflags": ["-O3"]}, cfg, "ext",
                                     str(tmp_path), record, CU_SOURCE, "")
    assert module == "module"
    light = tmp_path / "pacevolve-headers"
    assert (light / "torch" / "extension.h").exists() and (light / "ATen" / "Functions.h").exists()
    assert record["light"]["lean_types"] and 0 < record["light"]["operators"] < record["light"]["of"]
    marker = tmp_path / "pacevolve-light-headers"
    if not fail_light:
        assert ce.calls == [([f"-I{light}", "-O3"], False)] and record["headers"] == "light"
        assert marker.read_text() == str(light)
    else:
        # The retry is the call as written, and torch's versioner forgot the first try (else it would
        # rename the module ext_v1 or skip the build as unchanged).
        assert ce.calls == [([f"-I{light}", "-O3"], False), (["-O3"], False)]
        assert record["headers"].startswith("full") and not marker.exists()
        assert ek.FULL_HEADER_RETRY in capsys.readouterr().out


def test_a_runner_rebuilds_with_the_flags_its_library_was_built_with(tmp_path):
    for built_light in (False, True):
        if built_light:
            (tmp_path / "pacevolve-light-headers").write_text("/light")
        ce = _FakeCppExtension(fail_light=False)
        eval_build._build_light(ce, ce.load_inline, (), {"extra_cuda_cflags": []},
                                {"light_headers": True, "prebuilt": True}, "ext", str(tmp_path), {}, CU_SOURCE, "")
        assert ce.calls == [(["-I/light"] if built_light else [], False)]
        assert not (tmp_path / "pacevolve-headers").exists()  # a runner writes nothing


@pytest.mark.parametrize("fail_light", [False, True])
@pytest.mark.parametrize("source", [CU_SOURCE, ""])
def test_the_binding_header_first_on_main_cpp_s_path_then_torch_s(tmp_path, capsys, fail_light, source):
    ce = _FakeCppExtension(fail_light)
    record: dict = {}
    kw = {"extra_cuda_cflags": [], "extra_cflags": ["-O3"], "use_pch": True}
    assert eval_build._build_light(ce, ce.load_inline, (), kw, {"light_headers": True, "binding": "/binding"},
                                   "ext", str(tmp_path), record, source, "/binding") == "module"
    marker = tmp_path / "pacevolve-main-header"
    # torch's own header check is not asked for with the binding header (it would see other flags)
    assert ce.cflags[0] == (["-I/binding", "-O3"], False)
    if not fail_light:
        assert record["binding"] is True and marker.read_text() == "/binding" and len(ce.cflags) == 1
    else:
        assert ce.cflags[1] == (["-O3"], True) and not marker.exists() and not record.get("binding")
        assert ek.FULL_HEADER_RETRY in capsys.readouterr().out
    # a runner that must rebuild does so with the flags the library was built with
    runner = _FakeCppExtension(False)
    eval_build._build_light(runner, runner.load_inline, (), dict(kw), {"light_headers": True, "prebuilt": True},
                            "ext", str(tmp_path), {}, source, "")
    assert runner.cflags == [(["-I/binding", "-O3"], False) if not fail_light else (["-O3"], True)]


@pytest.mark.parametrize("pch", ["ready", "pending", "failed: timed out"])
def test_main_cpp_parses_torch_s_header_until_its_precompiled_form_is_ready(tmp_path, monkeypatch, pch):
    """While the parent writes torch's precompiled header (a fresh machine) a build does not wait for it:
    main.cpp includes torch's header through a directory of ours, and so from its text."""
    from torch.utils import cpp_extension as ce
    calls: list = []
    def load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None, extra_cuda_cflags=None,
                    use_pch=False, verbose=False):
        calls.append((extra_cflags, use_pch))
    monkeypatch.setattr(ce, "load_inline", load_inline)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    monkeypatch.setattr(eval_build, "_ensure_pch", lambda *a: calls.append("torch's header checked"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    record = eval_build._install_build_defaults({"use_pch": True, "pch": pch, "pch_lock": str(tmp_path / "lock")})
    ce.load_inline(name="ext", cpp_sources="int f();", functions=["f"])
    # a call of its own flags asking torch for its header (which torch would precompile again with them)
    ce.load_inline(name="ext2", cpp_sources="int f();", functions=["f"], extra_cflags=["-I/mine", "-O2"], use_pch=True)
    wrapper = tmp_path / "ext" / "pacevolve-unprecompiled"
    if pch == "ready":
        assert calls == ["torch's header checked", ([], True), (["-I/mine", "-O2"], False)]
        assert not wrapper.exists() and "pch" not in record
    else:
        assert calls == [([f"-I{wrapper}"], False), (["-I/mine", "-O2", f"-I{tmp_path / 'ext2' / wrapper.name}"], False)]
        assert record["pch"] == f"not used: {pch}"
        text = (wrapper / "torch" / "extension.h").read_text()
        assert f'#include "{ce.include_paths()[0]}/torch/extension.h"' in text


def test_a_runner_looks_for_its_build_directory_without_making_it(tmp_path, monkeypatch):
    """(A runner's build directory lies in the read-only cache: an extension named at import time, a uuid,
    is loaded from the builder's library under its name.)"""
    from torch.utils import cpp_extension as ce
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert eval_build._build_directory(ce, "relu_1234", create=False) == str(tmp_path / "relu_1234")
    assert not (tmp_path / "relu_1234").exists()
    assert eval_build._build_directory(ce, "relu_1234", create=True) == str(tmp_path / "relu_1234")
    assert (tmp_path / "relu_1234").is_dir()


def test_a_precompiled_header_older_than_torch_loses_its_signature(tmp_path, monkeypatch):
    """After an upgrade torch's check would pass its header of the old headers (the signature holds flags
    and paths): the parent removes the signature, and the check builds the header again."""
    import importlib.util
    import types
    root = tmp_path / "torch"
    inc = root / "include" / "torch"
    inc.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for name in ("extension.h.gch", "extension.h.sign", "version.py"):
        (inc / name if name != "version.py" else root / name).write_text(name)
    spec = types.SimpleNamespace(origin=str(root / "__init__.py"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else real(name, *a))
    os.utime(root / "version.py", (1e9, 1e9))     # an installer may keep an archive's old times: not read
    os.utime(inc / "extension.h.gch", (4e9, 4e9))
    eval_build.forget_stale_pch()
    assert (inc / "extension.h.sign").exists()    # newer than torch's version file changed: kept
    os.utime(inc / "extension.h.gch", (1.5e9, 1.5e9))
    eval_build.forget_stale_pch()
    assert not (inc / "extension.h.sign").exists() and (inc / "extension.h.gch").exists()


@pytest.mark.parametrize("as_string", [False, True])
def test_the_parent_s_check_has_torch_write_its_header_aside_and_rename_it(tmp_path, as_string):
    """A compile reading torch's header while it is rewritten in place dies (a bus error): the parent's
    check makes torch's own compile write it aside, then renames it into place."""
    import shlex
    import types
    gch = tmp_path / "torch" / "extension.h.gch"
    gch.parent.mkdir()
    gch.write_text("the old header")
    seen = []

    def check_output(args, **kw):
        words = shlex.split(args) if isinstance(args, str) else args
        out = words[words.index("-o") + 1]
        seen.append((out, gch.read_text()))   # the old header stays whole while the new one is written
        with open(out, "w") as f:
            f.write("the new header")
        return b""

    def check(cflags, paths):
        cmd = ["c++", "-x", "c++-header", "extension.h", "-o", str(gch)]
        ce.subprocess.check_output(shlex.join(cmd) if as_string else cmd, stderr=None)
        ce.subprocess.check_output(["c++", "--version"])   # anything else goes through as it was

    ce = types.SimpleNamespace(subprocess=types.SimpleNamespace(check_output=check_output, STDOUT=-2),
                               _check_and_build_extension_h_precompiler_headers=check)
    real = ce.subprocess
    with pytest.raises(ValueError):   # "--version" has no -o: passed to the real module
        eval_build._ensure_pch(ce, [], str(tmp_path / "lock"), aside=True)
    assert seen[0][0] == f"{gch}.{os.getpid()}.aside" and seen[0][1] == "the old header"
    assert gch.read_text() == "the new header" and sorted(os.listdir(gch.parent)) == ["extension.h.gch"]
    assert ce.subprocess is real


def test_gcc_never_reads_a_precompiled_header_included_through_the_wrapper(tmp_path):
    """The mechanism above, with the real compiler: a precompiled torch/extension.h that would answer
    otherwise than its text (as a half-written one might) is not read through our directory."""
    import shutil
    import types
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    inc = tmp_path / "include" / "torch"
    inc.mkdir(parents=True)
    (inc / "extension.h").write_text("inline int answer() { return 2; }\n")
    subprocess.run([cxx, "-x", "c++-header", str(inc / "extension.h"), "-o", str(inc / "extension.h.gch")], check=True)
    (inc / "extension.h").write_text("inline int answer() { return 1; }\n")
    (tmp_path / "main.cpp").write_text("#include <torch/extension.h>\nint main() { return answer(); }\n")
    fake_ce = types.SimpleNamespace(include_paths=lambda *a, **k: [str(tmp_path / "include")])
    wrapper = eval_build._unprecompiled(fake_ce, str(tmp_path / "build"))
    answers = []
    for extra in ([], [f"-I{wrapper}"]):
        subprocess.run([cxx, "-Winvalid-pch", *extra, "-isystem", str(tmp_path / "include"), "main.cpp", "-o", "a.out"],
                       cwd=tmp_path, check=True, capture_output=True)
        answers.append(subprocess.run([str(tmp_path / "a.out")]).returncode)
    assert answers == [2, 1]   # directly the precompiled form; through the wrapper the text


def test_the_builder_scans_the_cu_file_load_inline_writes():
    text = eval_build._cu_text(["__global__ void k() {}", "int f();"])
    assert text.startswith("#include <torch/types.h>\n") and text.endswith("__global__ void k() {}\nint f();")
    assert eval_build._cu_text("int g();").endswith("\nint g();")


def test_build_options_reach_the_builder(ev, tmp_path):
    cfg = ev.builds.config()  # the defaults: light headers and fast_nvcc on
    assert cfg["light_headers"] is True
    assert cfg["nvcc"].endswith("fast_nvcc.py") and os.path.exists(cfg["nvcc"])
    with ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path), light_headers=False, fast_nvcc=False,
                      warm_runners=False) as other:
        assert other.builds.config()["light_headers"] is False and other.builds.config()["nvcc"] == ""


# ------------------------------------------------------------------------------------------ GPU
GPU_REF = REF.replace("batch_size = 8", "batch_size = 32")

CUDA_TAIL = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
__global__ void tail_kernel(const float* conv, const float* norm, float* out, int N, int C, int HW) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * HW) return;
    int b = idx / HW, p = idx % HW;
    float mx = -INFINITY, s = 0.f;
    for (int c = 0; c < C; ++c) {
        int i = (b * C + c) * HW + p;
        float t = tanhf(norm[i]);
        float v = conv[i] + t * (t + 3.f) / 6.f;
        if (v > mx) { s = s * expf(mx - v) + 1.f; mx = v; } else { s += expf(v - mx); }
    }
    WRITE_TARGET = mx + logf(s);
}
torch::Tensor tail(torch::Tensor conv, torch::Tensor norm) {
    auto c = conv.contiguous(); auto n = norm.contiguous();
    int N = c.size(0), C = c.size(1), HW = c.size(2) * c.size(3);
    auto out = torch::empty({N, 1, c.size(2), c.size(3)}, c.options());
    int threads = 256, blocks = (N * HW + threads - 1) / threads;
    tail_kernel<<<blocks, threads>>>(c.data_ptr<float>(), n.data_ptr<float>(), out.data_ptr<float>(), N, C, HW);
    return out;
}
"""
ext = load_inline(name="NAME", cpp_sources="torch::Tensor tail(torch::Tensor conv, torch::Tensor norm);",
                  cuda_sources=cuda_src, functions=["tail"])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        return ext.tail(x_conv, self.group_norm(x_conv))
'''


def cuda_candidate(name: str, write_target: str) -> str:
    return CUDA_TAIL.replace("NAME", name).replace("WRITE_TARGET", write_target)


# The .cu file uses the C++ frontend (torch::nn), which only the real torch/extension.h declares: the
# light-header build fails and the real header's build must take over.
NEEDS_FULL_HEADER = cuda_candidate("tail_full_header", "out[idx]").replace(
    'cuda_src = r"""', 'cuda_src = r"""\n#include <torch/extension.h>\n'
    'torch::Tensor never_called(torch::Tensor x) { return torch::nn::functional::relu(x); }')
BROKEN_CU = cuda_candidate("tail_broken", "out[idx]").replace("float mx = -INFINITY, s = 0.f;",
                                                               "float mx = -INFINITY, s = 0.f\n    int oops = ;")


@pytest.fixture(scope="module")
def gpu_ev(tmp_path_factory):
    e = ek.Evaluator(GPU_REF, device="cuda", cache_dir=str(tmp_path_factory.mktemp("gpucache")))
    yield e
    e.close()


# Its outputs come from a memory pool of its own, outside the pool over the runner's shared region, so no
# process but the runner could read them: refused once timed (the trials, without the pool, pass).
OUTPUT_FROM_ITS_OWN_POOL = variant(
    "        if not hasattr(self, 'pool'):\n"
    "            self.pool = torch.cuda.MemPool()\n"
    "        with torch.cuda.use_mem_pool(self.pool):\n"
    "            return self.honest(x)") + "\n    def honest(self, x):\n" + HONEST_BODY + "\n"


@pytest.fixture(scope="module")
def gpu_results(gpu_ev):
    srcs = {"ok": cuda_candidate("tail_ok", "out[idx]"),
            "wrong": cuda_candidate("tail_wrong", "out[b * HW + (p + 1) % HW]"),
            "oob": cuda_candidate("tail_oob", "((float*)256)[idx]"),
            "torch": HONEST, "own_pool": OUTPUT_FROM_ITS_OWN_POOL,
            "needs_full_header": NEEDS_FULL_HEADER, "broken_cu": BROKEN_CU}
    gpu_ev.builds.binding_header(wait=True)   # on a fresh machine the first builds would go without it
    with ThreadPoolExecutor(7) as pool:
        futures = {k: pool.submit(gpu_ev.evaluate, s) for k, s in srcs.items()}
        out = {k: f.result() for k, f in futures.items()}
    out["after_oob"] = gpu_ev.evaluate(srcs["ok"])
    return out


@pytest.mark.gpu
def test_gpu_fused_kernel_ok_and_timed(gpu_results):
    r = gpu_results["ok"]
    assert r.status == "ok", r.message
    assert r.details["build_headers"] == "light", r.details.get("build_headers")
    light = r.details["light_headers"]
    assert light["lean_types"] and 0 < light["operators"] < light["of"] / 10, light
    assert light["thrust"] == "declared" and r.details["binding_header"] is True, r.details
    # Timed beside five other candidates' builds on the same host: 6.2% measured on an H200 (the intervals
    # of calls this short widen with the host's load; alone, 0.4-0.6%).
    assert r.details["noise"] < 0.10 and r.details["timing"]["pairs"] >= 6
    assert r.details["gpu_protocol"] == "shared memory", r.details.get("gpu_protocol")
    print("GPU", r.details["device"], "baseline", r.baseline_ms, "kernel", r.runtime_ms, "speedup", r.speedup,
          "compile_s", r.details["compile_s"])


@pytest.mark.gpu
def test_gpu_outputs_allocated_outside_the_shared_region_are_refused(gpu_results):
    r = gpu_results["own_pool"]
    assert r.status == "rejected" and "outside the memory the evaluator reads" in r.message, r.message


@pytest.mark.gpu
def test_gpu_cu_needing_the_real_header_is_built_with_it(gpu_results):
    r = gpu_results["needs_full_header"]
    assert r.status == "ok", r.message
    assert r.details["build_headers"].startswith("full"), r.details.get("build_headers")


@pytest.mark.gpu
def test_gpu_cu_compile_error_reported_once_from_the_real_header_build(gpu_results):
    r = gpu_results["broken_cu"]
    assert r.status == "compile_error", r.message
    assert "candidate line" in r.message and "expected" in r.message, r.message
    assert r.details["build_headers"].startswith("full")
    assert ek.FULL_HEADER_RETRY not in r.details["compiler_output"]  # only the real header's errors


@pytest.mark.gpu
def test_gpu_wrong_index_incorrect(gpu_results):
    assert gpu_results["wrong"].status == "incorrect", gpu_results["wrong"].message


@pytest.mark.gpu
def test_gpu_oob_write_does_not_poison_next(gpu_results):
    assert gpu_results["oob"].status == "runtime_error", gpu_results["oob"].message
    assert gpu_results["after_oob"].status == "ok", gpu_results["after_oob"].message
    assert gpu_results["after_oob"].details.get("build_cached")


@pytest.mark.gpu
def test_gpu_pytorch_candidate_near_one_and_no_false_flags(gpu_results):
    r = gpu_results["torch"]
    assert r.status == "ok", r.message
    # Launch-bound at this size: the time is the host issuing kernels, and this candidate issues more of
    # them than the reference (its hardswish is four elementwise ops), so it is slower, honestly.
    assert 0.25 < r.speedup < 2.0 and not r.details["flags"]


@pytest.mark.gpu
def test_gpu_the_baseline_is_measured_beside_the_first_build(tmp_path):
    """With cores of their own for the runners, the constructor returns once the workers are up; the
    baseline is measured in the background (a first build goes on meanwhile), and the first timing waits
    for it."""
    t0 = time.monotonic()
    with ek.Evaluator(GPU_REF, device="cuda", cache_dir=str(tmp_path)) as e:
        started = time.monotonic() - t0
        if not e.pinned:
            pytest.skip("the runners have no cores of their own here: the baseline is measured first")
        dev = e.devices[0]
        assert dev.baseline is None, f"measured before the constructor returned ({started:.1f} s)"
        r = e.evaluate(cuda_candidate("first_build", "out[idx]"))
        assert r.status == "ok", r.message
        assert dev.baseline is not None and r.details["baseline_start_ms"] == dev.baseline["baseline_ms"]
        assert 0.9 < e.baseline_info()["self_check"] < 1.1


@pytest.mark.gpu
def test_gpu_inputs_drawn_on_the_cpu_option(tmp_path):
    """inputs_on_device=False draws get_inputs() on the CPU in both the runner and the reference worker."""
    with ek.Evaluator(GPU_REF, device="cuda", cache_dir=str(tmp_path), inputs_on_device=False,
                      prepare_bytes=0) as e:
        ok = e.evaluate(HONEST)
        wrong = e.evaluate(variant("        return self.conv(x).sum(dim=1, keepdim=True)"))
    assert ok.status == "ok", ok.message
    assert wrong.status == "incorrect", wrong.message


# Honest arithmetic, but on a side stream that the call does not wait for, after ~1.5 ms of spinning there.
SIDE_STREAM_BODY = """        if not hasattr(self, "side"):
            self.side = torch.cuda.Stream(device=x.device)
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(3_000_000)
            x_conv = self.conv(x)
            t = torch.tanh(self.group_norm(x_conv))
            out = torch.logsumexp(x_conv + t * (t + 3.0) / 6.0, dim=1, keepdim=True)
        return out"""


@pytest.mark.gpu
def test_gpu_work_left_on_another_stream_is_timed(gpu_ev, monkeypatch):
    """Behind the screen's stream rule (switched off here): work a call leaves on a side stream (~1.5 ms of
    spinning per call) is inside the batch the parent clocks, whether the harness's synchronise or the
    settle step waits for it; or the outputs read before it finished are wrong."""
    from evaluate_kernel import evaluator as eval_evaluator
    monkeypatch.setattr(eval_evaluator, "screen", lambda src: ek.ScreenVerdict("ok"))
    r = gpu_ev.evaluate(variant(SIDE_STREAM_BODY))
    timed = r.status == "ok" and r.runtime_ms > 0.9
    assert timed or r.status in ("incorrect", "rejected"), (r.status, r.message, r.runtime_ms)


@pytest.mark.gpu
def test_gpu_device_work_is_inside_the_window(gpu_ev):
    # Honest code that spins the GPU for ~1 ms: the event time must include it.
    body = "        torch.cuda._sleep(2_000_000)\n" + HONEST_BODY
    r = gpu_ev.evaluate(variant(body))
    assert r.status == "ok" and r.runtime_ms > 0.5, (r.status, r.message, r.runtime_ms)


@pytest.mark.gpu
def test_gpu_repeatability(gpu_ev, gpu_results):
    src = cuda_candidate("tail_ok", "out[idx]")
    meds, walls = [gpu_results["ok"].runtime_ms], []
    for _ in range(4):
        t0 = time.monotonic()
        r = gpu_ev.evaluate(src)
        walls.append(time.monotonic() - t0)
        assert r.status == "ok"
        # A repeat is never rebuilt; its wall time depends on the host's load and is bench_eval's to measure.
        assert r.details.get("build_cached"), r.details.get("phases")
        meds.append(r.runtime_ms)
    spread = (max(meds) - min(meds)) / min(meds)
    print("REPEAT medians_ms", [round(m, 5) for m in meds], "spread", round(spread, 4), "cached wall_s",
          [round(w, 2) for w in walls])
    # A ~0.1 ms kernel is launch- and sync-bound, so a busy host (builds of other candidates) shows up as
    # outliers; most medians must agree. scripts/bench_eval.py measures the full-size task (BENCHMARKS.md).
    close = sorted(meds)[len(meds) // 2] * 1.15
    assert sum(m <= close for m in meds) >= 3, spread


@pytest.mark.gpu
def test_gpu_multi_gpu_dispatch(tmp_path):
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    with ek.Evaluator(GPU_REF, device="cuda", gpus=[0, 1], cache_dir=str(tmp_path)) as e:
        with ThreadPoolExecutor(2) as pool:
            rs = list(pool.map(e.evaluate, [HONEST, HONEST + "\n# variant\n"]))
        assert all(r.status == "ok" for r in rs)
        assert {r.details["gpu"] for r in rs} == {0, 1}


# ------------------------------------------------------------------------------------------ runner start-up
def test_prepared_spare_starts_the_next_evaluation_at_once(ev):
    ev.evaluate(HONEST)
    time.sleep(4)  # the spare imports torch meanwhile (as during an LLM call)
    r = ev.evaluate(HONEST)
    phases = r.details["phases"]
    assert {"cpu_wait", "runner_start", "load", "trials", "compare", "timing"} <= set(phases)
    assert phases["runner_start"] < 0.5, phases  # a cold runner needs seconds to import torch
    assert r.details["build_cached"]


def test_spare_waits_for_the_device_lock_but_not_for_its_own_job(tmp_path):
    """A spare's warm-up takes the device's file lock (never overlapping someone's timing), yet a job that
    arrives while another process holds the lock (its sender holds it for the spare) runs at once."""
    import fcntl
    lock_path = str(tmp_path / "device.lock")
    holder = open(lock_path, "a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    env = ek.scrubbed_env(CUDA_VISIBLE_DEVICES="")
    waiting = eval_protocol.Worker(env, str(tmp_path / "a.log"), warm=True)
    jobbed = eval_protocol.Worker(env, str(tmp_path / "b.log"), warm=True)
    try:
        prep = {"role": "prep", "device": "cpu", "reference_src": REF, "allow_tf32": False, "cpu_threads": 1,
                "gpu_lock": lock_path}
        waiting.send(prep)
        jobbed.send(prep)
        jobbed.send({"role": "nothing"})  # any job line: the spare must stop waiting for the lock
        assert jobbed.recv(timeout=60)["kind"] == "ready"
        with pytest.raises(TimeoutError):
            waiting.recv(timeout=3.0)  # still blocked on the lock
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert waiting.recv(timeout=60)["kind"] == "ready"
    finally:
        holder.close()
        waiting.kill()
        jobbed.kill()


def test_line_reader_sees_lines_already_buffered():
    r_fd, w_fd = os.pipe()
    reader = eval_protocol.LineReader(r_fd)
    os.write(w_fd, b'{"a": 1}\n{"b": 2}\n')
    assert reader.wait(1.0)
    assert reader.readline() == {"a": 1}
    assert reader.wait(0.0)  # the second line came in the same read; select alone would miss it
    assert reader.readline() == {"b": 2}
    assert not reader.wait(0.05)
    os.close(w_fd)
    assert reader.readline() == {"cmd": "quit"}  # EOF
    os.close(r_fd)


def test_reference_outputs_beyond_the_memory_cap_are_computed_at_comparison(tmp_path):
    with ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path), max_pairs=4, prepare_bytes=0) as e:
        ok = e.evaluate(HONEST)
        wrong = e.evaluate(variant("        return self.conv(x).sum(dim=1, keepdim=True)"))
    assert ok.status == "ok", ok.message
    assert wrong.status == "incorrect", wrong.message


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already died
    except OSError:
        return False


def test_a_stopped_runner_dies_with_a_killed_evaluator(tmp_path):
    """The runner is stopped (SIGSTOP) while the reference is timed; if the evaluator is killed then, no
    process of its (the runner stopped, the spares, the reference worker, a namespace's launcher) may stay
    behind: they would hold memory and, on a GPU, a CUDA context."""
    import signal
    import subprocess
    import sys
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(ek.__file__).parent.parent)!r})
import evaluate_kernel as ek
ev = ek.Evaluator(open({str(HERE / 'reference_small.py')!r}).read(), device="cpu", cache_dir={str(tmp_path)!r})
runner = ev.devices[0].take_runner()
workers = [runner] + [w for d in ev.devices for w in d.spares] + [d.ref for d in ev.devices]
os.kill(runner.main_pid(), signal.SIGSTOP)
print(" ".join(w.mark for w in workers), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    marks = out.split()
    assert len(marks) >= 2, out   # the runner and the reference worker, and the spares where there are any
    deadline = time.monotonic() + 20
    while _marked(marks) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {pid: _describe_process(pid) for pid in _marked(marks)}
    assert not left, left


def _describe_process(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return f"state {state}: {cmd}"
    except OSError:
        return "gone"


def _marked(marks: list[str]) -> list[int]:
    """Live processes whose environment carries one of the marks."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry)):
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if any(m.encode() in env for m in marks):
                found.append(int(entry))
    return found


@pytest.mark.slow   # a minute: four Evaluators' start-ups and one C++ build on two cores
def test_evaluators_sharing_a_cache_build_a_source_once(tmp_path):
    """Four Evaluators on one cache directory at once, all given the same C++ candidate: one builds it, the
    others wait for the build's file lock and load it (its signed marker holds), and no build reads as
    tampered with (a second build of the same source had rewritten the first one's libraries)."""
    from concurrent.futures import ThreadPoolExecutor
    cache = str(tmp_path / "shared")
    evs = [ek.Evaluator(REF, device="cpu", cache_dir=cache, max_pairs=3, timing_s=0.5) for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda e: e.evaluate(HONEST_CPP), evs))
    finally:
        for e in evs:
            e.close()
    assert all(r.status == "ok" for r in results), [r.message for r in results]
    assert not any("tamper" in r.details.get("build_note", "") for r in results), [r.details.get("build_note") for r in results]
    if evs[0].isolation == "pid+mount+net namespace":   # markers are signed only there
        assert sum(bool(r.details.get("build_cached")) for r in results) == 3, [r.details.get("compile_s") for r in results]


_ONE_EVALUATION = """
import json, sys
import evaluate_kernel as ek
ref, cand = (open(p).read() for p in sys.argv[1:3])
cache = sys.argv[3]
with ek.Evaluator(ref, device="cpu", cache_dir=cache, max_pairs=3, timing_s=0.5) as ev:
    r = ev.evaluate(cand)
print(json.dumps({"status": r.status, "message": r.message, "cached": bool(r.details.get("build_cached")),
                  "note": r.details.get("build_note", ""), "isolation": ev.isolation}))
"""


@pytest.mark.slow   # two minutes: four processes' Evaluators and two C++ builds on two cores
def test_processes_sharing_a_cache_build_each_source_once(tmp_path):
    """Four processes, each with its own Evaluator on one cache directory, at once: three given one C++
    candidate, one given another. The file lock beside a build serves processes as it serves threads:
    each source is built once, the others load it, and nothing reads as tampered with."""
    import subprocess
    import sys
    other = HONEST_CPP + "\n# another source, the same extension\n"
    files = {}
    for name, text in (("ref.py", REF), ("same.py", HONEST_CPP), ("other.py", other)):
        files[name] = tmp_path / name
        files[name].write_text(text)
    cache = str(tmp_path / "shared")
    root = str(HERE.parent.parent) if (HERE.parent.parent / "evaluate_kernel").is_dir() else str(HERE.parent)
    env = dict(os.environ, PYTHONPATH=root)
    procs = [subprocess.Popen([sys.executable, "-c", _ONE_EVALUATION, str(files["ref.py"]), str(files[cand]), cache],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cand in ("same.py", "same.py", "same.py", "other.py")]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["status"] == "ok" for o in outs), outs
    assert not any("tamper" in o["note"] for o in outs), outs
    if outs[0]["isolation"] == "pid+mount+net namespace":   # markers are signed only there
        assert [o["cached"] for o in outs[:3]].count(False) == 1, outs   # one of the three built it
        assert outs[3]["cached"] is False, outs                         # the other source was built anew
