"""The binding header: main.cpp's torch/extension.h cut to what the Python bindings of kernel functions use,
precompiled once per machine and torch.

load_inline writes main.cpp as ``#include <torch/extension.h>``, the candidate's cpp_sources, then one
pybind11 ``m.def`` per function; for a CUDA candidate cpp_sources only declares what the .cu file defines.
torch's extension.h (the whole C++ frontend and its Python bindings) is most of main.o's time even
precompiled: GCC's precompiled header keeps the parse but not the template instantiations that each
translation unit then makes at its end (7.0 s of an empty file on the development VM). A directory first on
main.cpp's include path replaces it:

* ``torch/extension.h`` includes light_headers.py's lean ``torch/types.h`` (with the operators its own
  code names), pybind11 with torch's type casters (``torch/csrc/utils/pybind.h``) and
  ``wrap_pybind_function`` (``torch/csrc/Exceptions.h``): everything load_inline's own lines use.
* ``torch/extension.h.gch`` is a directory holding that header precompiled twice, without -O and at -O2;
  GCC takes the first file in it valid for a compilation (-O1 to -O3 take the second; other flags that
  change the header's meaning take none, and the header's text is parsed instead). Both are built with the
  flags torch precompiles its own header with (checked against torch's signature of that header where
  there is one). The directory is usable as soon as its text is written and checked: on a fresh machine
  the first builds parse it (seconds) while it is precompiled, and the precompiled forms then appear in
  one rename, so that no compile sees one half-written.

main.cpp of a CUDA candidate then compiles in 3.0 s instead of 7.0 on the development VM, and at -O3 in
4.6 s instead of 22.7 (BENCHMARKS.md, session 30, with the H200 machine's figures).

A build uses it only when its cpp_sources declare functions and do nothing else (``usable``): a
declaration means the same with either header, while a function body, a macro or a conditional may not
(a call finds functions by argument-dependent lookup among the declarations left out). Before it is used,
the headers torch's extension.h reaches and this one does not are checked for pybind11 type casters (an
argument would convert otherwise): none may be there. Left open: a declared function named like one of
the few names torch's full header declares at global scope (THP*, libkineto, ...) fails to compile with
torch's header and builds with this one. GPU Evaluators build the directory once per machine, torch and
compiler, outside the namespace; builders see it read-only.

The same machinery precompiles torch's own extension.h at -O2 (``prepare(kind="optimised")``) for a main.cpp
that cannot use the binding header and asks for -O1 to -O3, which torch's precompiled header never serves;
an Evaluator prepares it after the first build that wanted it. Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor

from . import light_headers

SOURCE = ("#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n"
          "#include <torch/csrc/Exceptions.h>\n")
# No include guard of their own (the headers they include have theirs): no macro tells a source which it got.
EXTENSION_H = "// Written by pacevolve (binding_header.py): what load_inline's main.cpp uses.\n" + SOURCE
# The two headers this module prepares -> their precompiled forms (a file in extension.h.gch -> its flags).
KINDS = {"binding": {"plain": [], "o2": ["-O2"]}, "optimised": {"o2": ["-O2"]}}
OPTIMISED_H = "// Written by pacevolve (binding_header.py): torch's own, precompiled here at -O2.\n#include \"{header}\"\n"
OPTIMISING = re.compile(r"^-O[123]$")     # the flags the -O2 forms serve
FORMAT = 5                                # of the directory: a change here makes a new one
READY = "READY"
GCH = os.path.join("torch", "extension.h.gch")   # in the directory, once precompiled
OPERATORS = "operators"   # every operator torch's headers declare, one a line
ALLOWED_INCLUDE = re.compile(r"torch/(?:extension|types)\.h|\w+(?:\.h)?")   # its own, the standard library's
DECLARATION = re.compile(r"\s*[\w:<>,\s*&]+?\b\w+\s*\([\w:<>,\s*&]*\)\s*")   # type name(params)
NOT_IN_A_DECLARATION = {"template", "typename", "using", "namespace", "typedef", "extern", "static", "inline",
                        "operator", "decltype", "struct", "class", "union", "enum", "friend", "constexpr",
                        "consteval", "constinit", "auto", "sizeof", "alignof", "noexcept", "throw", "requires",
                        "concept", "register", "thread_local", "volatile", "asm", "mutable", "explicit",
                        "virtual", "typeid", "alignas", "_Pragma"}


def default_root() -> str:
    """Beside the default cache, not in it: $XDG_CACHE_HOME/pacevolve/headers or ~/.cache/pacevolve/headers."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pacevolve", "headers")


