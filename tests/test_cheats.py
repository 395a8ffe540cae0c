"""Red-team tests for evaluate_kernel: cheating candidates must not score, honest ones must.

Every file in tests/cheats/ is a complete KernelBench answer (defines `ModelNew`) that cheats in one known
way (tests/cheats/README.md has the catalogue). Its module docstring carries machine-readable lines:

    REFERENCE: gn | softmax | relu | matmul | bias_reduce | loop_softmax | gn_cuda | inf_relu | two_gn | reduce_dims |
               flatten | transpose
    EXPECT:    a |-separated set of statuses, or "honest-timing", "no-profit" or "no-leak"
    TWIN:      for "no-profit": the honest file in tests/honest/ computing the same thing without the trick
    RULE:      keywords (|-separated, any one) the message must contain when the status is "rejected"
    MESSAGE:   keywords the message must contain for any failing status
    FORGED:    a number the candidate tries to forge; it must not appear as runtime or speedup
    HONEST_FRACTION: overrides HONEST_FRACTION for an honest-timing cheat that fakes only a small factor
    NAIVE:     "correct" and/or "fast": what the cheat achieves against a naive KernelBench-v0.1-style harness
               (cheats/_naive_harness.py), proving the cheat works and the evaluator is what stops it

"no-profit" means the cheat gains nothing over its honest twin, measured beside it in the same Evaluator
(or fails): its speedup is at most the twin's times 1 + PROFIT_TOLERANCE (the run-to-run noise of a
speedup on the device), or its 95% interval reaches down into the twin's; an apparent gain is measured
twice more, each a fresh evaluation of both, and judged on the medians of three. "honest-timing" means neutralised: "rejected" or "incorrect", or "ok" with a runtime no better than a
fraction of the honest computation's cost (the reference itself, which the cheat secretly performs: our own
measurement or the evaluator's baseline, whichever is smaller). Files in tests/honest/ must come back "ok". Files ending in _cuda.py are GPU-only.

One Evaluator per reference (module-scoped) keeps the suite fast; the env-leak candidates get a fresh
interpreter started with a canary "API key" in its initial environment, as run.py would have.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import tasks

HERE = Path(__file__).resolve().parent
CHEATS = HERE / "cheats"
HONEST = HERE / "honest"
REPO = HERE.parent
CANARY = "sk-pacevolve-canary-5d1e"
FORGED_RUNTIME_MS = 0.0001
# An honest-timing cheat "wins" if it looks this much faster than the work it secretly does.
HONEST_FRACTION = 0.3
# A no-profit cheat "wins" if it reads this much faster than its twin (the speedup's noise on the device:
# on a 2-core VM evaluations of one candidate spread by about 3% (sd), 0.998-1.125x over twenty; a GPU by
# well under 1%).
PROFIT_TOLERANCE = {"cpu": 0.15, "cuda": 0.03}

# ---------------------------------------------------------------------------------------------------------
# References (KernelBench format), small enough for a 2-core CPU.

GN_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level2 #92: Conv2d -> GroupNorm -> Tanh -> HardSwish -> residual add -> LogSumExp."""

    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self.tanh = nn.Tanh()
        self.hard_swish = nn.Hardswish()

    def forward(self, x):
        x_conv = self.conv(x)
        x_norm = self.group_norm(x_conv)
        x_tanh = self.tanh(x_norm)
        x_hard_swish = self.hard_swish(x_tanh)
        x_res = x_conv + x_hard_swish
        return torch.logsumexp(x_res, dim=1, keepdim=True)


batch_size = BATCH
in_channels = IN_CH
out_channels = OUT_CH
height, width = SIZE, SIZE
kernel_size = 3
groups = GROUPS


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
'''

SOFTMAX_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over a wide row: every output is ~3e-5, under an absolute 1e-4 tolerance."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 8
dim = 32768


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''

RELU_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU: the identity on torch.rand inputs."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(16, 4096)]


def get_init_inputs():
    return []
'''

MATMUL_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Matmul with a large K (like level1 #6): long all-positive sums hide reduced precision."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


M = N = 64
K = 65536


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, N)]


def get_init_inputs():
    return []
