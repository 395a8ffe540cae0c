"""Parent side: from what an evaluation measured to its EvalResult, and nothing else.

    from_timing      the timed figures (clock.py) as a verdict: every figure finite and positive, or a
                     rejection that says which (a NaN compares false with everything: it must not pass)
    physical_checks  a runtime below what the hardware can move or compute is impossible: rejected; a
                     speedup above max_speedup is flagged for review
    failure, forged  a worker's error or out-of-turn answer, and a claim that does not hold, as verdicts

What a runner says is never a figure here: every number comes from the parent's clock or the reference
worker's judgement.
"""
from __future__ import annotations

import math

from . import clock
from .common import _PEAKS, EvalResult


def from_timing(timed: dict, device: str, details: dict) -> EvalResult:
    f: clock.Figures | None = timed["figures"]
    details["timing"] = timing_details(timed, device)
    if f is None:
        return EvalResult("rejected", message="rejected: no timed batch counted (the timing was cut short)",
                          details=details)
    values = {"runtime_ms": f.runtime_ms, "baseline_ms": f.baseline_ms, "speedup": f.speedup,
              "interval": f.low, "interval_high": f.high}
    bad = [k for k, v in values.items() if not (isinstance(v, float) and math.isfinite(v) and v > 0)]
    if bad:
        return EvalResult("rejected", message=f"rejected: the timing gave no finite positive {', '.join(bad)} "
                          "(a figure the evaluator cannot rank)", details=details)
    details["speedup_ci"] = [f.low, f.high]
    details["noise"] = f.noise
    return EvalResult("ok", correct=True, runtime_ms=f.runtime_ms, baseline_ms=f.baseline_ms, speedup=f.speedup,
                      details=details)


def timing_details(timed: dict, device: str) -> dict:
    f = timed["figures"]
    def rows(batches):
        return [{"n": b.n, **{p: round(getattr(b, p) * 1e3, 4) for p in clock.PHASES},
                 **({"host": round(b.host * 1e3, 4)} if b.host is not None else {})} for b in batches]
    clock_name = "the parent's monotonic clock" if device == "cuda" else "the workers' CPU time, read by the parent"
    out = {"clock": clock_name, "batches_ref_ms": rows(timed["refs"]),
           "batches_cand_ms": rows(timed["cands"]), "calls_per_batch": timed["cands"][-1].n if timed["cands"] else 0,
           "calls_per_reference_batch": timed["refs"][-1].n if timed["refs"] else 0}
    if f is not None:
        out.update(pairs=f.pairs, ratios=[round(r, 5) for r in f.ratios], runtime_ms=f.runtime_ms,
                   baseline_ms=f.baseline_ms, speedup=f.speedup, interval=[f.low, f.high])
    return out


def not_stopped(details: dict, states: list[str]) -> EvalResult:
    """A runner with a thread still running a second after SIGSTOP (inside a system call that holds off the
    stop): what it does meanwhile lies outside the clock, and beside the reference."""
    return EvalResult("rejected", message=f"rejected: a thread of the candidate's process did not stop within 1 s "
                      f"of SIGSTOP (state {''.join(sorted(states)) or '?'}: inside a system call that holds off the "
                      "stop), so it would have run outside its batch's time, or while the reference was timed",
                      details=details)


def forged(details: dict, what: str, honest_mistake: bool = False) -> EvalResult:
    """A runner's answer the evaluator refuses; honest_mistake: one an honest program can give (outputs
    reused across calls), said so without calling it forged."""
    return EvalResult("rejected", message=f"rejected: {what}" + ("" if honest_mistake else " (forged result)"),
                      details=details)


def failure(msg: dict, details: dict) -> EvalResult:
    kind, err = str(msg.get("kind"))[:40], str(msg.get("error", ""))[:2000]
    if kind == "rejected":
        return EvalResult("rejected", message=f"rejected: {err}", details=details)
    if kind != "error":
        return forged(details, f"the runner answered {kind!r} out of turn")
    if "out of memory" in err.lower():
        err = "out of memory: " + err
    elif ("Operation not permitted" in err or "PermissionError" in err) and any(
            k in err for k in ("Inductor", "inductor", "dynamo", "triton", "Triton")):
        err = ("torch.compile and Triton compile at the first call, in a process that may not start a compiler; "
               "build native code with load_inline at import or in the constructor: " + err)
    elif "Operation not permitted" in err or "PermissionError" in err:
        err = ("the sandbox refused a system call (a candidate may not start processes on the CPU, move its "
               "threads to other cores or raise their priority, arm timers, open local sockets, or watch or lock "
               "files others read): " + err)
    where = str(msg.get("where", "run"))[:40]
    status = "invalid" if where == "import" and "ModelNew" in err and "KeyError" in err else "runtime_error"
    return EvalResult(status, message=f"{where}: {err}", details=dict(details, error=err))


def physical_checks(ev, result: EvalResult, dev) -> None:
    """A runtime below what the hardware can do is impossible; a huge speedup is flagged."""
    floor = floor_ms(ev, dev)
    result.details["floor_ms"] = floor
    if floor and result.runtime_ms is not None and result.runtime_ms < floor:
        result.status, result.correct = "rejected", False
        result.message = (f"rejected: {result.runtime_ms:.4f} ms is below the physical floor {floor:.4f} ms "
                          "for this task (bytes moved / peak bandwidth, flops / peak rate)")
        return
    noise = result.details.get("noise")
    band = f" ±{noise * 100:.1f}%" if isinstance(noise, float) else ""
    if result.speedup and result.speedup > ev.opts.max_speedup:
        result.details.setdefault("flags", []).append(f"speedup {result.speedup:.1f}x above {ev.opts.max_speedup:g}x")
        result.message = f"ok, but the {result.speedup:.1f}x speedup is unusually high and flagged for review"
    else:
        result.message = (f"ok: {result.speedup:.3g}x{band} ({result.runtime_ms:.4g} ms vs the reference's "
                          f"{result.baseline_ms:.4g} ms)")


def floor_ms(ev, dev) -> float:
    name = dev.info.get("device_name", "")
    bw, peak = next((v for k, v in _PEAKS.items() if k in name), (None, None))
    bw, peak = ev.opts.peak_bytes_per_s or bw, ev.opts.peak_flops or peak
    nbytes = int(dev.info.get("in_bytes", 0)) + int(dev.info.get("out_bytes", 0))
    floor = 0.0
    if bw and nbytes:
        floor = max(floor, nbytes / bw * 1e3)
    if peak and ev.flops:
        floor = max(floor, ev.flops / peak * 1e3)
    return floor
