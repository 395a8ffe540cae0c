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

import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

from . import figures
from .common import _DISTS, _PEAKS, EvalResult, call_seed
from .device import _Device, _FileLock, _NullCtx
from .protocol import _Worker
from .sandbox import find_processes


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
    reference in a block before, between and after the candidate's blocks of event calls, on the same
    device and core, so both see the same machine; after each of the candidate's host rounds it runs
    the same round on the reference. Returns (shipped message, revealed calls) or a failed EvalResult."""
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
        ref_blocks.append(_quiet(w, busy, lambda: _reference_block(ev, dev, job)))
    # Never an input set twice in a round (a cache keyed on contents or pointers would answer the repeat):
    # as many calls as distinct sets fit in host_bytes, at least one.
    calls = max(1, min(t["host_calls"], t["host_bytes"] // max(1, t["in_bytes"])))
    t["round_calls"] = calls
    ref_rounds, round_msgs, walls = [], [], []
    # On the CPU with one thread, each round's CPU time too (both sides): load stretches a round's wall
    # time but hardly its CPU time, so the floor by difference stays tight on a loaded machine.
    clocks = {"runner": [], "reference": []} if ev.device == "cpu" and ev.opts.cpu_threads == 1 else None
    rng = secrets.SystemRandom()
    round_cpu = 0.0
    dev.ref_call({"cmd": "pin", "cpus": job.get("cpus")})
    try:
        r = 0
        while _more_rounds(ev, r, ref_rounds):  # the fastest round counts: load only ever slows a round
            # Which call of the previous round will be verified, chosen after its digests arrived: the
            # runner keeps that output and lets the others go, so no round waits on fresh allocations.
            chosen = [r - 1, round_msgs[-1][2]] if round_msgs else None
            go = {"cmd": "go", "seed": secrets.randbits(31), "round": r, "sets": calls, "calls": calls,
                  "chosen": chosen}
            cpu, clock = cpu_times(w, clocks is not None)
            started = time.monotonic()
            w.send(go)
            msg = recv()
            walls.append(time.monotonic() - started)
            cpu_after, clock_after = cpu_times(w, clocks is not None)
            round_cpu += cpu_after - cpu
            if clocks is not None:
                clocks["runner"].append(clock_after - clock)
            if msg["kind"] != "round":
                return _failure(msg, details)
            if len(msg.get("digests", [])) != calls:
                return _forged(details, "a host round reported digests for another number of calls than it ran")
            round_msgs.append((go, msg, rng.randrange(calls)))
            ref_rounds.append(_quiet(w, busy, lambda: _reference_round(dev, t, calls, clocks)))
            r += 1
    finally:
        dev.ref_call({"cmd": "pin", "cpus": None})
    too_busy = _cpu_check(ev, round_cpu, sum(walls), details)
    if too_busy is not None:
        return too_busy
    if busy[0] > 0.1 * busy[1] + CPU_SLACK_S:
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
    figures.timing_details(ev, timed, walls, event_wall_ms, t, details)
    if paired and (paired_fig := figures.paired_figures(ev, ref_blocks)) is not None:
        details["reference_timing"] = paired_fig
    figures.host_rounds_details(ev, dev, job, walls, ref_rounds, details, clocks)
    return shipped, revealed


def _quiet(w: _Worker, busy: list, measure):
    """Run a measurement of the reference, adding the runner's CPU time meanwhile to busy[0] and the wall
    time to busy[1]: the candidate's processes sit idle then, and work they do would slow the reference."""
    cpu, started = cpu_seconds(w), time.monotonic()
    out = measure()
    busy[0] += cpu_seconds(w) - cpu
    busy[1] += time.monotonic() - started
    return out


def _more_rounds(ev, done: int, ref_rounds: list[float]) -> bool:
    """host_rounds rounds, then more (up to host_rounds_max) until the reference's two fastest agree within
    host_settle. The floor's noise allowance is their difference: on a loaded 2-core machine four rounds
    left it at up to 95% of the call (a forged runtime of 0.1 ms passed for a 1.1 ms call); the rounds
    alternate between the two sides, so the extra ones give both more chances at a quiet moment."""
    if done < ev.opts.host_rounds:
        return True
    if done >= ev.opts.host_rounds_max:
        return False
    if len(ref_rounds) < 2:
        return True
    fastest = sorted(ref_rounds)[:2]
    return fastest[1] - fastest[0] > ev.opts.host_settle * fastest[0]


