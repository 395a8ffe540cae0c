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

import ast
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "invalid", "compile_error", "runtime_error", "incorrect", "timeout", "rejected")

# ======================================================================================================
# Result type
# ======================================================================================================


@dataclass
class EvalResult:
    status: str
    correct: bool = False
    runtime_ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None  # baseline_ms / runtime_ms
    message: str = ""  # feedback for the LLM (short, specific)
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ======================================================================================================
# Static screen: rules as data, so messages and docs come from one place
# ======================================================================================================

RULES: dict[str, str] = {
    "threads": "no threads, processes or async tasks (work finished after the timer stops is a known cheat)",
    "subprocess": "no subprocesses, shell commands or sockets",
    "tensor_subclass": "no tensor subclasses or __torch_function__/__torch_dispatch__ (lazy outputs that "
                       "compute during the check)",
    "introspection": "no frame, gc or inspect introspection (it can read the harness's expected outputs)",
    "native_ffi": "no ctypes/cffi/dlopen (use load_inline for native code)",
    "patching": "no assignment to attributes of torch/time/builtins/os/sys modules, and no setattr on them "
                "(patching timers, comparisons or precision flags)",
    "try_except": "no try/except or contextlib.suppress: a fallback to PyTorch hides a broken kernel",
    "reference_model": "do not use or subclass the reference class Model; write ModelNew yourself",
    "persisting_l2": "no persisting-L2 APIs (accessPolicyWindow, hitProp, cudaLimitPersistingL2CacheSize)",
    "streams": "no CUDA stream creation or stream switching (work on a side stream escapes the timer)",
    "file_io": "no file I/O (open, os.open/os.read, /proc) and no writes to os.environ",
    "dynamic_code": "no pickle/marshal/importlib/exec/eval/compile/__import__ (code the screen cannot see)",
    "harness_access": "do not import or read the evaluator (evaluate_kernel) or its workers",
}

_MODULE_RULES = {
    "threading": "threads", "_thread": "threads", "multiprocessing": "threads", "concurrent": "threads",
    "asyncio": "threads", "subprocess": "subprocess", "socket": "subprocess", "pty": "subprocess",
    "gc": "introspection", "inspect": "introspection", "traceback": "introspection",
    "ctypes": "native_ffi", "cffi": "native_ffi", "pickle": "dynamic_code", "marshal": "dynamic_code",
    "importlib": "dynamic_code", "runpy": "dynamic_code", "evaluate_kernel": "harness_access",
    "shutil": "file_io", "tempfile": "file_io", "pathlib": "file_io", "io": "file_io", "mmap": "file_io",
    "linecache": "file_io", "fileinput": "file_io", "codecs": "file_io", "glob": "file_io",
}
_CALL_RULES = {
    "exec": "dynamic_code", "eval": "dynamic_code", "compile": "dynamic_code", "__import__": "dynamic_code",
    "open": "file_io", "globals": "introspection", "vars": "introspection", "breakpoint": "introspection",
}
_ATTR_RULES = {
    "_getframe": "introspection", "f_back": "introspection", "f_locals": "introspection",
    "f_globals": "introspection", "get_objects": "introspection", "get_referrers": "introspection",
    "_make_subclass": "tensor_subclass", "__torch_function__": "tensor_subclass",
    "__torch_dispatch__": "tensor_subclass", "_make_wrapper_subclass": "tensor_subclass",
    "system": "subprocess", "popen": "subprocess", "fork": "subprocess", "spawnv": "subprocess",
    "execv": "subprocess", "Stream": "streams", "ExternalStream": "streams", "stream": "streams",
    "set_stream": "streams", "putenv": "file_io", "write_bytes": "file_io", "write_text": "file_io",
    "dup2": "file_io", "gi_frame": "introspection", "cr_frame": "introspection", "ag_frame": "introspection",
    "tb_frame": "introspection", "tb_next": "introspection", "f_code": "introspection", "gi_code": "introspection",
    "__traceback__": "introspection", "exc_info": "introspection", "TorchFunctionMode": "tensor_subclass",
    "TorchDispatchMode": "tensor_subclass", "_push_mode": "tensor_subclass",
    "_get_current_function_mode_stack": "tensor_subclass", "suppress": "try_except",
    # getattr by another name: with a computed attribute name they reach frames the rules above name
    "__getattribute__": "introspection", "attrgetter": "introspection", "methodcaller": "introspection",
}
# os-level file access (reading /proc/<ancestor>/environ leaks the parent's API keys, for one).
_OS_FILE_CALLS = {"open", "read", "write", "fdopen", "listdir", "scandir", "walk", "readlink", "pread", "getppid",
                  "dup", "dup2", "pipe", "mkfifo", "remove", "unlink", "rename", "chdir", "kill", "killpg"}
_PATCH_ROOTS = {"torch", "time", "builtins", "os", "sys", "numpy", "math", "F", "nn"}
# Native code is in string literals; these patterns run over them with C/C++ comments removed.
_NATIVE_RULES = [
    ("persisting_l2", r"accessPolicyWindow|hitProp|PersistingL2|cudaLimitPersisting|cudaCtxResetPersisting"),
    # Pieces, not only whole API names, so names assembled with ## or looked up by string are caught too.
    ("streams", r"StreamCreate|CreateWithFlags|CreateWithPriority|NonBlocking|NON_BLOCKING|getStreamFromPool"
                r"|getStreamFromExternal|StreamGuard|cublasSetStream|setCurrentCUDAStream|GetDriverEntryPoint"
                r"|GetProcAddress"),
    ("threads", r"std::thread|std::async|pthread_create|std::jthread|#\s*include\s*<thread>|omp\s+task"),
    ("subprocess", r"\bsystem\s*\(|\bpopen\s*\(|\bfork\s*\(|\bexec[lv]p?e?\s*\("),
    ("file_io", r"\bfopen\s*\(|std::[io]?fstream|\bopen\s*\(\s*\"|/proc/|\bsetenv\s*\("),
    ("native_ffi", r"\bdlopen\s*\(|\bdlsym\s*\("),
    ("introspection", r"PyEval_GetFrame|PyGC_|PyImport_ImportModule|PyRun_"),
]


@dataclass
class ScreenVerdict:
    status: str  # "ok", "invalid" or "rejected"
    message: str = ""
    rule: str = ""
    line: int = 0