'''

BIAS_REDUCE_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Bias-dominated reduction (like level2 #8): on i.i.d. inputs every sample gives nearly the same value."""

    def __init__(self, channels, divisor):
        super().__init__()
        self.divisor = divisor
        self.bias = nn.Parameter(torch.randn(channels, 1, 1))

    def forward(self, x):
        x = x.mean(dim=(2, 3), keepdim=True) / self.divisor + self.bias
        return x.sum(dim=1).flatten()


def get_inputs():
    return [torch.rand(8, 16, 64, 64)]


def get_init_inputs():
    return [16, 3000.0]
'''

LOOP_SOFTMAX_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A deliberately slow reference (one softmax per row in Python) that an honest kernel beats ~10x."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.stack([torch.softmax(row, dim=0) for row in x])


def get_inputs():
    return [torch.rand(512, 256)]


def get_init_inputs():
    return []
'''


BMM_INSTNORM_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level2 #28: Linear, InstanceNorm2d over the features (no affine parameters), + y, * y."""

    def __init__(self, in_features, out_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.bmm = nn.Linear(in_features, out_features)
        self.instance_norm = nn.InstanceNorm2d(out_features, eps=eps, momentum=momentum)

    def forward(self, x, y):
        x = self.bmm(x)
        x = self.instance_norm(x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
        x = x + y
        x = x * y
        return x


def get_inputs():
    return [torch.randn(128, 64), torch.randn(128, 128)]


def get_init_inputs():
    return [64, 128]
'''


INF_RELU_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU with the first column of every row set to +inf: RMS(ref) and ||ref|| are infinite."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.relu(x)
        y[:, 0] = float("inf")
        return y


def get_inputs():
    return [torch.rand(16, 4096)]


def get_init_inputs():
    return []
'''


def _gn(batch: int, in_ch: int, out_ch: int, size: int, groups: int) -> str:
    return (GN_SRC.replace("BATCH", str(batch)).replace("IN_CH", str(in_ch)).replace("OUT_CH", str(out_ch))
            .replace("SIZE", str(size)).replace("GROUPS", str(groups)))


LAYERNORM_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over (C, H, W), as KernelBench level1 #40: its weight and bias are 3-D, ones and zeros
    under every seed."""

    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(4, 8, 16, 16)]


def get_init_inputs():
    return [(8, 16, 16)]
'''


TWO_GN_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d -> GroupNorm -> ReLU -> GroupNorm: two norms of one shape, built alike."""

    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.gn1 = nn.GroupNorm(groups, out_channels)
        self.gn2 = nn.GroupNorm(groups, out_channels)

    def forward(self, x):
        return self.gn2(torch.relu(self.gn1(self.conv(x))))


def get_inputs():
    return [torch.randn(8, 3, 24, 24)]


def get_init_inputs():
    return [3, 16, 3, 4]
'''


FLATTEN_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A flatten and a softmax: the first output is a view of the input."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.flatten(x, 1), torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 8, 64)]


def get_init_inputs():
    return []
'''


TRANSPOSE_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A softmax returned as a transposed view, as attention blocks return theirs."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1).transpose(1, 2)


def get_inputs():
    return [torch.randn(8, 64, 128)]


def get_init_inputs():
    return []
'''


REDUCE_DIMS_SRC = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A sum over dimensions passed to forward as a tuple."""

    def __init__(self):
        super().__init__()

    def forward(self, x, dims):
        return x.sum(dim=dims)


def get_inputs():
    return [torch.randn(16, 64, 128), (1, 2)]


def get_init_inputs():
    return []