def usable(cpp_sources: str, directory: str, flags: list[str] | None = None, functions=None) -> bool:
    """Whether main.cpp with these cpp_sources (and the build's extra_cflags) may use the binding header in
    `directory`: only when cpp_sources declare functions and do nothing else, besides including
    torch/extension.h, torch/types.h or the standard library; when load_inline's `functions` (which it
    writes into main.cpp) are plain names and docstrings; when every flag is on light_headers' allow-list
    and no include path comes from the environment; and when no name qualified by at:: or torch:: is also
    one of torch's operators (at::complex is a type here and a function with torch's header).

    A declaration means the same with either header: the types it names are the same entities (the binding
    header's files are torch's, or torch's with declarations left out), a name only torch's declares fails
    to compile here (the build is then made with torch's), and no call, macro or conditional is left whose
    outcome could depend on what else the headers declare or define. A function body can: a call finds
    functions by argument-dependent lookup in the headers left out, a macro or #if can test what is
    defined, and a -D flag can supply a name no scan of the text sees (BENCHMARKS.md, session 30).
    """
    if not os.path.isfile(os.path.join(directory, READY)) or not light_headers.host_flags_allowed(flags or []) \
            or light_headers.compiler_env_set(os.environ):
        return False
    if re.search(r"[\"'\\?%]", cpp_sources) or not _plain_functions(functions):   # no literal, splice, trigraph
        return False                                                                 # or digraph to lex around
    try:
        with open(os.path.join(directory, OPERATORS)) as f:
            operators = set(f.read().split())
    except OSError:
        return False
    if set(re.findall(r"\b(?:at|torch)\s*::\s*(\w+)", cpp_sources)) & operators:
        return False
    text = re.sub(r"/\*.*?\*/", " ", cpp_sources, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    lines = []
    for line in text.splitlines():
        directive = re.match(r"\s*#\s*(\w*)\s*(.*?)\s*$", line)
        if directive is None:
            lines.append(line)
        elif directive.group(1) != "include" or not re.fullmatch(r"<([^<>]+)>", directive.group(2)) \
                or not ALLOWED_INCLUDE.fullmatch(directive.group(2)[1:-1]):
            return False
    *declarations, rest = " ".join(lines).split(";")
    return not rest.strip() and all(DECLARATION.fullmatch(d) and not NOT_IN_A_DECLARATION
                                    & set(light_headers.IDENTIFIER.findall(d)) for d in declarations)


def _plain_functions(functions) -> bool:
    """load_inline's functions: a name, names, or names with docstrings, none able to leave its string."""
    if functions is None:
        return False   # cpp_sources bind themselves: not declarations only
    items = [(functions, "")] if isinstance(functions, str) else \
        list(functions.items()) if isinstance(functions, dict) else [(f, "") for f in functions]
    return all(isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w*", name) and isinstance(doc, str)
               and not re.search(r"[\"\\\n\r?%]", doc) for name, doc in items)


def prepare(torch_root: str, root: str | None = None, timeout_s: float = 600,
            kind: str = "binding", precompiled: bool = True) -> tuple[str, str]:
    """(directory, "") with the header ready, else ("", why not). Writes it when this torch and compiler
    have none yet, and with `precompiled` precompiles it (tens of seconds, once per machine). kind
    "binding" is the header described above; "optimised" is torch's own extension.h precompiled at -O2, for
    a main.cpp that cannot use the binding header and asks for -O1 to -O3 (torch's precompiled header
    serves no -O: such a main.cpp parsed all of torch's headers, 22.7 s against 10.5 s with this one on the
    development VM)."""
    command = torch_command(torch_root)
    if command is None:
        return "", "torch's signature of its precompiled header reads otherwise than its flags"
    texts = _texts() if kind == "binding" else {
        os.path.join("torch", "extension.h"): OPTIMISED_H.format(
            header=os.path.join(torch_root, "include", "torch", "extension.h"))}
    if texts is None:
        return "", "torch's headers were not found"
    version = subprocess.run([*command[:_compiler_words(command)], "--version"], capture_output=True,
                             text=True).stdout
    with open(os.path.join(torch_root, "version.py"), "rb") as f:
        torch_version = f.read().decode(errors="replace")
    key = hashlib.sha256(json.dumps([FORMAT, kind, command, texts, version, torch_version, KINDS[kind]],
                                    sort_keys=True).encode()).hexdigest()[:16]
    root = root or default_root()
    directory = os.path.join(root, key)
    why = "" if os.path.isfile(os.path.join(directory, READY)) else \
        _publish(root, key, lambda aside: _write(aside, command, texts, check_casters=kind == "binding"))
    if not why and precompiled and not os.path.isdir(os.path.join(directory, GCH)):
        why = _publish(os.path.join(directory, "torch"), os.path.basename(GCH),
                       lambda aside: _precompile(directory, aside, command, KINDS[kind], timeout_s))
    return (directory, "") if not why else ("", why)


def torch_command(torch_root: str) -> list[str] | None:
    """The compiler and flags torch precompiles its extension.h with (less the header and output); None
    where torch's signature file records anything else. Before torch has precompiled it (no signature
    yet), the flags with C++17, a guess: the binding header's text serves meanwhile, and it is precompiled
    once torch's header is signed (flags that differ from a compile's only make GCC parse the text)."""
    inc = os.path.join(torch_root, "include")
    try:
        with open(os.path.join(inc, "torch", "extension.h.sign")) as f:
            sign = f.read()
    except FileNotFoundError:
        sign = None
    except OSError:
        return None
    cxx = os.environ.get("CXX", "c++")
    compiler = shlex.split(cxx)
    head = os.path.join(inc, "torch", "extension.h")
    std = re.search(r"_-std=([\w+]+)_", sign or "_-std=c++17_")
    if not std:
        return None
    flags = ["-I", inc, "-I", sysconfig.get_path("include"), "-I", os.path.join(inc, "torch", "csrc", "api", "include"),
             "-DTORCH_API_INCLUDE_EXTENSION_H", f"-std={std.group(1)}", "-fPIC"]
    if sign is None:
        return [*compiler, *flags]
    # torch writes the compiler as the environment names it, quoted or not by version, after ccache or
    # sccache where one is on PATH (a wrapper that changes nothing compiled: our commands go without it).
    for wrapper in ([], ["ccache"], ["sccache"]):
        for written_compiler in (" ".join([*wrapper, *compiler]), shlex.join([*wrapper, cxx])):
            written = " ".join([written_compiler, "-x", "c++-header", head, "-o", head + ".gch", *flags])
            if written.replace(" ", "_") == sign:
                return [*compiler, *flags]
    return None


# ---------------------------------------------------------------------------------------------- helpers
def _compiler_words(command: list[str]) -> int:
    return command.index("-I")


def _texts() -> dict[str, str] | None:
    """The directory's headers (light_headers.py's, for SOURCE), by relative path."""
    torch_dirs = light_headers.torch_include_dirs()
    if not torch_dirs:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        light_headers.write(tmp, SOURCE, [])
        texts = {}
        for base, _, files in os.walk(tmp):
            for name in files:
                path = os.path.join(base, name)
                with open(path) as f:
                    texts[os.path.relpath(path, tmp)] = f.read()
    texts.pop(os.path.join("thrust", "complex.h"), None)   # a .cu file's; main.cpp is C++
    texts[os.path.join("torch", "extension.h")] = EXTENSION_H
    with open(os.path.join(torch_dirs[0], "ATen", "Functions.h")) as f:
        texts[OPERATORS] = "".join(f"{name}\n" for name in sorted(
            set(re.findall(light_headers.OPERATOR_INCLUDE.format(suffix=""), f.read()))))
    return texts


def _publish(parent: str, name: str, fill) -> str:
    """Fill a directory made aside in `parent` (fill(aside) -> "" or why not) and rename it to `name` once
    complete: no lock (which a candidate could hold, the files being visible to it), no compile sees it
    half-made, and of two Evaluators preparing at once each builds and one directory stays. "" or why not."""
    os.makedirs(parent, mode=0o755, exist_ok=True)
    aside = tempfile.mkdtemp(prefix=f".{name}.", dir=parent)
    try:
        why = fill(aside)
        if not why:
            os.chmod(aside, 0o755)
            try:
                os.rename(aside, os.path.join(parent, name))
            except OSError:   # another Evaluator's came first
                if not os.path.exists(os.path.join(parent, name)):
                    why = "another preparation left it unfinished"
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return why


def _own_first(command: list[str], directory: str) -> list[str]:
    """The command with this directory first, as on main.cpp's path (where torch's come after, as -isystem):
    what is precompiled is what a compile that cannot use the precompiled form parses."""
    return [*command[:_compiler_words(command)], "-I", directory, *command[_compiler_words(command):]]


def _write(directory: str, command: list[str], texts: dict[str, str], check_casters: bool) -> str:
    """Write the headers into `directory` (with check_casters, check that torch's headers it leaves out
    hold no pybind11 type caster) and mark it ready; "" on success, else why not."""
    for name, text in texts.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    header = os.path.join(directory, "torch", "extension.h")
    caster = _casters_left_out(_own_first(command, directory), header, command) if check_casters else ""
    if caster:
        return caster
    with open(os.path.join(directory, READY), "w") as f:
        f.write(json.dumps(command) + "\n")
    return ""


def _precompile(directory: str, out: str, command: list[str], variants: dict[str, list[str]],
                timeout_s: float) -> str:
    """The header in `directory` precompiled into `out`, one file per variant; "" or why not."""
    header = os.path.join(directory, "torch", "extension.h")

    def precompile(variant: str) -> subprocess.CompletedProcess:
        return subprocess.run([*_own_first(command, directory), *variants[variant], "-x", "c++-header", header,
                               "-o", os.path.join(out, variant)], capture_output=True, text=True, timeout=timeout_s)
    try:
        with ThreadPoolExecutor(len(variants)) as pool:
            runs = list(pool.map(precompile, variants))
    except subprocess.TimeoutExpired:
        runs = None
    failed = "timed out" if runs is None else next((r.stderr.strip()[-300:] or "failed" for r in runs
                                                    if r.returncode), "")
    return f"precompiling failed: {failed}" if failed else ""


def _casters_left_out(own_first: list[str], header: str, command: list[str]) -> str:
    """"" unless a header torch's extension.h reaches and this one does not specialises a pybind11 type
    caster: an argument of that type would convert otherwise (or not at all) with this header."""
    def reached(argv: list[str]) -> set[str] | None:
        run = subprocess.run([*argv, "-M", "-x", "c++"], capture_output=True, text=True)
        return set(run.stdout.replace("\\\n", " ").split()[1:]) if run.returncode == 0 else None
    words = _compiler_words(command)
    torch_header = os.path.join(command[words + 1], "torch", "extension.h")
    ours, torch_s = reached([*own_first, header]), reached([*command, torch_header])
    if ours is None or torch_s is None:
        return "listing the headers' includes failed"
    for path in sorted(torch_s - ours):
        with open(path, errors="replace") as f:
            if "type_caster" in f.read():
                return f"a pybind11 type caster in a header it leaves out: {path}"
    return ""
