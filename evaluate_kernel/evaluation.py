"""Parent side: one evaluation, one object. A fresh runner (the candidate's process) is used once.

Public flow, Evaluation.run():

    trials    the runner computes the trials' outputs from seeds drawn here; the reference worker judges
    timing    batches alternate between the reference's side and the runner (clock.py), each timed by
              this process; the runner is stopped (SIGSTOP) whenever it is not its turn, until the
              speedup's interval is narrow enough (or the pairs or the time run out).
              CPU: the reference worker writes a batch's inputs into the runner's input file; the runner
              runs "go" alone, timed by its CPU time (stopped.py); the reference is timed the same way in
              a runner of its own (host_batches.py).
              GPU: "draw", "go", "digest" in the runner and in the reference worker, every step timed by
              this process's clock; the reference worker waits until the device is idle before the
              reference runs, the wait charged to the batch before it (batches.py)
    verify    after every candidate batch, untimed, calls chosen once the batch is over. CPU: their
              outputs read from the stopped runner's memory (readout.py), and from the reference's runner;
              GPU: shipped by the runner, whose digests came first. The reference worker compares them
    verdict   every figure finite and positive, or a rejection that says which

Nothing the runner says is believed: its outputs count as the reference worker judges them; its only
part in the runtime is when its answers arrive (CPU: the CPU time it spends). The baseline (src None)
runs the reference's own Model in a runner by the same protocol: its speedup is the protocol's self-check
(close to 1).
"""
from __future__ import annotations

import gc
import math
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

from . import clock, readout, verdict
from .common import _DISTS, EvalResult, _remove
from .verdict import failure as _failure, forged as _forged
from .device import Device, FileLock, NullCtx
from .protocol import Worker
from .stopped import cpu_seconds, stop
from .sandbox import find_processes, kill_processes