'''

REFERENCES = {
    "gn": _gn(8, 3, 16, 32, 8),                    # level2 #92 at KernelBench v0 sizes, batch 8
    "gn_cuda": _gn(32, 8, 64, 128, 16),            # a quarter of the v0.1 batch, for the GPU tests
    "softmax": SOFTMAX_SRC,
    "softmax_v0": tasks.get("softmax@v0").reference_src,   # 16 x 16,384, torch.randn
    "relu": RELU_SRC,
    "matmul": MATMUL_SRC,
    "bias_reduce": BIAS_REDUCE_SRC,
    "loop_softmax": LOOP_SOFTMAX_SRC,
    "inf_relu": INF_RELU_SRC,
    "bmm_instnorm": BMM_INSTNORM_SRC,
    "two_gn": TWO_GN_SRC,
    "flatten": FLATTEN_SRC,
    "transpose": TRANSPOSE_SRC,
    "reduce_dims": REDUCE_DIMS_SRC,
    "layernorm": LAYERNORM_SRC,
}


# ---------------------------------------------------------------------------------------------------------
# Candidate files and their docstring contract.

@dataclass(frozen=True)
class Spec:
    path: Path
    reference: str
    expect: frozenset[str]
    rules: tuple[str, ...] = ()
    message: tuple[str, ...] = ()
    forged: float | None = None
    devices: tuple[str, ...] = ("cpu",)
    naive: tuple[str, ...] = ()
    honest_fraction: float = 0.3
    twin: str | None = None

    @property
    def source(self) -> str:
        return self.path.read_text()


def _field(doc: str, key: str) -> str | None:
    for line in doc.splitlines():
        if line.strip().startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None


def _alternatives(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split("|") if v.strip()) if value else ()


def load_spec(path: Path) -> Spec:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    forged = _field(doc, "FORGED")
    devices = _field(doc, "DEVICES")
    cuda_file = path.name.endswith("_cuda.py")
    return Spec(
        path=path,
        reference=_field(doc, "REFERENCE") or "",
        expect=frozenset(_alternatives(_field(doc, "EXPECT"))),
        rules=_alternatives(_field(doc, "RULE")),
        message=_alternatives(_field(doc, "MESSAGE")),
        forged=float(forged) if forged else None,
        devices=tuple(devices.split()) if devices else (("cuda",) if cuda_file else ("cpu",)),
        naive=tuple((_field(doc, "NAIVE") or "").split()),
        honest_fraction=float(_field(doc, "HONEST_FRACTION") or HONEST_FRACTION),
        twin=_field(doc, "TWIN"),
    )


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


CHEAT_SPECS = [load_spec(p) for p in _files(CHEATS)]
HONEST_SPECS = [load_spec(p) for p in _files(HONEST)]
STATUSES = {"ok", "invalid", "compile_error", "runtime_error", "incorrect", "timeout", "rejected"}


def _params(specs, device, pred=lambda s: True):
    return [pytest.param(s, id=s.path.stem) for s in specs if device in s.devices and pred(s)]


# ---------------------------------------------------------------------------------------------------------
# Fixtures: one shared Evaluator per reference and device, our own honest timings.

def _evaluate_kernel():
    return pytest.importorskip("evaluate_kernel", reason="evaluate_kernel.py is not importable yet")


class _Pool:
    """Lazily builds one Evaluator per reference for a device, closes them all at the end."""

    def __init__(self, device: str, cache_dir: Path):
        self.device, self.cache_dir, self._evaluators = device, cache_dir, {}

    def __call__(self, reference: str):
        if reference not in self._evaluators:
            ek = _evaluate_kernel()
            # A shorter run timeout than the default keeps a hung cheat from stalling the suite for minutes.
            # Fewer pairs than a search's default: each verdict takes about a second of timing, and a twin
            # comparison needs only the noise PROFIT_TOLERANCE allows.
            # On a GPU, a small batch budget: each Evaluator's runners hold device memory of twice the
            # budget (4 GiB by default on an 80 GB card), and this module keeps about ten Evaluators open,
            # which ran an H100 out of memory; these references need a few MiB a call. ReLU's keeps the
            # default: padded_output_view's outputs take ten times the reference's memory, and its batches
            # fit its region only with a quarter of the calls, which the default budget leaves long enough.
            small = self.device == "cuda" and reference != "relu"
            self._evaluators[reference] = ek.Evaluator(
                REFERENCES[reference], device=self.device, cache_dir=str(self.cache_dir), run_timeout_s=45,
                max_pairs=12, timing_s=2.0, **({"batch_bytes": 512 << 20} if small else {}))
        return self._evaluators[reference]

    def close(self) -> None:
        for ev in self._evaluators.values():
            ev.close()


@pytest.fixture(scope="module")
def cpu_evaluators(tmp_path_factory):
    pool = _Pool("cpu", tmp_path_factory.mktemp("ek_cache_cpu"))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def gpu_evaluators(tmp_path_factory):
    pool = _Pool("cuda", tmp_path_factory.mktemp("ek_cache_gpu"))
    yield pool
    pool.close()


def _namespace(src: str) -> dict:
    ns: dict = {}
    exec(compile(src, "<reference>", "exec"), ns)
    return ns


def measure_reference_ms(reference: str, device: str, calls: int = 25) -> float:
    """Fastest call of the reference's forward on fresh inputs: a lower bound on what the same work costs.

    The minimum, not the median, because this machine is shared: load only ever makes a call slower. One
    CPU thread: with two, a busy neighbour stalls every parallel region and the "honest" time balloons.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _min_call_ms(reference, device, calls)
    finally:
        torch.set_num_threads(threads)


def _min_call_ms(reference: str, device: str, calls: int) -> float:
    ns = _namespace(REFERENCES[reference])
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).to(device)
    input_sets = [[t.to(device) for t in ns["get_inputs"]()] for _ in range(4)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = []
    with torch.no_grad():
        for i in range(calls + 3):
            inputs = input_sets[i % len(input_sets)]
            sync()
            t0 = time.perf_counter()
            model(*inputs)
            sync()
            samples.append((time.perf_counter() - t0) * 1e3)
    return min(samples[3:])


@pytest.fixture(scope="module")
def honest_ms():
    cache: dict = {}

    def get(reference: str, device: str) -> float:
        if (reference, device) not in cache:
            cache[(reference, device)] = measure_reference_ms(reference, device)
        return cache[(reference, device)]

    return get


# ---------------------------------------------------------------------------------------------------------
# Checking one outcome.

def _describe(result) -> str:
    return (f"status={result.status!r} correct={result.correct} runtime_ms={result.runtime_ms} "
            f"speedup={result.speedup} message={result.message[:400]!r}")


def _contains_any(text: str, keywords: tuple[str, ...]) -> bool:
    return any(k.lower() in text.lower() for k in keywords)


def _gains(result, twin, device: str) -> bool:
    """A gain: a speedup beyond the tolerance whose interval also clears the twin's (a loaded machine moves
    single figures by more than a real 15% gain, rarely both intervals apart)."""
    limit = twin.speedup * (1 + PROFIT_TOLERANCE[device])
    (c_low, _), (_, t_high) = result.details["speedup_ci"], twin.details["speedup_ci"]
    print(f"  twin {twin.speedup:.4f}x (up to {t_high:.4f}), cheat {result.speedup:.4f}x (from {c_low:.4f}); "
          f"limit {limit:.4f}x")
    return result.speedup > limit and c_low > t_high


def check_cheat(spec: Spec, result, honest: float | None, twin=None, device: str = "cpu", again=None) -> None:
    """again: () -> (the cheat's result, the twin's), each from a fresh evaluation; called when the first
    pair reads as a gain."""
    info = f"{spec.path.name}: {_describe(result)}"
    print(f"\nOBSERVED {spec.path.name}: {result.status} (runtime_ms={result.runtime_ms}): {result.message[:110]}")
    assert result.status in STATUSES, info
    if "no-profit" in spec.expect:
        if result.status == "ok":
            assert twin is not None and twin.status == "ok", f"{info}\n  twin: {twin and _describe(twin)}"
            if _gains(result, twin, device):
                if again is None:
                    raise AssertionError(f"{info}\n  the cheat gains over its twin ({twin.speedup:.4f}x)")
                # A speedup's interval covers the noise within one evaluation, not the spread between
                # evaluations (about 3% sd on a 2-core VM, part of it the runner process's own speed): one
                # lucky process read 15% over its twin. A real gain shows in the medians of three
                # evaluations of each, every one in a fresh process.
                cheats, twins = [result.speedup], [twin.speedup]
                for _ in range(2):
                    c, t = again()
                    assert t.status == "ok", f"{info}\n  twin: {_describe(t)}"
                    cheats.append(c.speedup if c.status == "ok" else 0.0)
                    twins.append(t.speedup)
                c_med, t_med = sorted(cheats)[1], sorted(twins)[1]
                print(f"  again: cheat {cheats}, twin {twins}")
                assert c_med <= t_med * (1 + PROFIT_TOLERANCE[device]), \
                    f"{info}\n  the cheat gains over its twin: medians {c_med:.4f}x and {t_med:.4f}x of three"
        else:
            assert result.status in {"rejected", "incorrect", "runtime_error"}, info
    elif "honest-timing" in spec.expect:
        if result.status == "ok":
            assert result.runtime_ms is not None and honest is not None, info
            # The cheat secretly does the reference's work, so the evaluator's own baseline is an honest
            # measurement of it too; the smaller of the two keeps noise on this shared machine from
            # flagging an honestly timed cheat (real wins are 10-1000x, far below the line).
            if result.baseline_ms:
                honest = min(honest, result.baseline_ms)
            assert result.runtime_ms >= spec.honest_fraction * honest, (
                f"{info}\n  cheat timed at {result.runtime_ms:.4f} ms, honest work costs ~{honest:.4f} ms")
        else:
            assert result.status in {"rejected", "incorrect"} | (spec.expect & STATUSES), info
    else:
        assert result.status in spec.expect, info
    if result.status != "ok":
        assert result.correct is False, info
    if result.status == "rejected" and spec.rules:
        assert _contains_any(result.message, spec.rules), f"{info}\n  message should name the rule {spec.rules}"
    if result.status != "ok" and spec.message:
        assert _contains_any(result.message, spec.message), f"{info}\n  message should mention {spec.message}"
    if spec.forged is not None:
        assert result.speedup is None or abs(result.speedup - spec.forged) > 1e-6, info
        assert result.runtime_ms is None or abs(result.runtime_ms - FORGED_RUNTIME_MS) > 1e-9, info


# Files some cheats write into the cwd or /tmp; removed afterwards if the test created them.
_FORGE_NAMES = ["result.json", "results.json", "eval_result.json", "output.json", "score.json"]


@pytest.fixture
def forged_files_cleanup():
    places = [Path(d) / n for d in (os.getcwd(), "/tmp", str(REPO)) for n in _FORGE_NAMES]
    before = {p for p in places if p.exists()}
    yield places
    for p in places:
        if p.exists() and p not in before:
            p.unlink()


# ---------------------------------------------------------------------------------------------------------
# Tests: the profit judgement itself, on made-up results (no evaluator needed).

def _fake(speedup: float, half_width: float = 0.015, status: str = "ok"):
    from types import SimpleNamespace
    return SimpleNamespace(status=status, correct=status == "ok", runtime_ms=1.0 / speedup if speedup else None,
                           baseline_ms=1.0, speedup=speedup, message=status,
                           details={"speedup_ci": [speedup * (1 - half_width), speedup * (1 + half_width)]})


def test_a_lucky_process_is_measured_again_and_a_real_gain_stays_a_gain():
    spec = Spec(path=CHEATS / "raise_priority.py", reference="gn", expect=frozenset({"no-profit"}), twin="gn_twin.py")
    lucky = iter([(_fake(1.00), _fake(0.99)), (_fake(0.97), _fake(1.01))])
    check_cheat(spec, _fake(1.10), None, _fake(0.956), "cpu", again=lambda: next(lucky))   # the CI failure's figures
    steady = iter([(_fake(1.30), _fake(1.00)), (_fake(1.28), _fake(0.98))])
    with pytest.raises(AssertionError, match="medians"):
        check_cheat(spec, _fake(1.31), None, _fake(0.99), "cpu", again=lambda: next(steady))
    with pytest.raises(AssertionError, match="gains over its twin"):
        check_cheat(spec, _fake(1.31), None, _fake(0.99), "cpu")
    rejected_later = iter([(_fake(0.0, status="rejected"), _fake(1.0)), (_fake(1.02), _fake(1.0))])
    check_cheat(spec, _fake(1.31), None, _fake(0.99), "cpu", again=lambda: next(rejected_later))
    check_cheat(spec, _fake(1.31), None, _fake(1.20), "cpu", again=lambda: pytest.fail("no gain: not measured again"))


# ---------------------------------------------------------------------------------------------------------
# Tests: the contract of the candidate files themselves (no evaluator needed).

@pytest.mark.parametrize("spec", [pytest.param(s, id=s.path.stem) for s in CHEAT_SPECS + HONEST_SPECS])
def test_candidate_file_is_well_formed(spec: Spec):
    tree = ast.parse(spec.source)
    doc = ast.get_docstring(tree)
    assert doc and len(doc.splitlines()) >= 4, "each candidate explains itself in its module docstring"
    assert spec.reference in REFERENCES, f"unknown REFERENCE {spec.reference!r}"
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    known = STATUSES | {"honest-timing", "no-profit", "no-leak"}
    assert spec.expect and spec.expect <= known, spec.expect
    if "no-profit" in spec.expect:
        assert spec.twin and (HONEST / spec.twin).is_file(), f"a no-profit cheat names its twin: {spec.twin!r}"
    if spec.path.parent == HONEST:
        assert spec.expect == {"ok"}
    else:
        assert "ok" not in spec.expect
        assert "Seen" in doc and "Expected outcome" in doc and "How it cheats" in doc


# ---------------------------------------------------------------------------------------------------------
# Tests: the cheats really cheat (a naive same-process harness is fooled), so a catch is the evaluator's doing.

NAIVE_FAST_FRACTION = 0.3


@pytest.fixture(scope="module")
def naive_results():
    paths = [str(s.path) for s in CHEAT_SPECS if s.naive and "cpu" in s.devices]
    proc = subprocess.run([sys.executable, str(CHEATS / "_naive_harness.py"), *paths], capture_output=True,
                          text=True, timeout=300, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            results[d["file"]] = d
    return results, proc.stderr[-2000:]


def _again(evaluator, spec: Spec):
    """The cheat and its twin evaluated once more, the twin first."""
    if not spec.twin:
        return None
    twin_src = (HONEST / spec.twin).read_text()

    def both():
        twin = evaluator.evaluate(twin_src)
        return evaluator.evaluate(spec.source), twin

    return both


@pytest.mark.parametrize("spec", _params(CHEAT_SPECS, "cpu", lambda s: bool(s.naive)))
def test_cheat_fools_a_naive_harness(spec: Spec, naive_results):
    results, stderr = naive_results
    r = results.get(spec.path.name)
    assert r is not None and "error" not in r, f"{spec.path.name}: {r}\n{stderr}"
    if "correct" in spec.naive:
        assert r["correct"], f"{spec.path.name} does not even pass a naive allclose(1e-2) check: {r}"
    if "fast" in spec.naive:
        assert r["new_ms"] < NAIVE_FAST_FRACTION * r["ref_ms"], f"{spec.path.name} does not look fast: {r}"


# ---------------------------------------------------------------------------------------------------------
# Tests: CPU (CI).

@pytest.fixture(scope="module")
def twins():
    """The twin's result, evaluated once per (device, reference, file) in the cheat's own Evaluator."""
    cache: dict = {}

    def get(evaluator, device: str, reference: str, name: str):
        key = (device, reference, name)
        if key not in cache:
            cache[key] = evaluator.evaluate((HONEST / name).read_text())
        return cache[key]

    return get


@pytest.mark.parametrize("spec", _params(CHEAT_SPECS, "cpu", lambda s: "no-leak" not in s.expect))
def test_cheat_is_caught_cpu(spec: Spec, cpu_evaluators, honest_ms, twins, forged_files_cleanup):
    evaluator = cpu_evaluators(spec.reference)
    result = evaluator.evaluate(spec.source)
    honest = honest_ms(spec.reference, "cpu") if "honest-timing" in spec.expect else None
    twin = twins(evaluator, "cpu", spec.reference, spec.twin) if spec.twin else None
    check_cheat(spec, result, honest, twin, "cpu", again=_again(evaluator, spec))
    for p in forged_files_cleanup:
        if p.exists():
            assert "4242" not in p.read_text(errors="replace") or p.parent != REPO, \
                f"a candidate wrote a forged result into the repository: {p}"


def _slow_builds(params: list) -> list:
    """Honest C++ candidates build an extension on the CPU (30-40 s each on 2 cores): `slow`."""
    return [pytest.param(*p.values, id=p.id, marks=pytest.mark.slow) if "load_inline" in p.values[0].source
            else p for p in params]


@pytest.mark.parametrize("spec", _slow_builds(_params(HONEST_SPECS, "cpu")))
def test_honest_candidate_passes_cpu(spec: Spec, cpu_evaluators):
    result = cpu_evaluators(spec.reference).evaluate(spec.source)
    assert result.status == "ok", f"{spec.path.name} wrongly failed: {_describe(result)}"
    assert result.correct is True
    assert result.runtime_ms is not None and result.runtime_ms > 0
    assert result.speedup is not None and result.speedup > 0


LAYERNORM_CHANNELS_LAST = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """A LayerNorm over (C, H, W) working on a channels-last view, its weight and bias kept as (H, W, C)."""

    def __init__(self, normalized_shape):
        super().__init__()
        c, h, w = normalized_shape
        self.gamma = nn.Parameter(torch.ones(h, w, c))
        self.beta = nn.Parameter(torch.zeros(h, w, c))

    def forward(self, x):
        y = x.permute(0, 2, 3, 1)
        mean = y.mean(dim=(1, 2, 3), keepdim=True)
        var = y.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
        return ((y - mean) * torch.rsqrt(var + 1e-5) * self.gamma + self.beta).permute(0, 3, 1, 2)
'''


