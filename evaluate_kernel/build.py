"""The build: load_inline wrapped with our flags, build directory and light headers; compiler messages.

Runs in the builder worker (eval_worker.py, no GPU visible) and again in the runner, which imports the
library the builder made. trim_compiler_output and arch_list_for run in the parent.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import linecache
import os
import re
import shlex
import sys
from typing import Any

from .common import _read, _remove, open_lock

def arch_list_for(capability: tuple[int, int]) -> str:
    # Build SASS only for the GPU present, no PTX: one device pass less, nothing to JIT at load time.
    # sm_90 becomes 9.0a so Hopper-only instructions (wgmma, TMA, setmaxnreg) are available to candidates;
    # 9.0a SASS runs exactly on the sm_90 part we time on, so nothing is lost.
    major, minor = capability
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"


_ERROR_LINE = re.compile(r"^(?P<file>[^\s:()]+\.(?:cpp|cu|cuh|h))"
                         r"(?::(?P<line>\d+)(?::\d+)?:|\((?P<nvcc_line>\d+)\):)"  # gcc f.cpp:12:5: / nvcc f.cu(12):
                         r"\s*(?P<kind>fatal error|error)\b[: ]*(?P<msg>.*)$")


def trim_compiler_output(log: str, candidate_src: str, max_errors: int = 3) -> str:
    """The first compiler errors, each mapped to the candidate's own line where the code text matches."""
    src_lines = candidate_src.splitlines()
    lines = log.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        m = _ERROR_LINE.match(line.strip())
        if not m and " error" not in line.lower():
            continue
        if not m:
            if re.search(r"\berror\b", line) and not line.startswith(("FAILED", "ninja", "subprocess")) and len(picked) < max_errors:
                picked.append(line.strip()[:300])
            continue
        where = f"{os.path.basename(m.group('file'))}:{m.group('line') or m.group('nvcc_line')}"
        snippet = ""
        for follow in lines[i + 1: i + 4]:  # gcc prints "  12 |   code"; nvcc prints the code line itself
            code = follow.split("|", 1)[1] if "|" in follow else follow
            code = code.strip()
            if code and not code.startswith("^") and not _ERROR_LINE.match(follow.strip()):
                snippet = code
                break
        cand_line = next((n + 1 for n, s in enumerate(src_lines) if snippet and snippet in s), None)
        loc = f"candidate line {cand_line} ({where})" if cand_line else where
        picked.append(f"{loc}: {m.group('kind')}: {m.group('msg').strip()}" + (f"  `{snippet[:120]}`" if snippet else ""))
        if len(picked) >= max_errors:
            break
    if not picked:
        tail = [l for l in lines if l.strip()][-8:]
        return "\n".join(tail)[-1500:]
    return "\n".join(picked)

def _exec_source(src: str, filename: str) -> dict:
    """Run a source as a real module (registered in sys.modules: dataclasses and pickling look it up)."""
    import types
    module = types.ModuleType(f"pacevolve_{filename.strip('<>')}")
    sys.modules[module.__name__] = module
    # Registered as the source of its file name, so inspect.getsource works (torch.jit.script needs it).
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    exec(compile(src, filename, "exec"), module.__dict__)  # noqa: S102 - the harness, not the candidate
    return module.__dict__

