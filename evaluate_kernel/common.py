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


class EvaluatorError(RuntimeError):
    """The evaluator itself failed (closed meanwhile, its reference could not run): no verdict about the
    candidate, so nothing to store as one."""

# ======================================================================================================
# Result type
# ======================================================================================================


@dataclass
class EvalResult:
    status: str
    correct: bool = False
    runtime_ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None  # median of paired batch ratios, about baseline_ms / runtime_ms
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

# The dtypes a CPU batch lays out and reads back by name (host_batches.py, readout.py), with their sizes.
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
               "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16}


def torch_dtype(name: str):
    import torch
    if name not in DTYPE_SIZES:
        raise ValueError(f"dtype {name!r} is not one the timing lays out")
    return getattr(torch, name)


def _flat(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]

def _int_view(t):
    import torch
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]

def compare_outputs(outs: list, refs: list, rtol: float, atol: float, l2_tol: float) -> dict:
    """Elementwise |out-ref| <= rtol*|ref| + atol*RMS(ref) and ||out-ref||/||ref|| <= l2_tol, per output
    (for fp16 and bf16 outputs each bound at least the dtype's resolution, torch.finfo(dtype).eps).

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
        # Half-precision outputs are held to their own resolution at least: one rounding more or less (an
        # affine computed in fp32 and rounded once, as every fused kernel does) moves a value by an ulp.
        eps = torch.finfo(r.dtype).eps if r.dtype in (torch.float16, torch.bfloat16) else 0.0
        rtol_i, atol_i, l2_i = max(rtol, eps), max(atol, eps), max(l2_tol, eps)
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
        bound = rtol_i * rf.abs() + atol_i * rms
        ref_norm = rf.norm().item()
        rel_l2 = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
        excess = diff - bound
        j = int(excess.argmax())
        idx = list(torch.unravel_index(torch.tensor(j), o.shape)) if o.dim() else []
        worst["max_abs_err"] = max(worst["max_abs_err"], diff.max().item())
        worst["max_rel_err"] = max(worst["max_rel_err"], (diff / rf.abs().clamp_min(1e-12)).max().item())
        worst["rel_l2"] = max(worst["rel_l2"], rel_l2)
        elem_ok, l2_ok = excess.reshape(-1)[j].item() <= 0, rel_l2 <= l2_i
        if not (elem_ok and l2_ok) and worst["ok"]:
            why = [] if elem_ok else ["elementwise bound rtol*|ref|+atol*RMS(ref) exceeded"]
            why += [] if l2_ok else [f"relative L2 error {rel_l2:.3g} > {l2_i:.3g}"]
            worst.update(ok=False, reason=f"output {i}: " + "; ".join(why) +
                         f"; worst at index {[int(v) for v in idx]}: got {of.reshape(-1)[j].item():.6g}, "
                         f"expected {rf.reshape(-1)[j].item():.6g} (abs err {diff.reshape(-1)[j].item():.3g}, "
                         f"RMS(ref) {rms:.3g})")
    return worst


def digests(calls: list[list], weights: dict | None = None, chunk_bytes: int = 1 << 30) -> list[int]:
    """A 64-bit commitment to the exact bits of each call's outputs (calls: one list of tensors per call).

    A sum of per-element terms would be linear: a candidate could ship a right output afterwards and tune
    low bits until it matched a digest committed for garbage. So: on the CPU, BLAKE2b over the outputs'
    bytes (with their shapes and dtypes); on a GPU, where copying every output to the host would cost more
    than the calls, a hash tree computed in place: the outputs' bytes as 64-bit words, each added its
    index term, pairs of words joined by a function no one word can be solved from (_pairs), then
    neighbours combined through a 64-bit mixer (splitmix64's finaliser), level by level, down to one
    value, and a call's outputs are chained in order. Changing any element changes every value
    above it unpredictably, so matching a committed digest means recomputing the same bits. Exact
    (integer arithmetic wraps) on any GPU. Calls whose outputs have the same shapes and dtypes are stacked
    (chunk_bytes of outputs at a time), so a batch of n calls costs a few kernels per level, not per call;
    a single call's digest is the same number. `weights` caches the index terms per (size, device).
    """
    if all(o.device.type == "cpu" for outs in calls for o in outs):
        return [_blake(outs) for outs in calls]
    return tree_digests(calls, weights, chunk_bytes)


def tree_digests(calls: list[list], weights: dict | None = None, chunk_bytes: int = 1 << 30) -> list[int]:
    """The GPU's digest (see digests), on whatever device the outputs are."""
    import numpy as np
    import torch
    weights = {} if weights is None else weights
    out: list[int] = [0] * len(calls)
    groups: dict[tuple, list[int]] = {}
    for i, outs in enumerate(calls):
        groups.setdefault(tuple((tuple(o.shape), o.dtype, str(o.device)) for o in outs), []).append(i)
    for signature, members in groups.items():
        size = max(1, sum(o.numel() * 24 for o in calls[members[0]]))   # int64 work tensors, with headroom
        step = max(1, chunk_bytes // size)
        for start in range(0, len(members), step):
            chunk = members[start:start + step]
            total = np.full(len(chunk), _SEED, dtype=np.int64).view(np.uint64) if signature else None
            for k in range(len(signature)):
                words = _words(torch.stack([calls[i][k].detach() for i in chunk]).reshape(len(chunk), -1))
                if words.shape[1] % 2:
                    words = _pad_odd(words)
                key = (words.shape[1], str(words.device))
                if key not in weights:
                    idx = torch.arange(words.shape[1], dtype=torch.int64, device=words.device)
                    weights[key] = idx * _GOLDEN + _SEED
                total = _mix(total * _U(_GOLDEN) + _tree(_pairs(words + weights[key])))
            values = total.view(np.int64).tolist() if total is not None else [0] * len(chunk)
            for i, v in zip(chunk, values):
                out[i] = int(v)
    return out


def output_digest(outs: list, weights: dict | None = None) -> int:
    """digests() of one call."""
    return digests([list(outs)], weights)[0]


def _blake(outs: list) -> int:
    import torch
    h = hashlib.blake2b(digest_size=8)
    for o in outs:
        h.update(f"{tuple(o.shape)}{o.dtype};".encode())
        flat = o.detach().contiguous().reshape(-1)
        if flat.numel():
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    return int.from_bytes(h.digest(), "little", signed=True)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_GOLDEN, _SEED = _signed(0x9E3779B97F4A7C15), _signed(0x232BE59BD9B4E019)
_M1, _M2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _U(v: int):
    """A constant as the host's unsigned 64-bit integer (its signed value's bits)."""
    import numpy as np
    return np.int64(v).view(np.uint64)


def _shr(x, s: int):
    """Logical right shift of 64-bit values: torch's >> on int64 is arithmetic; numpy's uint64 is unsigned."""
    import numpy as np
    if isinstance(x, np.ndarray):
        return x >> _U(s)
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x):
    """splitmix64's finaliser, elementwise on an int64 tensor or a uint64 array (a bijection with full
    avalanche; the same bits either way)."""
    import numpy as np
    host = isinstance(x, np.ndarray)
    m1, m2 = (_U(_M1), _U(_M2)) if host else (_M1, _M2)
    x = x ^ _shr(x, 30)
    x = x * m1
    x = x ^ _shr(x, 27)
    x = x * m2
    return x ^ _shr(x, 31)


def _pairs(v):
    """[m, 2k] -> [m, k]: the bottom level, each pair of words (a, b) to mix(a*G + b) ^ mix(rotl(b, 17)*G' + a).
    Every step above it is a bijection in either child, so from a committed digest one can compute what
    any one node below must have been; at the bottom that stops: given a and the node, no b is found but
    by trying all 2^64 (each of the two terms is a bijection of b, their XOR is not). A bottom of plain
    bijections (each word mixed, then pairs combined as above) let a forger solve for the last word of a
    right output given the rest, and retry the free low bits of its neighbours until that word too lay
    within tolerance: about 2^38 tries for float32, seconds on a GPU. The rotation: with b itself in the
    second term, flipping the top bits of a and b together changed neither term (G and G' are odd, so
    2^63 * (G + 1) = 0 mod 2^64): two float32 signs, or the sign of an odd row's last word, were free."""
    if v.shape[1] == 0:
        return v
    a, b = v[:, 0::2], v[:, 1::2]
    return _mix(a * _GOLDEN + b) ^ _mix(((b << 17) | _shr(b, 47)) * _M1 + a)


def _tree(v, host_values: int = 1 << 16):
    """[m, n] int64 tensor -> [m] uint64 array: neighbours combined and mixed, level by level (an odd one
    out is carried up). Once the levels hold at most host_values values they go on on the host (numpy,
    the same bits): a level on a GPU is a dozen kernel launches however small, and the last dozen levels
    of a few large outputs were all launches (3.5 ms of host work, the digest's noise, for six 8 MB
    outputs)."""
    import numpy as np
    while v.shape[1] > 1 and v.shape[0] * v.shape[1] > host_values:
        if v.shape[1] % 2:
            v = _pad_odd(v)
        v = _mix(v[:, 0::2] * _GOLDEN + v[:, 1::2])
    h = v.detach().cpu().numpy().view(np.uint64)
    while h.shape[1] > 1:
        if h.shape[1] % 2:
            h = np.concatenate([h, h[:, -1:] ^ _U(_M2)], axis=1)
        h = _mix(h[:, 0::2] * _U(_GOLDEN) + h[:, 1::2])
    return h[:, 0] if h.shape[1] else np.zeros(h.shape[0], dtype=np.uint64)


def _pad_odd(v):
    import torch
    return torch.cat([v, v[:, -1:] ^ _M2], dim=1)


def _words(rows):
    """[m, k] -> [m, w] int64: each row's bytes as 64-bit words (zero bytes pad the last one), so the tree
    starts from a quarter of a float16 output's elements, half of a float32 one's, and mixes no element's
    bits twice. Padding is unambiguous: a group's outputs have one shape and dtype."""
    import torch
    b = rows.contiguous().view(torch.uint8) if rows.dtype != torch.uint8 else rows.contiguous()
    pad = -b.shape[1] % 8
    if b.shape[1] == 0:
        return torch.zeros((b.shape[0], 0), dtype=torch.int64, device=b.device)
    if pad:
        b = torch.cat([b, b.new_zeros(b.shape[0], pad)], dim=1)
    return b.view(torch.int64)


# Upper bounds of what the hardware can do (a runtime below them is physically impossible).
_PEAKS = {"H100": (3.9e12, 1.0e15), "H200": (5.2e12, 1.0e15), "A100": (2.1e12, 3.2e14), "B200": (8.5e12, 2.5e15)}
_DISTS = ("own", "own", "scaled", "negated", "zero_mean", "per_sample")
# The timing's stop rule by device, where Options leave it open (target_ci, timing_s: None).
TARGET_CI = {"cuda": 0.005, "cpu": 0.02}
TIMING_S = {"cuda": 10.0, "cpu": 2.0}


@dataclass
class Options:
    trials: int = 7  # correctness input sets; the last one re-seeds and perturbs the weights
    build_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    warm_runners: bool = True  # start runner processes ahead of need (torch imported, CUDA up)
    spare_runners: int = 3  # per device, when the runner has a core of its own (else 1)
    prepare_bytes: int = 2 << 30  # reference outputs computed ahead, alongside the candidate's trials (0: off)
    inputs_on_device: bool = True  # get_inputs() draws on the timing device (False: on the CPU, then copied)
    pin_cpus: bool = True  # cores of its own for each device's runner when there are enough
    isolate: bool = True  # builder and runner in a PID + mount namespace where unshare works (namespace.py)
    fork_server: bool = True  # ... forked there from a process that has imported torch (forkserver.py)
    keep_worker_dirs: bool = False  # keep what each builder and runner wrote (its home, cache/w/...) until close()
    # Timing (clock.py): batches of back-to-back calls, alternating reference and candidate ...
    batch_ms: float = 20.0  # ... each lasting about this long (with shared memory each side's; in the GPU's
    # fallback, where both run the same sets, the faster side's) ...
    max_batch_ms: float = 250.0  # ... and at most this long on the slower one ...
    batch_bytes: int = 0  # ... its inputs and outputs within this (0: 4 GiB on a GPU, 512 MiB on the CPU);
    min_pairs: int = 6  # counted pairs before the interval may stop the timing ...
    max_pairs: int = 40  # ... and at most this many
    target_ci: float | None = None  # stop when the speedup's 95% interval is within +- this (None: TARGET_CI,
    # 0.5% on a GPU, 2% on the CPU) ...
    timing_s: float | None = None  # ... or after this long, once min_pairs count (None: TIMING_S, 10 s on a
    # GPU, 2 s on the CPU, where a loaded machine may never reach 2% and every candidate of a search would pay
    # the whole budget; with nothing but calls in a CPU batch, 2 s gives about +-2% on conv_groupnorm_small)
    verify_per_batch: int = 2  # calls per candidate batch whose outputs are checked (chosen after its digests or
    # its stopped memory): a shortcut that holds for half the input distributions escapes a batch 1 time in 4
    max_threads: int = 64  # threads a runner may hold while it is stopped for the reference (each can
    # leave a wake-up that fires on the reference's core, where its interrupt is the reference's CPU time)
    probe_ms: float = 0.2  # a trivial kernel slower than this (or 4x its idle time) after a batch: GPU busy
    drain_s: float = 5.0  # the GPU must be idle this soon after the candidate's batch ends
    gpu_shared: bool = True  # a GPU runner's inputs and outputs in device memory the reference worker
    # shares (vmm.py), where the machine allows it; False: the runner draws and digests them (batches.py)
    eager_baseline: bool = True  # measure each device's baseline at start (GPU, pinned: beside the first build)
    max_speedup: float = 10.0  # above this a speedup is flagged, not rejected
    allow_tf32: bool = False
    cpu_threads: int = 1
    max_jobs: int | None = None
    build_workers: int | None = None
    use_pch: bool = True
    light_headers: bool = True  # .cu files try light_headers.py's cut-down torch headers first, then the real ones
    fast_nvcc: bool = True  # nvcc's host and device front ends side by side (fast_nvcc.py)
    prefixes: bool = True  # fast_nvcc's final step from a precompiled prefix where the store has one (prefixes.py)
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
        for name in ("trials", "min_pairs", "max_pairs", "verify_per_batch", "cpu_threads"):
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


# ======================================================================================================
# Machine-wide file locks
# ======================================================================================================


def lock_path(name: str) -> str:
    """A machine-wide lock file (a GPU's turn, torch's shared precompiled header). The locks live in a
    directory of their own, created here, which the namespace mounts read-only: a candidate can neither
    take a lock away nor put a directory, a FIFO or a fresh file in its place (every later evaluation on
    the machine would crash, hang or stop waiting for its turn)."""
    import tempfile
    d = os.path.join(tempfile.gettempdir(), "pacevolve-locks")
    try:
        os.mkdir(d, 0o777)
        os.chmod(d, 0o1777)   # shared by every user's evaluators, like /tmp itself
    except FileExistsError:
        pass
    path = os.path.join(d, name)
    open_lock(path, create=True).close()
    return path


def open_lock(path: str, create: bool = False):
    """The lock file, open for flock (read-only: a read-only mount is enough); never a directory, FIFO or
    link left in its place: with create, such a thing is set aside and a plain file made, else OSError."""
    import stat
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    for _ in range(3):
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as e:
            if not create or not os.path.lexists(path):
                raise
            bad = e
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return os.fdopen(fd, "rb")
            os.close(fd)
            bad = OSError(f"{path} is not a plain file")
            if not create:
                raise bad
        os.replace(path, f"{path}.not-a-lock-{os.getpid()}-{os.urandom(4).hex()}")
    raise bad
