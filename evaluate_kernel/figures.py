"""What the parent makes of a timing: the three runtime figures, the paired reference, the host floor.

Pure functions over the numbers eval_run.py collected (no processes, no I/O):
  runtime_figures    (a) GPU time, (b) KernelBench's protocol, (c) steady state, and the runtime the
                     search optimises: max(a, c) on a GPU, (a) on the CPU (README: "What the number means");
  timing_details     all of them, with the samples and the host rounds, for details["timing"];
  paired_figures     the reference's figures from its blocks between the candidate's;
  paired_speedup     the speedup from that pair, capped by the start's baseline;
  host_rounds_details / bounded_runtime / host_figure
                     the parent's own estimate of the candidate's cost (the reference's runtime plus the
                     difference of the fastest host rounds) and the floor it puts under the runtime.
"""
from __future__ import annotations

import math

from .common import EvalResult, _quantile


def runtime_figures(samples: list[float], plain: list[float], steady: list[float], gpu: bool = True) -> dict:
    """The three figures of a callable and the runtime the search optimises (README: "What the number means").

    gpu_ms (a): median of the event samples with the lead (on the CPU: the 10th percentile of per-call
    host samples); kernelbench_ms (b): median of the samples taken without a lead (KernelBench's
    protocol; (a) where there are none); steady_ms (c): per-call time of back-to-back calls, best pass.
    On a GPU the runtime is max(a, c): a call costs whichever side is slower, the GPU doing its work or
    the host issuing it. On the CPU both are the host's time per call and (a) is the runtime: a 20 ms
    pass is often cut by the scheduler on a loaded machine, a single call rarely, and load only ever adds
    time, so a low percentile is what a call costs when it runs undisturbed (the median moved 2x more
    than the 10th percentile across evaluations beside a busy process).
    """
    a = _quantile(sorted(samples), 0.5 if gpu else 0.1)
    b = _quantile(sorted(plain), 0.5) if plain else a
    c = min(steady) if steady else float("nan")
    runtime = max(a, c) if gpu and not math.isnan(c) else a
    return {"gpu_ms": a, "kernelbench_ms": b, "steady_ms": None if math.isnan(c) else c, "runtime_ms": runtime,
            "bound": "steady state (host)" if runtime > a else ("gpu" if gpu else "host, per call")}


def timing_details(ev, msg: dict, rounds: list, event_wall_ms: float, t: dict, details: dict) -> None:
    samples = sorted(msg["samples"])
    iqr = _quantile(samples, 0.75) - _quantile(samples, 0.25)
    raw_ms = min(rounds) * 1e3 / t["round_calls"] if rounds else None
    tail = _quantile(sorted(msg.get("tails") or []), 0.5)
    figures = runtime_figures(msg["samples"], msg.get("plain_samples") or [], msg.get("steady_ms") or [],
                              ev.device == "cuda")
    details["timing"] = {**figures, "samples_ms": msg["samples"], "median_ms": figures["gpu_ms"], "iqr_ms": iqr,
                         "spread": iqr / figures["gpu_ms"] if figures["gpu_ms"] else None,
                         "steady_passes_ms": msg.get("steady_ms") or [],
                         "batch_wall_ms_per_call": raw_ms, "event_phase_wall_ms": event_wall_ms,
                         "rounds_ms": [r * 1e3 for r in rounds],
                         "samples_sum_ms": sum(msg["samples"]) + sum(msg.get("plain_samples") or []),
                         "plain_samples_ms": msg.get("plain_samples", []), "plain_median_ms": figures["kernelbench_ms"],
                         "device_tail_ms": None if math.isnan(tail) else tail, "tails_ms": msg.get("tails", []),
                         "lead_ms": msg.get("lead_ms", 0.0), "io_bytes": msg.get("io_bytes", 0),
                         "peak_bytes": msg.get("peak_bytes")}


