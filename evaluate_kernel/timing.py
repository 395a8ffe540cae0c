"""Parent side: the timing of one evaluation, batch by batch (clock.py turns the batches into the speedup).

Public flow, Timing._time(): the reference's runner (or, in the GPU's fallback, the reference worker) and
the candidate's runner take turns, r0 c0 r1 c1 ..., each batch on inputs of a seed drawn when it starts,
until the speedup's interval is narrow enough or the pairs or the time run out.

    _calibrate / _fixed_cost / _empty_cost   (the baseline's run) the reference alone sizes the batches;
                                             what a batch costs besides its calls (GPU, shared memory)
    a batch of either side                   steps.py: the runner let go for one step, stopped again,
                                             its claim checked (CPU; GPU with shared memory) or its
                                             digests taken (the GPU's fallback)
    _choose / _pick / _check                 the calls to check, chosen once a batch's claim is in; the
                                             reference worker compares their outputs

Timing is a part of Evaluation (evaluation.py), which owns the runner, the job and the details; it is
kept apart only to be read apart.
"""
from __future__ import annotations

import gc
import math
import os
import secrets
import statistics
import threading
import time

from . import clock, readout
from .common import TARGET_CI, TIMING_S, EvalResult, _remove
from .steps import Steps
from .verdict import forged as _forged

FIXED_PAIRS = 5   # pairs of the reference's batches (one call, a whole batch) that measure a batch's fixed cost
FIXED_SPREAD = 0.05   # ... accepted once their estimates' quartiles lie within this fraction of a whole batch
FIXED_TRIES = 4       # ... else measured again, up to this many times in all (the steadiest one is used)
EMPTY_BATCHES = 5     # batches of no calls that measure what a batch costs outside any model's calls