def _strip_c_comments(text: str) -> str:
    # Keep newlines so line offsets inside the string stay right.
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _findings(tree: ast.AST) -> list[tuple[str, int, str]]:
    """(rule, line, detail) for every rule broken in the Python syntax tree and its string literals."""
    out: list[tuple[str, int, str]] = []
    module_alias = {name: name for name in _PATCH_ROOTS}
    # Docstrings are prose, never passed to load_inline: native-code patterns skip them.
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for full in names:
                root = full.split(".")[0]
                if root in _MODULE_RULES:
                    out.append((_MODULE_RULES[root], node.lineno, f"import {full}"))
            for a in node.names:
                root = (a.name if isinstance(node, ast.Import) else (node.module or "")).split(".")[0]
                if root in _PATCH_ROOTS or root == "torch":
                    module_alias[a.asname or a.name.split(".")[0]] = root
                if isinstance(node, ast.ImportFrom) and a.name in _ATTR_RULES:
                    out.append((_ATTR_RULES[a.name], node.lineno, f"from {node.module} import {a.name}"))
                if isinstance(node, ast.ImportFrom) and a.name in _CALL_RULES:
                    out.append((_CALL_RULES[a.name], node.lineno, f"from {node.module} import {a.name}"))
                if isinstance(node, ast.ImportFrom) and node.module in ("os", "posix") and a.name in _OS_FILE_CALLS:
                    out.append(("file_io", node.lineno, f"from {node.module} import {a.name}"))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            out.append(("try_except", node.lineno, "try/except"))
        elif isinstance(node, ast.Name) and node.id == "Model":
            out.append(("reference_model", node.lineno, "Model"))
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _dotted(base).split(".")[-1] in ("Tensor", "Model"):
                    rule = "tensor_subclass" if _dotted(base).endswith("Tensor") else "reference_model"
                    out.append((rule, node.lineno, f"class {node.name}({_dotted(base)})"))
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.count(".") == 1 and name.split(".")[0] in ("os", "posix") and name.split(".")[1] in _OS_FILE_CALLS:
                out.append(("file_io", node.lineno, f"{name}(...)"))
            if name in _CALL_RULES:
                out.append((_CALL_RULES[name], node.lineno, f"{name}(...)"))
            if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2 \
                    and not isinstance(node.args[1], (ast.Constant, ast.JoinedStr)):
                # A computed attribute name hides what is accessed (e.g. "gi_" + "frame" to walk frames).
                out.append(("introspection", node.lineno, f"{name} with a computed attribute name"))
            if name in ("setattr", "delattr") and node.args and _dotted(node.args[0]).split(".")[0] in module_alias:
                out.append(("patching", node.lineno, f"{name}({_dotted(node.args[0])}, ...)"))
        elif isinstance(node, ast.Attribute):
            if node.attr in _ATTR_RULES:
                out.append((_ATTR_RULES[node.attr], node.lineno, _dotted(node) or node.attr))
            if _dotted(node) == "sys.modules":
                out.append(("introspection", node.lineno, "sys.modules"))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                base = t.value if isinstance(t, ast.Subscript) else t
                dotted = _dotted(base)
                if isinstance(base, ast.Attribute) and dotted.split(".")[0] in module_alias:
                    rule = "file_io" if dotted.endswith("environ") else "patching"
                    out.append((rule, node.lineno, f"assignment to {dotted}"))
        if isinstance(node, ast.Call) and _dotted(node.func).endswith("environ.update"):
            out.append(("file_io", node.lineno, "os.environ.update"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 3 \
                and id(node) not in docstrings:
            text = _strip_c_comments(node.value)
            for rule, pattern in _NATIVE_RULES:
                m = re.search(pattern, text)
                if m:
                    out.append((rule, node.lineno + text[: m.start()].count("\n"), m.group(0)))
    return sorted(out, key=lambda f: f[1])


def screen(src: str) -> ScreenVerdict:
    """Static screen before any build: syntax, a ModelNew class, and the RULES."""
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        return ScreenVerdict("invalid", f"SyntaxError at line {e.lineno}: {e.msg}", line=e.lineno or 0)
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if "ModelNew" not in defined:
        return ScreenVerdict("invalid", "no top-level `class ModelNew` found; define ModelNew(nn.Module) with "
                                        "the same constructor and forward signature as the reference Model")
    found = _findings(tree)
    if not found:
        return ScreenVerdict("ok")
    rule, line, detail = found[0]
    lines = src.splitlines()
    code = lines[line - 1].strip() if 0 < line <= len(lines) else detail
    return ScreenVerdict("rejected", f"rejected by rule '{rule}' ({RULES[rule]}) at line {line}: {code[:160]}",
                         rule=rule, line=line)


def rules_markdown() -> str:
    return "\n".join(f"- `{rule}`: {why}" for rule, why in RULES.items())


# ======================================================================================================
# Build flags, environment, compiler messages
# ======================================================================================================

_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


def scrubbed_env(**extra: str) -> dict[str, str]:
    """The parent's environment minus anything that looks like a credential."""
    env = {k: v for k, v in os.environ.items() if not _SECRET_ENV.search(k)}
    env.update({"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"})
    env.update(extra)
    return env


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


def source_hash(src: str) -> str:
    return hashlib.sha256(src.encode()).hexdigest()


# ======================================================================================================
# Worker protocol (parent side): one JSON job on stdin; messages on a dedicated pipe, each with the nonce
# ======================================================================================================


class _Worker:
    """A subprocess running this file with --worker: own process group, scrubbed env, stdout to a log.

    Results travel on a private pipe, never on stdout, and every message must carry the job's nonce, so text
    the candidate prints cannot pose as a result (it goes to the log only).
    """

    def __init__(self, env: dict[str, str], log_path: str, warm: bool = False):
        r, w = os.pipe()
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(w)] + (["warm", str(os.getpid())] if warm else []),
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, pass_fds=(w,), env=env,
            start_new_session=True, preexec_fn=_die_with_parent_preexec() if warm else None)
        os.close(w)
        self._rfd = r
        self._buf = b""
        self.nonce = secrets.token_hex(16)
        self.prepped = False  # runners: "prep" sent
        self.ready = False  # runners: "ready" received (start-up done)

    def send(self, msg: dict) -> None:
        msg = dict(msg, nonce=self.nonce)
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> dict:
        """The next message with our nonce. Raises TimeoutError or EOFError (worker gone)."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.get("nonce") == self.nonce:
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._rfd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._rfd, 1 << 20)
                if not chunk:
                    raise EOFError
                self._buf += chunk
                if len(self._buf) > 64 << 20:
                    raise EOFError  # a flood on the result pipe is not a result

    def death(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the process stopped answering"
        if rc < 0:
            return f"the process died with signal {signal.Signals(-rc).name}"
        return f"the process exited with code {rc} before reporting a result"

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def discard(self) -> None:
        """Kill it and delete its log (a runner or spare whose output nobody will read)."""
        self.kill()
        _remove(self.log_path)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the whole group: compilers, stray children
            except ProcessLookupError:
                pass
            self.proc.wait()
        for closer in (self.proc.stdin.close, self._log.close, lambda: os.close(self._rfd)):
            try:
                closer()
            except OSError:
                pass


# ======================================================================================================
# Worker side: shared helpers (run inside subprocesses; torch imported lazily)
# ======================================================================================================


def _set_seed(seed: int) -> None:
    import torch
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _exec_source(src: str, filename: str) -> dict:
    """Run a source as a real module (registered in sys.modules: dataclasses and pickling look it up)."""
    import types
    module = types.ModuleType(f"pacevolve_{filename.strip('<>')}")
    sys.modules[module.__name__] = module
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
        build_dir = ce._get_build_directory(name, False) if bound and hasattr(ce, "_get_build_directory") else ""
        stamp = os.path.join(build_dir, "pacevolve-call.sha256")
        reusable = (cfg.get("prebuilt") and fingerprint and name not in seen and bound.get("is_python_module", True)
                    and not bound.get("is_standalone", False) and hasattr(ce, "_import_module_from_library"))
        seen.add(name)
        if reusable and _read(stamp) == fingerprint and os.path.exists(os.path.join(build_dir, name + ".so")):
            return ce._import_module_from_library(name, build_dir, True)
        if pch_ok and not user_cflags and not kw.get("extra_include_paths"):
            _ensure_pch(ce, kw["extra_cflags"], cfg["pch_lock"])
            kw["use_pch"] = True
        if cfg.get("nvcc") and "PYTORCH_NVCC" not in os.environ and getattr(ce, "CUDA_HOME", None):
            # fast_nvcc.py: nvcc's own steps, with the host and device front ends side by side.
            os.environ["PYTORCH_NVCC"] = shlex.join([sys.executable, cfg["nvcc"], "--nvcc",
                                                     os.path.join(ce.CUDA_HOME, "bin", "nvcc")])
        try:
            module = _build_with_light_headers(ce, original, args, kw, cfg, name, build_dir, record,
                                               _cu_text(bound["cuda_sources"])) \
                if bound and bound.get("cuda_sources") and cfg.get("light_headers") else original(*args, **kw)
        except BaseException as e:
            record["error"] = f"{type(e).__name__}: {e}"
            raise
        if fingerprint and build_dir and not cfg.get("prebuilt"):
            with open(stamp, "w") as f:
                f.write(fingerprint)
        return module

    if pch_ok:
        # torch deletes the shared header when use_pch=False; builds that opt out must not break others.
        ce.remove_extension_h_precompiler_headers = lambda: None
    ce.load_inline = load_inline
    return record


FULL_HEADER_RETRY = "pacevolve: the light-header build failed; building again with the real torch headers"


def _build_with_light_headers(ce, original, args, kw, cfg, name: str, build_dir: str, record: dict,
                              source: str):
    """load_inline with light_headers.py's directory first on the .cu include path; if that fails, the call
    as written.

    The directory is written into the build directory for this source. The builder leaves a marker naming
    it, so a runner that must rebuild (rare: the library is normally imported as built) uses the same flags.
    """
    marker = os.path.join(build_dir, "pacevolve-light-headers")
    versions = getattr(getattr(ce, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if not isinstance(versions, dict):
        return original(*args, **kw)  # without resetting torch's versioner a second build would be renamed
    if cfg.get("prebuilt"):
        light_dir = _read(marker)
        if not light_dir:
            return original(*args, **kw)
    else:
        try:
            import light_headers
        except ImportError:  # evaluate_kernel.py copied without its companion: torch's headers as they are
            return original(*args, **kw)
        light_dir = os.path.join(build_dir, "pacevolve-headers")
        record["light"] = light_headers.write(light_dir, source, list(kw.get("extra_include_paths") or []))
    light_kw = dict(kw, extra_cuda_cflags=[f"-I{light_dir}"] + list(kw.get("extra_cuda_cflags") or []))
    try:
        module = original(*args, **light_kw)
    except Exception:  # noqa: BLE001 - whatever failed, the real headers decide
        _remove(marker)
        versions.pop(name, None)  # same name, other flags: build it again under the same name
        record["headers"] = "full (the light-header build failed)"
        print(FULL_HEADER_RETRY, flush=True)  # the parent reads compiler errors after this line
        return original(*args, **kw)
    if not cfg.get("prebuilt"):
        with open(marker, "w") as f:
            f.write(light_dir)
    record["headers"] = "light"
    return module


def _cu_text(cuda_sources) -> str:
    """The .cu file as load_inline writes it (its implicit includes first)."""
    sources = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    return "\n".join(["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"] + sources)


def _call_fingerprint(arguments: dict) -> str:
    return hashlib.sha256(json.dumps(arguments, sort_keys=True, default=repr).encode()).hexdigest()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _ensure_pch(ce, cflags: list[str], lock_path: str) -> None:
    # The precompiled torch/extension.h lives inside torch's install dir and is shared: build it under a
    # file lock so concurrent builders never read a half-written header.
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ce._check_and_build_extension_h_precompiler_headers(cflags, None)


class _Guard:
    """Identity of timing/comparison functions and thread counts, captured before the candidate is imported.

    Covers monkey-patched timers or comparisons (hack 6) and background threads finishing work after the
    timer stops (hack 4).
    """

    def __init__(self):
        import torch
        self._targets = {
            "torch.cuda.Event.record": (torch.cuda.Event, "record"),
            "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
            "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
            "torch.cuda.synchronize": (torch.cuda, "synchronize"),
            "torch.cuda.Event": (torch.cuda, "Event"),
            "time.perf_counter": (time, "perf_counter"),
            "time.monotonic": (time, "monotonic"),
            "torch.allclose": (torch, "allclose"),
            "torch.save": (torch, "save"),
            "torch.Tensor.cpu": (torch.Tensor, "cpu"),
            "torch.Tensor.__eq__": (torch.Tensor, "__eq__"),
            "torch.Tensor.clone": (torch.Tensor, "clone"),
            "json.dumps": (json, "dumps"),
            "os.write": (os, "write"),
        }
        self._ids = {k: id(getattr(obj, attr)) for k, (obj, attr) in self._targets.items()}
        self.py_threads = threading.active_count()
        self.os_threads = self._os_threads()

    @staticmethod
    def _os_threads() -> int:
        try:
            return len(os.listdir("/proc/self/task"))
        except OSError:
            return threading.active_count()

    def problems(self, when: str) -> list[str]:
        import torch
        out = [f"{k} was replaced ({when})" for k, (obj, attr) in self._targets.items()
               if id(getattr(obj, attr, None)) != self._ids[k]]
        # A torch function/dispatch mode left active intercepts every op, our checks included (hack 5).
        for probe in ("_len_torch_function_stack", "_len_torch_dispatch_stack"):
            if getattr(torch._C, probe, lambda: 0)() > 0:
                out.append(f"a torch function/dispatch mode is active ({when})")
        if threading.active_count() > self.py_threads:
            out.append(f"Python thread count grew {self.py_threads} -> {threading.active_count()} ({when})")
        if self._os_threads() > self.os_threads:
            out.append(f"OS thread count grew {self.os_threads} -> {self._os_threads()} ({when})")
        return out


def _flat(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _make_inputs(ref_ns: dict, spec: dict, device) -> list:
    """Inputs for one trial: the task's own get_inputs() under a fresh seed, then a distribution transform.

    get_inputs() runs with the timing device as the default device, so its random tensors come from that
    device's generator (drawing 64 MB on the CPU took ~0.1 s, on the GPU well under a millisecond). The
    reference worker and the candidate process share the GPU and the seed, so they draw identical inputs.
    Scaled, negated, zero-mean and per-sample inputs expose shortcuts tuned to all-positive i.i.d. data
    (hacks 8, 11, 12, 14); the seeds are drawn per evaluation, unknown when the candidate was written.
    """
    import torch
    draw_on = device if spec.get("on_device", True) else torch.device("cpu")
    _set_seed(spec["seed"])
    try:
        with torch.device(draw_on):
            xs = list(ref_ns["get_inputs"]())
    except Exception:  # noqa: BLE001 - a get_inputs() that needs CPU tensors (.numpy() etc.) runs on the CPU
        draw_on = torch.device("cpu")
        _set_seed(spec["seed"])
        xs = list(ref_ns["get_inputs"]())
    gen = torch.Generator(device=draw_on).manual_seed(spec["seed"] + 1)
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            x = _transform(x.to(draw_on), spec["dist"], gen) if x.is_floating_point() else x
            x = x.to(device)
        out.append(x)
    return out


def _transform(x, dist: str, gen):
    import torch
    if dist == "scaled":
        return x * 3.0
    if dist == "negated":
        return -x
    if dist == "zero_mean":
        return x - x.mean()
    if dist == "per_sample" and x.dim() >= 1:
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        scale = torch.rand(shape, generator=gen, dtype=x.dtype, device=x.device) * 1.5 + 0.5
        offset = torch.randn(shape, generator=gen, dtype=x.dtype, device=x.device)
        return x * scale + offset
    return x


def _build_model(cls, ref_ns: dict, weight_seed: int, perturb: bool, device, dtype_names: list | None = None):
    """KernelBench order: seed, get_init_inputs(), seed, construct; optionally perturb small parameters.

    Re-seeded weights plus perturbed biases/affine parameters (by name, the same delta in both processes)
    stop shortcuts tuned to seed-42 weights or to GroupNorm's weight=1, bias=0 (hack 18).
    """
    import torch
    _set_seed(weight_seed)
    init = ref_ns["get_init_inputs"]()
    _set_seed(weight_seed)
    with torch.no_grad():
        model = cls(*init)
    names = []
    if perturb:
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                if p.dim() <= 1:
                    seed = int(hashlib.sha256(f"{weight_seed}:{name}".encode()).hexdigest()[:8], 16)
                    g = torch.Generator().manual_seed(seed)
                    p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
                    names.append(name)
    return model.to(device), names


def _inputs_unchanged(xs: list, pristine: list) -> bool:
    """Bit-exact comparison with a pristine copy, on the device (a hash of GBs on the host is too slow)."""
    import torch
    for x, p in zip(xs, pristine):
        if isinstance(x, torch.Tensor):
            if x.shape != p.shape or x.dtype != p.dtype:
                return False
            a, b = x.detach().reshape(-1), p.reshape(-1)
            if a.is_floating_point():  # compare bits, so NaN == NaN and -0.0 != 0.0
                a, b = a.view(_int_view(a)), b.view(_int_view(b))
            if not torch.equal(a, b):
                return False
        elif x != p:
            return False
    return True


def _int_view(t):
    import torch
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def _clone_inputs(xs: list) -> list:
    import torch
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def _poison(device, nbytes: int) -> None:
    """Hand the allocator's free memory back full of NaN (hack 1: outputs left in stale memory).

    empty_cache() returns cached blocks; a large NaN-filled allocation then overwrites what the caching
    allocator will hand out next, so an unwritten output reads as NaN and fails the finiteness check.
    """
    import torch
    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    n = max(1, min(nbytes, int(free * 0.5)) // 4)
    buf = torch.empty(n, dtype=torch.float32, device=device)
    buf.fill_(float("nan"))
    del buf
    torch.cuda.synchronize()


def _check_outputs(out: Any, device) -> tuple[list | None, str]:
    """Plain tensors with real storage on the expected device (hack 5: lazy tensor subclasses)."""
    import torch
    tensors = []
    for i, o in enumerate(_flat(out)):
        if type(o) is not torch.Tensor:
            return None, f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"
        if o.numel() and o.untyped_storage().size() == 0:
            return None, f"output {i} has no storage"
        if o.device.type != device.type:
            return None, f"output {i} is on {o.device}, expected {device.type}"
        tensors.append(o.detach().clone().cpu())
    return tensors, ""


def _short_traceback(exc: BaseException) -> str:
    """The exception plus the candidate's own frames (file "<candidate>"), for the LLM."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<candidate>"]
    where = "; ".join(f"candidate line {f.lineno} in {f.name}: {(f.line or '').strip()[:100]}" for f in frames[-3:])
    text = f"{type(exc).__name__}: {str(exc).strip()[:700]}"
    return text + (f" [{where}]" if where else "")