def paired_figures(ev, blocks: list[dict]) -> dict | None:
    """The reference's figures from its blocks, leaving out those the GPU was found busy around (None
    when that leaves nothing: the start's baseline then counts)."""
    dropped = sum(1 for b in blocks if b.get("busy"))
    blocks = [b for b in blocks if not b.get("busy")]
    if not blocks or not any(b.get("samples") for b in blocks):
        return None
    merged = {k: [v for b in blocks for v in b.get(k) or []] for k in ("samples", "plain_samples", "steady_ms")}
    figures = runtime_figures(merged["samples"], merged["plain_samples"], merged["steady_ms"], ev.device == "cuda")
    # Block by block (each between two of the candidate's): how much the machine moved while it was timed.
    figures["blocks_ms"] = [_quantile(sorted(b["samples"]), 0.5) for b in blocks]
    figures["samples_ms"] = merged["samples"]
    figures["blocks_dropped_busy_gpu"] = dropped
    # What the reference costs when the machine is quiet, as the fastest host rounds see it: on a GPU its
    # runtime; on a loaded CPU the 10th percentile of its calls (the median is the typical, loaded call).
    figures["quiet_ms"] = figures["runtime_ms"] if ev.device == "cuda" else _quantile(sorted(merged["samples"]), 0.1)
    return figures


def paired_speedup(result: EvalResult, start_ms: float, max_drift: float) -> None:
    """baseline_ms and speedup from the pair measured in this evaluation; the baseline of the start stays
    for the record (details["baseline_start_ms"]) and the drift between the two says how much the machine
    moved. A reference slowed while the candidate's process lived (work it left running, say) would
    inflate the speedup, so the pair counts at most (1 + max_drift) x the start's figure."""
    paired = result.details.get("reference_timing")
    result.baseline_ms = paired["runtime_ms"] if paired else start_ms
    cap = start_ms * (1.0 + max_drift)
    if result.baseline_ms > cap:
        result.details["reference_capped_from_ms"], result.baseline_ms = result.baseline_ms, cap
    result.details["baseline_start_ms"] = start_ms
    result.details["baseline_drift"] = result.baseline_ms / start_ms - 1.0
    result.speedup = result.baseline_ms / result.runtime_ms if result.runtime_ms else None