def test_a_parameter_kept_in_another_layout_is_named_in_the_message(cpu_evaluators):
    """Not supported, and said so: the trial perturbs a LayerNorm's 3-D ones element by element, and a
    counterpart held permuted (channels-last) takes the deltas in its own order, which its values (ones)
    cannot tell from a reshape. The message names the parameter and the layout rule."""
    result = cpu_evaluators("layernorm").evaluate(LAYERNORM_CHANNELS_LAST)
    assert result.status == "incorrect", _describe(result)
    assert "ModelNew's gamma (16, 16, 8) for the reference's ln.weight (8, 16, 16)" in result.message
    assert "another layout (permuted, channels-last) is not supported" in result.message


def test_honest_fast_kernel_is_really_faster(cpu_evaluators):
    """A legitimately much faster kernel must be reported faster (flagged at most), not clamped or rejected.

    It reads 3.0-3.5x on the 2-core machine, with the session-12 code and with this one alike (2.7x once
    while the suite ran)."""
    spec = load_spec(HONEST / "fast_vs_loop.py")
    result = cpu_evaluators(spec.reference).evaluate(spec.source)
    assert result.status == "ok", _describe(result)
    assert result.speedup > 2.0, _describe(result)


_LEAK_RUNNER = r"""
import json, sys
import evaluate_kernel
ref, cand = open(sys.argv[1]).read(), open(sys.argv[2]).read()
result = evaluate_kernel.evaluate(ref, cand, device="cpu", cache_dir=sys.argv[3])
print("RESULT-JSON " + result.to_json())
"""