class Timing(Steps):
    """The timing half of an Evaluation (its runner self.w, device self.dev, options, details)."""

    def _time(self) -> dict | EvalResult:
        """Alternate batches until the interval is narrow enough; returns what _verify and _verdict need."""
        opts, dev = self.opts, self.dev
        gpu = self.ev.device == "cuda"
        target = opts.target_ci if opts.target_ci is not None else TARGET_CI["cuda" if gpu else "cpu"]
        budget_s = opts.timing_s if opts.timing_s is not None else TIMING_S["cuda" if gpu else "cpu"]
        budget = opts.batch_bytes or ((4 << 30) if gpu else (512 << 20))
        per_call_bytes = int(dev.info.get("in_bytes", 1)) + int(dev.info.get("out_bytes", 1))
        host = not gpu or self.w.region is not None   # the runners' memories are written and read from outside
        extra = {"weights": self.timed_weights}   # (digests) the reference worker's timed model's
        if host:
            self.rr = dev.reference_runner()
            if gpu and self.rr.region is None:   # its region could not be made: the digest protocol
                host = False
                self.rr = None
            else:
                self._weigh_reference()
        if gpu:
            self.details["gpu_protocol"] = "shared memory" if host else f"digests (shared memory: {dev.shared})"
        if host and not gpu:   # the input files of both runners, which the reference worker opens through us
            extra["arenas"] = {side: {"path": f"/proc/{os.getpid()}/fd/{w.arena[0]}", "size": w.arena[1]}
                               for side, w in (("runner", self.w), ("reference", self.rr))}
        elif host:   # the regions of both runners, which the reference worker made
            extra["regions"] = {side: {"id": w.region[1], "inputs": w.region[3]}
                                for side, w in (("runner", self.w), ("reference", self.rr))}
            budget, per_call_bytes = self._region_calls(per_call_bytes), 1
        dev.ref_call({"cmd": "timing", "cpus": self.cpus, **extra})   # fresh batches, on the runner's cores
        _NoCollections.hold()
        try:
            bad = self._freeze()
            if bad is not None:
                return bad
            if host and not gpu:
                self.rr_mem = readout.Memory(self.rr.main_pid())
                try:
                    self.mem = readout.Memory(self.main)
                except OSError as e:
                    return EvalResult("rejected", message=f"rejected: the runner's memory cannot be read ({e.strerror}): "
                                      "a candidate may not make its process unreadable (if every candidate gets this, "
                                      "the machine forbids reading a child's memory: Yama's ptrace_scope above 1)",
                                      details=self.details)
            if gpu:   # no set-up work (a new region, the last runner's teardown) lands in the first batches
                wait = clock.Batch("ref", 1)
                bad = self._drain(wait, "settle")
                if bad is not None:
                    return bad
                self.details["idle_wait_ms"] = round(wait.settle * 1e3, 3)
            cands, checks = [], []
            ref_ms = dev.ref_ms
            if ref_ms is None:   # the baseline's run: the reference alone first, to size the batches
                r0 = self._calibrate(budget, per_call_bytes)
                ref_ms = r0.calls / r0.n * 1e3
            n = clock.calls_per_batch(ref_ms, None, per_call_bytes, opts.batch_ms, opts.max_batch_ms, budget)
            fixed = empty = 0.0   # what a batch costs besides its calls, taken off both sides' (GPU, shared
            # memory); and what one of no calls costs, taken off a batch cut for memory (_fitting_cand_batch)
            if gpu and host:
                fixed, empty = self._fixed_cost(n) if dev.ref_ms is None else (dev.fixed_ms / 1e3, dev.empty_ms / 1e3)
                self.details["batch_fixed_ms"] = round(fixed * 1e3, 4)
                self.details["batch_empty_ms"] = round(empty * 1e3, 4)
            first = self._host_ref_batch if host else (lambda seed, n: self._ref_batch(seed, n, -1, None))
            refs = [r0] if dev.ref_ms is None else [first(secrets.randbits(31), n)]
            n_ref = n   # (shared memory) the reference's batches keep their own length; a faster candidate's grow
            started, f = time.monotonic(), None
            for i in range(opts.max_pairs + 1):
                seed = secrets.randbits(31)
                t = time.monotonic()
                if host:
                    c, values, seed, n = self._fitting_cand_batch(seed, n, ref_ms, fixed, empty, n_ref)
                else:
                    c, values = self._cand_batch(seed, n, i)
                if isinstance(c, EvalResult):
                    return c
                if not host:   # on the CPU the phases are CPU seconds, not the wall's
                    self._spent("candidate batch", t, sum(getattr(c, p) for p in clock.PHASES))
                cands.append(c)
                # A candidate faster than the reference gets longer batches after its first (its reference keeps
                # its own length with shared memory). Never shorter ones: a warm-up made slow on purpose would
                # shrink them until fixed costs rival the calls. (By its calls alone, its own phases its usual:
                # one slow drain in a batch sized every batch of the evaluation.) Only once: the first batch of
                # a new length pays for its new memory (on the CPU a batch sized again after its third read 2x
                # its neighbours), and each such batch counts.
                if i == 0:
                    own = clock.typical([c])
                    n_next = max(n, clock.calls_per_batch(ref_ms, clock.cost_ms(c, own, own, fixed),
                                                          per_call_bytes, opts.batch_ms, opts.max_batch_ms, budget))
                    if "calls_cut_for_memory" in self.details:   # never more than its memory held
                        n_next = n
                else:
                    n_next = n
                # The calls to check, chosen now that their digests (on the CPU: the stopped runner's claim of
                # where its outputs lie) are in.
                if host:
                    # The reference's next batch runs n_ref of this batch's sets, the chosen calls' among them
                    # (its outputs are what theirs are checked against): each side's batch lasts about
                    # batch_ms, where one length for both made a 2.5x faster candidate's reference batch 52 ms
                    # of a 72 ms pair.
                    drawn = max(c.n, n_ref)   # the sets of the seed (a batch cut for memory ran the first c.n)
                    chosen = self._choose(c.n, n_ref)   # from all its calls: the reference runs their sets
                    pick = self._pick(drawn, n_ref, chosen)
                    path = None
                    if not gpu:   # read now, from the stopped runner (on a GPU the reference worker reads them)
                        path = os.path.join(self.readout_dir, f"read-{i}.out")
                        problem = readout.write(path, self.mem, values, chosen)
                        if problem is not None:
                            return _forged(self.details, problem)
                    at = [pick.index(j) for j in chosen]   # where the reference's batch ran each chosen set
                    refs.append(self._host_ref_batch(seed, drawn, at, pick))
                    step, base = values.layout["set_bytes"], values.layout["base"]
                    items = [{"key": f"{i}:{j}", "call": j, "ref_call": k, "inputs": [base + j * step, step]}
                             for j, k in zip(chosen, at)]
                    if gpu:
                        for it in items:
                            it["cand"], it["ref"] = values.pointers[it["call"]], self._ref_claim.pointers[it["ref_call"]]
                            it["geometry"] = values.geometry_of(it["call"])
                            it["ref_geometry"] = self._ref_claim.geometry_of(it["ref_call"])
                else:
                    chosen = self._choose(min(c.n, n_next), n_next)   # the reference runs the first n_next
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
                bad = self._check(path, items, checks, host and gpu)
                if bad is not None:
                    return bad
                self._spent("check", t)
                n = n_next
                f = clock.figures(refs, cands, fixed=fixed)
                # The budget stops the timing only once the interval can mean something: a single pair's
                # "interval" is a point, and a search keeping the best of several evaluations would profit
                # from that noise (one pair of an 8 ms CPU ReLU read 0.96-1.10x for the same source).
                out_of_time = (time.monotonic() - started > budget_s and f is not None
                               and f.pairs >= min(opts.min_pairs, opts.max_pairs))
                if clock.enough(f, target, opts.min_pairs) or out_of_time:
                    break
            if gpu:
                self.details["probe_idle_ms"] = dev.info.get("probe_ms")
            if host and gpu:
                self.details.update(clock.host_note(refs + cands, clock.steady_host(list(dev.host_loops))))
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
            b = self._host_ref_batch(seed, n) if self.rr is not None else self._ref_batch(seed, n, -1, None)
            ms = b.calls * 1e3
            if ms >= self.opts.batch_ms / 4 or n >= n_max:
                break
            n = min(n_max, max(2 * n, math.ceil(n * self.opts.batch_ms / 2 / max(ms, 1e-3))))
        return b

    def _fixed_cost(self, n: int) -> tuple[float, float]:
        """(GPU with shared memory, the baseline's run) Seconds every batch costs besides its calls, the
        same for either side: waking the stopped runner, the GPU switching back to its context from the
        prober's, the last synchronise, the answer (0.7-0.9 ms on an H100: 4% of a 20 ms batch, which
        pulled every speedup towards 1). Measured on the reference's runner, never the candidate's, from
        FIXED_PAIRS pairs of a batch of n calls and one of one call (clock.fixed_cost), the two of a pair
        next to each other in time, so that what changes over the measurement (the GPU's clock follows its
        load) touches both alike. Measured again while the pairs disagree (clock.fixed_cost_spread above
        FIXED_SPREAD), up to FIXED_TRIES times, the steadiest kept: an Evaluator started in a process
        confined to one core measured it while its own start-up work shared that core, and read 7.5 ms
        (0.8 on a quiet machine) and 2.92x for a kernel an independent timer put at 2.59x, for the
        Evaluator's life; its pairs disagreed by 20% of a whole batch, a quiet H100's by 0.5-3%. Each
        measured batch follows one of its own size, as in a timing, where a step frees the outputs of the
        batch before it: a batch of one call after one of n freed n outputs in its step (on softmax@v0,
        1.7 ms read as fixed). Returned with it: what a batch of no calls costs (_empty_cost; on a GPU one
        trivial kernel in their place: host_batches.HostBatches.go), the part of the fixed cost that lies
        outside any model's calls."""
        if n < 2:
            return 0.0, self._empty_cost()
        best, tries = None, []
        for _ in range(FIXED_TRIES):   # again while the pairs disagree: the device or the core was not quiet
            pairs = []
            for _ in range(FIXED_PAIRS):
                pair = []
                for size in (n, 1):
                    self._host_ref_batch(secrets.randbits(31), size)
                    pair.append(self._host_ref_batch(secrets.randbits(31), size))
                pairs.append(tuple(pair))
            spread, fixed = clock.fixed_cost_spread(pairs), clock.fixed_cost(pairs)
            tries.append({"pairs_ms": [[round(b.calls * 1e3, 3) for b in p] for p in pairs],
                          "spread": round(spread, 4) if math.isfinite(spread) else None,
                          "fixed_ms": round(fixed * 1e3, 4)})
            if best is None or spread < best[0]:
                best = (spread, fixed)
            if spread <= FIXED_SPREAD:
                break
        self.details["batch_fixed_tries"] = tries
        return best[1], self._empty_cost()

    def _empty_cost(self) -> float:
        """(GPU with shared memory, the baseline's run) What a batch of no calls costs: the median of
        EMPTY_BATCHES, each after another empty one (a step frees the outputs of the batch before it)."""
        empties = []
        for _ in range(EMPTY_BATCHES):
            self._host_ref_batch(0, 0)
            empties.append(self._host_ref_batch(0, 0).calls)
        self.details["batch_empty_tries_ms"] = [round(e * 1e3, 4) for e in empties]
        return statistics.median(empties)

    def _region_calls(self, per_call_bytes: int) -> int:
        """(GPU, shared memory) How many calls a batch may hold: their input sets in the region's input
        part (less the layout's random shift, each set's items on cache lines), their outputs (as torch's
        allocator rounds them) in as much again; the rest is for what the calls allocate and free."""
        from .host_batches import ALIGN, MAX_SHIFT
        inputs = min(self.w.region[3], self.rr.region[3])   # region_layout(): as much again for the outputs
        in_b, out_b = int(self.dev.info.get("in_bytes", 1)), int(self.dev.info.get("out_bytes", 1))
        if out_b > 1 << 20:
            out_b = -(-out_b // (2 << 20)) * (2 << 20)
        return max(1, min((inputs - MAX_SHIFT) // (in_b + 16 * ALIGN), inputs // (out_b + 1024)))

    @property
    def _ref_path(self) -> str:
        """(CPU) Where the reference's outputs of the checked calls are read to."""
        return os.path.join(self.readout_dir, "read-reference.out")

    def _choose(self, among: int, n_ref: int) -> list[int]:
        """The calls whose outputs will be checked, chosen now that their digests are in, from the first
        `among`: every batch, so no batch is known in advance to go unchecked; no more than the reference's
        next batch holds (n_ref)."""
        k = max(1, min(self.opts.verify_per_batch, among, n_ref))
        return sorted(secrets.SystemRandom().sample(range(among), k))

    @staticmethod
    def _pick(n_cand: int, n_ref: int, chosen: list[int]) -> list[int]:
        """Which of the candidate's n_cand sets the reference's next batch runs: the chosen calls' and
        others at random, n_ref in all, in the candidate's order."""
        rest = sorted(set(range(n_cand)) - set(chosen))
        return sorted(set(chosen) | set(secrets.SystemRandom().sample(rest, max(0, n_ref - len(chosen)))))

    def _check(self, path: str | None, items: list[dict], checks: list, in_regions: bool = False
               ) -> EvalResult | None:
        """The shipped (GPU, digests) or read (CPU) outputs against the reference's for the same calls (its
        last batch ran the same inputs), and against the digests the runner committed to (GPU) or the
        inputs as written (CPU; a GPU with shared memory, in_regions, where the reference worker reads both
        runners' outputs itself, at the offsets and in the layouts of their checked claims, which the
        items carry). An empty or short check fails."""
        req = {"cmd": "check", "path": path, "ref_path": self._ref_path, "items": items,
               "rtol": self.ev.rtol, "atol": self.ev.atol, "l2_tol": self.ev.l2_tol, "in_regions": in_regions}
        reply = self.dev.ref_call(req)
        if path is not None:
            _remove(path)
            _remove(self._ref_path)
        results = reply.get("results") or []
        if not items or reply.get("kind") != "checked" or len(results) != len(items):
            return _forged(self.details, "the timed outputs could not be verified")
        checks += [{"call": it["key"], "ok": r["ok"]} for it, r in zip(items, results)]
        self.details["timed_checks"] = checks
        for it, r in zip(items, results):
            if not r["ok"]:
                # A near miss is precision (an honest kernel's summation order on inputs the trials did not
                # draw), not a sign of outputs that were never computed for these inputs.
                l2 = r.get("rel_l2")
                near = isinstance(l2, (int, float)) and 0 < l2 <= 10 * self.ev.l2_tol
                why = "is outside the tolerance" if near else \
                    "returned a wrong result (outputs cached, skipped or computed after their batch?)"
                return EvalResult("incorrect", message=f"timed call {it['key']} (batch:call) {why}: {r['reason']}",
                                  details=self.details)
        return None

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
