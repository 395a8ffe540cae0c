"""Parent side: one evaluation, one object. A fresh runner (the candidate's process) is used once.

Public flow, Evaluation.run():

    trials    the runner computes the trials' outputs from seeds drawn here; the reference worker judges
    timing    batches alternate between the reference's side and the runner (clock.py), each timed by
              this process; the runner is stopped (SIGSTOP) whenever it is not its turn, until the
              speedup's interval is narrow enough (or the pairs or the time run out).
              CPU: the reference worker writes a batch's inputs into the runner's input file; the runner
              runs "go" alone, timed by its CPU time (stopped.py); the reference is timed the same way in
              a runner of its own (host_batches.py).
              GPU: the same through device memory the reference worker shares with both runners
              (vmm.py), timed by this process's clock from letting the runner go to stopping it; the
              device is drained before and after each batch, the waits charged (clock.py). Where that
              memory cannot be shared: "draw", "go", "digest" in the runner and in the reference
              worker, every step timed by this process's clock (batches.py)
    verify    after every candidate batch, untimed, calls chosen once the batch is over. CPU: their
              outputs read from the stopped runner's memory (readout.py), and from the reference's runner;
              GPU: read by the reference worker from both regions (fallback: shipped by the runner,
              whose digests came first). The reference worker compares them
    verdict   every figure finite and positive, or a rejection that says which

Nothing the runner says is believed: its outputs count as the reference worker judges them; its only
part in the runtime is when its answers arrive (CPU: the CPU time it spends). The baseline (src None)
runs the reference's own Model in a runner by the same protocol: its speedup is the protocol's self-check
(close to 1).
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

from . import readout, verdict
from .common import _DISTS, EvalResult
from .verdict import failure as _failure, forged as _forged
from .device import Device, FileLock, NullCtx
from .protocol import Worker
from .stopped import running_states, stop
from .sandbox import find_processes, kill_processes, remove_all
from .steps import _Answered
from .timing import Timing


class Evaluation(Timing):
    """One candidate (src) or the baseline (src None: the reference Model) on one device slot."""

    def __init__(self, ev, dev: Device, src: str | None, source_hash: str, details: dict, locked: bool = False):
        self.ev, self.dev, self.src, self.details, self.locked = ev, dev, src, details, locked
        self.opts = ev.opts
        self.mode = "baseline" if src is None else "candidate"
        self.specs = trial_specs(self.opts) if src is not None else [_own_spec(self.opts)]
        self.timed_weights = timed_weights(self.specs)
        self.cpus = ev.runner_cpus(dev)
        self.job = ev.job("run", mode=self.mode, candidate_src=src, device=ev.torch_device(), trials=self.specs,
                          timed_weights=self.timed_weights,
                          build=ev.builds.config(), poison_bytes=self.opts.poison_bytes, env=ev.builds.extension_env(source_hash),
                          cpus=self.cpus, ref_names=dev.info.get("ref_names"), ref_shapes=dev.info.get("ref_shapes"),
                          on_device=self.opts.inputs_on_device, no_processes=ev.device != "cuda")
        self.phases: dict = {}
        self.deadline = 0.0
        self.w: Worker | None = None
        self._frozen = False
        self._main: int | None = None
        self.mem: readout.Memory | None = None     # (CPU, timing) the runner's memory
        self.rr: Worker | None = None               # the reference's runner (CPU; GPU with shared memory),
        self.rr_mem: readout.Memory | None = None   # (CPU) its memory,
        self._ref_claim: readout.Claim | None = None   # (GPU) and its last claim of where its outputs lie
        self._ref_layout: dict | None = None       # the layout of its last batch (a batch of no calls reuses it)
        self._ref_geometry: list | None = None     # (CPU) the reference's outputs: dtype, shape, stride,
        self._ref_views: set[int] = set()          # and those it returns as views of its inputs
        self.ref_died = False   # the reference worker or runner died during this evaluation's turn

    # ------------------------------------------------------------------------------------------ the flow
    def run(self) -> EvalResult:
        work = None
        self.readout_dir = tempfile.mkdtemp(prefix="run-", dir=self.ev.readout_dir)   # (CPU) ours alone
        t_wait = time.monotonic()
        try:
            with (NullCtx() if self.locked else self.dev.lock), FileLock(self.dev.gpu_lock_path):
                self.phases[f"{'gpu' if self.ev.device == 'cuda' else 'cpu'}_wait"] = round(time.monotonic() - t_wait, 3)
                self.details["phases"] = self.phases
                # Deaths counted from this turn's start, and until every process of this candidate is
                # dead: one while it waited for its turn or built was not its doing (no worker can signal
                # the reference's in the namespace, and memory is the kernel's guard: Evaluator._checked).
                deaths = self.dev.deaths()
                self.w = self.dev.take_runner()
                # Its work files (trials, shipped outputs) in its home, the one directory it writes in.
                work = self.job["work_dir"] = work_dir(self.w, self.ev.cache_dir)
                if self.w.arena is not None:
                    self.job["arena"] = {"fd": self.w.arena[0], "size": self.w.arena[1]}
                if self.dev.shared == "yes" and self.w.fd_sock is not None:   # (GPU) its region, made now
                    problem = self.dev.give_region(self.w)
                    if problem is None:
                        self.job["region"] = self.dev.region_job(self.w)
                    else:
                        self.details["shared_memory"] = problem
                prepare = self._prepare()
                try:
                    return self._drive(prepare)
                finally:
                    self._thaw()
                    if prepare is not None:
                        futures_wait([prepare])  # nothing of this evaluation may still run when the lock goes
                    strays = self.w.discard()  # used once: all it started dies with it
                    self.dev.resume_ref()
                    self.ref_died = self.dev.deaths() != deaths
                    if strays:
                        self.details["stray_processes_killed"] = strays
                    self.dev.settle_spare(final=True)
        finally:
            if work is not None:
                remove_all(work)
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

    # ------------------------------------------------------------------------------------------ the runner
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
        if not stop(main, signal_sent=True):   # the reference must not run beside any thread of it
            return verdict.not_stopped(self.details, running_states(main))
        return None

    def _thaw(self) -> None:
        if getattr(self, "_frozen", False) and self.w is not None:
            self._frozen = False
            try:
                os.kill(self.main, signal.SIGCONT)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------------------------------ verdict
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
        missing = _strings(msg, "unmapped", 100)
        path = os.path.join(self.job["work_dir"], "trials.bin")   # where the runner was to write them, no other
        if msg.get("path") != path:
            return _forged(self.details, "the runner's trial outputs came without their file")
        if any(s["perturb"] for s in self.specs) and missing:
            return EvalResult("incorrect", message="the perturbed-weights trial cannot run: the reference's "
                              f"parameters {', '.join(missing[:6])} have no counterpart in ModelNew (by name, by "
                              "shape and values, or by shape in registration order); keep each of the reference's "
                              "parameters as an nn.Parameter of its own, in its shape (or a reshape of it)",
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
                hint = _perturbed_hint(_strings(msg, "relaid", 120)) if s["perturb"] else ""
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
            if {"first_trial_done", "trials_run"} <= set(marks):   # where a fresh process's trials go
                self.details["trials_split_s"] = {
                    "first": round(marks["first_trial_done"] - marks["candidate_loaded"], 3),
                    "others": round(marks["trials_run"] - marks["first_trial_done"], 3),
                    "outputs_written": round(marks["trials_done"] - marks["trials_run"], 3)}
        if msg.get("confined") is not None:
            self.details["confined"] = str(msg["confined"] or "yes")[:200]


def trial_specs(opts) -> list[dict]:
    """Input sets for the correctness trials; seeds drawn now, unknown when the candidate was written."""
    specs = [dict(_own_spec(opts), dist=_DISTS[k % len(_DISTS)]) for k in range(opts.trials)]
    if len(specs) >= 2:  # the last trial re-seeds and perturbs the weights
        specs[-1].update(dist="own", weight_seed=secrets.randbits(31), perturb=True)
    # The first input set once more, after poisoning: an output read from stale memory or a cache cannot
    # match twice under different allocator states.
    return specs + [dict(specs[0], repeat=True)]


def timed_weights(specs: list[dict]) -> dict:
    """The weights both runners' timed calls run on: the re-seeded, perturbed ones of this evaluation's
    last trial (drawn now, unknown when the candidate was written, so no shortcut tuned to seed 42's
    weights holds in a timed call, and a checked timed call is checked on weights the trials checked
    too); the seed-42 ones where no trial has other weights (the baseline, a single trial)."""
    s = next((s for s in specs if s["perturb"]), specs[0])
    return {"weight_seed": s["weight_seed"], "perturb": bool(s["perturb"])}


def _own_spec(opts) -> dict:
    return {"seed": secrets.randbits(31), "dist": "own", "weight_seed": 42, "perturb": False,
            "on_device": opts.inputs_on_device}


def work_dir(w, cache_dir: str) -> str:
    """A runner's work directory: in its home (a worker started by exec outside warm has none: the cache)."""
    return tempfile.mkdtemp(prefix="work-", dir=w.home or cache_dir)


def _strings(msg: dict, key: str, width: int) -> list[str]:
    """A runner's list of notes (parameters unmapped or relaid), each cut to width; [] if not a list."""
    value = msg.get(key)
    return [str(m)[:width] for m in value] if isinstance(value, list) else []


def _perturbed_hint(relaid: list[str]) -> str:
    """What a failed perturbed-weights trial did, and which counterparts took its deltas in another shape."""
    layout = (f"; {', '.join(relaid[:4])} took the perturbation in its own element order: a parameter kept in "
              "another layout (permuted, channels-last) is not supported, keep the reference's") if relaid else ""
    return (" (each of the reference's parameters that is 1-D or the same under every seed gets a perturbation, "
            "element by element, and so does its counterpart in ModelNew, found by name, else by shape and values "
            "(the name sharing most words with the reference's first), else by shape in registration order"
            f"{layout})")