def _install_build_defaults(cfg: dict) -> dict:
    """Wrap load_inline so every candidate build gets our build directory, flags and precompiled header.

    Candidates write ordinary load_inline calls; the wrapper only adds flags and records failures, so a
    failed build is reported as compile_error and everything else the module does is left to the run.
    The builder records each call's arguments beside the built library; the runner then imports that
    library directly when its call is the same, instead of asking ninja again (which rebuilds whenever the
    shared precompiled header changed, for instance when another program's load_inline deleted it).
    """
    import inspect
    from torch.utils import cpp_extension as ce
    record: dict[str, Any] = {"calls": 0, "error": None}
    original = ce.load_inline
    pch_ok = cfg.get("use_pch") and hasattr(ce, "_check_and_build_extension_h_precompiler_headers")
    seen: set[str] = set()
    loaded: dict[str, tuple[str, Any]] = {}   # name -> (call's fingerprint, module): the same call again, the same module

    def load_inline(*args, **kw):
        record["calls"] += 1
        kw.pop("build_directory", None)  # builds stay inside the per-source directory
        kw["verbose"] = True  # the compiler output goes to the worker log for the trimmed message
        user_cflags = list(kw.get("extra_cflags") or [])
        kw["extra_cflags"] = list(cfg.get("cflags", [])) + user_cflags
        kw["extra_cuda_cflags"] = list(cfg.get("cuda_cflags", [])) + list(kw.get("extra_cuda_cflags") or [])
        try:
            bound = inspect.signature(original).bind(*args, **kw).arguments
        except TypeError:
            bound = None  # torch reports the bad call itself
        fingerprint = _call_fingerprint(bound) if bound else None
        name = str(bound["name"]) if bound else ""
        if fingerprint and name in loaded and loaded[name][0] == fingerprint:
            # ModelNew's constructor runs once per trial model: its build, imported once, serves them all
            return loaded[name][1]
        module = _load(name, fingerprint, bound, args, kw, user_cflags)
        if fingerprint:
            loaded[name] = (fingerprint, module)
        return module

    def _load(name, fingerprint, bound, args, kw, user_cflags):
        build_dir = _build_directory(ce, name, create=not cfg.get("prebuilt")) if bound else ""
        stamp = os.path.join(build_dir, "pacevolve-call.sha256")
        reusable = (cfg.get("prebuilt") and fingerprint and name not in seen
                    and not bound.get("is_standalone", False) and hasattr(ce, "_import_module_from_library"))
        # A Python module is imported; a library of operators only (TORCH_LIBRARY) is loaded into torch.ops.
        python_module = bool(bound.get("is_python_module", True)) if bound else True
        seen.add(name)
        if reusable and _read(stamp) == fingerprint and os.path.exists(os.path.join(build_dir, name + ".so")):
            return ce._import_module_from_library(name, build_dir, python_module)
        if reusable:
            # A name made at import time (a uuid, a counter) differs between the builder and the runner: the
            # library the builder made from the same sources and flags is the one to load, under its name.
            built = _built_under_another_name(os.path.dirname(build_dir), _call_fingerprint(bound, anonymous=True))
            if built is not None:
                return ce._import_module_from_library(built[0], built[1], python_module)
        # torch would precompile its shared header with this call's flags: never a build's to write.
        kw["use_pch"] = False
        pch_ready = cfg.get("pch", "ready") == "ready"
        if pch_ok and not pch_ready and build_dir and not cfg.get("prebuilt"):
            # torch's precompiled header is still being written outside (a fresh machine) or failed: GCC
            # must not read it half-written, so main.cpp compiles from the headers' text. After the call's
            # own flags: a directory of its -I comes first, as with torch (and after an -I- ours still counts).
            kw["extra_cflags"] = kw["extra_cflags"] + [f"-I{_unprecompiled(ce, build_dir)}"]
            record["pch"] = f"not used: {cfg.get('pch')}"
        elif pch_ok and not user_cflags and not kw.get("extra_include_paths"):
            try:
                _ensure_pch(ce, kw["extra_cflags"], cfg["pch_lock"])
                kw["use_pch"] = True
            except Exception as e:   # torch's install dir is read-only in the namespace: build without it
                record["pch"] = f"not used: {type(e).__name__}"
        header = _main_header(cfg, bound, user_cflags, record) \
            if pch_ok and bound and not kw.get("extra_include_paths") else ""
        if cfg.get("nvcc") and "PYTORCH_NVCC" not in os.environ and getattr(ce, "CUDA_HOME", None):
            # fast_nvcc.py: nvcc's own steps, with the host and device front ends side by side.
            # With a store of precompiled prefixes for its final step, and where to ask for one (prefixes.py).
            store = ["--prefixes", cfg["prefixes"], "--prefix-requests", cfg["prefix_requests"]] \
                if cfg.get("prefixes") and cfg.get("prefix_requests") else []
            os.environ["PYTORCH_NVCC"] = shlex.join([sys.executable, cfg["nvcc"], "--nvcc",
                                                     os.path.join(ce.CUDA_HOME, "bin", "nvcc"), *store])
        try:
            cu = _cu_text(bound["cuda_sources"]) if bound and bound.get("cuda_sources") and cfg.get("light_headers") \
                else ""
            if cu and _names_can_hide(cu, list(kw.get("extra_cuda_cflags") or [])):
                cu = ""   # names the light headers' scan cannot see: torch's headers
            # A runner rebuilds as its builder built (the markers say how), whatever its own options say.
            module = _build_light(ce, original, args, kw, cfg, name, build_dir, record, cu, header) \
                if cu or header or cfg.get("prebuilt") else original(*args, **kw)
        except BaseException as e:
            record["error"] = f"{type(e).__name__}: {e}"
            if cfg.get("prefix_requests"):
                record["prefix"] = _prefix_notes(cfg["prefix_requests"])
            if cfg.get("prebuilt"):   # a runner, which may not start a compiler (torch then says ninja is missing)
                raise RuntimeError(
                    f"load_inline({name!r}) had to build in the timed process, which may not start a compiler: the "
                    "evaluator builds what the module builds when imported and what ModelNew's constructor builds "
                    "from get_init_inputs(); build there, with sources, flags and name that depend on nothing else "
                    f"({type(e).__name__}: {str(e)[:300]})") from e
            raise
        if cfg.get("prefix_requests"):
            record["prefix"] = _prefix_notes(cfg["prefix_requests"])
        if fingerprint and build_dir and not cfg.get("prebuilt"):
            with open(stamp, "w") as f:
                f.write(fingerprint)
            with open(os.path.join(build_dir, "pacevolve-call-anonymous.sha256"), "w") as f:
                f.write(_call_fingerprint(bound, anonymous=True))
        return module

    # torch deletes the shared header when use_pch=False: never a build's to delete, whoever reads it.
    ce.remove_extension_h_precompiler_headers = lambda: None
    ce.load_inline = load_inline
    return record