def _reference_round(dev: _Device, t: dict, calls: int, clocks: dict | None = None) -> float:
    """The same host round on the reference, in the reference worker, timed by this process's clock (and,
    where clocks is given, its CPU time appended to clocks["reference"])."""
    msg = {"cmd": "round", "seed": secrets.randbits(31), "sets": calls, "calls": calls,
           "timing": {"host_calls": calls, "on_device": t["on_device"]}}
    pid = dev.ref.main_pid()
    clock = _process_clock_s(pid) if clocks is not None else None
    started = time.monotonic()
    reply = dev.ref_call(msg)
    wall = time.monotonic() - started
    if clock is not None:
        after = _process_clock_s(pid)
        if after is not None:
            clocks["reference"].append(after - clock)
    if reply.get("kind") != "round":
        raise RuntimeError(f"reference worker error: {reply.get('error')}")
    # A busy GPU made this round slow; the baseline run's round (no candidate alive then) stands in for it.
    if _gpu_was_busy(dev.ev, reply) and dev.clean_timing is not None:
        return dev.clean_timing["ref_round_s"]
    return wall


def _reference_block(ev, dev: _Device, job: dict, first: bool = False) -> dict:
    """One block of the reference's paired measurement, timed by the reference worker on the runner's
    core: the first warms up as a runner does; each ends with its steady passes, as the runner's blocks do."""
    t = job["timing"]
    block = dict(t, iters=max(8, t["iters"] // (3 * t["blocks"])),
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


def cpu_seconds(w: _Worker) -> float:
    """CPU time (user + system, every thread, and waited-for children) of the runner and every process
    it started, read from /proc by us: the runner cannot report a smaller figure. Monotone: a process
    once seen keeps its last reading after it is gone (a child reaped without a wait, SIGCHLD ignored,
    takes its time with it from its parent's counters)."""
    return cpu_times(w, clocks=False)[0]


def cpu_times(w: _Worker, clocks: bool) -> tuple[float, float]:
    """cpu_seconds, and with `clocks` the same processes' time from their own CPU clocks (nanosecond
    resolution where /proc ticks every 10 ms; every thread, those that have ended too), in one walk of the
    runner's processes. A process started and ended between two readings is missed by the clocks (the
    wall-clock floor still bounds what it did)."""
    ticks, clock = w.__dict__.setdefault("cpu_seen", {}), w.__dict__.setdefault("clock_seen", {})
    for pid in find_processes({w.main_pid()}, w.mark):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            key = (pid, fields[19])   # with its start time: a pid reused later is another process
            ticks[key] = max(ticks.get(key, 0.0), sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS)
        except (OSError, IndexError, ValueError):
            continue
        reading = _process_clock_s(pid) if clocks else None
        if reading is not None:
            clock[key] = max(clock.get(key, 0.0), reading)
    return sum(ticks.values()), sum(clock.values())


def _process_clock_s(pid: int) -> float | None:
    """The CPU time of process pid, all its threads (Linux's process-wide CPU clock of another process:
    clock id ((~pid) << 3) | 2); None where that clock cannot be read."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9
    except (OSError, OverflowError, AttributeError):
        return None


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


def _verdict(ev, job: dict, details: dict) -> EvalResult:
    timing = details["timing"]
    runtime = figures.bounded_runtime(ev, timing)
    if job["mode"] == "candidate":
        if details["flags"]:
            return EvalResult("rejected", message="rejected: " + "; ".join(details["flags"][:3]), details=details)
        if timing["samples_sum_ms"] > timing["event_phase_wall_ms"]:
            return _forged(details, f"the reported timings add up to {timing['samples_sum_ms']:.3f} ms, more than "
                           f"the {timing['event_phase_wall_ms']:.3f} ms that passed")
        tail, plain = timing["device_tail_ms"], timing["plain_median_ms"]
        host_ms, noise = figures.host_figure(ev, timing)
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
