"""Parent side of builds: a candidate's extension is built once, by a builder process, and trusted later
only by its digest.

    builds.build(src, h, details)   # None when the library is ready (built now or cached), else the verdict

A builder is a worker forked in the namespace without a GPU (its candidate code cannot reach the device),
one per build, the next one started while this one works. Identical sources build once, even submitted at
once: to this Evaluator (a lock per source) or to others sharing the cache, in this process or another (a
file lock beside the build). A cached build counts while its libraries' digest is the one this Evaluator
recorded, or the one a marker signed with the key candidates cannot read (sandbox.BuildSeal) vouches for;
anything else is rebuilt, and the note says why. torch's precompiled extension.h lives in torch's install
directory, read-only in the namespace: a process of ours outside it brings it up to date, and the state it
left is remembered where candidates cannot write (DESIGN.md, "Both protocols"). No build waits for it: one
that starts before it is ready compiles main.cpp from the headers' text (build.py), so the first verdict on
a fresh machine does not wait for the minute that header takes.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import Executor, Future

from . import binding_header, prefixes
from .build import FULL_HEADER_RETRY, _pch_writable, forget_stale_pch, pch_state, trim_compiler_output
from .common import EvalResult, EvaluatorError, lock_path, open_lock
from .protocol import Worker
from .sandbox import BuildSeal, library_digest, own_dir, read_plain, remove_all, walk, write_under


class Builds:
    """The builds of one Evaluator (`ev`: its cache, options, workers and code checks, through their public
    names); thread-safe."""

    def __init__(self, ev, seal: BuildSeal | None, key_dir: str, code_dir: str, fast_nvcc: str):
        self.ev, self._seal, self._key_dir, self._code_dir = ev, seal, key_dir, code_dir
        self._fast_nvcc = fast_nvcc
        self.arch = ""   # TORCH_CUDA_ARCH_LIST, once the device's architecture is known
        cores = os.cpu_count() or 2
        # load_inline has at most two translation units (main.cpp, cuda.cu): two jobs per build, and
        # several builds side by side, so builds overlap with timing and with each other.
        self._max_jobs = ev.opts.max_jobs or 2
        self._sem = threading.BoundedSemaphore(ev.opts.build_workers or max(2, cores // 2))
        self._locks: dict[str, threading.Lock] = {}
        self._built: dict[str, str] = {}  # source hash -> digest of its built libraries
        self._lock = threading.Lock()
        self._spare: Worker | None = None
        self._pch: Future | None = None
        self._pch_current = False   # torch's check had passed on the header as it was when preparation began
        self._binding: Future | None = None   # binding_header.py's directory, or "" (never waited for)
        self._binding_usable = ""   # the directory builds use now: its text until its preparation ends
        self._optimised: Future | None = None   # the same for torch's header at -O2, once a build wanted it
        self.header_notes: dict[str, str] = {}   # per kind of binding_header.py's: why there is none
        # Precompiled prefixes of nvcc's final step (prefixes.py), beside the binding header; only in the
        # namespace (elsewhere candidates could write the store), and only through fast_nvcc.
        self._prefix_store = os.path.join(binding_header.default_root(), "prefixes") \
            if fast_nvcc and ev.opts.prefixes else ""
        self._prefixing: set[str] = set()   # keys being precompiled now

    # ---------------------------------------------------------------- the flow
    def build(self, src: str, h: str, details: dict) -> EvalResult | None:
        with self._lock:
            lock = self._locks.setdefault(h, threading.Lock())
        ext = _open_ext(self.ev.cache_dir)
        try:
            return self._build(src, h, details, lock, f"/proc/self/fd/{ext}")
        finally:
            os.close(ext)

    def _build(self, src: str, h: str, details: dict, lock: threading.Lock, ext: str) -> EvalResult | None:
        # ext: the cache's ext directory as we opened it. Candidates building beside us may put a link in
        # its place at any moment; through the descriptor, our locks, directories and deletions stay in it.
        ev = self.ev
        marker = os.path.join(ext, h[:16], "BUILT")
        with lock, open_lock(os.path.join(ext, h[:16] + ".lock"), create=True) as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            if os.path.exists(marker):
                # A build is trusted as this Evaluator made it (digest in memory) or as a signed marker says
                # (another Evaluator built it again meanwhile: its libraries' bytes differ, its seal holds).
                made = self._built.get(h, "")
                signed = self._seal.opened(h, (read_plain(marker, 1 << 16) or b"").decode(errors="replace")) \
                    if self._seal else ""
                trusted = made or signed
                if trusted and _library_digest(ext, h) in (made, signed):
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
                remove_all(os.path.dirname(marker))
            with self._sem:
                # No marker: whatever stands at the build's directory is no build of ours (a failed one), so
                # it goes; the builder builds in its own home, and the build comes here once it is dead.
                remove_all(os.path.dirname(marker))
                t0 = time.monotonic()
                tampered = ev.tamper_events
                w = self._take_builder()
                w.keep_home = True   # its build is moved out of it once the builder is dead, and the rest removed
                home = w.home
                try:
                    # In the namespace a builder takes no lock (the precompiled header's is hidden): locks
                    # are then no-ops there, else a channel to other candidates (confine.confine_builder).
                    cfg = self.config()
                    if home and cfg["prefixes"]:
                        cfg["prefix_requests"] = os.path.join(home, PREFIX_REQUESTS)
                    w.send({"role": "build", "candidate_src": src, "reference_src": ev.reference_src,
                            "build": cfg, "cpus": ev.other_cpus, "locks": not ev.isolated,
                            "env": self.extension_env(h, os.path.join(home, "build") if home else None)})
                    msg = w.recv(ev.opts.build_timeout_s)
                except TimeoutError:
                    msg = EvalResult("timeout", message=f"build exceeded {ev.opts.build_timeout_s:.0f} s",
                                     details=dict(details, compile_s=time.monotonic() - t0))
                except EOFError:
                    msg = EvalResult("compile_error", message=f"build: {w.death()}; {w.log_tail(600)}",
                                     details=details)
                finally:
                    strays = w.kill()
                    if strays:
                        details["stray_processes_killed"] = strays
                    details["build_wall_s"] = round(time.monotonic() - t0, 3)
                    # The build's log stays in our log directory: moved into the cache, it went through a
                    # link the candidate put there (root wrote its text anywhere) or was read through one.
                unfit = None
                try:
                    # Every process of the builder is dead: what its home holds now is what it built, and
                    # no candidate's process can write where it goes (the finished builds are read-only).
                    if home and isinstance(msg, dict) and msg.get("kind") == "built":
                        unfit = _settle(os.path.join(home, "build"), ext, h[:16])
                    if home:
                        self.take_requests(os.path.join(home, PREFIX_REQUESTS), details)
                finally:
                    if home and not ev.opts.keep_worker_dirs:
                        remove_all(home)
                if isinstance(msg, EvalResult):
                    return msg
                if unfit:
                    return EvalResult("rejected", message=f"rejected: the build left {unfit}", details=details)
            bad = ev.tamper_verdict(tampered, None, details)
            if bad is not None:
                return bad
            # The builder ran candidate code: every field it sent is checked for its type before use.
            compile_s = msg.get("compile_s")
            details["compile_s"] = round(compile_s if isinstance(compile_s, (int, float)) else time.monotonic() - t0, 3)
            if isinstance(msg.get("headers"), str):
                details["build_headers"] = msg["headers"]
            if isinstance(msg.get("light"), dict):
                details["light_headers"] = msg["light"]  # lean torch/types.h or not; operators kept
            if isinstance(msg.get("pch"), str):
                details["pch"] = msg["pch"][:200]   # why torch's precompiled header was not used
            if isinstance(msg.get("binding"), bool):
                details["binding_header"] = msg["binding"]  # main.cpp built with binding_header.py's
            if isinstance(msg.get("prefix"), str) and msg["prefix"]:
                details["prefix"] = msg["prefix"][:100]   # nvcc's final step with a precompiled prefix
            if isinstance(msg.get("optimised"), bool):
                details["optimised_header"] = msg["optimised"]  # or with torch's, precompiled at -O2
            if msg.get("wants_optimised") is True:
                # Candidate code could claim this: it costs one preparation (a minute, once per machine).
                self.want_optimised()
            if msg.get("kind") not in ("built", "compile_error"):
                return EvalResult("rejected", message=f"rejected: the build process answered "
                                  f"{str(msg.get('kind'))[:40]!r}, not a build result (forged result)", details=details)
            if msg["kind"] == "compile_error":
                # After a failed light-header build only the real header's errors count (they are what
                # torch's own build of this source would say).
                log = w.log_tail(200000).rsplit(FULL_HEADER_RETRY, 1)[-1] + "\n" + str(msg.get("error", ""))
                details["compiler_output"] = log[-20000:]
                return EvalResult("compile_error", message=trim_compiler_output(log, src), details=details)
            if msg.get("deferred_error"):
                details["build_note"] = str(msg["deferred_error"])[:2000]
            # The libraries' digest, kept here: a cached build loads only while it still matches. The marker's
            # copy serves a later Evaluator: it lies in the writable cache, so it counts only signed.
            self._built[h] = _library_digest(ext, h)
            text = self._seal.seal(h, self._built[h]) if self._seal else self._built[h] + "\n"
            try:   # the cache is the candidates' to write: never through what they left there
                write_under(ext, [h[:16]], "BUILT", text.encode())
            except OSError:
                pass   # no marker: later Evaluators build it again; this one trusts its digest in memory
            return None

    def config(self) -> dict:
        """How builders (and a runner that must build again) call load_inline: our flags and options."""
        return {"cflags": [], "cuda_cflags": [], "use_pch": self.ev.opts.use_pch and _pch_writable(),
                "prefixes": self._prefix_store if self.ev.isolated else "",
                "pch_lock": lock_path("pch.lock"),  # guards torch's install dir
                "pch": self.pch_state(),
                "light_headers": self.ev.opts.light_headers, "nvcc": self._fast_nvcc,
                "binding": self.binding_header(), "optimised": self.optimised_header()}

    def extension_env(self, h: str, build_dir: str | None = None) -> dict[str, str]:
        """A runner's (or, with build_dir, a builder's) settings for load_inline. The runner finds the build
        where the builder's directory was moved (_settle), under the same names and flags: up to date."""
        extra = {"TORCH_EXTENSIONS_DIR": build_dir or os.path.join(self.ev.cache_dir, "ext", h[:16]),
                 "MAX_JOBS": str(self._max_jobs)}
        if self.arch:
            extra["TORCH_CUDA_ARCH_LIST"] = self.arch
        return extra

    def prepare_header(self, pool: Executor) -> Future:
        """torch's precompiled header brought up to date on `pool` (builds until then go without it, unless
        torch's check last passed on the header exactly as it is now: the check then rewrites nothing)."""
        self._pch_current = self._pch_checked(self.ev.env())
        self._pch = pool.submit(self.prepare_pch)
        # A CPU candidate's main.cpp holds all its code, which nearly always names an operator the binding
        # header leaves out: the header (a minute of a 2-core machine, 1 GB) is prepared for GPUs only.
        if self.ev.opts.light_headers and self.ev.device == "cuda":
            self._binding = pool.submit(self.prepare_main_header, "binding")
        return self._pch

    def pch_state(self) -> str:
        """"ready" once torch's precompiled header is (or where no process of ours prepares it: builders then
        bring it up to date themselves, under its lock), else "pending" or why it is not."""
        if self._pch is None:
            return "ready"
        if not self._pch.done():
            return "ready" if self._pch_current else "pending"
        try:
            return self._pch.result()
        except Exception as e:   # noqa: BLE001 - builds go without it
            return f"failed: {type(e).__name__}"

    def binding_header(self, wait: bool = False) -> str:
        """The binding header's directory once its text is usable (with wait: once it is precompiled too,
        or its preparation failed), else ""."""
        if wait:
            return self._ready(self._binding, True, "binding")
        return self._binding_usable or self._ready(self._binding, False, "binding")

    def optimised_header(self, wait: bool = False) -> str:
        """The same for torch's extension.h precompiled at -O2 (binding_header.py), prepared from the first
        build that asked for -O1 to -O3 and could not use the binding header."""
        return self._ready(self._optimised, wait, "optimised")

    def want_optimised(self) -> None:
        with self._lock:
            if self._optimised is None and self._pch is not None and self.ev.opts.light_headers:
                self._optimised = self.ev.helpers.submit(self.prepare_main_header, "optimised")

    def prepare_main_header(self, kind: str) -> str:
        """One of binding_header.py's directories (kind "binding" or "optimised"), made ready outside the
        namespace (builds use it from then on and never wait for it; the first on a machine takes tens of
        seconds), or "". The binding header is usable as soon as its text is written and checked (seconds);
        it is precompiled once torch's own header is; torch's at -O2 is only worth its precompiled form."""
        if kind == "binding":
            self._binding_usable = self._run_prepare(kind, precompiled=False)
        # Precompiled with the flags torch's check signs its header with (the language standard is torch's
        # choice): once that header is ready.
        if self._pch is None or self._pch.result() not in ("ready", "off"):
            return self._binding_usable if kind == "binding" else ""
        directory = self._run_prepare(kind, precompiled=True)
        if kind == "binding" and directory:
            self._binding_usable = directory   # another directory where the text's flags were not torch's
        return directory or (self._binding_usable if kind == "binding" else "")

    def _run_prepare(self, kind: str, precompiled: bool) -> str:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if not spec or not spec.origin:
            return ""
        script = ("import json, os, sys; cpus = [int(c) for c in sys.argv[3].split(',') if c]; "
                  "cpus and os.sched_setaffinity(0, cpus); sys.path.append(sys.argv[1]); "
                  "from evaluate_kernel import binding_header; "
                  "print(json.dumps(binding_header.prepare(sys.argv[2], sys.argv[4], kind=sys.argv[5], "
                  "precompiled=sys.argv[6] == '1')))")
        cpus = ",".join(str(c) for c in (self.ev.other_cpus or []))
        proc = None
        try:
            # The machine's place, as this process sees it: a worker's environment has caches of its own.
            proc = subprocess.run([sys.executable, "-c", script, self._code_dir, os.path.dirname(spec.origin), cpus,
                                   binding_header.default_root(), kind, "1" if precompiled else "0"],
                                  env=self.ev.env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
                                  timeout=self.ev.opts.build_timeout_s)
            directory, why = json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            self.header_notes[kind] = f"not prepared: {type(e).__name__}: {proc.stderr.strip()[-300:] if proc else e}"
            return ""
        self.header_notes[kind] = why
        return directory

    def _ready(self, future: Future | None, wait: bool, kind: str) -> str:
        if future is None or not (wait or future.done()):
            return ""
        try:
            return future.result()
        except Exception as e:   # noqa: BLE001 - no header is never an evaluation's failure
            self.header_notes[kind] = f"not prepared: {type(e).__name__}: {e}"
            return ""

    def prepare_pch(self) -> str:
        """Builds torch's precompiled extension.h outside the namespace (builders only find it there)."""
        cfg = self.config()
        if not cfg["use_pch"]:
            return "off"
        env = self.ev.env(CUDA_VISIBLE_DEVICES="")
        seen = os.path.join(self._key_dir, "pch-current")   # hidden from candidates, as the key is
        if self._pch_checked(env):
            return "ready"   # as torch's check last left it: that check imports torch, seconds of a first build
        forget_stale_pch()
        # On the cores the runners do not use: it may run beside the baseline (a header built on the runner's
        # core once put a batch's fixed cost at 7.5 ms instead of 0.8: DESIGN.md).
        script = ("import os, sys; cpus = [int(c) for c in sys.argv[3].split(',') if c]; "
                  "cpus and os.sched_setaffinity(0, cpus); sys.path.append(sys.argv[1]); "
                  "from evaluate_kernel import build; "
                  "from torch.utils import cpp_extension as ce; build._ensure_pch(ce, [], sys.argv[2], aside=True)")
        cpus = ",".join(str(c) for c in (self.ev.other_cpus or []))
        try:
            proc = subprocess.run([sys.executable, "-c", script, self._code_dir, cfg["pch_lock"], cpus],
                                  env=env, capture_output=True, text=True, timeout=self.ev.opts.build_timeout_s)
        except subprocess.TimeoutExpired:
            return "timed out"
        if proc.returncode != 0:
            return "failed: " + proc.stderr.strip()[-300:]
        state = pch_state(env)
        if state:
            try:
                os.makedirs(self._key_dir, mode=0o700, exist_ok=True)
                with open(seen + ".tmp", "w") as f:
                    f.write(state)
                os.replace(seen + ".tmp", seen)
            except OSError:
                pass
        return "ready"

    def _pch_checked(self, env: dict[str, str]) -> bool:
        """Whether torch's check of its precompiled header last passed on the header as it is now (its
        signature, size, time, torch's version, the compiler and PATH, where ccache would come from)."""
        state = pch_state(env)
        return bool(state) and read_plain(os.path.join(self._key_dir, "pch-current"), 1 << 16) == state.encode()

    def discard_spare(self) -> None:
        """(The evaluator's code changed.) The next builder may have read a modified copy. No lock: the
        spawn in _take_builder, under the lock, is what finds the change."""
        builder, self._spare = self._spare, None
        if builder is not None:
            builder.discard()

    # ---------------------------------------------------------------- precompiled prefixes
    def take_requests(self, requests: str, details: dict) -> str:
        """The prefix a dead builder asked for (fast_nvcc.py), read now (its home goes next), checked
        (prefixes.read_request) and precompiled beside the evaluations: one a build (a candidate's code
        could ask for any number), two at most at once; a refusal is noted in details. Returns the store."""
        store = self._prefix_store
        if not store or not self.ev.isolated or os.path.islink(requests) or not os.path.isdir(requests):
            return store
        with os.scandir(requests) as found:
            names = [e.name for _, e in zip(range(64), found)]
        keys = sorted(n for n in names if len(n) == 40)
        for name in names:   # an entry used now is kept longer (the store drops the least recently used)
            if name.startswith("used-"):
                prefixes.touch(store, name[5:])
        for key in keys[:1]:
            with self._lock:
                if key in self._prefixing or len(self._prefixing) >= 2 or \
                        os.path.exists(os.path.join(store, key, prefixes.READY)):
                    continue
            try:
                request = prefixes.read_request(requests, key, self._include_roots(), self._compilers())
            except prefixes.Refused as e:
                details["prefix_refused"] = str(e)[:300]
                continue
            with self._lock:
                if key in self._prefixing or len(self._prefixing) >= 2:
                    continue
                self._prefixing.add(key)
            self.ev.helpers.submit(self._precompile, request)
        return store

    def prefixes_settled(self, timeout_s: float) -> bool:
        """Waits until no prefix is being precompiled (a benchmark's way to measure a long search's builds,
        which find their prefix stored); True if none is, False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._prefixing:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def _precompile(self, request: dict) -> None:
        """One prefix precompiled by a worker of ours (no candidate code, confined as a builder) and put in
        the store; a failure leaves the store as it was (builds then compile the whole text)."""
        ev, w, home = self.ev, None, ""
        try:
            w = self._spawn_builder()
            w.keep_home = True
            home = w.home
            if not home or ev.closed:
                return
            header = os.path.join(home, prefixes.HEADER)   # written before the worker is given anything to do
            with open(header, "w", encoding="utf-8", newline="") as f:
                f.write(request["text"])
            w.send({"role": "precompile", "command": prefixes.precompile_command(request, header, header + ".gch"),
                    "cpus": ev.other_cpus, "locks": False, "timeout_s": prefixes.TIMEOUT_S,
                    "memory": prefixes.MAX_MEMORY})
            msg = w.recv(prefixes.TIMEOUT_S + 10)
            w.kill()
            if isinstance(msg, dict) and msg.get("kind") == "precompiled" and msg.get("returncode") == 0 \
                    and not ev.closed:
                prefixes.publish(self._prefix_store, request, header + ".gch")
            else:
                why = msg.get("error") if isinstance(msg, dict) else msg
                self.header_notes["prefix"] = f"not precompiled: {str(why)[-300:]}"
        except Exception as e:   # noqa: BLE001 - no prefix is never an evaluation's failure
            self.header_notes["prefix"] = f"not precompiled: {type(e).__name__}: {e}"
        finally:
            if w is not None:
                w.kill()
            if home:
                remove_all(home)
            with self._lock:
                self._prefixing.discard(request["key"])

    def _include_roots(self) -> list[str]:
        """Where a precompiled prefix may read headers from: torch's, CUDA's and Python's include trees."""
        import importlib.util
        import sysconfig
        roots = [sysconfig.get_paths()["include"]]
        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            roots.append(os.path.join(os.path.dirname(spec.origin), "include"))
        nvcc = shutil.which("nvcc", path=self.ev.env().get("PATH"))
        cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or \
            (os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else "")
        return roots + ([cuda] if cuda else [])

    def _compilers(self) -> list[str]:
        env = self.ev.env()
        return [c for c in (env.get("CXX"), env.get("CC")) if c and os.path.isabs(c)]

    # ---------------------------------------------------------------- helpers
    def _take_builder(self) -> Worker:
        """A build process with torch already imported (the next one starts now); per-source settings
        (build directory, arch list) travel in the job."""
        with self._lock:
            w, self._spare = self._spare, None
            if self.ev.opts.warm_runners and not self.ev.closed:
                self._spare = self._spawn_builder()
        if w is None or w.proc.poll() is not None:
            if w is not None:
                w.discard()
            w = self._spawn_builder()
        return w

    def _spawn_builder(self) -> Worker:
        # Builds never see a GPU (no device node in their namespace; the variable is for a builder without
        # one): candidate module-level code cannot disturb a timing in progress.
        return self.ev.spawn_warm(self.ev.env(CUDA_VISIBLE_DEVICES=""),
                                  os.path.join(self.ev.log_dir, f"build-{secrets.token_hex(6)}.log"), gpu=False,
                                  builder=True)