# ======================================================================================================
# Worker side: roles
# ======================================================================================================


def _role_build(job: dict, send) -> None:
    """Exec the candidate with no GPU visible, so its load_inline builds land in the per-source directory."""
    record = _install_build_defaults(job["build"])
    t0 = time.perf_counter()
    try:
        ns = _exec_source(job["candidate_src"], "<candidate>")
        ok = "ModelNew" in ns
        send({"kind": "built", "compile_s": time.perf_counter() - t0, "has_model": ok, "calls": record["calls"],
              **_headers_used(record)})
    except BaseException as e:  # noqa: BLE001 - any failure is reported, never raised
        if record["error"]:
            send({"kind": "compile_error", "error": record["error"][-20000:], "compile_s": time.perf_counter() - t0,
                  **_headers_used(record)})
        else:  # module-level code that needs the GPU fails here; the run reports it properly
            send({"kind": "built", "compile_s": time.perf_counter() - t0, "has_model": True,
                  "deferred_error": _short_traceback(e), "calls": record["calls"], **_headers_used(record)})


def _headers_used(record: dict) -> dict:
    return {"headers": record.get("headers"), "light": record.get("light")}


def _prepare_runner(prep: dict, send, stdin: "_LineReader") -> dict:
    """Everything a runner does before it sees a candidate: torch set up, CUDA and its libraries warm, the
    reference module loaded, the guard snapshot taken. A spare runner does this while no candidate waits.

    This work happens only under the device's lock: a spare takes the file lock itself, unless its job
    arrives first (the parent holds the lock for it then), so a spare warming up never overlaps a timing.
    """
    import torch
    marks = {"torch_imported": time.time()}
    device = torch.device(prep["device"])
    lock = _take_gpu_lock(prep.get("gpu_lock"), stdin)
    try:
        _setup_torch(prep, device)
        # Warm the libraries before the guard snapshot, so their own helper threads are not blamed on the candidate.
        a = torch.randn(64, 64, device=device)
        (a @ a).sum().item()
        torch.nn.functional.conv2d(a.view(1, 1, 64, 64), a[:3, :3].reshape(1, 1, 3, 3)).sum().item()
        _reset_persisting_l2(device)
        hold = _make_hold(device)  # before any candidate code runs in this process
    finally:
        if lock is not None:
            lock.close()  # closing the file releases the lock
    marks["cuda_ready"] = time.time()
    state = {"device": device, "ref_ns": _exec_source(prep["reference_src"], "<reference>"), "guard": _Guard(),
             "hold": hold}
    marks["reference_ready"] = time.time()
    send({"kind": "ready", "marks": marks})
    return state