def _prefix_notes(requests: str) -> str:
    """What fast_nvcc did with the final step's prefix, for the details: used, asked for, or failed."""
    try:
        names = os.listdir(requests)
    except OSError:
        return ""
    said = {"used": "used", "failed": "failed with it, compiled whole"}
    notes = sorted({said[n.split("-")[0]] for n in names if n.split("-")[0] in said}
                   | ({"asked for"} if any(len(n) == 40 for n in names) else set()))
    return ", ".join(notes)


FULL_HEADER_RETRY = "pacevolve: the light-header build failed; building again with the real torch headers"


def _build_light(ce, original, args, kw, cfg, name: str, build_dir: str, record: dict, source: str,
                 main_header: str):
    """load_inline with light headers: light_headers.py's directory first on the .cu include path (for a
    .cu `source`) and a header directory of binding_header.py's first on main.cpp's (`main_header`: the
    binding header, or torch's at -O2); if that fails, the call as written.

    The .cu's directory is written into the build directory for this source. The builder leaves markers
    naming both, so a runner that must rebuild (rare: the library is normally imported as built) uses the
    same flags.
    """
    markers = {"cu": os.path.join(build_dir, "pacevolve-light-headers"),
               "main": os.path.join(build_dir, "pacevolve-main-header")}
    versions = getattr(getattr(ce, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if not isinstance(versions, dict):
        return original(*args, **kw)  # without resetting torch's versioner a second build would be renamed
    if cfg.get("prebuilt"):
        light_dir, main_header = (_read(markers["cu"]), _read(markers["main"])) if build_dir else ("", "")
        if not light_dir and not main_header:
            return original(*args, **kw)
    elif source:
        try:
            from . import light_headers
        except ImportError:  # evaluate_kernel.py copied without its companion: torch's headers as they are
            light_dir = ""
        else:
            light_dir = os.path.join(build_dir, "pacevolve-headers")
            record["light"] = light_headers.write(light_dir, source, list(kw.get("extra_include_paths") or []))
    else:
        light_dir = ""
    if not light_dir and not main_header:
        return original(*args, **kw)
    light_kw = dict(kw)
    if light_dir:
        light_kw["extra_cuda_cflags"] = [f"-I{light_dir}"] + list(kw.get("extra_cuda_cflags") or [])
    if main_header:
        # torch's own header check would see other flags and rebuild its header: not asked for here
        light_kw.update(extra_cflags=[f"-I{main_header}"] + list(kw.get("extra_cflags") or []), use_pch=False)
    try:
        module = original(*args, **light_kw)
    except Exception:  # noqa: BLE001 - whatever failed, the real headers decide
        for marker in markers.values():
            _remove(marker)
        versions.pop(name, None)  # same name, other flags: build it again under the same name
        record["headers"] = "full (the light-header build failed)"
        print(FULL_HEADER_RETRY, flush=True)  # the parent reads compiler errors after this line
        return original(*args, **kw)
    if not cfg.get("prebuilt"):
        for part, value in (("cu", light_dir), ("main", main_header)):
            if value:
                with open(markers[part], "w") as f:
                    f.write(value)
    if light_dir:
        record["headers"] = "light"
    record["binding"] = bool(main_header) and main_header == cfg.get("binding")
    record["optimised"] = bool(main_header) and main_header == cfg.get("optimised")
    return module


def _build_directory(ce, name: str, create: bool) -> str:
    """Where load_inline builds `name`; a runner only looks (its build directory is read-only)."""
    if create and hasattr(ce, "_get_build_directory"):
        return ce._get_build_directory(name, False)
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or \
        (ce.get_default_build_root() if hasattr(ce, "get_default_build_root") else "")
    return os.path.join(root, name) if root else ""


def forget_stale_pch() -> None:
    """(The parent.) torch's signature of its precompiled header holds its flags and paths, not torch's
    version: after an upgrade the header of the old headers would still pass torch's check (and GCC takes
    it whatever the text says now). One older than torch's version file loses its signature, so the check
    builds it again. The version file's inode change time, which an installer cannot set back (a tar or
    conda extraction keeps the archive's modification times)."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.origin:
        return
    root = os.path.dirname(spec.origin)
    inc = os.path.join(root, "include", "torch")
    try:
        if os.path.getmtime(os.path.join(inc, "extension.h.gch")) < os.path.getctime(os.path.join(root, "version.py")):
            os.remove(os.path.join(inc, "extension.h.sign"))
    except OSError:
        pass


UNPRECOMPILED_H = """// Written by pacevolve (build.py): torch's extension.h, included from here so that GCC does not look
// for its precompiled form (it does so only for a translation unit's first include), which is not ready.
#include "{header}"
"""


def _unprecompiled(ce, build_dir: str) -> str:
    """A directory whose torch/extension.h includes torch's by its path: main.cpp parses the text."""
    directory = os.path.join(build_dir, "pacevolve-unprecompiled")
    header = os.path.join(directory, "torch", "extension.h")
    os.makedirs(os.path.dirname(header), exist_ok=True)
    with open(header, "w") as f:
        f.write(UNPRECOMPILED_H.format(header=os.path.join(ce.include_paths()[0], "torch", "extension.h")))
    return directory


def _names_can_hide(source: str, flags: list) -> bool:
    try:
        from . import light_headers
    except ImportError:
        return True
    return light_headers.names_can_hide(source, flags)


def _main_header(cfg: dict, bound: dict, user_cflags: list, record: dict) -> str:
    """The directory of binding_header.py's to put first on main.cpp's path, or "": the binding header
    where the cpp_sources may use it, else torch's own at -O2 for a build asking for -O1 to -O3 (the
    parent is told to prepare it where it is not ready yet)."""
    try:
        from . import binding_header
    except ImportError:
        return ""
    sources = bound.get("cpp_sources")
    text = "\n".join([sources] if isinstance(sources, str) else list(sources or []))
    if cfg.get("binding") and binding_header.usable(text, cfg["binding"], user_cflags, bound.get("functions")):
        return cfg["binding"]
    # torch's own header at -O2: the flags on the allow-list (GCC takes a precompiled header beside flags
    # that change what its declarations mean), the include paths not the environment's.
    from . import light_headers
    if not light_headers.host_flags_allowed(user_cflags) or light_headers.compiler_env_set(os.environ):
        return ""
    if any(binding_header.OPTIMISING.match(str(flag)) for flag in user_cflags):
        if not cfg.get("optimised"):
            record["wants_optimised"] = True
        return cfg.get("optimised") or ""
    return ""


def _cu_text(cuda_sources) -> str:
    """The .cu file as load_inline writes it (its implicit includes first)."""
    sources = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    return "\n".join(["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"] + sources)


def _call_fingerprint(arguments: dict, anonymous: bool = False) -> str:
    """A load_inline call's arguments, hashed; anonymous: without its name."""
    kept = {k: v for k, v in arguments.items() if not (anonymous and k == "name")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=repr).encode()).hexdigest()


def _built_under_another_name(root: str, anonymous: str) -> tuple[str, str] | None:
    """(name, build directory) of a library in root built by a call with these arguments but another name."""
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        build_dir = os.path.join(root, name)
        if (_read(os.path.join(build_dir, "pacevolve-call-anonymous.sha256")) == anonymous
                and os.path.exists(os.path.join(build_dir, name + ".so"))):
            return name, build_dir
    return None


def _ensure_pch(ce, cflags: list[str], lock_path: str, aside: bool = False) -> None:
    # The precompiled torch/extension.h lives inside torch's install dir and is shared: build it under a
    # file lock so concurrent builders never read a half-written header. In the namespace the lock is
    # hidden (a candidate holding it stalled every other build) and torch's directory read-only: the
    # parent brought the header up to date before any build, and the check here only reads it. The
    # parent's check (aside) has torch write the header aside and rename it into place: a compile reading
    # the header while it was rewritten in place died of a bus error (other Evaluators' builders read it).
    check = ce._check_and_build_extension_h_precompiler_headers
    if aside:
        ce.subprocess, real = _PchAside(ce.subprocess), ce.subprocess
    try:
        try:
            lock = open_lock(lock_path)
        except OSError:
            check(cflags, None)
            return
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            check(cflags, None)
    finally:
        if aside:
            ce.subprocess = real


class _PchAside:
    """torch's cpp_extension's `subprocess`, but a compile writing its extension.h.gch writes it aside and
    renames it into place. (Whatever else, or another way of running the compiler, goes through as it was.)"""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    def check_output(self, args, *rest, **kw):
        words = shlex.split(args) if isinstance(args, str) else list(args)
        at = words.index("-o") + 1 if "-o" in words[:-1] else 0
        if not at or not str(words[at]).endswith(os.path.join("torch", "extension.h.gch")):
            return self._module.check_output(args, *rest, **kw)
        target = str(words[at])
        words[at] = f"{target}.{os.getpid()}.aside"
        try:
            out = self._module.check_output(shlex.join(words) if isinstance(args, str) else words, *rest, **kw)
            os.replace(words[at], target)
            return out
        finally:
            _remove(words[at])

def pch_state(env: dict[str, str]) -> str:
    """(The parent, without importing torch.) What torch's precompiled extension.h is now: its signature
    (the command it was built by), the header's size and time, torch's version file and the compiler the
    environment names; "" when there is none. The parent remembers the state it last saw torch's check
    pass, so that a fresh Evaluator need not import torch (seconds) to learn the header is current; any
    change (torch upgraded, the header rebuilt or touched, another compiler) makes the check run again."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.origin:
        return ""
    root = os.path.dirname(spec.origin)
    inc = os.path.join(root, "include", "torch")
    try:
        st = os.stat(os.path.join(inc, "extension.h.gch"))
        with open(os.path.join(inc, "extension.h.sign"), "rb") as f:
            sign = f.read()
        with open(os.path.join(root, "version.py"), "rb") as f:
            version = f.read()
    except OSError:
        return ""
    parts = [root, hashlib.sha256(sign).hexdigest(), f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}",
             hashlib.sha256(version).hexdigest(), env.get("CXX", ""), env.get("PATH", ""),
             env.get("TORCH_NO_COMPILER_WRAPPER", "")]   # PATH and this: whether ccache comes first
    return json.dumps(parts)


def _pch_writable() -> bool:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    inc = os.path.join(os.path.dirname(spec.origin), "include", "torch") if spec and spec.origin else ""
    return bool(inc) and os.access(inc, os.W_OK)

