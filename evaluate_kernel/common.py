"""What both sides of the evaluator need: the result type, the options, the comparison and small helpers.

A leaf: imports nothing of the evaluator's own. The parent (evaluate_kernel.py, eval_device.py) and the
workers (eval_worker.py) both import it; torch is imported lazily, inside the functions that need it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "invalid", "compile_error", "runtime_error", "incorrect", "timeout", "rejected")

# ======================================================================================================
# Result type
# ======================================================================================================


@dataclass
class EvalResult:
    status: str
    correct: bool = False
    runtime_ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None  # baseline_ms / runtime_ms
    message: str = ""  # feedback for the LLM (short, specific)
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


def scrubbed_env(**extra: str) -> dict[str, str]:
    """The parent's environment minus anything that looks like a credential."""
    env = {k: v for k, v in os.environ.items() if not _SECRET_ENV.search(k)}
    env.update({"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"})
    env.update(extra)
    return env
def source_hash(src: str) -> str:
    return hashlib.sha256(src.encode()).hexdigest()

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None

def _flat(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]

def _int_view(t):
    import torch
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]

def compare_outputs(outs: list, refs: list, rtol: float, atol: float, l2_tol: float) -> dict:
    """Elementwise |out-ref| <= rtol*|ref| + atol*RMS(ref) and ||out-ref||/||ref|| <= l2_tol, per output.

    The absolute term scales with the output's RMS: honest kernels with another summation order differ
    most where outputs are near zero, while degenerate outputs (zeros for a softmax) fail the relative-L2
    bound regardless of how small the outputs are. Non-finite reference values are handled explicitly, so
    no check can skip itself: the output must have inf/nan at exactly the same places (infinities with
    the same sign), and both bounds are applied to the finite part (an infinite RMS would accept anything).
    """
    import torch
    if len(outs) != len(refs):
        return {"ok": False, "reason": f"{len(outs)} outputs, expected {len(refs)}"}
    worst: dict = {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "rel_l2": 0.0}
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, torch.Tensor) or type(o) is not torch.Tensor:
            return {"ok": False, "reason": f"output {i} is not a tensor"}
        if tuple(o.shape) != tuple(r.shape):
            return {"ok": False, "reason": f"output {i} has shape {tuple(o.shape)}, expected {tuple(r.shape)}"}
        if o.dtype != r.dtype:
            return {"ok": False, "reason": f"output {i} has dtype {o.dtype}, expected {r.dtype}"}
        o = o.to(r.device)
        if o.numel() == 0:
            continue
        of, rf = o.double(), r.double()
        finite = torch.isfinite(rf)
        same_special = (torch.isnan(of) == torch.isnan(rf)) & ((of == rf) | finite | torch.isnan(rf))
        bad_mask = ~same_special | (finite & ~torch.isfinite(of))
        if bool(bad_mask.any()):
            j = int(bad_mask.reshape(-1).nonzero()[0])
            idx = [int(v) for v in torch.unravel_index(torch.tensor(j), o.shape)] if o.dim() else []
            return {"ok": False, "reason": f"output {i} has non-finite values where the reference has none, or "
                    f"not the reference's inf/nan (first at index {idx}: got {of.reshape(-1)[j].item():.6g}, "
                    f"expected {rf.reshape(-1)[j].item():.6g})"}
        if not bool(finite.any()):
            continue  # every value is inf/nan and matched exactly above
        of, rf = torch.where(finite, of, 0.0), torch.where(finite, rf, 0.0)
        diff = (of - rf).abs()
        rms = (rf.pow(2).sum() / finite.sum()).sqrt().item()
        bound = rtol * rf.abs() + atol * rms
        ref_norm = rf.norm().item()
        rel_l2 = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
        excess = diff - bound
        j = int(excess.argmax())
        idx = list(torch.unravel_index(torch.tensor(j), o.shape)) if o.dim() else []
        worst["max_abs_err"] = max(worst["max_abs_err"], diff.max().item())
        worst["max_rel_err"] = max(worst["max_rel_err"], (diff / rf.abs().clamp_min(1e-12)).max().item())
        worst["rel_l2"] = max(worst["rel_l2"], rel_l2)
        elem_ok, l2_ok = excess.view(-1)[j].item() <= 0, rel_l2 <= l2_tol
        if not (elem_ok and l2_ok) and worst["ok"]:
            why = [] if elem_ok else ["elementwise bound rtol*|ref|+atol*RMS(ref) exceeded"]
            why += [] if l2_ok else [f"relative L2 error {rel_l2:.3g} > {l2_tol:.3g}"]
            worst.update(ok=False, reason=f"output {i}: " + "; ".join(why) +
                         f"; worst at index {[int(v) for v in idx]}: got {of.view(-1)[j].item():.6g}, "
                         f"expected {rf.view(-1)[j].item():.6g} (abs err {diff.view(-1)[j].item():.3g}, "
                         f"RMS(ref) {rms:.3g})")
    return worst


