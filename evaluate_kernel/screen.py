"""The static screen: syntax, a ModelNew class, and rules against code patterns with no honest use.

A fast first filter with a clear message (the broken rule, its reason and the line). No verdict depends
on it alone: every class of cheat it names is also stopped at run time by a check outside the candidate's
process (the package's front file lists them), and it is easy to get past on purpose: `builtins.exec` of
a built string, and in native code a name split by concatenation or a macro, or a driver context of the
candidate's own (its streams are none the screen names). Rules are data, so messages and docs come from
one place.
"""
from __future__ import annotations

import ast
import re
import threading
from dataclasses import dataclass

# CPython 3.11 before 3.11.8 keeps ast.parse's recursion count once per interpreter, so threads
# parsing at once (evaluations screened side by side) can fail with "AST constructor recursion depth
# mismatch". One lock for every parse in the process, kept on the ast module so that code outside this
# package that parses in threads (the search's duplicate filter) can take the same one without importing it.
_PARSE_LOCK = ast.__dict__.setdefault("_pacevolve_parse_lock", threading.RLock())

# ======================================================================================================
# Static screen: rules as data, so messages and docs come from one place
# ======================================================================================================

RULES: dict[str, str] = {
    "threads": "no threads, processes or async tasks (work finished after the timer stops is a known cheat)",
    "subprocess": "no subprocesses, shell commands or sockets",
    "tensor_subclass": "no tensor subclasses or __torch_function__/__torch_dispatch__ (lazy outputs that "
                       "compute during the check)",
    "introspection": "no frame, gc or inspect introspection, and no getattr/setattr by a computed name except on "
                     "self (use a dict of the functions you need); it can read the harness's expected outputs",
    "native_ffi": "no ctypes/cffi/dlopen (use load_inline for native code)",
    "patching": "no assignment to attributes of torch/time/builtins/os/sys modules, and no setattr on them "
                "(patching timers, comparisons or precision flags; torch.backends.cudnn.benchmark excepted)",
    "try_except": "no try/except or contextlib.suppress: a fallback to PyTorch hides a broken kernel",
    "reference_model": "do not use or subclass the reference class Model; write ModelNew yourself",
    "persisting_l2": "no persisting-L2 APIs (accessPolicyWindow, hitProp, cudaLimitPersistingL2CacheSize)",
    "streams": "no CUDA stream creation or stream switching (work on a side stream escapes the timer)",
    "file_io": "no file I/O (open, os.open/os.read, /proc) and no writes to os.environ (but for "
               "TORCH_CUDA_ARCH_LIST, OMP_NUM_THREADS and MKL_NUM_THREADS)",
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
# Settings a candidate may assign: they choose algorithms for its own calls, never precision or a timer.
_SETTINGS = {"torch.backends.cudnn.benchmark"}
# Precision flags a candidate may turn off (full fp32, as the reference runs), never on.
_OFF_ONLY = {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
             "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
             "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"}
# Environment variables a candidate may set (its extension's target architectures, its own thread count).
_ENV_KEYS = {"TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}
_ENV_WRITES = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"}

# Native code is in string literals; these patterns run over them with C/C++ comments removed.
_NATIVE_RULES = [
    ("persisting_l2", r"accessPolicyWindow|hitProp|PersistingL2|cudaLimitPersisting|cudaCtxResetPersisting"),
    # Pieces, not only whole API names, so names assembled with ## or looked up by string are caught too.
    ("streams", r"StreamCreate|CreateWithFlags|CreateWithPriority|NonBlocking|NON_BLOCKING|getStreamFromPool"
                r"|getStreamFromExternal|StreamGuard|cublasSetStream|setCurrentCUDAStream|GetDriverEntryPoint"
                r"|GetProcAddress"),
    # A thread that is started (not std::thread::hardware_concurrency, not the header); an OpenMP task
    # may outlive its region (taskloop, like parallel for, ends with it).
    ("threads", r"std::thread(?!::hardware_concurrency)\b|std::async|pthread_create|std::jthread|omp\s+task\b"),
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


def _canonical(dotted: str, module_alias: dict[str, str]) -> str:
    """A dotted name with its import alias spelt out (T.backends.cudnn.benchmark, after `import torch as
    T` -> torch.backends.cudnn.benchmark)."""
    root, _, rest = dotted.partition(".")
    full = module_alias.get(root, root)
    return f"{full}.{rest}" if rest else full


def _constant_text(node: ast.AST) -> str | None:
    """An attribute name written as a constant (a string, or an f-string of constant parts); else None."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)
    return None


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
                if root in _MODULE_RULES or root.startswith("eval_"):
                    out.append((_MODULE_RULES.get(root, "harness_access"), node.lineno, f"import {full}"))
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
                if isinstance(node, ast.ImportFrom) and f"{node.module}.{a.name}" == "sys.modules":
                    out.append(("introspection", node.lineno, "from sys import modules"))   # forty-fourth red team
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
            if _canonical(name, module_alias) == "torch.set_float32_matmul_precision" and not (
                    node.args and _constant_text(node.args[0]) == "highest"):   # TF32 or bf16 passes
                out.append(("patching", node.lineno, f"{name}(...)"))
            if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
                attr = _constant_text(node.args[1])
                if attr is None and _dotted(node.args[0]) != "self":
                    # A computed attribute name hides what is accessed (e.g. "gi_" + "frame" to walk frames);
                    # the model's own layers set and looked up by name are ordinary PyTorch. On anything
                    # else, even torch.nn.functional or an attribute of self, it reaches modules, frames and
                    # __builtins__ (twenty-first red team).
                    out.append(("introspection", node.lineno, f"{name} with a computed attribute name"))
                elif attr is not None and attr in _ATTR_RULES:   # the rules below, spelt as a string
                    out.append((_ATTR_RULES[attr], node.lineno, f"{name}(..., {attr!r})"))
                elif attr in ("modules", "__dict__") and _dotted(node.args[0]).split(".")[0] in module_alias:
                    out.append(("introspection", node.lineno, f"{name}({_dotted(node.args[0])}, {attr!r})"))
            if name in ("setattr", "delattr") and node.args and _dotted(node.args[0]).split(".")[0] in module_alias:
                out.append(("patching", node.lineno, f"{name}({_dotted(node.args[0])}, ...)"))
        elif isinstance(node, ast.Attribute):
            if node.attr in _ATTR_RULES:
                out.append((_ATTR_RULES[node.attr], node.lineno, _dotted(node) or node.attr))
            if _canonical(_dotted(node), module_alias) == "sys.modules" or (node.attr == "__dict__"
                                                  and _dotted(node.value).split(".")[0] in module_alias):
                out.append(("introspection", node.lineno, _dotted(node)))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.For, ast.AsyncFor,
                             ast.With, ast.AsyncWith, ast.NamedExpr, ast.comprehension)):
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = list(node.targets)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
            else:
                targets = [node.target]
            while any(isinstance(t, (ast.Tuple, ast.List, ast.Starred)) for t in targets):   # a, b = ...
                targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else
                                                         [t.value] if isinstance(t, ast.Starred) else [t])]
            for t in targets:
                base = t.value if isinstance(t, ast.Subscript) else t
                dotted = _dotted(base)
                if isinstance(base, ast.Attribute) and dotted.split(".")[0] in module_alias:
                    if dotted.endswith("environ"):
                        key = _constant_text(t.slice) if isinstance(t, ast.Subscript) else None
                        if not (key in _ENV_KEYS and not isinstance(node, ast.Delete)):
                            out.append(("file_io", node.lineno, f"assignment to {dotted}"))
                    elif not (not isinstance(t, ast.Subscript) and (
                            _canonical(dotted, module_alias) in _SETTINGS
                            or (_canonical(dotted, module_alias) in _OFF_ONLY and isinstance(node, ast.Assign)
                                and isinstance(node.value, ast.Constant) and node.value.value is False))):
                        out.append(("patching", node.lineno, f"assignment to {dotted}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and _dotted(node.func.value).endswith("environ") and node.func.attr in _ENV_WRITES:
            key = _constant_text(node.args[0]) if node.args and node.func.attr in ("setdefault", "__setitem__") else None
            if key not in _ENV_KEYS:
                out.append(("file_io", node.lineno, f"{_dotted(node.func)}(...)"))
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
        with _PARSE_LOCK:
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

