"""Parent side, per device: the reference worker, the spare runners, the device's locks and baseline, and
the machine's physical cores (physical_cores), which the Evaluator shares out between devices.

Nothing here imports candidate code; it starts and stops worker processes (protocol.py) and keeps the
state one timing slot needs.
"""
from __future__ import annotations

import collections
import fcntl
import os
import secrets
import signal
import statistics
import tempfile
import threading
import time

from . import vmm
from .common import lock_path, open_lock
from .sandbox import remove_all
from .protocol import Worker

HOST_LOOPS_KEPT = 2000   # (GPU) the latest host loops before batches (steps.host_loop): their low quantile is the steady time
SWITCHES_KEPT = 31      # (GPU) the latest first probes after the reference runner's batches, whose median is a switch's cost ...
SWITCH_CAP_MS = 1.0     # ... never above this (those drains are ours; this only bounds a fault)


class Device:
    """One timing slot: a GPU (or the CPU), its reference worker, its lock and its cached baseline."""

    def __init__(self, ev: "Evaluator", index: int):
        self.index = index
        self.lock = threading.Lock()
        self.pending = 0
        self.baseline: dict | None = None
        self.ev = ev
        self.physical = physical_gpu(index)
        self.ref: Worker | None = None
        self.ref_lock = threading.Lock()
        self.ref_deaths = 0  # unexpected deaths of the reference worker: each rejects the candidate then running
        self.ref_starts = 0  # (GPU) regions belong to one reference worker: a runner's region, to the start it came from
        t0 = time.monotonic()
        self.info = self._start_ref()
        self.start_s = {"reference_worker": round(time.monotonic() - t0, 3)}   # display only (Evaluator.start_s)
        # (GPU) A runner's inputs and outputs lie in device memory the reference worker makes and reads
        # (vmm.py, host_batches.py), where the driver and the kernel allow it; else the runner draws and
        # digests them itself (batches.py). "yes", or why not.
        self.shared = "off" if not ev.opts.gpu_shared else str(self.info.get("shared_memory", "no"))
        self.prober: Worker | None = None
        self.armed: float | None = None   # an armed drain's max_s, until its reply is collected
        self.fired = False
        if ev.device == "cuda":
            self._start_prober()
            try:
                ready = self.prober.recv(timeout=300)
                self.info["probe_ms"] = float(ready.get("probe_ms") or 0.05)
                self.info["probe_copy_ms"] = {k: float(v) for k, v in (ready.get("probe_copy_ms") or {}).items()}
            except (TimeoutError, EOFError) as e:
                raise RuntimeError(f"GPU prober failed to start ({e!r}): {self.prober.log_tail()}") from None
            self.start_s["prober"] = round(time.monotonic() - t0, 3)
        # (GPU) The first probe after another context's work waits while the GPU switches to the prober's
        # context (0.15-0.2 ms on an H100, where an idle probe takes 0.02): what the drains after the
        # reference runner's batches saw first, which drains._drain charges nobody for.
        self.switches: collections.deque = collections.deque(maxlen=SWITCHES_KEPT)
        self.host_loops: collections.deque = collections.deque(maxlen=HOST_LOOPS_KEPT)
        # (CPU; a GPU with shared memory) The reference is timed in a runner of its own (host_batches.py).
        self.ref_runner: Worker | None = None
        self._ref_runner_ready = False
        # Spares, oldest first: the first is prepared (CUDA up, reference loaded) while an evaluation runs,
        # the others only import torch. A new evaluation then starts with a ready process.
        self.spares: list[Worker] = []
        self.pinned = ev.pinned
        if ev.opts.warm_runners:
            self.spares = [self._spawn()]
            self._prep(self.spares[0], self.gpu_lock_path)  # no lock held here: the spare takes it itself

    def _spawn(self) -> Worker:
        """A runner process that imports torch at once, on the cores not reserved for timing (on a GPU with
        shared memory, with a channel on which its region arrives when an evaluation takes it)."""
        return self.ev.spawn_warm(self.env(), os.path.join(self.ev.log_dir, f"run-{secrets.token_hex(6)}.log"),
                                  fd_channel=self.shared == "yes")

    def region_layout(self) -> tuple[int, int]:
        """(GPU) A runner's region: (bytes, of which the first hold a batch's inputs). The batch budget
        (batch_bytes; by default 4 GiB or a twentieth of the device's memory, whichever is less) for the
        inputs, as much for the outputs, and three times what a call of the reference allocates besides
        its outputs (a candidate's temporaries, which its calls reuse, may be larger), at most a quarter
        of the device's memory."""
        total = int(self.info.get("total_mem") or 0)
        budget = self.ev.opts.batch_bytes or max(256 << 20, min(4 << 30, total // 20))
        temp = max(0, int(self.info.get("peak_bytes") or 0) - int(self.info.get("out_bytes") or 0))
        size = max(2 * budget + 3 * temp + (256 << 20), 512 << 20)
        if total:
            size = min(size, total // 4)
        mib2 = 2 << 20
        return -(-size // mib2) * mib2, min(budget, size // 3) // mib2 * mib2

    def give_region(self, w: Worker) -> str | None:
        """(GPU) A new region from the reference worker, sent to runner w on its channel; or why not (the
        evaluation then runs the fallback protocol, and a reference worker that died meanwhile is the
        evaluation's to find)."""
        size, inputs = self.region_layout()
        try:
            reply = self.ref_call({"cmd": "region", "size": size})
            if reply.get("kind") != "region":
                return f"the reference worker could not make the shared memory: {reply.get('error')}"
            start, rid = self.ref_starts, reply["id"]
            try:
                fd = vmm.pidfd_getfd(self.ref.main_pid(), int(reply["fd"]))
                try:
                    w.send_fd(fd)
                finally:
                    os.close(fd)
            except (OSError, EOFError, AttributeError) as e:
                self._free_region(start, rid)
                return f"its descriptor could not be passed on: {e}"
            self.ref_call({"cmd": "region_taken", "id": rid})
        except RuntimeError as e:
            return f"the reference worker failed while making it: {e}"
        w.region = (start, rid, int(reply["size"]), inputs)
        w.on_kill = lambda: self._free_region(start, rid)
        return None

    def region_job(self, w: Worker) -> dict:
        """What a runner's job says of its region."""
        return {"channel": w.fd_channel, "size": w.region[2], "inputs": w.region[3]}

    def _free_region(self, start: int, rid: int) -> None:
        """(GPU) A runner is gone: its region goes (unless the reference worker that made it is gone too)."""
        with self.ref_lock:
            if start != self.ref_starts or self.ref is None or self.ref.proc.poll() is not None:
                return
            try:
                self.ref.send({"cmd": "free_region", "id": rid})
                self.ref.recv(timeout=60)
            except (OSError, EOFError, ValueError):
                pass

    def _stale(self, w: Worker) -> bool:
        """A runner whose region a reference worker that is gone made."""
        return w.region is not None and w.region[0] != self.ref_starts

    def _prep(self, w: Worker, lock_path: str | None) -> None:
        w.send(self.ev.job("prep", device=self.ev.torch_device(), gpu_lock=lock_path))
        w.prepped = True

    def take_runner(self) -> Worker:
        """A fresh runner for one evaluation; called with the GPU's lock held."""
        while self.spares and self.spares[0].proc.poll() is not None:
            dead = self.spares.pop(0)
            dead.discard()
        w = self.spares.pop(0) if self.spares else self._spawn()
        if not w.prepped:
            self._prep(w, None)  # we hold the lock: it must not wait for it
        if self.pinned:  # the runner has a core of its own: spares may start while it works
            self._top_up()
        return w

    def _top_up(self, prep: bool = True) -> None:
        if self.ev.opts.warm_runners and not self.ev.closed:
            # Importing torch takes a few seconds, an evaluation of a built candidate about one: several
            # spares start side by side on the other cores, so back-to-back evaluations never wait for one.
            depth = max(1, self.ev.opts.spare_runners) if self.pinned else 1
            while len(self.spares) < depth:
                self.spares.append(self._spawn())
            # The next runner initialises CUDA now, during this evaluation's untimed part (settle_spare()).
            if prep and not self.spares[0].prepped:
                self._prep(self.spares[0], None)

    def settle_spare(self, final: bool = False, timeout: float = 120.0) -> None:
        """Wait until the prepared spare's start-up is over: called before timing and before the lock goes.

        Without a core of its own the runner would share the CPU with a starting spare, so then the one
        spare starts only here, after the evaluation, and is prepared when its evaluation takes it.
        """
        if final and not self.pinned:
            self._top_up(prep=False)
            return
        w = self.spares[0] if self.spares else None
        if w is None or not w.prepped or w.ready:
            return
        try:
            msg = w.recv(timeout)
            w.ready = msg.get("kind") == "ready"
        except (TimeoutError, EOFError):
            w.ready = False
        if not w.ready:  # a spare that failed to start is replaced by a cold runner later
            self.spares.pop(0)
            w.discard()

    def reference_runner(self) -> Worker:
        """(CPU; GPU with shared memory) The runner that times the reference (Model) by the code and protocol a candidate's runner is
        timed by: started with the device, started again after a death (counted with the reference
        worker's: either dying while a candidate runs rejects that candidate). Between its batches it is
        stopped."""
        w = self.ref_runner
        if w is not None and w.proc.poll() is None and self._stale(w):
            self._drop_ref_runner()
            w = None
        if w is None or w.proc.poll() is not None:
            if w is not None:
                self.ref_deaths += 1
                self._drop_ref_runner()
            w = self.ref_runner = self._start_ref_runner()
        if not self._ref_runner_ready:
            try:
                msg = w.recv(timeout=300)
                if msg.get("kind") == "ready":   # the start-up report, then the trial's outputs
                    msg = w.recv(timeout=300)
            except (TimeoutError, EOFError):
                msg = {"error": "no answer"}
            if msg.get("kind") != "outputs":
                log = w.log_tail()
                self._drop_ref_runner()
                raise RuntimeError(f"the reference's runner failed to start: {msg.get('error')} {log}")
            self._ref_runner_ready = True
        return w

    def drop_ref_runner(self) -> None:
        """The reference's runner failed in a timing: it is replaced before the next one."""
        self.ref_deaths += 1
        self._drop_ref_runner()

    def start_ref_runner(self) -> None:
        """Start the reference's runner now (it gets ready while other work goes on)."""
        if self.ref_runner is None:
            self.ref_runner = self._start_ref_runner()

    def _start_ref_runner(self) -> Worker:
        ev = self.ev
        w = self._spawn()
        w.work_dir = tempfile.mkdtemp(prefix="work-", dir=w.home or ev.cache_dir)
        if self.shared == "yes":
            problem = self.give_region(w)
            if problem is not None:
                self.shared = f"no: {problem}"
        self._prep(w, None)
        spec = {"seed": secrets.randbits(31), "dist": "own", "weight_seed": 42, "perturb": False,
                "on_device": ev.opts.inputs_on_device}
        w.send(ev.job("run", mode="baseline", candidate_src=None, device=ev.torch_device(), trials=[spec],
                      build=ev.builds.config(), poison_bytes=ev.opts.poison_bytes, env=ev.builds.extension_env("baseline"),
                      cpus=ev.runner_cpus(self), on_device=ev.opts.inputs_on_device, no_processes=True,
                      ref_names=self.info.get("ref_names"), ref_shapes=self.info.get("ref_shapes"),   # what it perturbs
                      work_dir=w.work_dir, arena={"fd": w.arena[0], "size": w.arena[1]} if w.arena else None,
                      region=self.region_job(w) if w.region else None))
        self._ref_runner_ready = False
        w.weights = (42, False)   # Steps._weigh_reference gives it each evaluation's
        return w

    def _drop_ref_runner(self) -> None:
        w, self.ref_runner = self.ref_runner, None
        if w is not None:
            w.discard()
            remove_all(getattr(w, "work_dir", "") or "/nonexistent")

    def close(self) -> None:
        for w in self.spares:
            w.discard()
        self.spares = []
        self._drop_ref_runner()

    def shutdown(self) -> None:
        """Every process of this slot: spares, the reference worker, the prober."""
        self.close()
        for name in ("ref", "prober"):
            w = getattr(self, name)
            if w is not None:
                try:
                    w.send({"cmd": "quit"})
                except (OSError, ValueError):
                    pass
                w.kill()
                setattr(self, name, None)

    def drain(self, limits: dict, first_limits: dict, check: dict, runs: int, max_s: float, armed: bool = False,
              watch: Worker | None = None) -> dict:
        """Probe from the prober's context (batches.Prober) until `runs` probes in a row are quiet
        (batches.drain): {"first": the first probe's steps {"ms": the kernel's time, "h2d", "d2h": the
        copies'}, "busy_s", "probes", "quiet"}.

        With `armed`, the prober waits, polling, and starts the moment anything waits on the results' pipe
        of the runner `watch` (which it sees without taking), or fire() comes, whichever is first:
        15-18 us after the answer on an H100. A prober woken by a request of ours started 0.45-0.5 ms after
        it (our wake-up 0.15-0.23 ms, reading the answer and writing the request 0.13-0.18 ms, the prober's
        own 0.04-0.05 ms): time in which a call's work left running past "done" could end unseen, and which
        an honest batch spends inside its clock. The reply of an armed drain is collected by the next
        drain() or collect(). A prober that died (killed from outside) is restarted."""
        if self.armed is not None:   # armed earlier, then its batch failed: its reply is collected first
            self.collect()
        if self.prober is None or self.prober.proc.poll() is not None:
            if self.prober is not None:
                self.prober.kill()
            self._start_prober()
            self.prober.recv(timeout=300)
        if watch is not None:
            self.prober.send_fd(watch.result_fd)
        self.prober.send({"cmd": "drain", "limits": limits, "first_limits": first_limits, "check": check, "runs": runs,
                          "max_s": max_s, "armed": armed, "watch": watch is not None})
        if armed:
            self.armed = max_s
            return {}
        return self._reply(max_s)

    def _start_prober(self) -> None:
        self.prober = self.ev.spawn_ref(self.env(), os.path.join(self.ev.log_dir, f"probe-{self.index}.log"),
                                        fd_channel=True)
        self.prober.send(self.ev.job("probe", device=self.ev.torch_device(), cpus=self.ev.other_cpus,
                                     channel=self.prober.fd_channel))

    def fire(self) -> None:
        """Start the armed drain now (one line on the prober's pipe, which it polls)."""
        if self.armed is not None and self.prober is not None and not self.fired:
            self.fired = True
            try:
                self.prober.send({"cmd": "now"})
            except OSError:
                pass

    def collect(self) -> dict:
        """The reply of the armed drain (fired)."""
        self.fire()
        return self._reply(self.armed if self.armed is not None else 0.0)

    def _reply(self, max_s: float) -> dict:
        self.armed, self.fired = None, False
        try:
            if self.prober is None:
                raise EOFError
            return self.prober.recv(timeout=max_s + 60)
        except (TimeoutError, EOFError, OSError):
            if self.prober is not None:
                self.prober.kill()
            self.prober = None
            raise RuntimeError("the GPU prober died") from None

    def note_switch(self, probe: dict) -> None:
        """(GPU) The first probe of a drain after the reference runner's batch: a switch of contexts, nothing else."""
        steps = {k: float(probe[k]) for k in ("ms", "h2d", "d2h") if isinstance(probe.get(k), (int, float))}
        if steps and all(0 <= v < 1e3 for v in steps.values()):
            self.switches.append(steps)

    def switch_ms(self) -> dict[str, float] | None:
        """(GPU) What each probe step typically takes right after another context's work, or None before
        the first drain after a reference runner's batch."""
        if not self.switches:
            return None
        keys = set.intersection(*(set(s) for s in self.switches))
        return {k: min(SWITCH_CAP_MS, statistics.median(s[k] for s in self.switches)) for k in keys}

    def env(self) -> dict[str, str]:
        extra = {"CUDA_VISIBLE_DEVICES": self.physical} if self.ev.device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}
        return self.ev.env(**extra)

    def _start_ref(self) -> dict:
        self.ref_starts += 1
        self.ref = self.ev.spawn_ref(self.env(), os.path.join(self.ev.log_dir, f"ref-{self.index}.log"))
        self.ref.send(self.ev.job("ref", device=self.ev.torch_device(), cpus=self.ev.other_cpus,
                                  on_device=self.ev.opts.inputs_on_device))
        try:
            return self.ref.recv(timeout=300)
        except (TimeoutError, EOFError) as e:
            raise RuntimeError(f"reference worker failed to start ({e!r}): {self.ref.log_tail()}") from None

    def resume_ref(self) -> None:
        """SIGCONT the reference worker: without a PID namespace a runner can stop it, and a runner killed
        while it was stopped would leave it stopped for every later candidate."""
        ref = self.ref
        if ref is not None and ref.proc.poll() is None:
            try:
                os.kill(ref.main_pid(), signal.SIGCONT)
            except (ProcessLookupError, PermissionError, EOFError):
                pass

    def deaths(self) -> int:
        """The reference worker's and the reference runner's deaths so far, those not yet noticed counted
        now (each is started again when next needed). Called at the start and the end of every turn on
        the device: a death between them is that turn's candidate's; one before it is nobody's."""
        with self.ref_lock:
            self._notice_dead_ref()
        if self.ref_runner is not None and self.ref_runner.proc.poll() is not None:
            self.ref_deaths += 1
            self._drop_ref_runner()
        return self.ref_deaths

    def _notice_dead_ref(self) -> None:
        """(ref_lock held) A reference worker found dead is counted and let go. Nothing of ours kills it: a
        candidate's process did (or it crashed), and the candidate of that turn is rejected
        (Evaluation.ref_died); the next one starts from the checked copy (_new_worker)."""
        if self.ref is not None and self.ref.proc.poll() is not None:
            self.ref_deaths += 1
            self.ref.kill()
            self.ref = None

    def ref_call(self, req: dict) -> dict:
        with self.ref_lock:
            self._notice_dead_ref()
            if self.ref is None:
                self._start_ref()
            self.ref.send(req)
            try:
                return self.ref.recv(timeout=self.ev.opts.run_timeout_s)
            except (TimeoutError, EOFError):
                self.ref_deaths += 1
                self.ref.kill()
                self.ref = None
                raise RuntimeError("reference worker died") from None

    @property
    def ref_ms(self) -> float | None:
        """The reference's time per call, from the baseline's run (None until it ran): it sizes batches."""
        return (self.baseline or {}).get("baseline_ms")

    @property
    def fixed_ms(self) -> float:
        """(GPU with shared memory) What a batch costs besides its calls, from the baseline's run."""
        return float((self.baseline or {}).get("fixed_ms") or 0.0)

    @property
    def empty_ms(self) -> float:
        """(GPU with shared memory) What a batch of no calls costs, from the baseline's run."""
        return float((self.baseline or {}).get("empty_ms") or 0.0)

    @property
    def gpu_lock_path(self) -> str:
        return gpu_lock_path(self.ev.device, self.physical)


def physical_gpu(index: int) -> str:
    """The GPU that torch calls cuda:index, as CUDA_VISIBLE_DEVICES names it (its index when unset)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v for v in visible.split(",") if v.strip()] if visible else []
    return ids[index] if index < len(ids) else str(index)


def gpu_lock_path(device: str, physical: str) -> str:
    """An fcntl lock per physical GPU, so two evaluator processes on one machine also take turns."""
    return lock_path(f"{device}{physical}.lock")

class NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FileLock:
    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        self.f = open_lock(self.path, create=True)
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
        return False

def _cuda_count() -> int:
    import torch
    return torch.cuda.device_count()


def physical_cores(cores: list[int], root: str = "/sys/devices/system/cpu") -> list[list[int]]:
    """The cores given, grouped by physical core (SMT siblings together, each group sorted), in order of
    their first core; a core whose topology cannot be read is a group of its own."""
    allowed, groups, placed = set(cores), {}, set()
    for c in sorted(allowed):
        if c in placed:
            continue
        try:
            with open(f"{root}/cpu{c}/topology/thread_siblings_list") as f:
                siblings = _cpu_list(f.read())
        except (OSError, ValueError):
            siblings = {c}
        key = tuple(sorted(((siblings & allowed) | {c}) - placed))
        placed.update(key)
        groups[key] = list(key)
    return sorted(groups.values())


def _cpu_list(text: str) -> set[int]:
    """Linux's cpu list format: "0-3,8,10-11"."""
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out