def call_seed(seed: int, i: int) -> int:
    """The input seed of timed call i in a batch whose seed the parent sent when the batch started."""
    return int(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def output_digest(outs: list, weights: dict | None = None):
    """A 64-bit commitment to the exact bits of a call's outputs, as a 0-d int64 tensor on their device.

    Sum over elements of bits * w (w odd, from the element's index), in int64, per output, mixed across
    outputs: one pass over the output on its device, no copy to the host, exact on any device. The runner
    sends the digests of all calls before the parent says which outputs to ship; the reference worker
    recomputes the digest of what was shipped, so an output shipped later must be bit-identical to the one
    that existed when its digest was sent. `weights` caches w per (size, device).
    """
    import torch
    weights = {} if weights is None else weights
    total = None
    for k, o in enumerate(outs):
        bits = _bits(o.detach().contiguous().reshape(-1))
        key = (bits.numel(), str(bits.device))
        if key not in weights:
            idx = torch.arange(bits.numel(), dtype=torch.int64, device=bits.device)
            weights[key] = ((idx * 0x1E3779B97F4A7C15 + 0x232BE59BD9B4E019) >> 17) | 1
        d = (bits.to(torch.int64) * weights[key]).sum() * (2 * k + 3)
        total = d if total is None else total + d
    return total if total is not None else torch.zeros((), dtype=torch.int64)


def _bits(flat):
    import torch
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    size = flat.element_size()
    if size == 8:
        return flat.view(torch.int64)
    return flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[size])


# Upper bounds of what the hardware can do (a runtime below them is physically impossible).
_PEAKS = {"H100": (3.9e12, 1.0e15), "H200": (5.2e12, 1.0e15), "A100": (2.1e12, 3.2e14), "B200": (8.5e12, 2.5e15)}
_DISTS = ("own", "own", "scaled", "negated", "zero_mean", "per_sample")