def host_rounds_details(ev, dev, job: dict, rounds: list, ref_rounds: list, details: dict,
                        clocks: dict | None = None) -> None:
    """The parent's own estimate of the candidate's cost per call, by difference with the reference.

    Each of the runner's host rounds is followed by the same round on the reference in the reference
    worker, on the same core: drawing the inputs, the digests and the copies cost the same in both, so
    (fastest candidate round - fastest reference round) / N is the difference of the calls alone, and the
    reference's runtime (measured beside it) plus that difference is the candidate's cost by this
    process's clock: details["timing"]["host_ms_per_call"]. Its noise is read from the reference's rounds
    (twice their second fastest less fastest) plus a quarter of the bookkeeping per call. The reference's rounds
    are capped at 1 + max_drift times what they took during the baseline's run, when no candidate process
    existed, as the paired reference is; the runner must sit idle while they run (_quiet).
    """
    n, timing = job["timing"]["round_calls"], details["timing"]
    if job["mode"] == "baseline" or dev.clean_timing is None:
        dev.clean_timing = {"ref_round_s": min(ref_rounds)}
    if job["mode"] == "baseline":
        return
    cap = (1.0 + ev._max_drift()) * dev.clean_timing["ref_round_s"]   # as the paired reference's own cap
    cand, ref = sorted(rounds), sorted(min(r, cap) for r in ref_rounds)
    # The reference's runtime in the fastest rounds' regime: the lowest of its quiet figure, the paired
    # runtime and the start's (a load spike during the paired blocks that spared the rounds must not
    # raise the estimate; none of these figures is the candidate's to move down).
    paired = details.get("reference_timing") or {}
    figures = [f for f in (paired.get("quiet_ms"), paired.get("runtime_ms"), (dev.baseline or {}).get("median_ms")) if f]
    if not figures:
        return
    ref_ms = min(figures)
    # The rounds' spread, read from the reference's side only (twice, for both sides): the candidate's own
    # rounds could be made to spread (a sleep costs no CPU time) and so lower the floor.
    noise = 2 * (ref[1] - ref[0]) * 1e3 / n if len(ref) > 1 else 0.0
    # The rounds' bookkeeping per call (drawing, digest, copy), from the reference's side: it is the same
    # on both sides only to within a fraction of itself (the two processes' allocators and caches differ),
    # so a quarter of it counts as noise too; calls much cheaper than it get a loose bound (README says so).
    bookkeeping = max(0.0, ref[0] * 1e3 / n - ref_ms)
    timing["reference_rounds_ms"] = [r * 1e3 for r in ref_rounds]
    timing["host_ms_per_call"] = ref_ms + (cand[0] - ref[0]) * 1e3 / n
    # Without the cap: what the mismatch check rejects on (a machine slower than at the start must not
    # turn an honest candidate into a "timing mismatch"; the floor still uses the capped figure).
    timing["host_ms_uncapped"] = ref_ms + (cand[0] - min(ref_rounds)) * 1e3 / n
    timing["host_bookkeeping_ms"] = bookkeeping
    timing["host_noise_ms"] = noise + 0.25 * bookkeeping
    if clocks and clocks["runner"] and len(clocks["reference"]) > 1:
        # The same difference in CPU time (the CPU, one thread): what load adds to a round's wall time,
        # waiting for a core, is no CPU time, so this estimate's noise stays small on a busy machine.
        ref_cpu = sorted(clocks["reference"])
        timing["cpu_rounds_ms"], timing["reference_cpu_rounds_ms"] = ([r * 1e3 for r in clocks[k]]
                                                                       for k in ("runner", "reference"))
        timing["host_cpu_ms_per_call"] = ref_ms + (min(clocks["runner"]) - ref_cpu[0]) * 1e3 / n
        timing["host_cpu_noise_ms"] = (2 * (ref_cpu[1] - ref_cpu[0]) * 1e3 / n
                                       + 0.25 * max(0.0, ref_cpu[0] * 1e3 / n - ref_ms))


def bounded_runtime(ev, timing: dict) -> float:
    """The runtime, never below the parent's own estimate less its noise and a margin: the runner's
    figures (max(a, c)) where they agree with it, else (host estimate - noise) / (1 + host_margin).

    The margin covers what still differs honestly between back-to-back rounds and the runner's phases
    (GPU clocks in short bursts, inputs drawn in the rounds), so an honest candidate's figure is its own
    and five evaluations repeat to 0.1%, while figures the runner forges lower its runtime by at most the
    margin plus the rounds' measured noise."""
    host_ms, noise = host_figure(ev, timing)
    runtime = timing["runtime_ms"]
    if host_ms is None:
        return runtime
    margin = ev.opts.host_margin if ev.opts.host_margin is not None else (0.05 if ev.device == "cuda" else 0.10)
    floor = max(0.0, host_ms - noise) / (1.0 + margin)
    if timing.get("host_cpu_ms_per_call") is not None:  # the CPU: the tighter of wall and CPU time bounds
        floor = max(floor, max(0.0, timing["host_cpu_ms_per_call"] - timing["host_cpu_noise_ms"]) / (1.0 + margin))
    timing["host_floor_ms"] = floor
    if floor > runtime:
        timing["runner_runtime_ms"], timing["runtime_ms"] = runtime, floor
        timing["bound"] = "host clock (the runner's figures read lower)"
        return floor
    return runtime


def host_figure(ev, timing: dict) -> tuple[float | None, float]:
    """The parent's estimate of the candidate's cost per call and its noise (None where there is none:
    the baseline, whose code is the reference's own)."""
    host_ms = timing.get("host_ms_per_call")
    return (None, 0.0) if host_ms is None else (host_ms, timing.get("host_noise_ms", 0.0))