def _take_gpu_lock(path: str | None, stdin: "_LineReader"):
    """The GPU's file lock, or None as soon as a job line is waiting (its sender holds the lock)."""
    if not path:
        return None
    f = open(path, "a")
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if stdin.wait(0.02):
                f.close()
                return None


def _role_run(job: dict, state: dict, send, recv) -> None:
    """The candidate process (also used for the baseline with the reference Model). Used once."""
    import torch
    device, ref_ns, guard = state["device"], state["ref_ns"], state["guard"]
    marks = {"job_received": time.time()}
    flags: list[str] = []
    t0 = time.perf_counter()
    try:
        if job["mode"] == "baseline":
            cls = ref_ns["Model"]
        else:
            _install_build_defaults(dict(job["build"], prebuilt=True))
            cls = _exec_source(job["candidate_src"], "<candidate>")["ModelNew"]
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "import", "error": _short_traceback(e)})
        return
    flags += guard.problems("after import")
    load_s = time.perf_counter() - t0
    marks["candidate_loaded"] = time.time()

    outputs, cand_names, t_check = [], [], time.perf_counter()
    models: dict[tuple, Any] = {}
    try:
        for k, spec in enumerate(job["trials"]):
            key = (spec["weight_seed"], spec["perturb"])
            if key not in models:
                models[key] = _build_model(cls, ref_ns, spec["weight_seed"], spec["perturb"], device)
                if spec["perturb"]:
                    cand_names = models[key][1]
            model = models[key][0]
            xs = _make_inputs(ref_ns, spec, device)
            pristine = _clone_inputs(xs)
            _poison(device, job["poison_bytes"])
            with torch.no_grad():
                out = model(*xs)
            _sync(device)
            # Hack 2: the candidate must not rewrite its inputs (it runs on its own copies anyway).
            if not _inputs_unchanged(xs, pristine):
                flags.append(f"inputs were modified in place (trial {k})")
            tensors, problem = _check_outputs(out, device)
            if tensors is None:
                send({"kind": "rejected", "error": problem, "flags": flags})
                return
            outputs.append(tensors)
            flags += guard.problems(f"after trial {k}")
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "forward", "error": _short_traceback(e), "flags": flags})
        return
    path = os.path.join(job["work_dir"], "trials.pt")
    torch.save({"outputs": outputs}, path)
    marks["trials_done"] = time.time()
    send({"kind": "outputs", "path": path, "names": cand_names, "flags": flags, "load_s": load_s,
          "check_s": time.perf_counter() - t_check, "marks": marks})
    if recv().get("cmd") != "time":
        return
    try:
        timing = _time_model(models[(job["trials"][0]["weight_seed"], False)][0], ref_ns, job, device, state["hold"])
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "timing", "error": _short_traceback(e), "flags": flags})
        return
    flags += guard.problems("after timing")
    send(dict(timing, kind="timed", flags=flags))


