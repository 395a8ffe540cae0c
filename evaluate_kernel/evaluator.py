"""Compile, verify and time a candidate kernel against a KernelBench reference, in isolation.

PACEvolve (paper section 4, "Kernel optimisation" experiments) scores a candidate by its speedup over the
PyTorch reference of a KernelBench problem. The search optimises whatever number this module returns, so
its job is to make that number honest. Public flow, Evaluator.evaluate():

    screen (eval_screen.py) -> build (builder worker) -> check (runner's trials, judged by the reference
    worker) -> time (runner, bounded by this process's clock) -> verdict (evaluation.py)

Trust boundary. The candidate's code runs in two processes, the builder (no GPU) and the runner, and it can
do anything there: patch any function of the harness code loaded in that process (`import __main__`,
builtins, torch, random), forge or suppress any message the process sends, start processes, write any
file its user may write. So nothing the parent believes rests on that process's word:

* correctness: the runner only ships outputs; the reference worker, which never imports candidate code,
  computes reference outputs from the same seeds and does every comparison (eval_common.compare_outputs:
  non-finite values must match exactly, the finite part meets both bounds; no check can skip itself);
  a trial that cannot run as specified (parameter names that differ from the reference's) fails;
* timed inputs: drawn in every call from a seed this process sends only when timing starts (and a fresh one
  for every host round), so nothing seen during the trials predicts them; no two calls share contents;
* completion: after every timed call the runner sends a digest of its outputs' bits (eval_common.
  output_digest); only after all calls does this process pick which calls to ship, and the reference worker
  checks that the shipped outputs are right and have the committed digests. A call whose work was
  skipped, cached, deferred or done lazily on inspection fails; an empty or short verification fails;
* time: the runtime is bounded by this process's clock: host rounds (N calls back to back on fresh inputs,
  bracketed by this process's own "go" and the round's digests, which cannot be sent before the work
  exists) alternate with the same rounds on the reference in the reference worker, on the same core; the
  reference's runtime plus the difference of the fastest rounds per call (the rounds' bookkeeping is the
  same on both sides and cancels) is details["timing"]["host_ms_per_call"]. Less the rounds' noise and
  divided by 1 + host_margin (5% on a GPU, 10% on the CPU) it is a floor under the runtime, so figures the
  runner forges lower its runtime by at most that. The runner's CPU time (/proc, all its threads and
  processes) must fit the cores allowed over its own rounds (evaluation._cpu_check) and be near zero while
  the reference is timed (evaluation._quiet); the reference's rounds and paired figure count at most
  1 + max_drift times their values at the start (10% on a GPU, 2x on the CPU), so slowing the reference
  buys little. Event samples must also fit in the event phase's wall time and, on a GPU, lie within
  host_ratio of the host figure;
* the speedup's other side: the reference is timed by the reference worker, in blocks between the
  candidate's blocks (same device, same core, same minutes), so a change in the machine's load moves
  both; a block around which the GPU was found busy (a trivial kernel of the reference worker's waited
  longer than gpu_busy_ms: work left on a side stream) does not count; the baseline measured at start is
  kept as details["baseline_start_ms"];
* code: workers start with `python -I -B` from a private copy of this code (eval_sandbox.PrivateCode),
  whose whole tree is hash-checked before every worker starts and after every build and run; a change or
  an extra name there, or a change to the original files, rejects the candidate whose process was running
  (the copy is restored, the spares that may have read it discarded). A reference-worker death during an
  evaluation rejects the candidate; a build's files are hash-checked before a cached build is reused
  (eval_sandbox.library_digest: whatever a runner loads or ninja relinks from). The digest is kept in
  memory; a later Evaluator believes the BUILT marker in the writable cache only if it carries an
  HMAC-SHA256 over (source hash, digest) under a per-user key (eval_sandbox.BuildSeal) kept outside the
  cache in a directory the namespace hides; without a namespace the key is deleted, markers are not
  signed, and only this Evaluator's own builds are reused (details["build_note"] says why it rebuilt);
* processes: builder and runner start in a PID + mount namespace where one can be made (eval_sandbox.
  Namespace: everything in it dies with it, the evaluator's processes are invisible, code, source and the
  Python installation read-only, the marker key hidden; details["isolation"] says whether it applied); in
  any case everything a worker started is found (descendants, the worker being a child subreaper, and an
  environment marker) and killed when its job ends; the baseline is measured before any build.

The static screen stays as a fast first filter with clear messages; no verdict depends on it alone. What
is not protected: the cache directory and files outside the read-only directories stay writable (so a
runner alive while another candidate is built can change that build before the parent hashes it); without
a namespace, a process that both clears its environment and leaves its worker's tree escapes the sweep,
the runner can signal the reference worker (its death then rejects the candidate), and a marker key made
by a namespaced Evaluator while this one runs is readable by its candidates until it closes.

Runtime (eval_timing.py measures, figures.runtime_figures decides): (a) GPU time, KernelBench's protocol
(synchronise, L2 flush, start event, the call, end event on its stream) with a lead (eval_timing._GpuHold:
every SM's warp slots held for lead_ms before the start event) that hides the host's launch latency;
(b) KernelBench's protocol as published, for the record; (c) the steady-state cost of back-to-back calls
on the host clock. The runtime is max(a, c) on a GPU: whichever side, GPU or host, limits the call; on
the CPU it is (a), the 10th percentile of single calls on the host clock (load only adds time). Left out:
profiler proof that custom kernels ran, clock locking, precision policies other than the problem's dtype.

Files, by role (no import cycles): eval_common (leaf: results, options, comparison, digest), eval_screen
(leaf), eval_protocol (the message table; the parent's handle on a worker), eval_sandbox (private code,
process sweep), eval_build / eval_inputs / eval_timing / eval_worker (worker side, eval_worker is the
script), eval_device, eval_run and eval_figures (parent side), and this file (Evaluator, evaluate). "Hack N" in comments
refers to the catalogue in tests/cheats/README.md.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import subprocess
import site
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from . import figures
from . import evaluation
from .build import FULL_HEADER_RETRY, _pch_writable, arch_list_for, trim_compiler_output
from .common import STATUSES, EvalResult, Options, _move, compare_outputs, scrubbed_env, source_hash
from .device import _cuda_count, _Device, gpu_lock_path, physical_gpu
from .protocol import _Worker
from .sandbox import (BuildSeal, Namespace, PrivateCode, default_key_dir, forget_key, library_digest,
                          namespace_problem, private_root, python_dirs)
from .screen import RULES, ScreenVerdict, rules_markdown, screen



def evaluate(reference_src: str, candidate_src: str, *, device: str = "cuda", **options) -> EvalResult:
    """One-shot convenience: builds an Evaluator, evaluates one candidate, closes it."""
    verdict = screen(candidate_src)  # no workers are started for code the screen already refuses
    if verdict.status != "ok":
        return EvalResult(verdict.status, message=verdict.message, details={"rule": verdict.rule})
    with Evaluator(reference_src, device=device, **options) as ev:
        return ev.evaluate(candidate_src)


class Evaluator:
    """One per task: thread-safe; caches baselines per device; owns the reference workers.

    log_dir: where worker logs go (default: a fresh directory private to this Evaluator), so an error shown
    for a candidate comes only from that candidate's processes. import_dirs: put on every worker's import
    path (a problem file that imports a module beside it). key_dir: where the key that signs build markers
    lives (default eval_sandbox.default_key_dir(); hidden from candidates, so never the cache or a parent).
    """

    def __init__(self, reference_src: str, *, device: str = "cuda", gpus: list[int] | None = None,
                 rtol: float = 1e-4, atol: float = 1e-4, l2_tol: float = 1e-5, flops: float = 0.0,
                 cache_dir: str | None = None, log_dir: str | None = None, import_dirs: Sequence[str] = (),
                 key_dir: str | None = None, **options):
        unknown = set(options) - {f.name for f in dataclasses.fields(Options)}
        if unknown:
            raise TypeError(f"unknown options: {sorted(unknown)}")
        self.reference_src, self.device, self.flops = reference_src, device, flops
        self.opts = Options(**options)
        if self.opts.allow_tf32:  # TF32 keeps 10 mantissa bits: ~1e-3 relative per product
            rtol, atol, l2_tol = max(rtol, 5e-3), max(atol, 5e-3), max(l2_tol, 1e-3)
        self.rtol, self.atol, self.l2_tol = rtol, atol, l2_tol
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir())
        os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
        self._private = private_root()
        self.log_dir = os.path.abspath(log_dir or os.path.join(self._private, "logs"))
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        self.import_dirs = [os.path.abspath(d) for d in import_dirs]
        self._code = PrivateCode(self._private)
        # Builder and runner (the processes that run candidate code) start in a namespace where one works.
        problem = namespace_problem() if self.opts.isolate else "turned off (isolate=False)"
        self._key_dir = os.path.abspath(key_dir or default_key_dir())
        read_only = [self._code.import_dir, self._code.source_dir, *python_dirs(), *self.import_dirs]
        if any(os.path.commonpath([self._key_dir, d]) == self._key_dir
               for d in [self.cache_dir, self.log_dir, *read_only]):
            raise ValueError(f"key_dir {self._key_dir} must not contain the cache, log, code or import directories")
        self._namespace = None if problem else Namespace(read_only=read_only, writable=[self.cache_dir],
                                                         hidden=[self._key_dir])
        # Build markers are signed only where candidates cannot read the key; elsewhere the key is deleted
        # (this Evaluator's candidates could read or plant it) and only this Evaluator's own builds count.
        self._seal = None if problem else BuildSeal(self._key_dir)
        if problem:
            forget_key(self._key_dir)
        self.isolation = f"none: {problem}" if problem else "pid+mount namespace"
        self._tamper_events, self._tamper_note = 0, ""
        self._built: dict[str, str] = {}  # source hash -> digest of its built libraries
        self._code_lock = threading.Lock()
        cores = os.cpu_count() or 2
        # load_inline has at most two translation units (main.cpp, cuda.cu): two jobs per build, and
        # several builds side by side, so builds overlap with timing and with each other.
        self._max_jobs = self.opts.max_jobs or 2
        self._build_sem = threading.BoundedSemaphore(self.opts.build_workers or max(2, cores // 2))
        self._build_locks: dict[str, threading.Lock] = {}
        self._state_lock = threading.Lock()
        self._closed = False
        self._spare_builder: _Worker | None = None
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="pacevolve-spawn")
        self._helpers = ThreadPoolExecutor(thread_name_prefix="pacevolve-prepare")  # reference prepares
        if gpus is None:
            gpus = list(range(_cuda_count())) if device == "cuda" else [0]
        if device == "cuda" and not gpus:
            raise RuntimeError("device='cuda' but no CUDA GPU is visible")
        self._cpu_plan(len(gpus))
        self.devices = [_Device(self, i) for i in gpus]
        cap = self.devices[0].info.get("capability")
        self._arch = arch_list_for(tuple(cap)) if cap else ""
        fast_nvcc = self._code.path("fast_nvcc.py")
        self._fast_nvcc = fast_nvcc if self.opts.fast_nvcc and os.path.exists(fast_nvcc) else ""
        # torch's precompiled extension.h lives in its install dir, read-only inside the namespace: a
        # trusted process outside it brings the header up to date once, while the baseline is measured.
        self._pch_ready = self._helpers.submit(self._prepare_pch) if self._namespace else None
        if self.opts.eager_baseline:  # before any candidate exists: nothing it started can slow the baseline
            for dev in self.devices:
                self._baseline(dev)

    # ---------------------------------------------------------------- public API
    def evaluate(self, candidate_src: str) -> EvalResult:
        t_start = time.monotonic()
        h = source_hash(candidate_src)
        details: dict = {"source_hash": h[:16], "flags": []}
        verdict = screen(candidate_src)
        if verdict.status != "ok":
            return EvalResult(verdict.status, message=verdict.message, details=dict(details, rule=verdict.rule))
        res = self._build(candidate_src, h, details)
        if res is not None:
            return res
        dev = self._pick(None)
        try:
            baseline = self._baseline(dev)
            tampered, ref_deaths = self._tamper_events, dev.ref_deaths
            try:
                result = evaluation.run(self, candidate_src, h, dev, details)
            except RuntimeError:
                if dev.ref_deaths == ref_deaths:
                    raise
                result = None
            if dev.ref_deaths != ref_deaths:  # never a silent restart: its death may have served the candidate
                result = EvalResult("rejected", message="rejected: the reference worker died while this "
                                    "candidate ran (stopped or killed from outside; restarted from the checked "
                                    "code copy)", details=details)
            result = self._tamper_verdict(tampered, result, details)
        finally:
            with self._state_lock:
                dev.pending -= 1
        if result.status == "ok":
            figures.paired_speedup(result, baseline["median_ms"], self._max_drift())
            evaluation.physical_checks(self, result, dev)
        if "tampering" in details.get("build_note", ""):
            result.message = "; ".join(m for m in (details["build_note"], result.message) if m)
        result.details.update(isolation=self.isolation, device=dev.info.get("device_name"), gpu=dev.index, torch=dev.info.get("torch"),
                              cuda=dev.info.get("cuda"), wall_s=time.monotonic() - t_start)
        return result

    def _max_drift(self) -> float:
        if self.opts.max_drift is not None:
            return self.opts.max_drift
        return 0.10 if self.device == "cuda" else 1.0   # a CPU's load moves its timings by 2-4x

    def baseline_ms(self, gpu: int | None = None) -> float:
        dev = self._pick(gpu)
        try:
            return self._baseline(dev)["median_ms"]
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
        internal = ("kind", "nonce", "ref_names", "ref_shapes", "in_bytes")
        return {k: v for k, v in dev.info.items() if k not in internal}

    # ---------------------------------------------------------------- plumbing
    def _cpu_plan(self, n_devices: int) -> None:
        """Reserve one core per device for its runner; builds and reference workers get the rest.

        Launch-bound kernels are timed partly on the host: a runner sharing its core with compilers reads
        slower, and a baseline measured during builds would skew every speedup after it.
        """
        try:
            cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = []
        if len(cores) >= n_devices + 2 and self.opts.pin_cpus:
            self._runner_cpus = [[c] for c in cores[-n_devices:]]
            self._other_cpus = cores[:-n_devices]
        else:
            self._runner_cpus, self._other_cpus = [None] * n_devices, None

    @classmethod
    def for_task(cls, task, **overrides) -> "Evaluator":
        kw = dict(device=getattr(task, "device", "cuda"), rtol=getattr(task, "rtol", 1e-4),
                  atol=getattr(task, "atol", 1e-4), l2_tol=getattr(task, "l2_tol", 1e-5),
                  flops=getattr(task, "flops", 0.0))
        kw.update(overrides)
        return cls(task.reference_src, **kw)

    def close(self) -> None:
        self._closed = True
        builder, self._spare_builder = getattr(self, "_spare_builder", None), None
        if builder is not None:
            builder.discard()
        for dev in getattr(self, "devices", []):
            dev.close()
            if dev.ref is not None:
                try:
                    dev.ref.send({"cmd": "quit"})
                except (OSError, ValueError):
                    pass
                dev.ref.kill()
                dev.ref = None
        for pool in (getattr(self, "_spawner", None), getattr(self, "_helpers", None)):
            if pool is not None:
                pool.shutdown(wait=False)
        if getattr(self, "_seal", 0) is None:  # a key made meanwhile by another Evaluator was readable here
            forget_key(self._key_dir)
        private = getattr(self, "_private", None)
        if private and os.path.isdir(private):
            _remove_tree(private, keep=self.log_dir)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _torch_device(self) -> str:
        return "cuda:0" if self.device == "cuda" else "cpu"

    def _env(self, **extra: str) -> dict[str, str]:
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
        return scrubbed_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONPATH=path,
                            PACEVOLVE_EVAL_PATH=os.pathsep.join(user_site + [path] if path else user_site),
                            **malloc, **extra)

    def _job(self, role: str, **kw) -> dict:
        job = dict(role=role, reference_src=self.reference_src, allow_tf32=self.opts.allow_tf32,
                   cpu_threads=self.opts.cpu_threads)
        job.update(kw)
        return job

    def _build_cfg(self) -> dict:
        return {"cflags": [], "cuda_cflags": [], "use_pch": self.opts.use_pch and _pch_writable(),
                "pch_lock": os.path.join(tempfile.gettempdir(), "pacevolve-pch.lock"),  # guards torch's install dir
                "light_headers": self.opts.light_headers, "nvcc": self._fast_nvcc}

    def _ext_extras(self, h: str) -> dict[str, str]:
        # Same values in the builder and the runner, so the runner's load_inline finds the build up to date.
        extra = {"TORCH_EXTENSIONS_DIR": os.path.join(self.cache_dir, "ext", h[:16]),
                 "MAX_JOBS": str(self._max_jobs)}
        if self._arch:
            extra["TORCH_CUDA_ARCH_LIST"] = self._arch
        return extra

    def _take_builder(self) -> _Worker:
        """A build process with torch already imported (the next one starts now); per-source settings
        (build directory, arch list) travel in the job."""
        with self._state_lock:
            w, self._spare_builder = self._spare_builder, None
            if self.opts.warm_runners and not self._closed:
                self._spare_builder = self._spawn_builder()
        if w is None or w.proc.poll() is not None:
            if w is not None:
                w.discard()
            w = self._spawn_builder()
        return w

    def _prepare_pch(self) -> str:
        """Builds torch's precompiled extension.h outside the namespace (builders only find it there)."""
        cfg = self._build_cfg()
        if not cfg["use_pch"]:
            return "off"
        script = ("import sys; sys.path.append(sys.argv[1]); from evaluate_kernel import build; "
                  "from torch.utils import cpp_extension as ce; build._ensure_pch(ce, [], sys.argv[2])")
        try:
            proc = subprocess.run([sys.executable, "-c", script, self._code.import_dir, cfg["pch_lock"]],
                                  env=self._env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
                                  timeout=self.opts.build_timeout_s)
        except subprocess.TimeoutExpired:
            return "timed out"
        return "ready" if proc.returncode == 0 else "failed: " + proc.stderr.strip()[-300:]

    def _spawn_builder(self) -> _Worker:
        # Builds never see a GPU: candidate module-level code cannot disturb a timing in progress.
        return self._spawn_warm(self._env(CUDA_VISIBLE_DEVICES=""),
                                os.path.join(self.log_dir, f"build-{secrets.token_hex(6)}.log"))

    def _new_worker(self, env: dict[str, str], log_path: str, warm: bool = False) -> _Worker:
        """A worker running the private copy of our code, checked just before it starts. Warm workers
        (builders and runners: they run candidate code) start in the namespace when there is one."""
        self._check_code()
        return _Worker(env, log_path, warm=warm, code_dir=self._code.import_dir,
                       namespace=self._namespace if warm else None, cpus=self._other_cpus if warm else None)

    def _spawn_warm(self, env: dict[str, str], log_path: str) -> _Worker:
        """A worker that imports torch at once, started from one long-lived thread: workers die with the
        thread that started them (_die_with_parent_preexec), and evaluation threads may be short-lived."""
        def start() -> _Worker:
            w = self._new_worker(env, log_path, warm=True)
            if self._other_cpus:
                try:
                    os.sched_setaffinity(w.proc.pid, self._other_cpus)
                except OSError:
                    pass
            return w
        try:
            return self._spawner.submit(start).result()
        except RuntimeError:  # the spawner is shut down: closing
            return start()

    # ---------------------------------------------------------------- stages
    def _pick(self, gpu: int | None) -> _Device:
        with self._state_lock:  # least busy device; ties go to the lowest index
            pool = [d for d in self.devices if gpu is None or d.index == gpu]
            if not pool:
                raise ValueError(f"gpu {gpu} is not one of {[d.index for d in self.devices]}")
            dev = min(pool, key=lambda d: d.pending)
            dev.pending += 1
            return dev

    def _build(self, src: str, h: str, details: dict) -> EvalResult | None:
        marker = os.path.join(self.cache_dir, "ext", h[:16], "BUILT")
        with self._state_lock:
            lock = self._build_locks.setdefault(h, threading.Lock())
        with lock:  # identical sources build once, even when submitted concurrently
            if os.path.exists(marker):
                # A build is trusted as this Evaluator made it (digest in memory) or as a signed marker says.
                trusted = self._built.get(h) or (self._seal.opened(h, _read_text(marker)) if self._seal else "")
                if trusted and library_digest(os.path.dirname(marker)) == trusted:
                    details["compile_s"] = 0.0
                    details["build_cached"] = True
                    return None
                # Another candidate's builder or runner rewrote this build's libraries: build it again.
                details["build_note"] = (
                    "the cached build was modified after it was built (tampering); rebuilt" if trusted else
                    "the cached build's marker has no valid signature (written by an Evaluator without a namespace, "
                    "with another key, or forged); rebuilt" if self._seal else
                    "a cached build from another Evaluator is not trusted without a namespace (candidates could "
                    "forge its marker); rebuilt")
                shutil.rmtree(os.path.dirname(marker), ignore_errors=True)
            if self._pch_ready is not None:
                self._pch_ready.result()
            with self._build_sem:
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                t0 = time.monotonic()
                tampered = self._tamper_events
                w = self._take_builder()
                try:
                    w.send({"role": "build", "candidate_src": src, "build": self._build_cfg(), "cpus": self._other_cpus,
                            "env": self._ext_extras(h)})
                    msg = w.recv(self.opts.build_timeout_s)
                except TimeoutError:
                    return EvalResult("timeout", message=f"build exceeded {self.opts.build_timeout_s:.0f} s",
                                      details=dict(details, compile_s=time.monotonic() - t0))
                except EOFError:
                    return EvalResult("compile_error", message=f"build: {w.death()}; {w.log_tail(600)}",
                                      details=details)
                finally:
                    strays = w.kill()
                    if strays:
                        details["stray_processes_killed"] = strays
                    details["build_wall_s"] = round(time.monotonic() - t0, 3)
                    _move(w.log_path, os.path.join(os.path.dirname(marker), "build.log"))
                    w.log_path = os.path.join(os.path.dirname(marker), "build.log")
            bad = self._tamper_verdict(tampered, None, details)
            if bad is not None:
                return bad
            details["compile_s"] = round(msg.get("compile_s", time.monotonic() - t0), 3)
            if msg.get("headers"):
                details["build_headers"] = msg["headers"]
            if msg.get("light"):
                details["light_headers"] = msg["light"]  # lean torch/types.h or not; operators kept
            if msg["kind"] == "compile_error":
                # After a failed light-header build only the real header's errors count (they are what
                # torch's own build of this source would say).
                log = w.log_tail(200000).rsplit(FULL_HEADER_RETRY, 1)[-1] + "\n" + msg["error"]
                details["compiler_output"] = log[-20000:]
                return EvalResult("compile_error", message=trim_compiler_output(log, src), details=details)
            if msg.get("deferred_error"):
                details["build_note"] = msg["deferred_error"]
            # The libraries' digest, kept here: a cached build loads only while it still matches. The marker's
            # copy serves a later Evaluator: it lies in the writable cache, so it counts only signed.
            self._built[h] = library_digest(os.path.dirname(marker))
            with open(marker, "w") as f:
                f.write(self._seal.seal(h, self._built[h]) if self._seal else self._built[h] + "\n")
            return None

    def _baseline(self, dev: _Device) -> dict:
        with self._state_lock:
            cached = dev.baseline
        if cached is not None:
            return cached
        with dev.lock:
            if dev.baseline is None:
                res = evaluation.run(self, None, "baseline", dev, {"flags": []}, locked=True)
                if res.status != "ok":
                    raise RuntimeError(f"the reference itself failed to run: {res.status}: {res.message}")
                dev.baseline = {**res.details.get("timing", {}), "median_ms": res.runtime_ms}
        return dev.baseline

    def baseline_info(self, gpu: int | None = None) -> dict:
        """The reference's measurement on a device: median_ms, peak_bytes (GPU memory allocated, or the CPU
        process's resident set) and what the peak counts."""
        dev = self.devices[0] if gpu is None else next(d for d in self.devices if d.index == gpu)
        base = self._baseline(dev)
        return {"median_ms": base.get("median_ms"), "peak_bytes": base.get("peak_bytes"),
                "peak_kind": "GPU memory allocated" if self.device == "cuda" else "process resident set"}

    def _check_code(self) -> None:
        """Compare the code the workers run (and its originals) with what was read at start."""
        with self._code_lock:
            problems = self._code.problems()
            if problems:
                self._tamper_events += 1
                self._tamper_note = "; ".join(problems)
        if problems:
            # _take_builder holds the state lock while it spawns (and so calls this): no lock taken here.
            builder, self._spare_builder = self._spare_builder, None
            if builder is not None:
                builder.discard()
            for dev in getattr(self, "devices", []):  # spares started since may have read a modified copy
                dev.close()

    def _tamper_verdict(self, before: int, result: EvalResult | None, details: dict) -> EvalResult | None:
        """A rejection if the evaluator's code changed while this candidate's process ran."""
        self._check_code()
        if self._tamper_events == before:
            return result
        return EvalResult("rejected", message=f"rejected: {self._tamper_note} while this candidate ran; a "
                          "candidate may write only inside its build directory", details=details)



def default_cache_dir() -> str:
    """Per-user: $XDG_CACHE_HOME/pacevolve/eval or ~/.cache/pacevolve/eval, created mode 0700."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "pacevolve", "eval")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _remove_tree(root: str, keep: str) -> None:
    """Remove the Evaluator's private directory, except a log directory inside it that someone reads."""
    import shutil
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
    if os.path.commonpath([root, keep]) == root and os.path.exists(keep) and os.listdir(keep):
        shutil.rmtree(os.path.join(root, "code"), ignore_errors=True)
        return
    shutil.rmtree(root, ignore_errors=True)


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