@pytest.mark.parametrize("spec", _params(CHEAT_SPECS, "cpu", lambda s: "no-leak" in s.expect))
def test_candidate_cannot_see_api_keys(spec: Spec, tmp_path):
    """The evaluator runs in a fresh interpreter whose *initial* environment holds canary keys (like run.py)."""
    _evaluate_kernel()
    ref = tmp_path / "reference.py"
    ref.write_text(REFERENCES[spec.reference])
    env = dict(os.environ, OPENAI_API_KEY=CANARY, GEMINI_API_KEY=CANARY, ANTHROPIC_API_KEY=CANARY,
               HF_TOKEN=CANARY, PACEVOLVE_SERVICE_API_KEY=CANARY, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _LEAK_RUNNER, str(ref), str(spec.path), str(tmp_path / "cache")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT-JSON ")]
    assert lines, f"runner failed: rc={proc.returncode}\n{proc.stderr[-2000:]}"
    result = json.loads(lines[-1][len("RESULT-JSON "):])
    dump = json.dumps(result)
    assert "LEAKED" not in dump, f"{spec.path.name}: the candidate saw a key: {result['message'][:300]}"
    assert CANARY not in dump
    assert result["status"] in {"ok", "rejected"}, f"{spec.path.name}: {result['status']}: {result['message'][:300]}"
    print(f"{spec.path.name}: {result['status']}: {result['message'][:200]}")


# ---------------------------------------------------------------------------------------------------------
# Tests: GPU (marked; skipped without CUDA; scripts/gpu_suite.sh runs them on a GPU machine).

@pytest.mark.gpu
@pytest.mark.parametrize("spec", _params(CHEAT_SPECS, "cuda"))
def test_cheat_is_caught_gpu(spec: Spec, gpu_evaluators, honest_ms, twins):
    evaluator = gpu_evaluators(spec.reference)
    result = evaluator.evaluate(spec.source)
    honest = honest_ms(spec.reference, "cuda") if "honest-timing" in spec.expect else None
    twin = twins(evaluator, "cuda", spec.reference, spec.twin) if spec.twin else None
    check_cheat(spec, result, honest, twin, "cuda", again=_again(evaluator, spec))


@pytest.mark.gpu
@pytest.mark.parametrize("spec", _params(HONEST_SPECS, "cuda"))
def test_honest_candidate_passes_gpu(spec: Spec, gpu_evaluators):
    result = gpu_evaluators(spec.reference).evaluate(spec.source)
    assert result.status == "ok", f"{spec.path.name} wrongly failed on GPU: {_describe(result)}"
    assert result.correct is True and result.runtime_ms and result.runtime_ms > 0
