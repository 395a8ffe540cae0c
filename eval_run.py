"""Parent side of one run: the conversation with a runner (the candidate's process) and the verdict.

Public flow of run(): trial specs (seeds drawn here) -> runner computes the trials while the reference
worker computes its own -> compare (reference worker) -> "time" with a fresh seed -> the runner's event
calls in blocks, the reference worker timing the reference between them (the pair the speedup comes
from) -> the runner's steady phase, its samples and a digest of every timed output -> host rounds, each
bracketed by this process's clock -> reveal which calls to ship -> verify them (reference worker:
outputs and digests) -> runtime_figures -> the checks that decide the verdict.

What is believed from the runner: nothing on its word. Trial and timed outputs count only as the
reference worker judges them; its runtime figures count only down to the host rounds' figure less a
margin (_bounded_runtime), their sum must fit in the event phase's wall time and on a GPU their median
within host_ratio of the host figure; its flags can only hurt it. See evaluate_kernel.py's docstring for
the whole boundary.
"""
from __future__ import annotations

import math
import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

from eval_common import _DISTS, _PEAKS, EvalResult, _quantile, call_seed
from eval_device import _Device, _FileLock, _NullCtx
from eval_protocol import _Worker
from eval_sandbox import find_processes


def run(ev, src: str | None, h: str, dev: _Device, details: dict, locked: bool = False) -> EvalResult:
    """One runner process, used once: a candidate (src) or the baseline (src None: the reference Model)."""
    mode = "baseline" if src is None else "candidate"
    specs = trial_specs(ev.opts) if mode == "candidate" else [_own_spec(ev.opts)]
    timing = {"iters": ev.opts.timing_iters, "warmup": ev.opts.warmup, "warmup_ms": ev.opts.warmup_ms,
              "lead_ms": ev.opts.lead_ms, "flush_bytes": _flush_bytes(ev, dev), "host_calls": ev.opts.host_calls,
              "host_bytes": ev.opts.host_bytes, "keep_bytes": ev.opts.keep_bytes,
              "on_device": ev.opts.inputs_on_device, "in_bytes": dev.info.get("in_bytes", 1),
              "blocks": max(1, ev.opts.timing_blocks), "steady_ms": ev.opts.steady_ms, "steady_passes": ev.opts.steady_passes,
              "steady_sets": _steady_sets(ev, dev), "steady_min_calls": ev.opts.steady_min_calls,
              "steady_max_calls": ev.opts.steady_max_calls}
    work = tempfile.mkdtemp(prefix="run-", dir=ev.cache_dir)
    job = ev._job("run", mode=mode, candidate_src=src, device=ev._torch_device(), trials=specs, timing=timing,
                  work_dir=work, build=ev._build_cfg(), poison_bytes=ev.opts.poison_bytes, env=ev._ext_extras(h),
                  cpus=ev._runner_cpus[ev.devices.index(dev)])
    lock_cm = _NullCtx() if locked else dev.lock
    t_wait = time.monotonic()
    try:
        with lock_cm, _FileLock(dev.gpu_lock_path):
            details["phases"] = {f"{'gpu' if ev.device == 'cuda' else 'cpu'}_wait": round(time.monotonic() - t_wait, 3)}
            w = dev.take_runner()
            # The reference worker computes its outputs while the candidate computes its own (not timed).
            prepare = ev._helpers.submit(dev.ref_call, {
                "cmd": "prepare", "max_bytes": ev.opts.prepare_bytes,
                "items": [{"spec": s, "index": k} for k, s in enumerate(specs) if not s["perturb"]]}) \
                if mode == "candidate" and ev.opts.prepare_bytes > 0 else None
            try:
                return _drive(ev, w, job, dev, specs, details, prepare)
            finally:
                dev.pause_spares(False)
                if prepare is not None:
                    futures_wait([prepare])  # nothing of this evaluation may still run when the lock goes
                strays = w.discard()  # used once: a fresh process per evaluation; all it started dies with it
                dev.resume_ref()
                if strays:
                    details["stray_processes_killed"] = strays
                dev.settle_spare(final=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def trial_specs(opts) -> list[dict]:
    """Input sets for the correctness trials; seeds drawn now, unknown when the candidate was written."""
    specs = [dict(_own_spec(opts), dist=_DISTS[k % len(_DISTS)]) for k in range(opts.trials)]
    if len(specs) >= 2:  # the last trial re-seeds and perturbs the weights
        specs[-1].update(dist="own", weight_seed=secrets.randbits(31), perturb=True)
    # The first input set once more, after poisoning: an output read from stale memory or a cache cannot
    # match twice under different allocator states.
    return specs + [dict(specs[0], repeat=True)]


def _own_spec(opts) -> dict:
    return {"seed": secrets.randbits(31), "dist": "own", "weight_seed": 42, "perturb": False,
            "on_device": opts.inputs_on_device}


def _drive(ev, w: _Worker, job: dict, dev: _Device, specs: list, details: dict,
           prepare: Future | None) -> EvalResult:
    t0 = time.monotonic()
    deadline = t0 + ev.opts.run_timeout_s
    phases = details["phases"]

    def recv() -> dict:
        return w.recv(max(0.0, deadline - time.monotonic()))

    def mark(name: str, since: float) -> float:
        now = time.monotonic()
        phases[name] = round(now - since, 3)
        return now

    try:
        sent = time.time()
        w.send(job)
        msg = recv()
        if msg["kind"] == "ready":  # the runner's start-up report (unless already read by settle_spare)
            msg = recv()
        t = time.monotonic()
        if msg["kind"] != "outputs":
            return _failure(msg, details)
        marks = msg.get("marks", {})
        if {"job_received", "candidate_loaded", "trials_done"} <= set(marks):  # the runner's clock: display only
            phases["runner_start"] = round(max(0.0, marks["job_received"] - sent), 3)  # ~0: a spare waited
            phases["load"] = round(marks["candidate_loaded"] - marks["job_received"], 3)  # its load_inline
            phases["trials"] = round(marks["trials_done"] - marks["candidate_loaded"], 3)
        details["flags"] += msg.get("flags", [])
        if job["mode"] == "candidate":
            if prepare is not None:
                futures_wait([prepare])  # if it failed, the comparison computes what is missing
            bad = _check_trials(ev, msg, dev, specs, details)
            if bad is not None:
                return bad
        t = mark("compare", t)
        dev.settle_spare()  # the next runner's CUDA start-up must not overlap this timing
        t = mark("spare_wait", t)
        dev.pause_spares()  # resumed by run() when this evaluation ends, however it ends
        timed = _converse_timing(ev, w, dev, job, recv, deadline, details)
        if isinstance(timed, EvalResult):
            return timed
    except TimeoutError:
        return EvalResult("timeout", message=f"run exceeded {ev.opts.run_timeout_s:.0f} s "
                                             "(infinite loop or deadlock?)", details=details)
    except (EOFError, OSError):
        return EvalResult("runtime_error", message=f"{w.death()}. Log tail: {w.log_tail(400)}", details=details)
    except RuntimeError as e:
        # The reference worker failed while this candidate's process lived (its outputs file rewritten
        # under it, the GPU's memory held, ...): that candidate's result, never an exception that would
        # stop a whole search. The reference's own run (the baseline) still raises.
        if job["mode"] != "candidate":
            raise
        return EvalResult("runtime_error", message=f"the reference worker could not do its part while this "
                          f"candidate's process was alive: {e}", details=details)
    msg, calls = timed
    t = mark("timing", t)
    details["time_s"] = round(time.monotonic() - t0, 3)
    if job["mode"] == "candidate":
        try:
            bad = _verify_shipped(ev, dev, calls, msg["path"], details)
        except RuntimeError as e:
            bad = EvalResult("runtime_error", message=f"the reference worker could not verify the timed outputs "
                             f"while this candidate's process was alive: {e}", details=details)
        mark("verify", t)
        if bad is not None:
            return bad
    return _verdict(ev, job, details)


def _converse_timing(ev, w: _Worker, dev: _Device, job: dict, recv, deadline: float, details: dict):
    """"time" -> "timed"; host_rounds x ("go" -> "round"); "reveal" -> "shipped"; "done". Every clock
    reading here is this process's own. A candidate's timing is paired: the reference worker times the
    reference in one block just before and one just after the candidate's event and steady phases, on
    the same device and core, so both see the same machine. Returns (shipped message, revealed calls)
    or a failed EvalResult."""
    t = job["timing"]
    paired = job["mode"] == "candidate" and ev.opts.paired_reference
    busy = [0.0, 0.0]  # the runner's CPU seconds, and the wall seconds, while the reference was timed
    ref_blocks = [_quiet(w, busy, lambda: _reference_block(ev, dev, job, first=True))] if paired else []
    seed = secrets.randbits(31)
    started = time.monotonic()
    w.send({"cmd": "time", "seed": seed})
    ref_ms, pauses = 0.0, 0  # time spent on the reference's blocks, inside the candidate's event phase
    while True:
        timed = recv()
        if timed["kind"] != "block" or pauses == t["blocks"] - 1:
            break
        pauses += 1
        t0 = time.monotonic()
        if paired:
            ref_blocks.append(_quiet(w, busy, lambda: _reference_block(ev, dev, job)))
        ref_ms += (time.monotonic() - t0) * 1e3
        w.send({"cmd": "next"})
    event_wall_ms = (time.monotonic() - started) * 1e3 - ref_ms
    if timed["kind"] != "timed":
        return _failure(timed, details)
    if len(timed.get("digests", [])) != t["iters"]:
        return _forged(details, "the runner reported digests for another number of calls than it was asked to run")
    if paired:
        ref_blocks.append(_quiet(w, busy, lambda: _reference_block(ev, dev, job, last=True)))
    # Never an input set twice in a round (a cache keyed on contents or pointers would answer the repeat):
    # as many calls as distinct sets fit in host_bytes, at least one.
    calls = max(1, min(t["host_calls"], t["host_bytes"] // max(1, t["in_bytes"])))
    t["round_calls"] = calls
    rounds, ref_rounds, round_msgs, walls = [], [], [], []
    rng = secrets.SystemRandom()
    round_cpu = 0.0
    dev.ref_call({"cmd": "pin", "cpus": job.get("cpus")})
    try:
        for r in range(ev.opts.host_rounds):  # the fastest round counts: load only ever slows a round
            # Which call of the previous round will be verified, chosen after its digests arrived: the
            # runner keeps that output and lets the others go, so no round waits on fresh allocations.
            chosen = [r - 1, round_msgs[-1][2]] if round_msgs else None
            go = {"cmd": "go", "seed": secrets.randbits(31), "round": r, "sets": calls, "calls": calls,
                  "chosen": chosen}
            cpu = cpu_seconds(w)
            started = time.monotonic()
            w.send(go)
            msg = recv()
            walls.append(time.monotonic() - started)
            round_cpu += cpu_seconds(w) - cpu
            if msg["kind"] != "round":
                return _failure(msg, details)
            if len(msg.get("digests", [])) != calls:
                return _forged(details, "a host round reported digests for another number of calls than it ran")
            round_msgs.append((go, msg, rng.randrange(calls)))
            ref_rounds.append(_quiet(w, busy, lambda: _reference_round(dev, t, calls)))
    finally:
        dev.ref_call({"cmd": "pin", "cpus": None})
    rounds = walls
    too_busy = _cpu_check(ev, round_cpu, sum(walls), details)
    if too_busy is not None:
        return too_busy
    if busy[0] > 0.1 * busy[1] + CPU_SLACK_S or cpu_seconds(w) < busy[0]:
        return EvalResult("rejected", message=f"rejected: the candidate's processes used {busy[0]:.3f} s of CPU time "
                          f"during the {busy[1]:.3f} s its reference was being timed (they should be idle then): work "
                          "that slows the reference inflates the speedup", details=details)
    # Chosen now, after every output they may name was committed to.
    revealed = [{"key": ["t", i], "spec": {"seed": call_seed(seed, i), "dist": "own"}, "digest": timed["digests"][i]}
                for i in sorted(rng.sample(range(t["iters"]), min(ev.opts.verify_calls, t["iters"])))]
    for go, msg, i in round_msgs:
        revealed.append({"key": ["h", go["round"], i], "digest": msg["digests"][i],
                         "spec": {"seed": go["seed"], "dist": "own", "set_index": i % go["sets"]}})
    if job["mode"] != "candidate":
        revealed = []
    w.send({"cmd": "reveal", "calls": [{"key": c["key"], "spec": c["spec"]} for c in revealed]})
    shipped = recv()
    if shipped["kind"] != "shipped":
        return _failure(shipped, details)
    done = recv()
    if done["kind"] != "done":
        return _failure(done, details)
    details["flags"] += done.get("flags", [])
    # The protocol is fixed: after "done", nothing. Extra messages mean someone else used the channel.
    if _drain(w, deadline):
        return _forged(details, "the result channel carried messages the harness did not send")
    _timing_details(ev, timed, rounds, event_wall_ms, t, details)
    if paired and (figures := _paired_figures(ev, ref_blocks)) is not None:
        details["reference_timing"] = figures
    _host_rounds_details(ev, dev, job, rounds, ref_rounds, details)
    return shipped, revealed


def _quiet(w: _Worker, busy: list, measure):
    """Run a measurement of the reference, adding the runner's CPU time meanwhile to busy[0] and the wall
    time to busy[1]: the candidate's processes sit idle then, and work they do would slow the reference."""
    cpu, started = cpu_seconds(w), time.monotonic()
    out = measure()
    busy[0] += cpu_seconds(w) - cpu
    busy[1] += time.monotonic() - started
    return out


def _reference_round(dev: _Device, t: dict, calls: int) -> float:
    """The same host round on the reference, in the reference worker, timed by this process's clock."""
    msg = {"cmd": "round", "seed": secrets.randbits(31), "sets": calls, "calls": calls,
           "timing": {"host_calls": calls, "on_device": t["on_device"]}}
    started = time.monotonic()
    reply = dev.ref_call(msg)
    wall = time.monotonic() - started
    if reply.get("kind") != "round":
        raise RuntimeError(f"reference worker error: {reply.get('error')}")
    # A busy GPU made this round slow; the baseline run's round (no candidate alive then) stands in for it.
    if _gpu_was_busy(dev.ev, reply) and dev.clean_timing is not None:
        return dev.clean_timing["ref_round_s"]
    return wall


def _reference_block(ev, dev: _Device, job: dict, first: bool = False, last: bool = False) -> dict:
    """One block of the reference's paired measurement, timed by the reference worker on the runner's
    core: the first warms up as a runner does, the last also runs the steady phase."""
    t = job["timing"]
    block = dict(t, iters=max(8, t["iters"] // (3 * t["blocks"])), steady_passes=t["steady_passes"] if last else 0,
                 warmup_ms=min(t["warmup_ms"], 30.0 if first else 10.0))  # the GPU is warm: the trials just ran
    reply = dev.ref_call({"cmd": "time", "seed": secrets.randbits(31), "cpus": job.get("cpus"), "timing": block})
    if reply.get("kind") != "ref_timed":
        raise RuntimeError(f"reference worker error: {reply.get('error')}")
    reply["busy"] = _gpu_was_busy(ev, reply)
    return reply


def _gpu_was_busy(ev, reply: dict) -> bool:
    """The reference worker found the GPU busy just before or after timing the reference: work another
    process left running (a side stream the candidate's call never waited for, or another user of the
    GPU) slows the reference and would inflate the speedup. Such a block or round does not count."""
    return (reply.get("gpu_busy_ms") or 0.0) > ev.opts.gpu_busy_ms


def _paired_figures(ev, blocks: list[dict]) -> dict | None:
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


def cpu_seconds(w: _Worker) -> float:
    """CPU time (user + system, every thread, and waited-for children) of the runner and every process
    it started, read from /proc by us: the runner cannot report a smaller figure. Monotone: a process
    once seen keeps its last reading after it is gone (a child reaped without a wait, SIGCHLD ignored,
    takes its time with it from its parent's counters)."""
    seen = w.__dict__.setdefault("cpu_seen", {})
    for pid in find_processes({w.main_pid()}, w.mark):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            key = (pid, fields[19])   # with its start time: a pid reused later is another process
            seen[key] = max(seen.get(key, 0.0), sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS)
        except (OSError, IndexError, ValueError):
            pass
    return sum(seen.values())


def _cpu_check(ev, cpu_s: float, wall_s: float, details: dict) -> EvalResult | None:
    """More CPU time than cores allowed over the host rounds: work spread over extra threads or processes
    (a figure read afterwards from thread counts misses threads that ended in time). On a GPU the host
    thread spins in synchronise, so one more core's worth is allowed there."""
    threads = ev.opts.cpu_threads
    limit = wall_s * (threads + 1) if ev.device == "cuda" else max(1.5 * wall_s * threads, wall_s)
    limit += CPU_SLACK_S
    details.setdefault("timing_checks", {})["host_rounds_cpu"] = {"cpu_s": round(cpu_s, 4), "wall_s": round(wall_s, 4),
                                                                  "limit_s": round(limit, 4)}
    if cpu_s <= limit:
        return None
    return EvalResult("rejected", message=f"rejected: the runner used {cpu_s:.3f} s of CPU time in {wall_s:.3f} s "
                      f"of host rounds with {threads} CPU thread(s) allowed (limit {limit:.3f} s): work spread over "
                      "extra cores", details=details)


CPU_SLACK_S = 0.05  # /proc counts in clock ticks (10 ms), per thread and process
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _timing_details(ev, msg: dict, rounds: list, event_wall_ms: float, t: dict, details: dict) -> None:
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


def _host_rounds_details(ev, dev: _Device, job: dict, rounds: list, ref_rounds: list, details: dict) -> None:
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


def _host_figure(ev, timing: dict) -> tuple[float | None, float]:
    """The parent's estimate of the candidate's cost per call and its noise (None where there is none:
    the baseline, whose code is the reference's own)."""
    host_ms = timing.get("host_ms_per_call")
    return (None, 0.0) if host_ms is None else (host_ms, timing.get("host_noise_ms", 0.0))


def _verdict(ev, job: dict, details: dict) -> EvalResult:
    timing = details["timing"]
    runtime = _bounded_runtime(ev, timing)
    if job["mode"] == "candidate":
        if details["flags"]:
            return EvalResult("rejected", message="rejected: " + "; ".join(details["flags"][:3]), details=details)
        if timing["samples_sum_ms"] > timing["event_phase_wall_ms"]:
            return _forged(details, f"the reported timings add up to {timing['samples_sum_ms']:.3f} ms, more than "
                           f"the {timing['event_phase_wall_ms']:.3f} ms that passed")
        tail, plain = timing["device_tail_ms"], timing["plain_median_ms"]
        host_ms, noise = _host_figure(ev, timing)
        host_ms = timing.get("host_ms_uncapped", host_ms)
        margin = ev.opts.host_slack_ms + noise
        if tail is not None and tail > ev.opts.tail_ms:
            return EvalResult("rejected", message=f"rejected: the GPU was still busy {tail:.4f} ms (median) after "
                              "the call's stream had finished: work on another stream, which is how timers are "
                              "escaped", details=details)
        # Events far below the host rounds on a GPU: work escaping the timed window, said plainly (the floor
        # in _bounded_runtime would also catch it, with a less useful message for the model).
        ratio = ev.opts.host_ratio or 3.0
        if ev.device == "cuda" and host_ms is not None and plain * ratio < host_ms and host_ms - plain > margin:
            return EvalResult("rejected", message=f"timing mismatch: CUDA events say {plain:.4f} ms per call, "
                              f"the host clock {host_ms:.4f} ms; work is escaping the timed window",
                              details=details)
    return EvalResult("ok", correct=True, runtime_ms=runtime, details=details)


def _bounded_runtime(ev, timing: dict) -> float:
    """The runtime, never below the parent's own estimate less its noise and a margin: the runner's
    figures (max(a, c)) where they agree with it, else (host estimate - noise) / (1 + host_margin).

    The margin covers what still differs honestly between back-to-back rounds and the runner's phases
    (GPU clocks in short bursts, inputs drawn in the rounds), so an honest candidate's figure is its own
    and five evaluations repeat to 0.1%, while figures the runner forges lower its runtime by at most the
    margin plus the rounds' measured noise."""
    host_ms, noise = _host_figure(ev, timing)
    runtime = timing["runtime_ms"]
    if host_ms is None:
        return runtime
    margin = ev.opts.host_margin if ev.opts.host_margin is not None else (0.05 if ev.device == "cuda" else 0.10)
    floor = max(0.0, host_ms - noise) / (1.0 + margin)
    timing["host_floor_ms"] = floor
    if floor > runtime:
        timing["runner_runtime_ms"], timing["runtime_ms"] = runtime, floor
        timing["bound"] = "host clock (the runner's figures read lower)"
        return floor
    return runtime


def _forged(details: dict, what: str) -> EvalResult:
    return EvalResult("rejected", message=f"rejected: {what} (forged result)", details=details)


def _drain(w: _Worker, deadline: float) -> int:
    """Messages after the final one, until the worker's "end" record (sent right after it) or the channel
    closing."""
    extra = 0
    while True:
        try:
            msg = w.recv(max(0.1, min(10.0, deadline - time.monotonic())))
        except (EOFError, TimeoutError):
            return extra
        if msg.get("kind") == "end":
            return extra
        extra += 1


def _failure(msg: dict, details: dict) -> EvalResult:
    details["flags"] += msg.get("flags", [])
    kind, err = msg.get("kind"), msg.get("error", "")
    if kind == "rejected":
        return EvalResult("rejected", message=f"rejected: {err}", details=details)
    if kind not in ("error",):
        return _forged(details, f"the runner answered {kind!r} out of turn")
    if "out of memory" in err.lower():
        err = "out of memory: " + err
    where = msg.get("where", "run")
    status = "invalid" if where == "import" and "ModelNew" in err and "KeyError" in err else "runtime_error"
    return EvalResult(status, message=f"{where}: {err}", details=dict(details, error=err))


def _check_trials(ev, msg: dict, dev: _Device, specs: list, details: dict) -> EvalResult | None:
    # The perturbation applies by position among the 1-D parameters, in both processes; the reference
    # worker reported its own at start-up. A trial that cannot be run as specified fails; it is never dropped.
    shapes, ref_shapes = msg.get("shapes", []), dev.info.get("ref_shapes")
    if any(s["perturb"] for s in specs) and shapes != ref_shapes:
        return EvalResult("incorrect", message="the perturbed-weights trial cannot run: ModelNew's 1-D parameters "
                          f"(biases, norm weights) {_described(msg.get('names', []), shapes)} do not match the "
                          f"reference's {_described(dev.info.get('ref_names', []), ref_shapes or [])} in number and "
                          "shape; keep the reference's biases and norm parameters, registered in its order",
                          details=details)
    items = [{"spec": s, "index": k} for k, s in enumerate(specs)]
    reply = dev.ref_call({"cmd": "compare", "path": msg["path"], "field": "outputs", "items": items,
                          "rtol": ev.rtol, "atol": ev.atol, "l2_tol": ev.l2_tol})
    if reply["kind"] != "compared" or len(reply["results"]) != len(items):
        raise RuntimeError(f"reference worker error: {reply.get('error')}")
    details["trials"] = [dict(r, dist=it["spec"]["dist"], perturbed=it["spec"]["perturb"])
                         for r, it in zip(reply["results"], items)]
    details["check_s"] = round(msg.get("check_s", 0.0), 3)
    if details["flags"]:
        return EvalResult("rejected", message="rejected: " + "; ".join(details["flags"][:3]), details=details)
    for r, it in zip(reply["results"], items):
        if not r["ok"]:
            s = it["spec"]
            what = f"trial {it['index']} (inputs: {s['dist']}{', re-seeded and perturbed weights' if s['perturb'] else ''})"
            hint = (" (the k-th 1-D parameter, in registration order, gets the k-th perturbation in both models)"
                    if s["perturb"] else "")
            return EvalResult("incorrect", message=f"incorrect on {what}: {r['reason']}{hint}", details=details)
    return None


def _described(names: list, shapes: list) -> str:
    return "[" + ", ".join(f"{n} {tuple(sh)}" for n, sh in list(zip(names, shapes))[:8]) + "]"


def _verify_shipped(ev, dev: _Device, calls: list, path: str, details: dict) -> EvalResult | None:
    """The revealed calls' outputs against the reference (same seeds) and against their digests. An empty
    or short verification is a failure, never a pass."""
    if not calls:
        return _forged(details, "no timed output could be verified")
    items = [{"spec": dict(c["spec"], weight_seed=42, perturb=False, on_device=ev.opts.inputs_on_device),
              "index": k, "digest": c["digest"]} for k, c in enumerate(calls)]
    reply = dev.ref_call({"cmd": "compare", "path": path, "field": "shipped", "items": items,
                          "rtol": ev.rtol, "atol": ev.atol, "l2_tol": ev.l2_tol})
    results = reply.get("results") or []
    if reply.get("kind") != "compared" or len(results) != len(items):
        return _forged(details, "the timed outputs could not be verified")
    details["timed_checks"] = [{"call": c["key"], "ok": r["ok"]} for c, r in zip(calls, results)]
    for c, r in zip(calls, results):
        if not r["ok"]:
            phase = "timed call" if c["key"][0] == "t" else "back-to-back call"
            return EvalResult("incorrect", message=f"{phase} {c['key'][-1]} returned a wrong result (outputs "
                              f"cached or computed after the timer?): {r['reason']}", details=details)
    return None


def _steady_sets(ev, dev: _Device) -> int:
    return max(1, min(ev.opts.steady_sets, ev.opts.host_bytes // max(1, dev.info.get("in_bytes", 1))))


def _flush_bytes(ev, dev: _Device) -> int:
    return max(ev.opts.flush_bytes, 2 * int(dev.info.get("l2_bytes") or 0))


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


def physical_checks(ev, result: EvalResult, dev: _Device) -> None:
    """A runtime below what the hardware can do is impossible; a huge speedup is flagged."""
    floor = _floor_ms(ev, dev)
    result.details["floor_ms"] = floor
    if floor and result.runtime_ms is not None and result.runtime_ms < floor:
        result.status, result.correct = "rejected", False
        result.message = (f"rejected: {result.runtime_ms:.4f} ms is below the physical floor {floor:.4f} ms "
                          "for this task (bytes moved / peak bandwidth, flops / peak rate)")
        return
    if result.speedup and result.speedup > ev.opts.max_speedup:
        result.details["flags"].append(f"speedup {result.speedup:.1f}x above {ev.opts.max_speedup:g}x")
        result.message = f"ok, but the {result.speedup:.1f}x speedup is unusually high and flagged for review"
    else:
        result.message = f"ok: {result.speedup:.3g}x ({result.runtime_ms:.4g} ms vs {result.baseline_ms:.4g} ms)"


def _floor_ms(ev, dev: _Device) -> float:
    name = dev.info.get("device_name", "")
    bw, peak = next((v for k, v in _PEAKS.items() if k in name), (None, None))
    bw, peak = ev.opts.peak_bytes_per_s or bw, ev.opts.peak_flops or peak
    nbytes = (dev.baseline or {}).get("io_bytes", 0)
    floor = 0.0
    if bw and nbytes:
        floor = max(floor, nbytes / bw * 1e3)
    if peak and ev.flops:
        floor = max(floor, ev.flops / peak * 1e3)
    return floor
