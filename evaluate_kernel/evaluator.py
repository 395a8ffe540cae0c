"""The Evaluator: one per task. It screens, builds, checks and times candidates against the task's
PyTorch reference, on one or more devices, and returns an EvalResult per candidate.

Public flow, Evaluator.evaluate():

    screen (screen.py) -> build (builds.py: a builder worker, no GPU) -> Evaluation(...).run() (evaluation.py: trials,
    timing by this process's clock, verification) -> the evaluator's own checks (its code unchanged, its
    reference worker alive) -> physical checks

What is protected and what is not: __init__.py; the reasoning: DESIGN.md and ISOLATION.md. Everything
here that a worker, a device slot or an evaluation needs from the Evaluator is a public method below
("collaborators").
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import site
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from . import binding_header, evaluation
from .build import arch_list_for
from .builds import Builds
from .common import EvalResult, EvaluatorError, Options, lock_path, scrubbed_env, source_hash
from .device import Device, _cuda_count, physical_cores
from .forkserver import ForkServer
from .host_batches import ALIGN, MAX_SHIFT, new_memfd
from .namespace import Namespace, namespace_problem
from .protocol import Worker, _preexec
from .sandbox import (BuildSeal, PrivateCode, default_key_dir, forget_key, own_dir, private_root, python_dirs,
                      remove_all, remove_tree, sweep_private_roots, sweep_worker_homes)
from .screen import screen
from .verdict import physical_checks




def task_settings(task) -> dict:
    """What a task (tasks.Task, or anything with those attributes) sets in an Evaluator: its device,
    tolerances and flops. Evaluator.for_task and the Ray evaluator's both use it."""
    return dict(device=getattr(task, "device", "cuda"), rtol=getattr(task, "rtol", 1e-4),
                atol=getattr(task, "atol", 1e-4), l2_tol=getattr(task, "l2_tol", 5e-5),
                flops=getattr(task, "flops", 0.0))


def evaluate(reference_src: str, candidate_src: str, *, device: str = "cuda", **options) -> EvalResult:
    """One-shot convenience: builds an Evaluator, evaluates one candidate, closes it."""
    verdict = screen(candidate_src)  # no workers are started for code the screen already refuses
    if verdict.status != "ok":
        return EvalResult(verdict.status, message=verdict.message, details={"rule": verdict.rule})
    with Evaluator(reference_src, device=device, **options) as ev:
        return ev.evaluate(candidate_src)


