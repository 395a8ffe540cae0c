"""Compile, verify and time a candidate kernel against a KernelBench reference, in isolation.

PACEvolve (paper section 4, "Kernel optimisation" experiments) scores a candidate by its speedup over the
PyTorch reference of a KernelBench problem. The search optimises whatever number this module returns, so
the module's job is to make that number honest:

* a static screen rejects code patterns with no honest use in a candidate (RULES, each with its reason);
* the candidate is built in a subprocess with no GPU (per-source-hash build dir, hard timeout; a .cu file
  is built first with light_headers.py's cut-down torch headers, about a third of the real ones' compile
  time, then with the real ones if that fails; nvcc's host and device front ends run side by side through
  fast_nvcc.py), then run in a fresh subprocess per evaluation (own process group, hard timeout, scrubbed
  environment);
* reference outputs come from a persistent worker that never imports candidate code; it also does every
  comparison, on tensors loaded with ``weights_only=True``, so the candidate cannot forge a verdict;
* timing is KernelBench's protocol (synchronise, L2 flush, start event, the call, end event on its stream) on
  fresh input contents every call, with a lead: the GPU is held (_GpuHold, every SM's warp slots) for
  lead_ms before the start event, so the host's latency to the first kernel does not count and nothing
  can run beside the hold; the runtime is the median, or the host's time to queue a call when longer. A
  device-wide synchronise after each call, less the host's own delay measured right after, rejects work
  left running on other streams; timed outputs are spot-checked and the host clock cross-checks the events
  (against calls timed without the lead). The baseline is the reference timed by the same routine on the
  same GPU, once per GPU.

Left out: profiler proof that custom kernels ran (a pure-PyTorch candidate is legal in KernelBench), clock
locking, and precision policies other than fp32 / opt-in TF32.

The same file is the worker program: ``python evaluate_kernel.py --worker`` reads one JSON job on stdin.
"""
from __future__ import annotations

import dataclasses
import math
import os
import secrets
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait

from eval_build import FULL_HEADER_RETRY, _pch_writable, arch_list_for, trim_compiler_output
from eval_common import (_DISTS, _PEAKS, STATUSES, EvalResult, Options, _move, _quantile, compare_outputs,
                         scrubbed_env, source_hash)
from eval_device import _cuda_count, _Device, _FileLock, _NullCtx, gpu_lock_path, physical_gpu
from eval_protocol import _Worker
from eval_screen import RULES, ScreenVerdict, rules_markdown, screen

__all__ = ["Evaluator", "EvalResult", "Options", "STATUSES", "RULES", "ScreenVerdict", "evaluate", "screen",
           "rules_markdown", "compare_outputs", "scrubbed_env", "source_hash", "arch_list_for",
           "trim_compiler_output", "physical_gpu", "gpu_lock_path", "FULL_HEADER_RETRY"]