class Evaluation:
    """One candidate (src) or the baseline (src None: the reference Model) on one device slot."""

    def __init__(self, ev, dev: Device, src: str | None, source_hash: str, details: dict, locked: bool = False):
        self.ev, self.dev, self.src, self.details, self.locked = ev, dev, src, details, locked
        self.opts = ev.opts
        self.mode = "baseline" if src is None else "candidate"
        self.specs = trial_specs(self.opts) if src is not None else [_own_spec(self.opts)]
        self.cpus = ev.runner_cpus(dev)
        self.job = ev.job("run", mode=self.mode, candidate_src=src, device=ev.torch_device(), trials=self.specs,
                          build=ev.build_config(), poison_bytes=self.opts.poison_bytes, env=ev.extension_env(source_hash),
                          cpus=self.cpus, ref_names=dev.info.get("ref_names"), ref_shapes=dev.info.get("ref_shapes"),
                          on_device=self.opts.inputs_on_device, no_processes=ev.device != "cuda")
        self.phases: dict = {}
        self.deadline = 0.0
        self.w: Worker | None = None
        self._frozen = False
        self._main: int | None = None
        self.mem: readout.Memory | None = None     # (CPU, timing) the runner's memory
        self.rr: Worker | None = None               # (CPU) the reference's runner, and its memory
        self.rr_mem: readout.Memory | None = None
        self._ref_geometry: list | None = None     # (CPU) the reference's outputs: dtype, shape, stride,
        self._ref_views: set[int] = set()          # and those it returns as views of its inputs

    # ------------------------------------------------------------------------------------------ the flow
    def run(self) -> EvalResult:
        work = tempfile.mkdtemp(prefix="run-", dir=self.ev.cache_dir)
        self.job["work_dir"] = work
        self.readout_dir = tempfile.mkdtemp(prefix="run-", dir=self.ev.readout_dir)   # (CPU) ours alone
        t_wait = time.monotonic()
        try:
            with (NullCtx() if self.locked else self.dev.lock), FileLock(self.dev.gpu_lock_path):
                self.phases[f"{'gpu' if self.ev.device == 'cuda' else 'cpu'}_wait"] = round(time.monotonic() - t_wait, 3)
                self.details["phases"] = self.phases
                self.w = self.dev.take_runner()
                if self.w.arena is not None:
                    self.job["arena"] = {"fd": self.w.arena[0], "size": self.w.arena[1]}
                prepare = self._prepare()
                try:
                    return self._drive(prepare)
                finally:
                    self._thaw()
                    if prepare is not None:
                        futures_wait([prepare])  # nothing of this evaluation may still run when the lock goes
                    strays = self.w.discard()  # used once: all it started dies with it
                    self.dev.resume_ref()
                    if strays:
                        self.details["stray_processes_killed"] = strays
                    self.dev.settle_spare(final=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(self.readout_dir, ignore_errors=True)

    def _drive(self, prepare: Future | None) -> EvalResult:
        t0 = time.monotonic()
        self.deadline = t0 + self.opts.run_timeout_s
        try:
            sent = time.time()
            self.w.send(self.job)
            msg = self._recv()
            if msg.get("kind") == "ready":  # the runner's start-up report (unless settle_spare read it)
                msg = self._recv()
            if msg.get("kind") != "outputs":
                return _failure(msg, self.details)
            self._note_runner(msg, sent)
            t = time.monotonic()
            if self.mode == "candidate":
                if prepare is not None:
                    futures_wait([prepare])  # if it failed, the comparison computes what is missing
                bad = self._check_trials(msg)
                if bad is not None:
                    return bad
            t = self._mark("compare", t)
            self.dev.settle_spare()  # the next runner's CUDA start-up must not overlap the timing
            t = self._mark("spare_wait", t)
            timed = self._time()
            t = self._mark("timing", t)
            if isinstance(timed, EvalResult):
                return timed
            return self._verdict(timed)
        except _Answered as e:
            return _failure(e.msg, self.details)
        except TimeoutError:
            return EvalResult("timeout", message=f"run exceeded {self.opts.run_timeout_s:.0f} s "
                                                 "(infinite loop or deadlock?)", details=self.details)
        except (EOFError, OSError):
            return EvalResult("runtime_error", message=f"{self.w.death()}. Log tail: {self.w.log_tail(400)}",
                              details=self.details)
        except RuntimeError as e:
            # The reference worker failed while this candidate's process lived (its memory taken, its
            # files rewritten): that candidate's result. The reference's own run (the baseline) raises.
            if self.mode != "candidate":
                raise
            return EvalResult("runtime_error", message=f"the reference worker could not do its part while this "
                              f"candidate's process was alive: {e}", details=self.details)
        finally:
            self.details["time_s"] = round(time.monotonic() - t0, 3)

    # ------------------------------------------------------------------------------------------ timing
    def _time(self) -> dict | EvalResult:
        """Alternate batches until the interval is narrow enough; returns what _verify and _verdict need."""
        opts, dev = self.opts, self.dev
        gpu = self.ev.device == "cuda"
        target = opts.target_ci if opts.target_ci is not None else (0.005 if gpu else 0.02)
        budget_s = opts.timing_s if opts.timing_s is not None else (10.0 if gpu else 2.0)
        budget = opts.batch_bytes or ((4 << 30) if gpu else (512 << 20))
        per_call_bytes = int(dev.info.get("in_bytes", 1)) + int(dev.info.get("out_bytes", 1))
        host = not gpu
        extra = {}
        if host:   # the input files of both runners, which the reference worker opens through us
            self.rr = dev.reference_runner()
            extra["arenas"] = {side: {"path": f"/proc/{os.getpid()}/fd/{w.arena[0]}", "size": w.arena[1]}
                               for side, w in (("runner", self.w), ("reference", self.rr))}
        dev.ref_call({"cmd": "timing", "cpus": self.cpus, **extra})   # fresh batches, on the runner's cores
        _NoCollections.hold()
        try:
            bad = self._freeze()
            if bad is not None:
                return bad
            if host:
                self.rr_mem = readout.Memory(self.rr.main_pid())
                try:
                    self.mem = readout.Memory(self.main)
                except OSError as e:
                    return EvalResult("rejected", message=f"rejected: the runner's memory cannot be read ({e.strerror}): "
                                      "a candidate may not make its process unreadable (if every candidate gets this, "
                                      "the machine forbids reading a child's memory: Yama's ptrace_scope above 1)",
                                      details=self.details)
            cands, checks = [], []
            ref_ms = dev.ref_ms
            if ref_ms is None:   # the baseline's run: the reference alone first, to size the batches
                r0 = self._calibrate(budget, per_call_bytes)
                ref_ms = r0.calls / r0.n * 1e3
            n = clock.calls_per_batch(ref_ms, None, per_call_bytes, opts.batch_ms, opts.max_batch_ms, budget)
            first = self._host_ref_batch if host else (lambda seed, n: self._ref_batch(seed, n, -1, None))
            refs = [r0] if dev.ref_ms is None else [first(secrets.randbits(31), n)]
            started, f = time.monotonic(), None
            for i in range(opts.max_pairs + 1):
                seed = secrets.randbits(31)
                t = time.monotonic()
                c, values = self._host_cand_batch(seed, n) if host else self._cand_batch(seed, n, i)
                if isinstance(c, EvalResult):
                    return c
                if not host:   # on the CPU the phases are CPU seconds, not the wall's
                    self._spent("candidate batch", t, sum(getattr(c, p) for p in clock.PHASES))
                cands.append(c)
                if i == 0:   # a candidate faster than the reference gets longer batches (never shorter ones:
                    # a warm-up made slow on purpose would shrink them until fixed costs rival the calls)
                    n_next = max(n, clock.calls_per_batch(ref_ms, clock.cost_ms(c, clock.typical([c]),
                                                                                 clock.typical(refs[-1:])),
                                                          per_call_bytes, opts.batch_ms, opts.max_batch_ms, budget))
                else:
                    n_next = n
                # The calls to check, chosen now that their digests (on the CPU: the stopped runner's claim of
                # where its outputs lie) are in.
                chosen = self._choose(c.n, n_next)
                if host:
                    path = os.path.join(self.readout_dir, f"read-{i}.out")
                    problem = readout.write(path, self.mem, values, chosen)
                    if problem is not None:
                        return _forged(self.details, problem)
                    refs.append(self._host_ref_batch(seed, n_next, chosen))
                    step, base = values.layout["set_bytes"], values.layout["base"]
                    items = [{"key": f"{i}:{j}", "call": j, "inputs": [base + j * step, step]} for j in chosen]
                else:
                    t = time.monotonic()
                    path = os.path.join(self.job["work_dir"], f"shipped-{i}.bin")
                    self.w.send({"cmd": "ship", "path": path, "calls": chosen})
                    self._reply("shipped")
                    t = self._spent("ship", t)
                    bad = self._stop_runner(c)
                    if bad is not None:
                        return bad
                    t = self._spent("stop", t, c.probe)
                    refs.append(self._ref_batch(seed, n_next, i, {"batch": i, "calls": chosen}))
                    self._spent("reference batch", t, sum(getattr(refs[-1], p) for p in clock.PHASES))
                    items = [{"key": f"{i}:{j}", "digest": values[j]} for j in chosen]
                t = time.monotonic()
                bad = self._check(path, items, checks)
                if bad is not None:
                    return bad
                self._spent("check", t)
                n = n_next
                f = clock.figures(refs, cands)
                out_of_time = time.monotonic() - started > budget_s and f is not None   # one pair counts, always
                if clock.enough(f, target, opts.min_pairs) or out_of_time:
                    break
            if gpu:
                self.details["probe_idle_ms"] = dev.info.get("probe_ms")
            return {"figures": f, "refs": refs, "cands": cands}
        finally:
            _NoCollections.release()
            self._thaw()
            for mem in (self.mem, self.rr_mem):
                if mem is not None:
                    mem.close()
            self.mem = self.rr_mem = None
            dev.ref_call({"cmd": "pin", "cpus": None})

    def _calibrate(self, budget: int, per_call_bytes: int) -> clock.Batch:
        """The reference alone, a few batches growing until one lasts about a quarter of batch_ms: its
        time per call sizes the batches (the baseline's run; candidates reuse that figure). The last one
        is the first reference batch of the alternation."""
        n, n_max = 1, max(1, budget // max(1, per_call_bytes))
        for _ in range(8):
            seed = secrets.randbits(31)
            b = self._host_ref_batch(seed, n) if self.ev.device != "cuda" else self._ref_batch(seed, n, -1, None)
            ms = b.calls * 1e3
            if ms >= self.opts.batch_ms / 4 or n >= n_max:
                break
            n = min(n_max, max(2 * n, math.ceil(n * self.opts.batch_ms / 2 / max(ms, 1e-3))))
        return b

    def _clock(self, pid: int):
        """What a batch's steps are timed by: this process's clock on a GPU; on the CPU the worker's own CPU
        time (every thread), which a busy neighbour taking the core does not inflate."""
        if self.ev.device == "cuda":
            return time.monotonic
        return lambda: cpu_seconds(pid)

    def _ref_batch(self, seed: int, n: int, batch: int, keep: dict | None) -> clock.Batch:
        b = clock.Batch("ref", n)
        call, now = self.dev.ref_call, self._clock(self.dev.ref.main_pid())
        t = now()
        self._expect(call({"cmd": "draw", "seed": seed, "n": n, "batch": batch, "keep": keep}), "drawn")
        t = self._lap(b, "draw", t, now)
        self._expect(call({"cmd": "go"}), "done")
        t = self._lap(b, "calls", t, now)
        if self.ev.device == "cuda":
            self._drain(b, "settle")
            t = now()
        self._expect(call({"cmd": "digest"}), "digests")
        self._lap(b, "digest", t, now)
        if self.ev.device == "cuda":
            self._drain(b, "probe")
        return b

    def _cand_batch(self, seed: int, n: int, batch: int):
        """One batch of the runner's: (Batch, the digests it committed to) or (a rejection, None)."""
        b = clock.Batch("cand", n)
        self._thaw()
        now = self._clock(self.main)
        t = now()
        self.w.send({"cmd": "draw", "seed": seed, "n": n, "batch": batch})
        self._reply("drawn")
        t = self._lap(b, "draw", t, now)
        self.w.send({"cmd": "go"})
        self._reply("done")
        t = self._lap(b, "calls", t, now)
        if self.ev.device == "cuda":   # work still running on any stream after "done" is the calls'
            bad = self._drain(b, "settle")
            if bad is not None:
                return bad, None
            t = now()
        self.w.send({"cmd": "digest"})
        msg = self._reply("digests")
        self._lap(b, "digest", t, now)
        values = msg.get("digests")
        if not isinstance(values, list) or len(values) != n or not all(type(v) is int for v in values):
            return _forged(self.details, "the runner sent digests for another number of calls than it made"), None
        return b, values

    def _host_ref_batch(self, seed: int, n: int, chosen: list[int] | None = None) -> clock.Batch:
        """(CPU) A batch of the reference's runner, timed as the candidate's are (_host_cand_batch); with
        `chosen`, the outputs of those calls, read from it afterwards, are what the candidate's are checked
        against. Its failure is the reference's: RuntimeError, and a new runner for the next timing."""
        rr = self.rr
        layout = self._expect(self.dev.ref_call({"cmd": "fill", "seed": seed, "n": n, "target": "reference"}),
                              "filled")["layout"]
        try:
            pid = rr.main_pid()
            stop(pid)   # stopped already, except in its first batch
            b = clock.Batch("ref", n)
            t = cpu_seconds(pid, stopped=True)
            rr.send({"cmd": "go", "layout": layout})
            os.kill(pid, signal.SIGCONT)
            reply = rr.recv(self.opts.run_timeout_s)
            stop(pid)
            b.calls = cpu_seconds(pid, stopped=True) - t
            if reply.get("kind") != "done":
                raise RuntimeError(f"the reference's runner answered {reply.get('kind')}: {reply.get('error')}")
            if self._ref_geometry is None:
                st = os.fstat(rr.arena[0])
                self._ref_geometry = reply["geometry"]
                self._ref_views = readout.views_of_inputs(reply, readout.mappings(pid, st.st_dev, st.st_ino))
            if chosen is not None:
                c = readout.claim(reply, n, self._ref_geometry)
                if isinstance(c, str) or readout.write(self._ref_path, self.rr_mem, c, chosen) is not None:
                    raise RuntimeError(f"the reference's outputs could not be read: {c}")
        except (EOFError, TimeoutError, OSError, RuntimeError) as e:
            self.dev.drop_ref_runner()
            raise RuntimeError(f"the reference's runner failed ({e!r})") from None
        return b

    def _host_cand_batch(self, seed: int, n: int):
        """(CPU) One batch of the runner's: (Batch, its checked claim of where its outputs lie) or (a
        rejection, None). Its inputs are written into its file while it is stopped (the reference's runner
        gets the same ones next); it runs only inside its one step, whose CPU time is read with it stopped
        before and after."""
        reply = self._expect(self.dev.ref_call({"cmd": "fill", "seed": seed, "n": n, "target": "runner"}), "filled")
        b = clock.Batch("cand", n)
        t = cpu_seconds(self.main, stopped=True)
        self.w.send({"cmd": "go", "layout": reply["layout"]})
        self._thaw()
        msg = self._reply("done")
        bad = self._freeze()
        if bad is not None:
            return bad, None
        b.calls = cpu_seconds(self.main, stopped=True) - t
        st = os.fstat(self.w.arena[0])
        c = readout.claim(msg, n, self._ref_geometry or [], readout.mappings(self.main, st.st_dev, st.st_ino),
                          self._ref_views)
        if isinstance(c, str):
            return _forged(self.details, c), None
        c.layout = reply["layout"]
        return b, c

    def _stop_runner(self, b: clock.Batch) -> EvalResult | None:
        """The runner stopped, and (GPU) the device drained before the reference runs: the wait is the
        candidate batch's probe step."""
        bad = self._freeze()
        if bad is None and self.ev.device == "cuda":
            bad = self._drain(b, "probe")
        return bad

    def _drain(self, b: clock.Batch, phase: str) -> EvalResult | None:
        """(GPU) Probe until a trivial kernel of the prober's (a context of its own, so either side pays
        the same switches) runs at once: the device holds no one's work. The time it takes is the batch's
        `phase` (settle: after "done"; probe: after the digests); its excess over the usual is charged."""
        t = time.monotonic()
        limit = max(self.opts.probe_ms, 4 * float(self.dev.info.get("probe_ms") or 0.05))
        while True:
            if self.dev.probe_ms() <= limit:
                setattr(b, phase, time.monotonic() - t)
                return None
            if time.monotonic() - t > self.opts.drain_s:
                return EvalResult("rejected", message=f"rejected: the GPU was still busy {self.opts.drain_s:.0f} s "
                                  "after the candidate's calls returned: work left running after a call is part "
                                  "of the call", details=self.details)

    @property
    def _ref_path(self) -> str:
        """(CPU) Where the reference's outputs of the checked calls are read to."""
        return os.path.join(self.readout_dir, "read-reference.out")

    @property
    def main(self) -> int:
        """The runner's Python process (in a namespace, the namespace's first process)."""
        if self._main is None:
            self._main = self.w.main_pid()
        return self._main

    def _freeze(self) -> EvalResult | None:
        """Stop the runner (SIGSTOP) so nothing of the candidate runs while the reference does; any other
        process in its tree is killed first, and rejects it (the timing allows no helper processes)."""
        main = self.main
        others = find_processes({self.w.proc.pid}, self.w.mark) - {main, self.w.proc.pid}
        if others:
            kill_processes(others, self.w.mark + "-none")
            return EvalResult("rejected", message=f"rejected: the candidate's process started {len(others)} other "
                              "process(es) that were running during the timing (killed); a candidate may not start "
                              "processes", details=self.details)
        try:
            os.kill(main, signal.SIGSTOP)
        except ProcessLookupError:
            raise EOFError from None
        self._frozen = True
        # A stopped thread's pending wake-up still fires as an interrupt on the core it slept on, which the
        # reference is timed on next, and on the CPU an interrupt's cost is the reference's CPU time
        # (thousands of timers aimed at the reference's batches read as a 1.4-1.9x speedup). There the
        # filter refuses timer objects (confine.py) and a thread holds at most one wake-up: the threads are
        # bounded.
        try:
            threads = len(os.listdir(f"/proc/{main}/task"))
        except OSError:
            threads = 0
        if threads > self.opts.max_threads:
            return EvalResult("rejected", message=f"rejected: the candidate's process ran {threads} threads while "
                              f"it was timed (at most {self.opts.max_threads}: each can leave a timer that fires "
                              "on the reference's core while it is timed)", details=self.details)
        stop(main, signal_sent=True)
        return None

    def _thaw(self) -> None:
        if getattr(self, "_frozen", False) and self.w is not None:
            self._frozen = False
            try:
                os.kill(self.main, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def _choose(self, n_cand: int, n_ref: int) -> list[int]:
        """The calls whose outputs will be checked, chosen now that their digests are in: every batch, so
        no batch is known in advance to go unchecked."""
        k = max(1, min(self.opts.verify_per_batch, n_cand, n_ref))
        return sorted(secrets.SystemRandom().sample(range(min(n_cand, n_ref)), k))

    # ------------------------------------------------------------------------------------------ verify, verdict
    def _check(self, path: str, items: list[dict], checks: list) -> EvalResult | None:
        """The shipped (GPU) or read (CPU) outputs against the reference's for the same calls (its last
        batch ran the same inputs), and against the digests the runner committed to (GPU) or the inputs
        as written (CPU). An empty or short check fails."""
        reply = self.dev.ref_call({"cmd": "check", "path": path, "ref_path": self._ref_path, "items": items,
                                   "rtol": self.ev.rtol, "atol": self.ev.atol, "l2_tol": self.ev.l2_tol})
        _remove(path)
        _remove(self._ref_path)
        results = reply.get("results") or []
        if not items or reply.get("kind") != "checked" or len(results) != len(items):
            return _forged(self.details, "the timed outputs could not be verified")
        checks += [{"call": it["key"], "ok": r["ok"]} for it, r in zip(items, results)]
        self.details["timed_checks"] = checks
        for it, r in zip(items, results):
            if not r["ok"]:
                return EvalResult("incorrect", message=f"timed call {it['key']} (batch:call) returned a wrong result "
                                  f"(outputs cached, skipped or computed after their batch?): {r['reason']}",
                                  details=self.details)
        return None

    def _verdict(self, timed: dict) -> EvalResult:
        return verdict.from_timing(timed, self.ev.device, self.details)

    # ------------------------------------------------------------------------------------------ trials
    def _prepare(self) -> Future | None:
        """The reference worker computes the trials' outputs while the candidate computes its own."""
        if self.mode != "candidate" or self.opts.prepare_bytes <= 0:
            return None
        items = [{"spec": s, "index": k} for k, s in enumerate(self.specs) if not s["perturb"]]
        return self.ev.helpers.submit(self.dev.ref_call, {"cmd": "prepare", "max_bytes": self.opts.prepare_bytes,
                                                           "items": items})

    def _check_trials(self, msg: dict) -> EvalResult | None:
        missing = [str(m)[:100] for m in msg.get("unmapped") or []] if isinstance(msg.get("unmapped"), list) else []
        path = os.path.join(self.job["work_dir"], "trials.bin")   # where the runner was to write them, no other
        if msg.get("path") != path:
            return _forged(self.details, "the runner's trial outputs came without their file")
        if any(s["perturb"] for s in self.specs) and missing:
            return EvalResult("incorrect", message="the perturbed-weights trial cannot run: the reference's "
                              f"parameters {', '.join(missing[:6])} have no counterpart in ModelNew (by name, by "
                              "shape and values, or by shape in registration order); keep the reference's parameters "
                              "as nn.Parameters",
                              details=self.details)
        items = [{"spec": s, "index": k} for k, s in enumerate(self.specs)]
        reply = self.dev.ref_call({"cmd": "compare", "path": path, "items": items,
                                   "rtol": self.ev.rtol, "atol": self.ev.atol, "l2_tol": self.ev.l2_tol})
        if reply.get("kind") != "compared" or len(reply.get("results", [])) != len(items):
            raise RuntimeError(f"reference worker error: {reply.get('error')}")
        self.details["trials"] = [dict(r, dist=it["spec"]["dist"], perturbed=it["spec"]["perturb"])
                                  for r, it in zip(reply["results"], items)]
        for r, it in zip(reply["results"], items):
            if not r["ok"]:
                s = it["spec"]
                what = f"trial {it['index']} (inputs: {s['dist']}{', re-seeded and perturbed weights' if s['perturb'] else ''})"
                hint = (" (each of the reference's 1-D parameters gets a perturbation, and so does its counterpart "
                        "in ModelNew, found by name, else by shape in registration order)" if s["perturb"] else "")
                return EvalResult("incorrect", message=f"incorrect on {what}: {r['reason']}{hint}", details=self.details)
        return None

    # ------------------------------------------------------------------------------------------ plumbing
    def _recv(self) -> dict:
        return self.w.recv(max(0.0, self.deadline - time.monotonic()))

    def _reply(self, kind: str) -> dict:
        msg = self._recv()
        if msg.get("kind") != kind:
            raise _Answered(msg)
        return msg

    def _expect(self, reply: dict, kind: str) -> dict:
        if reply.get("kind") != kind:
            raise RuntimeError(f"reference worker error: {reply.get('error')}")
        return reply

    @staticmethod
    def _lap(b: clock.Batch, phase: str, since: float, now=time.monotonic) -> float:
        t = now()
        setattr(b, phase, t - since)
        return t

    def _spent(self, step: str, since: float, counted: float = 0.0) -> float:
        """Seconds of the timing outside the batches' steps, by what they went to (diagnostics only)."""
        now = time.monotonic()
        spent = self.details.setdefault("timing_overhead_s", {})
        spent[step] = round(spent.get(step, 0.0) + max(0.0, now - since - counted), 4)
        return now

    def _mark(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.phases[name] = round(now - since, 3)
        return now

    def _note_runner(self, msg: dict, sent: float) -> None:
        marks = msg.get("marks")
        marks = marks if isinstance(marks, dict) and all(isinstance(v, (int, float)) for v in marks.values()) else {}
        if {"job_received", "candidate_loaded", "trials_done"} <= set(marks):  # the runner's clock: display only
            self.phases["runner_start"] = round(max(0.0, marks["job_received"] - sent), 3)
            self.phases["load"] = round(marks["candidate_loaded"] - marks["job_received"], 3)
            self.phases["trials"] = round(marks["trials_done"] - marks["candidate_loaded"], 3)
        if msg.get("confined") is not None:
            self.details["confined"] = str(msg["confined"] or "yes")[:200]


class _NoCollections:
    """This process's cyclic garbage collector, off while any of its evaluations is timing: a collection
    in a process that runs a search walks its whole heap, tens of milliseconds, charged to whichever
    side's step it falls in. The collector is the process's, so is this count of the timings holding it."""
    _lock = threading.Lock()
    _holders = 0
    _was_enabled = True

    @classmethod
    def hold(cls) -> None:
        with cls._lock:
            if cls._holders == 0:
                cls._was_enabled = gc.isenabled()
                gc.disable()
            cls._holders += 1

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._holders -= 1
            if cls._holders == 0 and cls._was_enabled:
                gc.enable()


class _Answered(Exception):
    """The runner answered out of turn (an error report, or a forged kind)."""

    def __init__(self, msg: dict):
        super().__init__(msg.get("kind"))
        self.msg = msg


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