@dataclass
class Options:
    trials: int = 7  # correctness input sets; the last one re-seeds and perturbs the weights
    build_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    warmup: int = 5
    warmup_ms: float = 50.0  # and at least this much warm-up work (GPU clocks ramp up; the trials ran just before)
    warm_runners: bool = True  # start runner processes ahead of need (torch imported, CUDA up)
    spare_runners: int = 3  # per device, when the runner has a core of its own (else 1)
    prepare_bytes: int = 2 << 30  # reference outputs computed ahead, alongside the candidate's trials (0: off)
    inputs_on_device: bool = True  # get_inputs() draws on the timing device (False: on the CPU, then copied)
    pin_cpus: bool = True  # a reserved core per device runner when there are enough cores
    isolate: bool = True  # builder and runner in a PID + mount namespace where unshare works (eval_sandbox.py)
    timing_iters: int = 100
    verify_calls: int = 3  # timed calls whose outputs are checked against the reference (chosen afterwards),
    # besides one call of every host round
    host_calls: int = 10  # calls back to back per host round, each on inputs of its own ...
    host_rounds: int = 4  # at least this many; more, up to host_rounds_max, while the reference's two
    host_rounds_max: int = 4  # fastest rounds differ by more than host_settle (a loaded machine: the floor's
    host_settle: float = 0.03  # noise allowance is that difference); off by default: with 12, a slow
    # candidate's run took 45 s+ on the loaded 2-core machine, and the CPU-time floor already holds there
    host_bytes: int = 1 << 30  # ... while the round's input sets fit in this
    keep_bytes: int = 1 << 30  # timed outputs the runner keeps for shipping; beyond, it computes them again
    eager_baseline: bool = True  # measure each device's baseline at start, before any candidate is built
    steady_ms: float = 20.0  # (c): each back-to-back pass lasts about this long ...
    steady_passes: int = 1  # ... this many after each block of event calls; the best counts ...
    steady_sets: int = 4  # ... cycling through this many input sets
    steady_min_calls: int = 10
    steady_max_calls: int = 2000
    paired_reference: bool = True  # time the reference in blocks between the candidate's; speedup from that pair
    timing_blocks: int = 4  # the candidate's event calls in this many blocks, with the reference's around them
    gpu_busy_ms: float = 1.0  # a trivial kernel of the reference worker's waiting longer: the GPU was busy
    # (the candidate's leftover work, another user) around a reference block or round, which then does not count
    max_drift: float | None = None  # the paired reference counts up to this much above the start's baseline
    # (None: 0.10 on a GPU, 1.0 on the CPU)
    host_margin: float | None = None  # the runtime is at least the host rounds' figure / (1 + this) (None:
    # 0.05 on a GPU, 0.10 on the CPU)
    host_ratio: float | None = None  # reject if event median * host_ratio < host per-call time (None: 3 on
    # a GPU, 10 on the CPU, where the host rounds share the cores with everything else) ...
    host_slack_ms: float = 0.05  # ... and the gap exceeds this (launch overhead on tiny kernels)
    lead_ms: float = 0.5  # the GPU held (_GpuHold) between the L2 flush and the start event; 0: KernelBench's protocol
    tail_ms: float = 0.05  # median device time after the call's stream finished, less the host's own delay:
    # above this, work was left on another stream
    max_speedup: float = 10.0  # above this a speedup is flagged, not rejected
    allow_tf32: bool = False
    cpu_threads: int = 1
    max_jobs: int | None = None
    build_workers: int | None = None
    use_pch: bool = True
    light_headers: bool = True  # .cu files try light_headers.py's cut-down torch headers first, then the real ones
    fast_nvcc: bool = True  # nvcc's host and device front ends side by side (fast_nvcc.py)
    flush_bytes: int = 256 << 20
    poison_bytes: int = 1 << 30
    peak_bytes_per_s: float | None = None
    peak_flops: float | None = None

    def __post_init__(self):
        # Every option is a flag, a count or a non-negative amount: anything else is refused by name (a
        # negative margin would silently double runtimes, a string flag would read as true).
        for f in dataclasses.fields(self):
            value, default = getattr(self, f.name), f.default
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            else:   # a float, or None for "the device's default"
                ok = (value is None and default is None) or (
                    isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
            if not ok:
                raise ValueError(f"Options.{f.name} must be {_kind(default)}, not {value!r}")
        for name in ("trials", "timing_iters", "timing_blocks", "host_calls", "host_rounds", "steady_passes",
                     "steady_sets", "steady_min_calls", "cpu_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"Options.{name} must be at least 1, not {getattr(self, name)}")


def _kind(default) -> str:
    if isinstance(default, bool):
        return "True or False"
    if isinstance(default, int):
        return "a whole number >= 0"
    return "a number >= 0" + (" or None" if default is None else "")

def _quantile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _move(src: str, dst: str) -> None:
    try:
        os.replace(src, dst)
    except OSError:
        pass