PREFIX_REQUESTS = "prefix-requests"   # in a builder's home: fast_nvcc's requests (prefixes.py)


def _open_ext(cache_dir: str) -> int:
    """A descriptor of cache/ext, made ours first (sandbox.own_dir); a link a candidate puts there between
    the two is set aside and the directory opened again."""
    path = os.path.join(cache_dir, "ext")
    for _ in range(3):
        own_dir(path)
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            problem = e
    raise EvaluatorError(f"the build cache's ext directory keeps being replaced: {problem}")


MAX_BUILD_ENTRIES, MAX_BUILD_DEPTH, MAX_BUILD_BYTES = 20000, 32, 4 << 30   # a build's tree, at most


def _settle(built: str, ext: str, name: str) -> str | None:
    """A dead builder's build directory moved to ext/name (ext: our descriptor's path), or copied where the
    two lie on different file systems, and made ours (sandbox.own_dir). Before the move, what no build
    holds is taken out of it: FIFOs, sockets and device nodes (a FIFO moved into the finished builds, which
    are read-only but can still be opened for writing, carried one candidate's inputs to another's builder:
    8.7x over the twin, twenty-eighth red team), and set-user-ID and set-group-ID bits (a worker is root: a
    file it creates with mode 6755 would be a root program for anyone who reaches the cache). Returns what
    is wrong with a tree no build is (too deep, too many files, too large: the parent walks and digests
    it), which is then not moved; an empty directory stands at ext/name either way."""
    target = os.path.join(ext, name)
    remove_all(target)
    unfit = None
    if os.path.isdir(built) and not os.path.islink(built):
        unfit = _tidy(built)
        if unfit is None:
            try:
                os.rename(built, target)
            except OSError:
                try:
                    shutil.copytree(built, target, symlinks=True)
                except (OSError, shutil.Error):
                    remove_all(target)
    own_dir(target)
    return unfit


def _tidy(top: str) -> str | None:
    """Take out of a build's tree what no build holds (see _settle); what is wrong with it, or None."""
    entries, size = 0, 0
    for here, dirs, others in walk(top):
        if os.path.relpath(here, top).count(os.sep) >= MAX_BUILD_DEPTH:
            return f"a directory tree deeper than {MAX_BUILD_DEPTH} levels"
        entries += len(dirs) + len(others)
        if entries > MAX_BUILD_ENTRIES:
            return f"more than {MAX_BUILD_ENTRIES} files"
        for f in others:
            path = os.path.join(here, f)
            try:
                st = os.lstat(path)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    os.unlink(path)
                    continue
                size += st.st_size
                if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            except OSError:
                pass
        if size > MAX_BUILD_BYTES:
            return f"more than {MAX_BUILD_BYTES >> 30} GiB of files"
    return None


def _library_digest(ext: str, h: str) -> str:
    """The digest of a build's directory under ext (a descriptor's path), if it is a directory: the cache
    is the candidates' to write, and a walk through a link to / would hash the machine."""
    build_dir = os.path.join(ext, h[:16])
    if os.path.islink(build_dir) or not os.path.isdir(build_dir):
        return "not the build's directory"
    return library_digest(build_dir)