def _setup_torch(job: dict, device) -> None:
    import torch
    torch.set_num_threads(job["cpu_threads"])
    # The precision policy is pinned here, not left to defaults (cuDNN convolutions default to TF32).
    tf32 = bool(job["allow_tf32"])
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if device.type == "cuda":
        torch.cuda.set_device(device)


def _reset_persisting_l2(device) -> None:
    # Hack 15: lines marked persisting survive an L2 flush; with a zero persisting limit none can exist.
    # The screen rejects the APIs; this reset covers anything set before (torch has no public setter).
    if device.type != "cuda":
        return
    import ctypes
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(0))  # cudaLimitPersistingL2CacheSize
        return


def _time_model(model, ref_ns: dict, job: dict, device, hold: "_GpuHold | None") -> dict:
    """Many calls, each on fresh input contents after an L2 flush and a lead (_GpuHold), timed from the
    lead's end to the end of the call's stream; after each, how long the whole device stayed busy beyond
    that (the tail)."""
    import torch
    t = job["timing"]
    bases = [_make_inputs(ref_ns, spec, device) for spec in t["input_specs"]]
    # Hack 7 (caching by pointer or fingerprint): >= 2 buffer sets kept alive (pointers alternate) and
    # refilled before every call with a base set times a fresh random scale, so no two calls see the same data.
    bufs = [_clone_inputs(bases[i % len(bases)]) for i in range(2)]
    flush = torch.empty(t["flush_bytes"] // 4, dtype=torch.float32, device=device) if device.type == "cuda" else None
    rng = __import__("random").Random(t["seed"])
    plan = [(rng.randrange(len(bases)), 1.0 + rng.uniform(-0.05, 0.05)) for _ in range(t["iters"])]
    verify = set(t["verify"])

    def refill(buf, base, scale):
        for b, x in zip(buf, base):
            if isinstance(b, torch.Tensor):
                b.copy_(x)
                if b.is_floating_point():
                    b.mul_(scale)

    samples, plain, queue, tails, checked = [], [], [], [], []
    with torch.no_grad():
        # Warm-up: at least `warmup` calls and `warmup_ms` of work, so clocks and caches reach steady state.
        t_end, i = time.perf_counter() + t["warmup_ms"] / 1e3, 0
        while i < t["warmup"] or time.perf_counter() < t_end:
            refill(bufs[i % 2], bases[0], 1.0)
            if flush is not None:
                flush.fill_(0.0)
            model(*bufs[i % 2])
            _sync(device)
            i += 1
        cycles_per_ms = _spin_cycles_per_ms() if flush is not None else 0.0
        lead_ms = t.get("lead_ms", 0.0) if hold is not None else 0.0
        for i, (d, scale) in enumerate(plan):
            buf = bufs[i % 2]
            refill(buf, bases[d], scale)
            if flush is not None:
                start, end, device_end, idle, idle_end = (torch.cuda.Event(enable_timing=True) for _ in range(5))
                torch.cuda.synchronize()
                flush.fill_(float(i))  # L2 flush: >= 2x the L2 size, outside the timed window
                # KernelBench's protocol (the start event waits behind the flush, the end event follows the
                # call on its stream) plus a lead: the GPU held for lead_ms before the start event, so the
                # call's first launches are queued before the GPU reaches them. Without it the host's
                # latency to its first kernel showed whenever it exceeded the flush: it moves in phases of
                # seconds on these machines and moved 30-call medians by 2-3% (0.1% with this lead).
                with_lead = bool(lead_ms) and i % 4 != 3  # every fourth call as KernelBench times it: the host check
                if with_lead:
                    hold(lead_ms)
                start.record()
                q0 = time.perf_counter()
                out = model(*buf)
                if not with_lead:  # a call that waits on the GPU inside would also wait for the lead
                    queue.append((time.perf_counter() - q0) * 1e3)
                end.record()
                # Hacks 3/4: then the whole device. Work still running on another stream makes the device
                # finish after the call's stream: a tail, which the parent rejects when it is systematic.
                # The host's own delay in noticing that the device is done (0.02-0.1 ms, longer after longer
                # waits, varying from second to second) is measured right after by waiting as long for a GPU
                # spin, and taken off: it is not work. (Only a non-blocking stream, which the screen refuses,
                # could also start during the flush: at most the flush's ~0.07 ms.)
                torch.cuda.synchronize()
                device_end.record()
                ms = start.elapsed_time(end)
                torch.cuda._sleep(int(min(ms, 5.0) * cycles_per_ms))
                idle.record()
                torch.cuda.synchronize()
                idle_end.record()
                idle_end.synchronize()
                (samples if with_lead or not lead_ms else plain).append(ms)
                tails.append(end.elapsed_time(device_end) - idle.elapsed_time(idle_end))
            else:
                t0 = time.perf_counter()
                out = model(*buf)
                samples.append((time.perf_counter() - t0) * 1e3)
            if i in verify:
                tensors, problem = _check_outputs(out, device)
                if tensors is None:
                    raise RuntimeError(f"timed call {i}: {problem}")
                checked.append({"iter": i, "base": d, "scale": scale, "out": tensors})
            del out
    path = os.path.join(job["work_dir"], "timed.pt")
    torch.save({"checked": [c["out"] for c in checked]}, path)
    host = _host_phase(model, bufs, device, t)
    with torch.no_grad():
        out_bytes = sum(o.numel() * o.element_size() for o in _flat(model(*bufs[0])) if isinstance(o, torch.Tensor))
    in_bytes = sum(x.numel() * x.element_size() for x in bases[0] if isinstance(x, torch.Tensor))
    return {"samples": samples, "tails": tails, "verify": [{k: c[k] for k in ("iter", "base", "scale")} for c in checked],
            "path": path, "io_bytes": in_bytes + out_bytes, "lead_ms": lead_ms, "plain_samples": plain,
            "queue_ms": queue, **host}


# Every thread spins until one deadline, set by whichever thread starts first (compare-and-swap on a zeroed
# slot), so all blocks leave together: none frees its SM early for someone else's kernel.
_HOLD_PTX = """.version 7.0
.target sm_70
.address_size 64
.visible .entry pacevolve_hold(.param .u64 ns, .param .u64 slot)
.maxnreg 32
{
    .reg .u64 %now, %deadline, %first, %addr;
    .reg .pred %wait;
    ld.param.u64 %deadline, [ns];
    ld.param.u64 %addr, [slot];
    cvta.to.global.u64 %addr, %addr;
    mov.u64 %now, %globaltimer;
    add.u64 %deadline, %deadline, %now;
    atom.global.cas.b64 %first, [%addr], 0, %deadline;
    setp.ne.u64 %wait, %first, 0;
    @%wait mov.u64 %deadline, %first;
SPIN:
    mov.u64 %now, %globaltimer;
    setp.lt.u64 %wait, %now, %deadline;
    @%wait bra SPIN;
    ret;
}
"""


def _make_hold(device) -> "_GpuHold | None":
    if device.type != "cuda":
        return None
    try:
        return _GpuHold(device)
    except Exception as e:  # noqa: BLE001 - then KernelBench's protocol without a lead; timing says lead_ms 0
        print(f"pacevolve: no timing lead ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


class _GpuHold:
    """A kernel that fills every warp slot of every SM and spins for a given time: the timing's lead.

    While it runs the call's first launches are queued behind it, so the host's latency cannot show in the
    sample; and since no SM has room for another block, work the candidate might start on a stream of its
    own during the lead cannot run either. (torch.cuda._sleep, a single thread, would leave the GPU free
    for that.) PTX loaded through the driver, so nothing is compiled.
    """

    def __init__(self, device):
        import ctypes
        import torch
        props = torch.cuda.get_device_properties(device)
        per_sm = getattr(props, "max_threads_per_multi_processor", 0) or 2048
        self.block = next(b for b in (1024, 768, 512, 256, 128, 64, 32) if per_sm % b == 0)
        self.grid = props.multi_processor_count * (per_sm // self.block)
        self._slot = torch.zeros(1, dtype=torch.int64, device=device)
        cuda = ctypes.CDLL("libcuda.so.1")
        module, self._fn = ctypes.c_void_p(), ctypes.c_void_p()
        torch.cuda.current_stream(device).synchronize()  # the primary context is current on this thread
        for call, args in ((cuda.cuModuleLoadData, (ctypes.byref(module), ctypes.c_char_p(_HOLD_PTX.encode()))),
                           (cuda.cuModuleGetFunction, (ctypes.byref(self._fn), module, b"pacevolve_hold"))):
            err = call(*args)
            if err:
                raise RuntimeError(f"{call.__name__} failed with CUDA error {err}")
        self._cuda, self._ctypes, self._torch, self._device = cuda, ctypes, torch, device
        self(0.01)  # loaded now (lazy module loading would otherwise delay the first lead)
        torch.cuda.current_stream(device).synchronize()

    def __call__(self, ms: float) -> None:
        """Queue the hold on the current stream."""
        c = self._ctypes
        self._slot.zero_()
        ns, slot = c.c_uint64(int(ms * 1e6)), c.c_uint64(self._slot.data_ptr())
        params = (c.c_void_p * 2)(c.cast(c.pointer(ns), c.c_void_p), c.cast(c.pointer(slot), c.c_void_p))
        stream = c.c_void_p(self._torch.cuda.current_stream(self._device).cuda_stream)
        err = self._cuda.cuLaunchKernel(self._fn, c.c_uint(self.grid), c.c_uint(1), c.c_uint(1), c.c_uint(self.block),
                                        c.c_uint(1), c.c_uint(1), c.c_uint(0), stream, params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err}")


def _spin_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured now (the clock moves with load)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / max(start.elapsed_time(end), 1e-3)


def _host_phase(model, bufs, device, t: dict) -> dict:
    """N back-to-back calls ending in one sync, bracketed by messages the parent timestamps itself."""
    import torch
    send, n = t["_send"], t["host_calls"]
    with torch.no_grad():
        for _ in range(t["host_rounds"]):  # the parent keeps the fastest round: load only ever slows a round
            _sync(device)
            send({"kind": "host_start"})
            for i in range(n):
                model(*bufs[i % 2])
            _sync(device)
            send({"kind": "host_end"})
    return {"host_calls": n}


def _role_ref(job: dict, send, recv) -> None:
    """Persistent reference worker: device info, reference outputs and every comparison. Never sees candidates."""
    import torch
    device = torch.device(job["device"])
    _setup_torch(job, device)
    ref_ns = _exec_source(job["reference_src"], "<reference>")
    models: dict[tuple, Any] = {(42, False): _build_model(ref_ns["Model"], ref_ns, 42, False, device)[0]}
    prepared: dict[str, list] = {}
    send({"kind": "ready", "ref_names": _small_param_names(models), **_device_info(device)})
    while True:
        req = recv()
        if req.get("cmd") == "quit":
            return
        try:
            if req.get("cmd") == "prepare":
                prepared.clear()  # at most one evaluation's reference outputs are kept
                held, cap, outs = 0, req.get("max_bytes", 1 << 31), None
                for item in req["items"]:
                    outs = _reference_outputs(item, ref_ns, models, device)
                    held += sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))
                    if held > cap:
                        break  # big outputs: the rest is computed at comparison time, one at a time
                    prepared[_item_key(item)] = outs
                del outs
                reply = {"kind": "prepared", "count": len(prepared)}
            else:
                reply = _ref_compare(req, ref_ns, models, prepared, device)
        except BaseException as e:  # noqa: BLE001
            reply = {"kind": "error", "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:]}
        if device.type == "cuda":
            if req.get("cmd") != "prepare":
                torch.cuda.empty_cache()
            torch.cuda.synchronize()  # all our GPU work is over before the reply: a timing may start on it
        send(reply)


def _perturbed(item: dict) -> bool:
    # The weight perturbation applies only when the candidate's parameter names match the reference's.
    return item["spec"]["perturb"] and item.get("names_match", False)


def _item_key(item: dict) -> str:
    spec = item["spec"]
    return json.dumps([spec["seed"], spec["dist"], spec["weight_seed"], _perturbed(item), item.get("scale", 1.0)])


def _reference_outputs(item: dict, ref_ns: dict, models: dict, device) -> list:
    import torch
    spec = item["spec"]
    perturb = _perturbed(item)
    key = (spec["weight_seed"], perturb)
    if key not in models:
        models.clear()  # keep at most one set of weights resident
        models[key] = _build_model(ref_ns["Model"], ref_ns, spec["weight_seed"], perturb, device)[0]
    xs = _make_inputs(ref_ns, spec, device)
    if item.get("scale", 1.0) != 1.0:
        xs = [x * item["scale"] if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
    with torch.no_grad():
        return [r.detach() for r in _flat(models[key](*xs))]


def _ref_compare(req: dict, ref_ns: dict, models: dict, prepared: dict, device) -> dict:
    import torch
    loaded = torch.load(req["path"], map_location="cpu", weights_only=True)  # tensors only: nothing executes
    if not isinstance(loaded, dict):
        raise ValueError("output file is not a dict")
    results = []
    produced = loaded.get(req["field"], [])
    for item in req["items"]:
        if item["index"] >= len(produced):
            raise ValueError("fewer outputs than trials")
        ref = prepared.pop(_item_key(item), None)
        if ref is None:
            ref = _reference_outputs(item, ref_ns, models, device)
        results.append(compare_outputs(produced[item["index"]], ref, req["rtol"], req["atol"], req["l2_tol"]))
    return {"kind": "compared", "results": results, "ref_names": _small_param_names(models)}


def _small_param_names(models: dict) -> list[str]:
    for model in models.values():
        return sorted(n for n, p in model.named_parameters() if p.dim() <= 1)
    return []


def _device_info(device) -> dict:
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device_name": "cpu"}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device_name=p.name, capability=[p.major, p.minor], total_mem=p.total_memory,
                    l2_bytes=getattr(p, "L2_cache_size", 50 << 20), sms=p.multi_processor_count,
                    cudnn=torch.backends.cudnn.version())
    return info


def compare_outputs(outs: list, refs: list, rtol: float, atol: float, l2_tol: float) -> dict:
    """Elementwise |out-ref| <= rtol*|ref| + atol*RMS(ref) and ||out-ref||/||ref|| <= l2_tol, per output.

    The absolute term scales with the output's RMS: honest kernels with another summation order differ
    most where outputs are near zero, while degenerate outputs (zeros for a softmax, hack 13) fail the
    relative-L2 bound regardless of how small the outputs are.
    """
    import torch
    if len(outs) != len(refs):
        return {"ok": False, "reason": f"{len(outs)} outputs, expected {len(refs)}"}
    worst: dict = {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "rel_l2": 0.0}
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, torch.Tensor) or type(o) is not torch.Tensor:
            return {"ok": False, "reason": f"output {i} is not a tensor"}
        if tuple(o.shape) != tuple(r.shape):
            return {"ok": False, "reason": f"output {i} has shape {tuple(o.shape)}, expected {tuple(r.shape)}"}
        if o.dtype != r.dtype:
            return {"ok": False, "reason": f"output {i} has dtype {o.dtype}, expected {r.dtype}"}
        o = o.to(r.device)
        if not torch.isfinite(o).all() and torch.isfinite(r).all():
            bad = (~torch.isfinite(o)).nonzero()[0].tolist()
            return {"ok": False, "reason": f"output {i} has non-finite values (first at index {bad})"}
        if o.numel() == 0:
            continue
        of, rf = o.double(), r.double()
        diff = (of - rf).abs().nan_to_num(0.0)
        rms = rf.pow(2).mean().sqrt().item()
        bound = rtol * rf.abs() + atol * rms
        ref_norm = rf.norm().item()
        rel_l2 = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
        excess = diff - bound
        j = int(excess.argmax())
        idx = list(torch.unravel_index(torch.tensor(j), o.shape)) if o.dim() else []
        worst["max_abs_err"] = max(worst["max_abs_err"], diff.max().item())
        worst["max_rel_err"] = max(worst["max_rel_err"], (diff / rf.abs().clamp_min(1e-12)).max().item())
        worst["rel_l2"] = max(worst["rel_l2"], rel_l2)
        elem_ok, l2_ok = excess.view(-1)[j].item() <= 0, rel_l2 <= l2_tol
        if not (elem_ok and l2_ok) and worst["ok"]:
            why = [] if elem_ok else [f"elementwise bound rtol*|ref|+atol*RMS(ref) exceeded"]
            why += [] if l2_ok else [f"relative L2 error {rel_l2:.3g} > {l2_tol:.3g}"]
            worst.update(ok=False, reason=f"output {i}: " + "; ".join(why) +
                         f"; worst at index {[int(v) for v in idx]}: got {of.view(-1)[j].item():.6g}, "
                         f"expected {rf.view(-1)[j].item():.6g} (abs err {diff.view(-1)[j].item():.3g}, "
                         f"RMS(ref) {rms:.3g})")
    return worst


class _LineReader:
    """Lines from stdin, read unbuffered, so "is a line waiting?" has an honest answer (select on a
    buffered stream misses lines already pulled into its buffer)."""

    def __init__(self, fd: int = 0):
        self.fd, self.buf = fd, b""

    def wait(self, timeout: float) -> bool:
        if b"\n" in self.buf:
            return True
        if select.select([self.fd], [], [], timeout)[0]:
            chunk = os.read(self.fd, 1 << 16)
            self.buf += chunk if chunk else b"\n"  # EOF reads as an empty line
        return b"\n" in self.buf

    def readline(self) -> dict:
        while not self.wait(3600):
            pass
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line) if line.strip() else {"cmd": "quit"}