class Evaluator:
    """One per task: thread-safe; caches baselines per device; owns the reference workers.

    log_dir: where worker logs go (default: a fresh directory private to this Evaluator, removed by close()
    unless a log in it holds something), so an error shown for a candidate comes only from that candidate's
    processes. import_dirs: put on every worker's import
    path (a problem file that imports a module beside it). key_dir: where the key that signs build markers
    lives (default eval_sandbox.default_key_dir(); hidden from candidates, so never the cache or a parent).
    """

    def __init__(self, reference_src: str, *, device: str = "cuda", gpus: list[int] | None = None,
                 rtol: float = 1e-4, atol: float = 1e-4, l2_tol: float = 5e-5, flops: float = 0.0,
                 cache_dir: str | None = None, log_dir: str | None = None, import_dirs: Sequence[str] = (),
                 key_dir: str | None = None, **options):
        unknown = set(options) - {f.name for f in dataclasses.fields(Options)}
        if unknown:
            raise TypeError(f"unknown options: {sorted(unknown)}")
        self._t0 = time.monotonic()
        self._start_s: dict[str, float] = {}   # see start_s
        self.reference_src, self.device, self.flops = reference_src, device, flops
        self.opts = Options(**options)
        if self.opts.allow_tf32:  # TF32 keeps 10 mantissa bits: ~1e-3 relative per product
            rtol, atol, l2_tol = max(rtol, 5e-3), max(atol, 5e-3), max(l2_tol, 1e-3)
        self.rtol, self.atol, self.l2_tol = rtol, atol, l2_tol
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir())
        os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
        sweep_private_roots()   # those of Evaluators killed before they could close
        self._private = private_root()
        # (CPU) The files a timing writes for the reference worker (outputs read from a runner's memory): a
        # directory of ours, hidden in the namespace. In a runner's work directory (the cache) a candidate
        # linked its outputs' file to the reference's (compared with itself: 28-69x, "ok") or to any path
        # (written by us, as root), or put a FIFO there (we hung).
        self.readout_dir = os.path.join(self._private, "readout")
        os.makedirs(self.readout_dir, mode=0o700)
        self.log_dir = os.path.abspath(log_dir or os.path.join(self._private, "logs"))
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        self.import_dirs = [os.path.abspath(d) for d in import_dirs]
        self._code = PrivateCode(self._private)
        # Builder and runner (the processes that run candidate code) start in a namespace where one works.
        problem = namespace_problem() if self.opts.isolate else "turned off (isolate=False)"
        self._key_dir = os.path.abspath(key_dir or default_key_dir())
        # Read-only for candidates: the code they run, the Python installation, the import directories, the
        # project this package sits in (a candidate must not rewrite the search that runs it) and the home
        # directory (startup files). Hidden from them: the build-marker key, the parent's readout files,
        # the workers' logs (a runner wrote its inputs to its own log and another candidate's builder, alive
        # at the same time, read them there and answered in its own: 5.8x over the twin on the CPU,
        # twenty-eighth red team) and, from builders, the machine's lock files (a builder held a device's
        # turn for 45 s; one holding the precompiled header's lock would stall every other build).
        home = os.path.expanduser("~")
        locks = os.path.dirname(lock_path("pch.lock"))
        read_only = [self._code.import_dir, self._code.source_dir, os.path.dirname(self._code.source_dir),
                     *python_dirs(), *self.import_dirs, *([home] if home not in ("/", "") else [])]
        if any(os.path.commonpath([self._key_dir, d]) == self._key_dir
               for d in [self.cache_dir, self.log_dir, *read_only]):
            raise ValueError(f"key_dir {self._key_dir} must not contain the cache, log, code or import directories")
        if any(os.path.commonpath([self.log_dir, d]) == self.log_dir for d in [self.cache_dir, *read_only]):
            raise ValueError(f"log_dir {self.log_dir} must not contain the cache, code or import directories "
                             "(it is hidden from candidates)")
        # Each builder and runner writes only in a directory of its own under cache/w (its home: a build's
        # files, a runner's work files, every cache and scratch file), which no other worker sees; the rest
        # of the cache is veiled but for the finished builds, read-only (namespace.py).
        sweep_worker_homes(self.cache_dir)   # those of Evaluators killed before they could close
        self._homes = os.path.join(self.cache_dir, "w", os.path.basename(self._private))
        for d in (os.path.join(self.cache_dir, "ext"), os.path.join(self.cache_dir, "w"), self._homes):
            own_dir(d)
        self._namespace = None if problem else Namespace(read_only=read_only, writable=[],
                                                         hidden=[self._key_dir, self.readout_dir, self.log_dir],
                                                         veiled=self.cache_dir)
        self._locks = locks   # visible (read-only) to runners, whose spares take a device's turn to warm up
        # Build markers are signed only where candidates cannot read the key; elsewhere the key is deleted
        # (this Evaluator's candidates could read or plant it) and only this Evaluator's own builds count.
        self._seal = None if problem else BuildSeal(self._key_dir)
        if problem:
            forget_key(self._key_dir)
        self.isolation = f"none: {problem}" if problem else "pid+mount+net namespace"
        self.isolated = not problem   # builders and runners start in the namespace
        self._tamper_events, self._tamper_note = 0, ""
        self._code_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._closed = False
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="pacevolve-spawn")
        # Builders and runners are forked from a process that has imported torch (forkserver.py), started
        # now, from the spawner thread it dies with; where it cannot run, they start by exec.
        self._forks: ForkServer | None = None
        self._fork_problem = "off" if not self.opts.fork_server else "no namespace" if problem else ""
        if not self._fork_problem:
            self._spawner.submit(self._start_fork_server)
        self.helpers = ThreadPoolExecutor(thread_name_prefix="pacevolve-prepare")  # reference prepares
        if gpus is None:
            gpus = list(range(_cuda_count())) if device == "cuda" else [0]
        if device == "cuda" and not gpus:
            raise RuntimeError("device='cuda' but no CUDA GPU is visible")
        self._cpu_plan(len(gpus))
        fast_nvcc = self._code.path("fast_nvcc.py")
        self.builds = Builds(self, self._seal, self._key_dir, self._code.import_dir,
                             fast_nvcc if self.opts.fast_nvcc and os.path.exists(fast_nvcc) else "")
        # torch's precompiled extension.h lives in its install dir, read-only inside the namespace: a
        # trusted process outside it brings the header up to date once, while the devices start and the
        # baseline is measured (the first on a machine takes a minute; builds meanwhile go without it).
        pch_ready = self.builds.prepare_header(self.helpers) if self._namespace else None
        self._started("setup")
        self.devices = [Device(self, i) for i in gpus]
        self._started("devices")   # each device's reference worker, then its prober (Device.start_s)
        cap = self.devices[0].info.get("capability")
        self.builds.arch = arch_list_for(tuple(cap)) if cap else ""
        for dev in self.devices:   # the reference is timed in a runner of its own (host_batches.py)
            if device != "cuda" or dev.shared == "yes":
                dev.start_ref_runner()
        # The baseline. On a GPU whose runners have cores of their own it is measured in the background, so
        # that a first candidate's build (on other cores, no GPU) goes on meanwhile; its timing waits for
        # the baseline (the device's lock). Otherwise, and before the first build: builds would share the
        # runners' cores. (DESIGN.md, "Both protocols".)
        if self.opts.eager_baseline:
            if device == "cuda" and self.pinned:
                for dev in self.devices:
                    self.helpers.submit(self._baseline, dev)   # a failure is raised again by evaluate()
            else:
                if device == "cuda" and pch_ready is not None:
                    pch_ready.result()   # nor our header's build, on cores the runners share
                for dev in self.devices:
                    self._baseline(dev)
                self._started("baseline")

    # ---------------------------------------------------------------- public API
    def evaluate(self, candidate_src: str) -> EvalResult:
        """A verdict about the candidate; a failure of the evaluator itself (closed meanwhile, its reference
        failing on its own) raises EvaluatorError instead, so that no caller stores it as a verdict."""
        t_start = time.monotonic()
        if self._closed:
            raise EvaluatorError("the evaluator is closed")
        oom_before = oom_kills()
        h = source_hash(candidate_src)
        details: dict = {"source_hash": h[:16], "flags": []}
        for d in (self.cache_dir, os.path.join(self.cache_dir, "ext"), self._homes):
            own_dir(d)   # as we mean them, whatever was made of them outside our workers (sandbox.own_dir)
        verdict = screen(candidate_src)
        if verdict.status != "ok":
            return EvalResult(verdict.status, message=verdict.message, details=dict(details, rule=verdict.rule))
        res = self.builds.build(candidate_src, h, details)
        if res is not None:
            return self._checked(res, oom_before)
        dev = self._pick(None)
        try:
            baseline = self._baseline(dev)
            tampered = self._tamper_events
            turn = evaluation.Evaluation(self, dev, candidate_src, h, details)
            try:
                result = turn.run()
            except RuntimeError:
                if not turn.ref_died:
                    raise
                result = None
            if turn.ref_died:  # never a silent restart: its death may have served the candidate
                result = EvalResult("rejected", message="rejected: the reference worker died while this "
                                    "candidate ran (stopped or killed from outside; restarted from the checked "
                                    "code copy)", details=details)
            result = self.tamper_verdict(tampered, result, details)
        finally:
            with self._state_lock:
                dev.pending -= 1
        if result.status == "ok":
            start_ms = baseline["baseline_ms"]
            details["baseline_start_ms"] = start_ms
            details["baseline_drift"] = result.baseline_ms / start_ms - 1.0
            physical_checks(self, result, dev)
        if "tampering" in details.get("build_note", ""):
            result.message = "; ".join(m for m in (details["build_note"], result.message) if m)
        result.details.update(isolation=self.isolation, device=dev.info.get("device_name"), gpu=dev.index,
                              torch=dev.info.get("torch"), cuda=dev.info.get("cuda"),
                              wall_s=time.monotonic() - t_start)
        return self._checked(result, oom_before)

    def _checked(self, result: EvalResult, oom_before: int) -> EvalResult:
        """A verdict reached while the evaluator was being closed is not about the candidate, nor is a
        failure while the cache's file system is full (a candidate alive at the same time may have filled
        it from its home: twenty-seventh red team), nor one during which the kernel killed a process for
        want of memory (memory held by a descriptor alone shows in no process's size, so the kernel may
        pick anyone's: an honest candidate's reference worker died beside such a candidate, twenty-ninth)."""
        if self._closed:
            raise EvaluatorError("the evaluator was closed while this candidate was evaluated (no verdict)")
        if result.status not in ("ok", "invalid") and oom_kills() > oom_before:
            raise EvaluatorError(f"the kernel killed a process for want of memory while this candidate was "
                                 f"evaluated: this {result.status} may be the machine's, not the candidate's "
                                 "(no verdict)")
        if result.status not in ("ok", "invalid"):
            free = free_bytes(self.cache_dir)
            if free < MIN_FREE_BYTES:
                raise EvaluatorError(f"the build cache's file system ({self.cache_dir}) has {free >> 20} MiB free, "
                                     f"under {MIN_FREE_BYTES >> 20} MiB: this {result.status} may be the disk's, "
                                     "not the candidate's (no verdict); free some space and resume")
        return result

    def baseline_ms(self, gpu: int | None = None) -> float:
        dev = self._pick(gpu)
        try:
            return self._baseline(dev)["baseline_ms"]
        finally:
            with self._state_lock:
                dev.pending -= 1

    def device_info(self, gpu: int | None = None) -> dict:
        """Facts about a timing device (the first one unless gpu names another): device_name, and for CUDA
        capability, sms, total_mem, l2_bytes and mem_bw_bytes_per_s (a device-to-device copy measured by
        the reference worker at start), plus torch and CUDA versions."""
        dev = next((d for d in self.devices if gpu is None or d.index == gpu), None)
        if dev is None:
            raise ValueError(f"gpu {gpu} is not one of {[d.index for d in self.devices]}")
        internal = ("kind", "nonce", "ref_names", "ref_shapes", "in_bytes", "out_bytes", "probe_ms", "probe_copy_ms",
                    "peak_bytes")
        return {k: v for k, v in dev.info.items() if k not in internal}

    # ---------------------------------------------------------------- plumbing
    def _cpu_plan(self, n_devices: int) -> None:
        """The cores of each device's runner (it is confined to them, and the reference is timed on them) and
        the cores left for builds and reference workers.

        With enough cores each runner gets cpu_threads of its own (pinned): launch-bound kernels are timed
        partly on the host, and a runner sharing its core with compilers reads slower. A core of its own is
        a physical one: its SMT siblings stay idle, since a build or a torch import on a sibling slowed a
        GPU runner's host work by 45% for seconds at a time (both sides of the batches around, so a small
        call's interval grew to +-10%). With fewer, runners still get cpu_threads cores each (the last
        ones), shared with everything else: no candidate's process may use more cores than the reference
        is timed on.
        """
        try:
            cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = []
        k, need = self.opts.cpu_threads, n_devices * self.opts.cpu_threads
        physical = physical_cores(cores)
        self.pinned = bool(cores) and self.opts.pin_cpus and len(physical) >= need + 1 \
            and sum(map(len, physical[:len(physical) - need])) >= 2
        if self.pinned:
            own = [group[0] for group in physical[len(physical) - need:]]
            self._runner_cpus = [own[i * k:(i + 1) * k] for i in range(n_devices)]
            self.other_cpus = [c for group in physical[:len(physical) - need] for c in group]
        else:
            self._runner_cpus, self.other_cpus = [cores[-k:] or None] * n_devices, None

    # ---------------------------------------------------------------- collaborators (device.py, evaluation.py)
    def runner_cpus(self, dev: Device) -> list[int] | None:
        return self._runner_cpus[self.devices.index(dev)]

    @property
    def closed(self) -> bool:
        return self._closed

    @classmethod
    def for_task(cls, task, **overrides) -> "Evaluator":
        return cls(task.reference_src, **dict(task_settings(task), **overrides))

    def close(self) -> None:
        self._closed = True
        if getattr(self, "builds", None) is not None:
            self.builds.discard_spare()
        for dev in getattr(self, "devices", []):
            dev.shutdown()
        for pool in (getattr(self, "_spawner", None), getattr(self, "helpers", None)):
            if pool is not None:
                pool.shutdown(wait=False)
        forks, self._forks = getattr(self, "_forks", None), None
        if forks is not None:
            forks.close()
        if getattr(self, "_seal", 0) is None:  # a key made meanwhile by another Evaluator was readable here
            forget_key(self._key_dir)
        private = getattr(self, "_private", None)
        if private and os.path.isdir(private):
            remove_tree(private, keep=self.log_dir)
        if getattr(self, "_homes", None):
            remove_all(self._homes)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def torch_device(self) -> str:
        return "cuda:0" if self.device == "cuda" else "cpu"

    def env(self, **extra: str) -> dict[str, str]:
        threads = str(self.opts.cpu_threads)
        # Fixed glibc malloc thresholds: with the default dynamic threshold a process serves tensors either
        # from fresh mmaps (page faults every call) or from the heap, and CPU timings of the same model
        # differed 3x between processes. Fixed, every process takes the heap path.
        malloc = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
        path = os.pathsep.join(self.import_dirs + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
        # Workers run under `python -I`, which ignores PYTHONPATH and the user site: both travel in a
        # variable of our own that eval_worker.py appends after site-packages (PYTHONPATH stays for the
        # programs a build runs).
        user_site = [d for d in [site.getusersitepackages()] if site.ENABLE_USER_SITE and d in sys.path]
        # Caches that libraries keep under the home directory (read-only to workers in a namespace) go into
        # a directory of ours instead (a builder's or runner's own home: new_worker): CUDA's JIT cache,
        # Triton's, Inductor's, anything XDG, and scratch files.
        caches = _caches(os.path.join(self._private, "caches"))
        return scrubbed_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONPATH=path,
                            PACEVOLVE_EVAL_PATH=os.pathsep.join(user_site + [path] if path else user_site),
                            **malloc, **caches, **extra)

    def job(self, role: str, **kw) -> dict:
        job = dict(role=role, reference_src=self.reference_src, allow_tf32=self.opts.allow_tf32,
                   cpu_threads=self.opts.cpu_threads)
        job.update(kw)
        return job

    def new_worker(self, env: dict[str, str], log_path: str, warm: bool = False, forked_ref: bool = False,
                   fd_channel: bool = False, gpu: bool = True, builder: bool = False) -> Worker:
        """A worker running the private copy of our code, checked just before it starts. Warm workers
        (builders and runners: they run candidate code) start in the namespace when there is one. Every
        worker dies with the thread that started it: start them through spawn_warm or spawn_ref."""
        self._check_code()
        # A CPU runner's inputs arrive in a shared-memory file the reference worker writes (host_batches.py):
        # made here, so the runner holds it from its start and the reference worker opens it through us. (A
        # GPU runner's region comes later, on its fd_channel: Device.give_region. A builder times nothing.)
        arena = ((new_memfd(self.input_file_bytes), self.input_file_bytes)
                 if warm and not builder and self.device != "cuda" else None)
        home = None
        if warm:   # its home: the only directory it writes in, and every cache and scratch file goes there
            home = tempfile.mkdtemp(prefix="", dir=self._homes)
            env = dict(env, **_caches(home))
        try:
            return Worker(env, log_path, warm=warm, code_dir=self._code.import_dir,
                          namespace=self._worker_namespace(gpu, home, builder) if warm else None,
                          cpus=self.other_cpus if warm else None, dies_with_parent=True, arena=arena,
                          forkserver=self._forks if warm or forked_ref else None, fd_channel=fd_channel,
                          home=home, keep_home=self.opts.keep_worker_dirs)
        except OSError as e:   # the machine's (no process or thread left to start: a candidate may hold them)
            if arena is not None:
                os.close(arena[0])
            if home:
                remove_all(home)
            raise EvaluatorError(f"a worker process could not be started: {e}") from None

    def _worker_namespace(self, gpu: bool, home: str, builder: bool) -> Namespace | None:
        if self._namespace is None:
            return None
        # The binding header (binding_header.py) sits outside the cache unless the cache was put around it.
        headers = binding_header.default_root()
        inside = os.path.commonpath([self.cache_dir, headers]) == self.cache_dir and os.path.isdir(headers)
        return dataclasses.replace(self._namespace, gpu=gpu and self.device == "cuda",
                                   shown=[(os.path.join(self.cache_dir, "ext"), False), (home, True)]
                                   + ([(headers, False)] if inside else []),
                                   hidden=self._namespace.hidden + ([self._locks] if builder else []))

    def _start_fork_server(self) -> None:
        """(On the spawner thread, first of all.) The fork server, or why there is none (workers then
        start by exec: each imports torch itself)."""
        if self._closed:
            return
        self._check_code()
        try:
            self._forks = ForkServer(self.env(), self._code.import_dir, os.path.join(self.log_dir, "forks.log"),
                                     preexec=_preexec(True, None))
        except OSError as e:
            self._fork_problem = f"failed: {e}"

    def _started(self, step: str) -> None:
        self._start_s[step] = round(time.monotonic() - self._t0, 3)

    @property
    def start_s(self) -> dict[str, float]:
        """Seconds from the constructor's call to the end of each start-up step (display only: where a
        first verdict waits): setup, fork_server (torch imported there, read at the first fork), devices
        (each device's reference worker, then its prober: Device.start_s), baseline (when measured then)."""
        forks = self._forks
        ready = {"fork_server": round(forks.ready_at - self._t0, 3)} if forks and forks.ready_at else {}
        return dict(self._start_s, **ready)

    @property
    def fork_server(self) -> str:
        """How workers (builders, runners, the reference worker, a GPU's prober) start: "on" (forked by the
        fork server), "starting", "off", "no namespace" or "failed: why" (the last three: by exec, each
        importing torch)."""
        return self._fork_problem or (self._forks.status if self._forks is not None else "starting")

    @property
    def input_file_bytes(self) -> int:
        """(CPU) A runner's input file: the batch budget, and room to start each batch at a random offset."""
        return -(-((self.opts.batch_bytes or (512 << 20)) + MAX_SHIFT + ALIGN) // 4096) * 4096   # whole pages

    def spawn_ref(self, env: dict[str, str], log_path: str, fd_channel: bool = False) -> Worker:
        """A reference worker (outside any namespace: it never runs candidate code), from the spawner. Its
        caches and scratch files are ours alone: it runs as root, and in the shared cache a CUDA JIT or
        temporary file could be written through a link a candidate left there."""
        env = dict(env, **_caches(os.path.join(self._private, "caches")))
        try:   # forked too, where the fork server runs
            return self._spawner.submit(self.new_worker, env, log_path, False, True, fd_channel).result()
        except RuntimeError:  # the spawner is shut down: closing
            return self.new_worker(env, log_path, fd_channel=fd_channel)

    def spawn_warm(self, env: dict[str, str], log_path: str, fd_channel: bool = False, gpu: bool = True,
                   builder: bool = False) -> Worker:
        """A worker that imports torch at once, started from one long-lived thread: workers die with the
        thread that started them (_die_with_parent_preexec), and evaluation threads may be short-lived.
        gpu: the GPU's device nodes in its namespace (runners on a GPU only)."""
        def start() -> Worker:
            w = self.new_worker(env, log_path, warm=True, fd_channel=fd_channel, gpu=gpu, builder=builder)
            if self.other_cpus:
                try:
                    os.sched_setaffinity(w.proc.pid, self.other_cpus)
                except OSError:
                    pass
            return w
        try:
            return self._spawner.submit(start).result()
        except RuntimeError:  # the spawner is shut down: closing
            return start()

    # ---------------------------------------------------------------- stages
    def _pick(self, gpu: int | None) -> Device:
        with self._state_lock:  # least busy device; ties go to the lowest index
            pool = [d for d in self.devices if gpu is None or d.index == gpu]
            if not pool:
                raise ValueError(f"gpu {gpu} is not one of {[d.index for d in self.devices]}")
            dev = min(pool, key=lambda d: d.pending)
            dev.pending += 1
            return dev

    def _baseline(self, dev: Device) -> dict:
        with self._state_lock:
            cached = dev.baseline
        if cached is not None:
            return cached
        with dev.lock:
            if dev.baseline is None:
                res = evaluation.Evaluation(self, dev, None, "baseline", {"flags": []}, locked=True).run()
                if res.status != "ok":
                    raise EvaluatorError(f"the reference itself failed to run: {res.status}: {res.message}")
                # baseline_ms: the reference worker's time per call; runner_ms: the same Model timed in a
                # runner by the same protocol; their ratio (self_check, ~1) is the protocol's own check.
                dev.baseline = {"baseline_ms": res.baseline_ms, "runner_ms": res.runtime_ms,
                                "self_check": res.speedup, "interval": res.details.get("speedup_ci"),
                                "timing": res.details.get("timing"), "fixed_ms": res.details.get("batch_fixed_ms", 0.0),
                                "empty_ms": res.details.get("batch_empty_ms", 0.0)}
        return dev.baseline

    def baseline_info(self, gpu: int | None = None) -> dict:
        """The reference's measurement on a device at start: median_ms (its time per call), the same Model
        timed in a runner (runner_ms) and their ratio (self_check: the protocol's own check, close to 1)."""
        dev = self.devices[0] if gpu is None else next(d for d in self.devices if d.index == gpu)
        base = self._baseline(dev)
        return {"median_ms": base["baseline_ms"], "runner_ms": base["runner_ms"], "self_check": base["self_check"],
                "cores_note": cores_note(self.device, self.pinned or not self.opts.pin_cpus, _usable_cores(),
                                         len(self.devices) * self.opts.cpu_threads + 2)}

    def _check_code(self) -> None:
        """Compare the code the workers run (and its originals) with what was read at start."""
        with self._code_lock:
            problems = self._code.problems()
            if problems:
                self._tamper_events += 1
                self._tamper_note = "; ".join(problems)
        if problems:
            if self.builds is not None:
                self.builds.discard_spare()
            for dev in getattr(self, "devices", []):  # spares started since may have read a modified copy
                dev.close()

    @property
    def tamper_events(self) -> int:
        """How often the evaluator's code was found changed (a build or an evaluation compares before/after)."""
        return self._tamper_events

    def tamper_verdict(self, before: int, result: EvalResult | None, details: dict) -> EvalResult | None:
        """A rejection if the evaluator's code changed while this candidate's process ran."""
        self._check_code()
        if self._tamper_events == before:
            return result
        return EvalResult("rejected", message=f"rejected: {self._tamper_note} while this candidate ran; a "
                          "candidate may write only inside its build directory", details=details)



MIN_FREE_BYTES = 1 << 30   # a failure with less free in the cache's file system is not the candidate's


def oom_kills() -> int:
    """How many processes the kernel has killed for want of memory: in this process's memory cgroup, which
    its workers share, where the machine shows it (a container's neighbours' kills are none of ours),
    else on the whole machine (/proc/vmstat); 0 where unknown."""
    for path in _oom_counters():
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


def _oom_counters() -> list[str]:
    found = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "" and path != "/":   # cgroup v2
                    found.append(f"/sys/fs/cgroup{path}/memory.events")
                elif "memory" in controllers.split(","):   # cgroup v1
                    found.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control")
    except (OSError, ValueError):
        pass
    return [p for p in found if os.path.exists(p)] + ["/proc/vmstat"]


def free_bytes(path: str) -> int:
    """Bytes free to us on path's file system (a large number where it cannot be read)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 1 << 62


def _caches(root: str) -> dict[str, str]:
    """Caches that libraries keep under the home directory, and compilers' scratch files (TMPDIR: /tmp is
    read-only in the namespace), under root."""
    caches = {name: os.path.join(root, sub) for name, sub in (
        ("CUDA_CACHE_PATH", "nv"), ("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("XDG_CACHE_HOME", "xdg"), ("TMPDIR", "tmp"))}
    own_dir(root)   # each as the parent means it, whatever a worker made of it (sandbox.own_dir)
    for path in caches.values():
        own_dir(path)
    return caches


def default_cache_dir() -> str:
    """Per-user: $XDG_CACHE_HOME/pacevolve/eval or ~/.cache/pacevolve/eval, created mode 0700."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "pacevolve", "eval")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def cores_note(device: str, pinned: bool, usable: int, wanted: int = 3) -> str:
    """What a user should know when a GPU's runners have no cores of their own (this process was given too
    few: under taskset, say): builds and the Evaluator's other work share them, and the timings of
    launch-bound calls are noisier. Empty when they are pinned, and on the CPU, whose clock is the
    runners' own CPU time. `wanted`: the physical cores that let them have their own (one per runner
    thread, two for everything else)."""
    if device != "cuda" or pinned:
        return ""
    return (f"this process may use {usable} core(s), too few for the GPU runners to have cores of their own: "
            f"builds share them and small calls' timings are noisier (give it at least {wanted} physical cores)")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