class Evaluator:
    """One per task: thread-safe; caches baselines per device; owns the reference workers."""

    def __init__(self, reference_src: str, *, device: str = "cuda", gpus: list[int] | None = None,
                 rtol: float = 1e-4, atol: float = 1e-4, l2_tol: float = 1e-5, flops: float = 0.0,
                 cache_dir: str | None = None, **options):
        unknown = set(options) - {f.name for f in dataclasses.fields(Options)}
        if unknown:
            raise TypeError(f"unknown options: {sorted(unknown)}")
        self.reference_src, self.device, self.flops = reference_src, device, flops
        self.opts = Options(**options)
        if self.opts.allow_tf32:  # TF32 keeps 10 mantissa bits: ~1e-3 relative per product
            rtol, atol, l2_tol = max(rtol, 5e-3), max(atol, 5e-3), max(l2_tol, 1e-3)
        self.rtol, self.atol, self.l2_tol = rtol, atol, l2_tol
        self.cache_dir = os.path.abspath(cache_dir or os.path.join(tempfile.gettempdir(), "pacevolve-eval"))
        os.makedirs(self.cache_dir, exist_ok=True)
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
        fast_nvcc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fast_nvcc.py")
        self._fast_nvcc = fast_nvcc if self.opts.fast_nvcc and os.path.exists(fast_nvcc) else ""

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

    # ---------------------------------------------------------------- plumbing
    def _torch_device(self) -> str:
        return "cuda:0" if self.device == "cuda" else "cpu"

    def _env(self, **extra: str) -> dict[str, str]:
        threads = str(self.opts.cpu_threads)
        # Fixed glibc malloc thresholds: with the default dynamic threshold a process serves tensors either
        # from fresh mmaps (page faults every call) or from the heap, and CPU timings of the same model
        # differed 3x between processes. Fixed, every process takes the heap path.
        malloc = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
        return scrubbed_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, **malloc, **extra)

    def _job(self, role: str, **kw) -> dict:
        job = dict(role=role, reference_src=self.reference_src, allow_tf32=self.opts.allow_tf32,
                   cpu_threads=self.opts.cpu_threads)
        job.update(kw)
        return job

    def _build_cfg(self) -> dict:
        return {"cflags": [], "cuda_cflags": [], "use_pch": self.opts.use_pch and _pch_writable(),
                "pch_lock": os.path.join(tempfile.gettempdir(), "pacevolve-pch.lock"),
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

    def _spawn_builder(self) -> _Worker:
        # Builds never see a GPU: candidate module-level code cannot disturb a timing in progress.
        return self._spawn_warm(self._env(CUDA_VISIBLE_DEVICES=""),
                                os.path.join(self.cache_dir, f"build-{secrets.token_hex(6)}.log"))

    def _spawn_warm(self, env: dict[str, str], log_path: str) -> _Worker:
        """A worker that imports torch at once, started from one long-lived thread: workers die with the
        thread that started them (_die_with_parent_preexec), and evaluation threads may be short-lived."""
        def start() -> _Worker:
            w = _Worker(env, log_path, warm=True)
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

    # ---------------------------------------------------------------- public API
    def baseline_ms(self, gpu: int | None = None) -> float:
        dev = self._pick(gpu)
        try:
            return self._baseline(dev)["median_ms"]
        finally:
            with self._state_lock:
                dev.pending -= 1

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
            result = self._run(candidate_src, h, dev, details)
        finally:
            with self._state_lock:
                dev.pending -= 1
        if result.status == "ok":
            result.baseline_ms = baseline["median_ms"]
            result.speedup = baseline["median_ms"] / result.runtime_ms if result.runtime_ms else None
            self._physical_checks(result, dev)
        result.details.update(device=dev.info.get("device_name"), gpu=dev.index, torch=dev.info.get("torch"),
                              cuda=dev.info.get("cuda"), wall_s=time.monotonic() - t_start)
        return result

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

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

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
                details["compile_s"] = 0.0
                details["build_cached"] = True
                return None
            with self._build_sem:
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                t0 = time.monotonic()
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
                    w.kill()
                    details["build_wall_s"] = round(time.monotonic() - t0, 3)
                    _move(w.log_path, os.path.join(os.path.dirname(marker), "build.log"))
                    w.log_path = os.path.join(os.path.dirname(marker), "build.log")
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
            with open(marker, "w") as f:
                f.write(h)
            return None

    def _baseline(self, dev: _Device) -> dict:
        with self._state_lock:
            cached = dev.baseline
        if cached is not None:
            return cached
        with dev.lock:
            if dev.baseline is None:
                res = self._run(None, "baseline", dev, {"flags": []}, locked=True)
                if res.status != "ok":
                    raise RuntimeError(f"the reference itself failed to run: {res.status}: {res.message}")
                dev.baseline = {**res.details.get("timing", {}), "median_ms": res.runtime_ms}
        return dev.baseline

    def _trial_specs(self) -> list[dict]:
        seeds = [secrets.randbits(31) for _ in range(self.opts.trials)]
        specs = [{"seed": s, "dist": _DISTS[k % len(_DISTS)], "weight_seed": 42, "perturb": False,
                  "on_device": self.opts.inputs_on_device} for k, s in enumerate(seeds)]
        if len(specs) >= 2:  # the last trial re-seeds and perturbs the weights
            specs[-1].update(dist="own", weight_seed=secrets.randbits(31), perturb=True)
        # Hack 1 again: the first input set once more, after poisoning; an output read from stale memory
        # or a cache cannot match twice under different allocator states.
        return specs + [dict(specs[0], repeat=True)]

    def _run(self, src: str | None, h: str, dev: _Device, details: dict, locked: bool = False) -> EvalResult:
        mode = "baseline" if src is None else "candidate"
        specs = self._trial_specs() if mode == "candidate" else []
        own = [s for s in specs if s["dist"] == "own" and not s["perturb"]][:2] or \
              [{"seed": secrets.randbits(31), "dist": "own", "weight_seed": 42, "perturb": False,
                "on_device": self.opts.inputs_on_device} for _ in range(2)]
        specs = specs or [own[0]]
        iters = self.opts.timing_iters
        timing = {"input_specs": own, "iters": iters, "warmup": self.opts.warmup, "warmup_ms": self.opts.warmup_ms,
                  "seed": secrets.randbits(31), "tail_ms": self.opts.tail_ms, "lead_ms": self.opts.lead_ms,
                  "verify": sorted(secrets.SystemRandom().sample(range(iters), min(self.opts.verify_calls, iters)))
                  if mode == "candidate" else [], "flush_bytes": self._flush_bytes(dev), "host_calls": self.opts.host_calls,
                  "host_rounds": self.opts.host_rounds}
        work = tempfile.mkdtemp(prefix="run-", dir=self.cache_dir)
        job = self._job("run", mode=mode, candidate_src=src, device=self._torch_device(), trials=specs,
                        timing=timing, work_dir=work, build=self._build_cfg(), poison_bytes=self.opts.poison_bytes,
                        env=self._ext_extras(h), cpus=self._runner_cpus[self.devices.index(dev)])
        lock_cm = _NullCtx() if locked else dev.lock
        t_wait = time.monotonic()
        try:
            with lock_cm, _FileLock(dev.gpu_lock_path):
                details["phases"] = {"gpu_wait": round(time.monotonic() - t_wait, 3)}
                w = dev.take_runner()
                # The reference worker computes its outputs while the candidate computes its own (not timed).
                prepare = self._helpers.submit(dev.ref_call, {
                    "cmd": "prepare", "max_bytes": self.opts.prepare_bytes,
                    "items": [{"spec": s, "index": k} for k, s in enumerate(specs) if not s["perturb"]]}) \
                    if mode == "candidate" and self.opts.prepare_bytes > 0 else None
                try:
                    return self._drive(w, job, dev, specs, details, prepare)
                finally:
                    dev.pause_spares(False)
                    if prepare is not None:
                        futures_wait([prepare])  # nothing of this evaluation may still run when the GPU lock goes
                    w.discard()  # used once: a fresh process per evaluation
                    dev.settle_spare(final=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _drive(self, w: _Worker, job: dict, dev: _Device, specs: list, details: dict,
               prepare: Future | None) -> EvalResult:
        t0 = time.monotonic()
        deadline = t0 + self.opts.run_timeout_s
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
                return self._failure(msg, details)
            marks = msg.get("marks", {})
            if {"job_received", "candidate_loaded", "trials_done"} <= set(marks):  # the runner's clock
                phases["runner_start"] = round(max(0.0, marks["job_received"] - sent), 3)  # ~0: a spare waited
                phases["load"] = round(marks["candidate_loaded"] - marks["job_received"], 3)  # its load_inline
                phases["trials"] = round(marks["trials_done"] - marks["candidate_loaded"], 3)
            details["flags"] += msg.get("flags", [])
            if job["mode"] == "candidate":
                if prepare is not None:
                    futures_wait([prepare])  # if it failed, the comparison computes what is missing
                bad = self._check_trials(msg, dev, specs, details)
                if bad is not None:
                    return bad
            t = mark("compare", t)
            dev.settle_spare()  # the next runner's CUDA start-up must not overlap this timing
            t = mark("spare_wait", t)
            dev.pause_spares()  # resumed by _run when this evaluation ends, however it ends
            w.send({"cmd": "time"})
            rounds, t_start = [], None
            msg = recv()
            while msg["kind"] in ("host_start", "host_end"):  # timestamped here, with the parent's clock
                if msg["kind"] == "host_start":
                    t_start = time.monotonic()
                elif t_start is not None:
                    rounds.append(time.monotonic() - t_start)
                    t_start = None
                msg = recv()
            if msg["kind"] != "timed":
                return self._failure(msg, details)
            # The protocol is fixed: exactly host_rounds rounds, then "timed", then nothing. Extra or missing
            # messages mean someone else in the process used the channel.
            extra = self._drain(w, deadline)
            if len(rounds) != job["timing"]["host_rounds"] or extra:
                return EvalResult("rejected", message="rejected: the result channel carried messages the harness "
                                  "did not send (forged result)", details=details)
        except TimeoutError:
            return EvalResult("timeout", message=f"run exceeded {self.opts.run_timeout_s:.0f} s "
                                                 "(infinite loop or deadlock?)", details=details)
        except (EOFError, OSError):
            return EvalResult("runtime_error", message=f"{w.death()}. Log tail: {w.log_tail(400)}", details=details)
        details["flags"] += msg.get("flags", [])
        samples = sorted(msg["samples"])
        median = _quantile(samples, 0.5)
        iqr = _quantile(samples, 0.75) - _quantile(samples, 0.25)
        host_ms = min(rounds) * 1e3 / job["timing"]["host_calls"] if rounds else None
        tail = _quantile(sorted(msg.get("tails") or []), 0.5)
        # Without a lead (every fourth call) the host's latency is in the sample, as in KernelBench: the host
        # check compares those with the host clock, so a launch-bound call is not mistaken for escaped work.
        plain = _quantile(sorted(msg.get("plain_samples") or msg["samples"]), 0.5)
        # The lead hides the host's time to queue the call; when the host is the slower side (launch-bound
        # calls), the call costs the host's time per call instead, as it would queued back to back.
        queue = _quantile(sorted(msg.get("queue_ms") or []), 0.5)
        runtime = max(median, queue) if msg.get("lead_ms") and not math.isnan(queue) else median
        details["timing"] = {"samples_ms": msg["samples"], "median_ms": median, "iqr_ms": iqr,
                             "spread": iqr / median if median else None, "host_ms_per_call": host_ms,
                             "host_queue_ms": None if math.isnan(queue) else queue,
                             "runtime_ms": runtime, "bound": "host" if runtime > median else "gpu",
                             "plain_samples_ms": msg.get("plain_samples", []), "plain_median_ms": plain,
                             "device_tail_ms": None if math.isnan(tail) else tail, "tails_ms": msg.get("tails", []),
                             "lead_ms": msg.get("lead_ms", 0.0), "io_bytes": msg.get("io_bytes", 0)}
        t = mark("timing", t)
        details["time_s"] = round(time.monotonic() - t0, 3)
        if job["mode"] == "candidate":
            bad = self._check_timed(msg, dev, specs, details)
            mark("verify", t)
            if bad is not None:
                return bad
            if details["flags"]:
                return EvalResult("rejected", message="rejected: " + "; ".join(details["flags"][:3]), details=details)
            if tail > self.opts.tail_ms:  # NaN (no GPU) compares False
                return EvalResult("rejected", message=f"rejected: the GPU was still busy {tail:.4f} ms (median) after "
                                  "the call's stream had finished: work on another stream, which is how timers are "
                                  "escaped", details=details)
            if host_ms and plain * self.opts.host_ratio < host_ms and host_ms - plain > self.opts.host_slack_ms:
                return EvalResult("rejected", message=f"timing mismatch: CUDA events say {plain:.4f} ms per call, "
                                  f"the host clock {host_ms:.4f} ms; work is escaping the timed window",
                                  details=details)
        return EvalResult("ok", correct=True, runtime_ms=runtime, details=details)

    @staticmethod
    def _drain(w: _Worker, deadline: float) -> int:
        """Messages after the final one, until the worker closes the channel (it exits right after)."""
        extra = 0
        while True:
            try:
                w.recv(max(0.1, min(10.0, deadline - time.monotonic())))
                extra += 1
            except (EOFError, TimeoutError):
                return extra

    def _failure(self, msg: dict, details: dict) -> EvalResult:
        details["flags"] += msg.get("flags", [])
        kind, err = msg.get("kind"), msg.get("error", "")
        if kind == "rejected":
            return EvalResult("rejected", message=f"rejected: {err}", details=details)
        if "out of memory" in err.lower():
            err = "out of memory: " + err
        where = msg.get("where", "run")
        status = "invalid" if where == "import" and "ModelNew" in err and "KeyError" in err else "runtime_error"
        return EvalResult(status, message=f"{where}: {err}", details=dict(details, error=err))

    def _check_trials(self, msg: dict, dev: _Device, specs: list, details: dict) -> EvalResult | None:
        # The perturbation applies by parameter name; the reference worker reported its names at start-up.
        match = msg.get("names", []) == dev.info.get("ref_names")
        items = [{"spec": s, "names_match": match, "index": k} for k, s in enumerate(specs)]
        if any(s["perturb"] for s in specs) and not match:
            details["notes"] = ("perturbed-weights trial skipped: ModelNew's bias/affine parameter names differ "
                                "from the reference's, so the same perturbation cannot be applied")
            items = [it for it in items if not it["spec"]["perturb"]]
        reply = dev.ref_call({"cmd": "compare", "path": msg["path"], "field": "outputs", "items": items,
                              "rtol": self.rtol, "atol": self.atol, "l2_tol": self.l2_tol})
        if reply["kind"] != "compared":
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
                return EvalResult("incorrect", message=f"incorrect on {what}: {r['reason']}", details=details)
        return None

    def _check_timed(self, msg: dict, dev: _Device, specs: list, details: dict) -> EvalResult | None:
        if not msg.get("verify"):
            return None
        own = [s for s in specs if s["dist"] == "own" and not s["perturb"]][:2]
        items = [{"spec": own[v["base"]], "scale": v["scale"], "index": k} for k, v in enumerate(msg["verify"])]
        reply = dev.ref_call({"cmd": "compare", "path": msg["path"], "field": "checked", "items": items,
                              "rtol": self.rtol, "atol": self.atol, "l2_tol": self.l2_tol})
        for v, r in zip(msg["verify"], reply.get("results", [])):
            if not r["ok"]:
                return EvalResult("incorrect", message=f"timed call {v['iter']} returned a wrong result (outputs "
                                  f"cached or computed after the timer?): {r['reason']}", details=details)
        return None

    def _flush_bytes(self, dev: _Device) -> int:
        return max(self.opts.flush_bytes, 2 * int(dev.info.get("l2_bytes") or 0))

    def _physical_checks(self, result: EvalResult, dev: _Device) -> None:
        """Hack 17: a runtime below what the hardware can do is impossible; a huge speedup is flagged."""
        floor = self._floor_ms(dev)
        result.details["floor_ms"] = floor
        if floor and result.runtime_ms is not None and result.runtime_ms < floor:
            result.status, result.correct = "rejected", False
            result.message = (f"rejected: {result.runtime_ms:.4f} ms is below the physical floor {floor:.4f} ms "
                              "for this task (bytes moved / peak bandwidth, flops / peak rate)")
            return
        if result.speedup and result.speedup > self.opts.max_speedup:
            result.details["flags"].append(f"speedup {result.speedup:.1f}x above {self.opts.max_speedup:g}x")
            result.message = f"ok, but the {result.speedup:.1f}x speedup is unusually high and flagged for review"
        else:
            result.message = f"ok: {result.speedup:.3g}x ({result.runtime_ms:.4g} ms vs {result.baseline_ms:.4g} ms)"

    def _floor_ms(self, dev: _Device) -> float:
        name = dev.info.get("device_name", "")
        bw, peak = next((v for k, v in _PEAKS.items() if k in name), (None, None))
        bw, peak = self.opts.peak_bytes_per_s or bw, self.opts.peak_flops or peak
        nbytes = (dev.baseline or {}).get("io_bytes", 0)
        t = 0.0
        if bw and nbytes:
            t = max(t, nbytes / bw * 1e3)
        if peak and self.flops:
            t = max(t, self.flops / peak * 1e3)
        return t


def evaluate(reference_src: str, candidate_src: str, *, device: str = "cuda", **options) -> EvalResult:
    """One-shot convenience: builds an Evaluator, evaluates one candidate, closes it."""
    verdict = screen(candidate_src)  # no workers are started for code the screen already refuses
    if verdict.status != "ok":
        return EvalResult(verdict.status, message=verdict.message, details={"rule": verdict.rule})
    with Evaluator(reference_src, device=device, **options) as ev:
        return ev.evaluate(candidate_src)