def _pin_all_threads(cpus: list[int]) -> None:
    # A prepared runner already has CUDA's and torch's helper threads; each thread has its own affinity.
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def _die_with_parent_preexec():
    """For spares: SIGKILL when the thread that started them ends (the evaluator's spawner thread, or the
    whole evaluator). A spare is SIGSTOPped while a candidate is timed; a stopped process never sees its
    pipes close, so without this a killed evaluator would leave it behind, holding memory and possibly a
    CUDA context. Set between fork and exec, so there is no moment when a spare could be stopped without it."""
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, in the parent
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _check_parent(parent_pid: int) -> None:
    if os.getppid() != parent_pid:  # the evaluator died before the child's prctl took effect
        os._exit(0)


def _worker_main() -> None:
    fd = int(sys.argv[2])
    chan = os.fdopen(fd, "wb", buffering=0)
    stdin = _LineReader()
    nonce_box: dict = {}

    def send(msg: dict) -> None:
        chan.write((json.dumps(dict(msg, nonce=nonce_box["n"])) + "\n").encode())

    if sys.argv[3:4] == ["warm"]:
        # A spare pays for the torch import while the previous candidate runs; CUDA waits for "prep".
        _check_parent(int(sys.argv[4]))
        import torch  # noqa: F401
        import torch.utils.cpp_extension  # noqa: F401
    job = stdin.readline()
    if "role" not in job:  # the evaluator closed our stdin before giving us work
        os._exit(0)
    nonce_box["n"] = job.pop("nonce", "")
    state = None
    if job["role"] == "prep":  # a runner: get ready first, then take one job
        try:
            state = _prepare_runner(job, send, stdin)
        except BaseException as e:  # noqa: BLE001
            send({"kind": "error", "where": "runner start-up", "error": f"{type(e).__name__}: {e}"})
            os._exit(1)
        job = stdin.readline()
        if "role" not in job:
            os._exit(0)
        job.pop("nonce", None)
    if job.get("cpus"):
        _pin_all_threads(job["cpus"])  # also inherited by compilers the candidate's build starts
    os.environ.update(job.get("env", {}))  # build dir and arch list of this candidate
    if job.get("timing"):
        job["timing"]["_send"] = send
    role = job["role"]
    if role == "build":
        _role_build(job, send)
    elif role == "run":
        _role_run(job, state, send, stdin.readline)
    elif role == "ref":
        _role_ref(job, send, stdin.readline)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit hooks or finalizers must not run late


