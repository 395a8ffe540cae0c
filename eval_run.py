"""Parent side of one run: the conversation with a runner (the candidate's process) and the verdict.

Public flow of run(): trial specs (seeds drawn here) -> runner computes the trials while the reference
worker computes its own -> compare (reference worker) -> "time" with a fresh seed -> event samples and a
digest of every timed output -> host rounds, each bracketed by this process's clock -> reveal which calls
to ship -> verify them (reference worker: outputs and digests) -> the checks that decide the verdict.

What is believed from the runner: nothing on its word. Trial and timed outputs count only as the
reference worker judges them; the event samples count only while consistent with this process's clock
(their sum within the event phase's wall time, their median within host_ratio of the host rounds'
wall time per call); its flags can only hurt it. See evaluate_kernel.py's docstring for the whole boundary.
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
              "host_overhead_ms": dev.info.get("host_overhead_ms", 0.0)}
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
    msg, calls = timed
    t = mark("timing", t)
    details["time_s"] = round(time.monotonic() - t0, 3)
    if job["mode"] == "candidate":
        bad = _verify_shipped(ev, dev, calls, msg["path"], details)
        mark("verify", t)
        if bad is not None:
            return bad
    return _verdict(ev, job, details)


def _converse_timing(ev, w: _Worker, dev: _Device, job: dict, recv, deadline: float, details: dict):
    """"time" -> "timed"; host_rounds x ("go" -> "round"); "reveal" -> "shipped"; "done". Every clock
    reading here is this process's own. Returns (shipped message, revealed calls) or a failed EvalResult."""
    t = job["timing"]
    seed = secrets.randbits(31)
    started = time.monotonic()
    w.send({"cmd": "time", "seed": seed})
    timed = recv()
    event_wall_ms = (time.monotonic() - started) * 1e3
    if timed["kind"] != "timed":
        return _failure(timed, details)
    if len(timed.get("digests", [])) != t["iters"]:
        return _forged(details, "the runner reported digests for another number of calls than it was asked to run")
    host_sets = max(2, min(t["host_calls"], t["host_bytes"] // max(1, t["in_bytes"])))
    latency = _round_trip_s(dev)
    overhead = dev.ref_call({"cmd": "ping", "overhead": True}).get("host_overhead_ms") or 0.0
    # Both are taken off the parent's clock, and both were measured while the candidate's process lived (it
    # could slow them, e.g. by stopping the reference worker). Capped at twice what they were during the
    # baseline's run, when no candidate process existed: a stall no longer buys a lower figure.
    if job["mode"] == "baseline" or dev.clean_timing is None:
        dev.clean_timing = {"latency": latency, "overhead_ms": max(overhead, t["host_overhead_ms"])}
    latency = min(latency, 2 * dev.clean_timing["latency"])
    t["host_overhead_ms"] = min(overhead, 2 * dev.clean_timing["overhead_ms"])
    rounds, round_msgs, walls = [], [], []
    cpu_before = cpu_seconds(w)
    for r in range(ev.opts.host_rounds):  # the fastest round counts: load only ever slows a round
        go = {"cmd": "go", "seed": secrets.randbits(31), "round": r, "sets": host_sets}
        started = time.monotonic()
        w.send(go)
        msg = recv()
        walls.append(time.monotonic() - started)
        rounds.append(max(0.0, walls[-1] - latency))
        if msg["kind"] != "round":
            return _failure(msg, details)
        if len(msg.get("digests", [])) != t["host_calls"]:
            return _forged(details, "a host round reported digests for another number of calls than it ran")
        round_msgs.append((go, msg))
    too_busy = _cpu_check(ev, cpu_seconds(w) - cpu_before, sum(walls), details)
    if too_busy is not None:
        return too_busy
    rng = secrets.SystemRandom()  # chosen now, after every output it may name was committed to
    calls = [{"key": ["t", i], "spec": {"seed": call_seed(seed, i), "dist": "own"}, "digest": timed["digests"][i]}
             for i in sorted(rng.sample(range(t["iters"]), min(ev.opts.verify_calls, t["iters"])))]
    for go, msg in round_msgs:
        i = rng.randrange(t["host_calls"])
        calls.append({"key": ["h", go["round"], i], "digest": msg["digests"][i],
                      "spec": {"seed": go["seed"], "dist": "own", "set_index": i % go["sets"]}})
    if job["mode"] != "candidate":
        calls = []
    w.send({"cmd": "reveal", "calls": [{"key": c["key"], "spec": c["spec"]} for c in calls]})
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
    _timing_details(timed, rounds, event_wall_ms, t, details)
    return shipped, calls


def cpu_seconds(w: _Worker) -> float:
    """CPU time (user + system, every thread, and waited-for children) of the runner and every process
    it started, read from /proc by us: the runner cannot report a smaller figure."""
    total = 0.0
    for pid in find_processes({w.main_pid()}, w.mark):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            pass
    return total


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
OVERHEAD_SHARE = 0.5  # the most of a host round's time per call that counts as bookkeeping


def _round_trip_s(dev: _Device, tries: int = 3) -> float:
    """The fastest message round trip to the reference worker (a process like the runner, but one the
    candidate never ran in): taken off each host round, whose window holds one such round trip."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.monotonic()
        dev.ref_call({"cmd": "ping"})
        best = min(best, time.monotonic() - t0)
    return best if best < 0.05 else 0.0


def _timing_details(msg: dict, rounds: list, event_wall_ms: float, t: dict, details: dict) -> None:
    samples = sorted(msg["samples"])
    median = _quantile(samples, 0.5)
    iqr = _quantile(samples, 0.75) - _quantile(samples, 0.25)
    raw_ms = min(rounds) * 1e3 / t["host_calls"] if rounds else None
    overhead = t.get("host_overhead_ms", 0.0) / t["host_calls"]
    tail = _quantile(sorted(msg.get("tails") or []), 0.5)
    # Without a lead (every fourth call) the host's latency is in the sample, as in KernelBench: the host
    # check compares those with the host clock, so a launch-bound call is not mistaken for escaped work.
    plain = _quantile(sorted(msg.get("plain_samples") or msg["samples"]), 0.5)
    # The lead hides the host's time to queue the call; when the host is the slower side (launch-bound
    # calls), the call costs the host's time per call instead, as it would queued back to back.
    queue = _quantile(sorted(msg.get("queue_ms") or []), 0.5)
    runtime = max(median, queue) if msg.get("lead_ms") and not math.isnan(queue) else median
    details["timing"] = {"samples_ms": msg["samples"], "median_ms": median, "iqr_ms": iqr,
                         "spread": iqr / median if median else None, "host_ms_per_call": raw_ms,
                         "batch_wall_ms_per_call": raw_ms, "batch_overhead_ms_per_call": overhead,
                         "event_phase_wall_ms": event_wall_ms,
                         "rounds_ms": [r * 1e3 for r in rounds],
                         "samples_sum_ms": sum(msg["samples"]) + sum(msg.get("plain_samples") or []),
                         "host_queue_ms": None if math.isnan(queue) else queue,
                         "runtime_ms": runtime, "bound": "host" if runtime > median else "gpu",
                         "plain_samples_ms": msg.get("plain_samples", []), "plain_median_ms": plain,
                         "device_tail_ms": None if math.isnan(tail) else tail, "tails_ms": msg.get("tails", []),
                         "lead_ms": msg.get("lead_ms", 0.0), "io_bytes": msg.get("io_bytes", 0),
                         "peak_bytes": msg.get("peak_bytes")}


def _host_figure(ev, timing: dict) -> tuple[float | None, float]:
    """The host rounds' wall time per call less the rounds' own bookkeeping (drawing input sets, a digest
    and a copy of each output), and the margin the host check allows.

    The bookkeeping is measured by the reference worker just before the rounds (the same steps on the
    reference's output, in a process the candidate never ran in, under the load of that moment); it is
    taken off, and allowed again as margin: calls much cheaper than it are not judged by the host check.
    """
    raw = timing["batch_wall_ms_per_call"]
    if raw is None:
        return None, 0.0
    # At most half the batch: the figure the parent's clock gives can shrink by no more than that.
    overhead = min(timing["batch_overhead_ms_per_call"] or 0.0, OVERHEAD_SHARE * raw)
    host_ms = max(raw - overhead, 0.0)
    timing["host_check"] = {"host_ms_per_call": host_ms, "overhead_ms_per_call": overhead}
    return host_ms, ev.opts.host_slack_ms + overhead


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
        host_ms, margin = _host_figure(ev, timing)
        if tail is not None and tail > ev.opts.tail_ms:
            return EvalResult("rejected", message=f"rejected: the GPU was still busy {tail:.4f} ms (median) after "
                              "the call's stream had finished: work on another stream, which is how timers are "
                              "escaped", details=details)
        # On the CPU the host figure is the runtime itself (_bounded_runtime), so events that read lower
        # change nothing and are not judged; on a GPU they are the figure and must agree with the host's.
        ratio = ev.opts.host_ratio or 3.0
        if ev.device == "cuda" and host_ms is not None and plain * ratio < host_ms and host_ms - plain > margin:
            return EvalResult("rejected", message=f"timing mismatch: CUDA events say {plain:.4f} ms per call, "
                              f"the host clock {host_ms:.4f} ms; work is escaping the timed window",
                              details=details)
    return EvalResult("ok", correct=True, runtime_ms=runtime, details=details)


def _bounded_runtime(ev, timing: dict) -> float:
    """The reported runtime, never below the parent's own figure: on the CPU it is the host rounds' time
    per call (the runner's event samples add nothing there); on a GPU the event figure, or the host
    figure where that is larger. Samples the runner reports can then lower nothing."""
    host_ms, _ = _host_figure(ev, timing)
    event = timing["runtime_ms"]
    if host_ms is None:
        return event
    runtime = host_ms if ev.device != "cuda" else max(event, host_ms)
    timing["event_runtime_ms"], timing["runtime_ms"] = event, runtime
    if ev.device != "cuda":
        timing["bound"] = "host clock"
    elif runtime > event:
        timing["bound"] = "host clock (above the events)"
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