# ======================================================================================================
# Evaluator (parent side)
# ======================================================================================================

# Upper bounds of what the hardware can do (a runtime below them is physically impossible).
_PEAKS = {"H100": (3.9e12, 1.0e15), "H200": (5.2e12, 1.0e15), "A100": (2.1e12, 3.2e14), "B200": (8.5e12, 2.5e15)}
_DISTS = ("own", "own", "scaled", "negated", "zero_mean", "per_sample")


@dataclass
class Options:
    trials: int = 7  # correctness input sets; the last one re-seeds and perturbs the weights
    build_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    warmup: int = 5
    warmup_ms: float = 100.0  # and at least this much warm-up work (GPU clocks ramp up)
    warm_runners: bool = True  # start runner processes ahead of need (torch imported, CUDA up)
    spare_runners: int = 3  # per device, when the runner has a core of its own (else 1)
    prepare_bytes: int = 2 << 30  # reference outputs computed ahead, alongside the candidate's trials (0: off)
    inputs_on_device: bool = True  # get_inputs() draws on the timing device (False: on the CPU, then copied)
    pin_cpus: bool = True  # a reserved core per device runner when there are enough cores
    timing_iters: int = 100
    verify_calls: int = 3  # timed calls whose outputs are checked against the reference
    host_calls: int = 10
    host_rounds: int = 3
    host_ratio: float = 3.0  # reject if event median * host_ratio < host per-call time ...
    host_slack_ms: float = 0.05  # ... and the gap exceeds this (launch overhead on tiny kernels)
    lead_ms: float = 0.5  # the GPU held (_GpuHold) between the L2 flush and the start event; 0: KernelBench's protocol
    tail_ms: float = 0.05  # median device time after the call's stream finished, less the host's own delay:
    # above this, work was left on another stream
    max_speedup: float = 10.0  # above this a speedup is flagged, not rejected
    allow_tf32: bool = False
    cpu_threads: int = 1
    max_jobs: int | None = None
    build_workers: int | None = None
    use_pch: bool = True
    light_headers: bool = True  # .cu files try light_headers.py's cut-down torch headers first, then the real ones
    fast_nvcc: bool = True  # nvcc's host and device front ends side by side (fast_nvcc.py)
    flush_bytes: int = 256 << 20
    poison_bytes: int = 1 << 30
    peak_bytes_per_s: float | None = None
    peak_flops: float | None = None


class _Device:
    """One timing slot: a GPU (or the CPU), its reference worker, its lock and its cached baseline."""

    def __init__(self, ev: "Evaluator", index: int):
        self.index = index
        self.lock = threading.Lock()
        self.pending = 0
        self.baseline: dict | None = None
        self.ev = ev
        self.physical = physical_gpu(index)
        self.ref: _Worker | None = None
        self.ref_lock = threading.Lock()
        self.info = self._start_ref()
        # Spares, oldest first: the first is prepared (CUDA up, reference loaded) while an evaluation runs,
        # the others only import torch. A new evaluation then starts with a ready process.
        self.spares: list[_Worker] = []
        self.pinned = ev._runner_cpus[0] is not None
        if ev.opts.warm_runners:
            self.spares = [self._spawn()]
            self._prep(self.spares[0], self.gpu_lock_path)  # no lock held here: the spare takes it itself

    def _spawn(self) -> _Worker:
        """A runner process that imports torch at once, on the cores not reserved for timing."""
        return self.ev._spawn_warm(self.env(), os.path.join(self.ev.log_dir, f"run-{secrets.token_hex(6)}.log"))

    def _prep(self, w: _Worker, lock_path: str | None) -> None:
        w.send(self.ev._job("prep", device=self.ev._torch_device(), gpu_lock=lock_path))
        w.prepped = True

    def take_runner(self) -> _Worker:
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
        if self.ev.opts.warm_runners and not self.ev._closed:
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

    def pause_spares(self, pause: bool = True) -> None:
        """Stop starting spares (SIGSTOP) for the timed window: importing torch is seconds of CPU and memory
        traffic that the timing should not share the machine with; SIGCONT resumes them."""
        for w in self.spares:
            try:
                os.killpg(w.proc.pid, signal.SIGSTOP if pause else signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        for w in self.spares:
            w.discard()
        self.spares = []

    def env(self) -> dict[str, str]:
        extra = {"CUDA_VISIBLE_DEVICES": self.physical} if self.ev.device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}
        return self.ev._env(**extra)

    def _start_ref(self) -> dict:
        self.ref = _Worker(self.env(), os.path.join(self.ev.log_dir, f"ref-{self.index}.log"))
        self.ref.send(self.ev._job("ref", device=self.ev._torch_device(), cpus=self.ev._other_cpus))
        try:
            return self.ref.recv(timeout=300)
        except (TimeoutError, EOFError) as e:
            raise RuntimeError(f"reference worker failed to start ({e!r}): {self.ref.log_tail()}") from None

    def ref_call(self, req: dict) -> dict:
        with self.ref_lock:
            if self.ref is None or self.ref.proc.poll() is not None:
                self._start_ref()
            self.ref.send(req)
            try:
                return self.ref.recv(timeout=self.ev.opts.run_timeout_s)
            except (TimeoutError, EOFError):
                self.ref.kill()
                self.ref = None
                raise RuntimeError("reference worker died") from None

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
    return os.path.join(tempfile.gettempdir(), f"pacevolve-{device}{physical}.lock")


class Evaluator:
    """One per task: thread-safe; caches baselines per device; owns the reference workers."""

    def __init__(self, reference_src: str, *, device: str = "cuda", gpus: list[int] | None = None,
                 rtol: float = 1e-4, atol: float = 1e-4, l2_tol: float = 1e-5, flops: float = 0.0,
                 cache_dir: str | None = None, log_dir: str | None = None,
                 import_dirs: list[str] | None = None, **options):
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
        self.log_dir = os.path.abspath(log_dir) if log_dir else self.cache_dir  # shim: worker logs
        os.makedirs(self.log_dir, exist_ok=True)
        self.import_dirs = [os.path.abspath(d) for d in import_dirs or []]  # shim: on every worker's path
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
        if self.import_dirs:
            path = [*self.import_dirs, os.environ.get("PYTHONPATH", "")]
            extra = {"PYTHONPATH": os.pathsep.join(p for p in path if p), **extra}
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
                                os.path.join(self.log_dir, f"build-{secrets.token_hex(6)}.log"))

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


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FileLock:
    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
        return False


def _quantile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _move(src: str, dst: str) -> None:
    try:
        os.replace(src, dst)
    except OSError:
        pass


def _cuda_count() -> int:
    import torch
    return torch.cuda.device_count()


def _pch_writable() -> bool:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    inc = os.path.join(os.path.dirname(spec.origin), "include", "torch") if spec and spec.origin else ""
    return bool(inc) and os.access(inc, os.W_OK)


def evaluate(reference_src: str, candidate_src: str, *, device: str = "cuda", **options) -> EvalResult:
    """One-shot convenience: builds an Evaluator, evaluates one candidate, closes it."""
    verdict = screen(candidate_src)  # no workers are started for code the screen already refuses
    if verdict.status != "ok":
        return EvalResult(verdict.status, message=verdict.message, details={"rule": verdict.rule})
    with Evaluator(reference_src, device=device, **options) as ev:
        return ev.evaluate(candidate_src)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "--worker":
    _worker_main()
