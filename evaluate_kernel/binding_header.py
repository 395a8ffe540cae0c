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
  flags torch precompiles its own header with, read back from torch's signature of that header.

main.cpp of a CUDA candidate then compiles in 3.0 s instead of 7.0 on the development VM, and at -O3 in
4.6 s instead of 22.7 (BENCHMARKS.md, session 30, with the H200 machine's figures).

A build uses it when cpp_sources includes nothing but the standard library and torch headers this one
includes already, calls or qualifies no operator it leaves out (``usable``), and needs none of torch's
own factories (light_headers.needs_torch_types). A name it lacks fails to compile rather than bind to something
else, and the build is then made again with torch's header (build.py). GPU Evaluators build the directory
once per machine, torch and compiler, outside the namespace; builders see it read-only. Standard library
only.
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
EXTENSION_H = ("// Written by pacevolve (binding_header.py): what load_inline's main.cpp uses to bind kernel functions.\n"
               "#ifndef PACEVOLVE_BINDING_HEADER\n#define PACEVOLVE_BINDING_HEADER\n" + SOURCE + "#endif\n")
# The two headers this module prepares -> their precompiled forms (a file in extension.h.gch -> its flags).
KINDS = {"binding": {"plain": [], "o2": ["-O2"]}, "optimised": {"o2": ["-O2"]}}
OPTIMISED_H = ("// Written by pacevolve (binding_header.py): torch's own extension.h, precompiled here at -O2.\n"
               "#ifndef PACEVOLVE_OPTIMISED_HEADER\n#define PACEVOLVE_OPTIMISED_HEADER\n#include \"{header}\"\n#endif\n")
OPTIMISING = re.compile(r"^-O[123]$")     # the flags the -O2 forms serve
FORMAT = 3                                # of the directory: a change here makes a new one
LEFT_OUT = "operators-left-out"           # the operators this header does not declare, one a line
INCLUDED = "included"                     # torch's headers it includes, as an #include names them
READY = "READY"
MEMBER_OR_STD = re.compile(r"(?:\.|->)\s*\w+|\bstd\s*::\s*\w+")
PARAMETER = re.compile(r"(?<=[\w>*&])(\s+|\s*[*&]+\s*)\w+(?=\s*[,)=])")   # "Tensor norm," "float* t)"
STANDARD = re.compile(r"\w+(?:\.h)?")   # <vector>, <cmath>, <stdint.h>: the standard library's spelling


def default_root() -> str:
    """Beside the default cache, not in it: $XDG_CACHE_HOME/pacevolve/headers or ~/.cache/pacevolve/headers."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pacevolve", "headers")


def usable(cpp_sources: str, directory: str) -> bool:
    """Whether main.cpp with these cpp_sources may try the binding header in `directory`.

    No operator the header leaves out may be named, in the text as written or with the candidate's own
    macros expanded and its comments removed (a name pasted by a macro, a call hidden in one, and a
    function of the candidate's own that shares an operator's name, which torch's declaration would
    outrank, all show there). Only a parameter's name in a declaration is passed over (norm in
    ``torch::Tensor f(torch::Tensor norm);``): it names nothing outside its function.
    """
    if light_headers.needs_torch_types(cpp_sources):
        return False
    try:
        with open(os.path.join(directory, LEFT_OUT)) as f:
            left_out = set(f.read().split())
        with open(os.path.join(directory, INCLUDED)) as f:
            included = set(f.read().split())
        with open(os.path.join(directory, READY)) as f:
            command = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    if not all(name in included or STANDARD.fullmatch(name) for name in light_headers.INCLUDE.findall(cpp_sources)):
        return False
    expanded = _expanded(cpp_sources, command[:_compiler_words(command)])
    return expanded is not None and not (_named(cpp_sources) | _named(expanded)) & left_out


def _named(text: str) -> set[str]:
    """The identifiers of a text but methods (x.relu(): declared with Tensor whatever the operators kept),
    std:: names and declared parameters (a name between a type and , ) or =)."""
    text = MEMBER_OR_STD.sub(" ", text)
    return set(light_headers.IDENTIFIER.findall(PARAMETER.sub(" ", text)))


def _expanded(cpp_sources: str, compiler: list[str]) -> str | None:
    """cpp_sources preprocessed alone (its #include lines left out): its own macros expanded, comments gone."""
    text = re.sub(r"^[ \t]*#[ \t]*include\b[^\n]*$", "", cpp_sources, flags=re.M)
    try:
        proc = subprocess.run([*compiler, "-E", "-P", "-w", "-x", "c++", "-"], input=text, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def prepare(torch_root: str, root: str | None = None, timeout_s: float = 600,
            kind: str = "binding") -> tuple[str, str]:
    """(directory, "") with the header ready, else ("", why not). Builds it when this torch and compiler
    have none yet (tens of seconds, once per machine). kind "binding" is the header described above;
    "optimised" is torch's own extension.h precompiled at -O2, for a main.cpp that cannot use the binding
    header and asks for -O1 to -O3 (torch's precompiled header serves no -O: such a main.cpp parsed all of
    torch's headers, 22.7 s against 10.5 s with this one on the development VM)."""
    command = torch_command(torch_root)
    if command is None:
        return "", "torch's precompiled header is missing or its signature reads otherwise"
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
    if os.path.isfile(os.path.join(directory, READY)):
        return directory, ""
    # Built aside and renamed into place when complete: no lock (which a candidate could hold, the files
    # being visible to it), and two Evaluators preparing at once each build, and one directory stays.
    os.makedirs(root, mode=0o755, exist_ok=True)
    aside = tempfile.mkdtemp(prefix=f".{key}.", dir=root)
    try:
        why = _build(aside, command, texts, timeout_s, KINDS[kind], listing=kind == "binding")
        if not why:
            os.chmod(aside, 0o755)
            try:
                os.rename(aside, directory)
            except OSError:   # another Evaluator's came first
                if not os.path.isfile(os.path.join(directory, READY)):
                    why = "another preparation left the directory unfinished"
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return (directory, "") if not why else ("", why)


def torch_command(torch_root: str) -> list[str] | None:
    """The compiler and flags torch precompiles its extension.h with (less the header and output), as its
    signature file records them; None unless the signature is exactly what those flags would write."""
    inc = os.path.join(torch_root, "include")
    try:
        with open(os.path.join(inc, "torch", "extension.h.sign")) as f:
            sign = f.read()
    except OSError:
        return None
    if not os.path.isfile(os.path.join(inc, "torch", "extension.h.gch")):
        return None
    compiler = shlex.split(os.environ.get("CXX", "c++"))
    head = os.path.join(inc, "torch", "extension.h")
    std = re.search(r"_-std=([\w+]+)_", sign)
    if not std:
        return None
    flags = ["-I", inc, "-I", sysconfig.get_path("include"), "-I", os.path.join(inc, "torch", "csrc", "api", "include"),
             "-DTORCH_API_INCLUDE_EXTENSION_H", f"-std={std.group(1)}", "-fPIC"]
    written = " ".join([*compiler, "-x", "c++-header", head, "-o", head + ".gch", *flags]).replace(" ", "_")
    return [*compiler, *flags] if written == sign else None


# ---------------------------------------------------------------------------------------------- helpers
def _compiler_words(command: list[str]) -> int:
    return command.index("-I")


def _texts() -> dict[str, str] | None:
    """The directory's headers (light_headers.py's, for SOURCE) and the operators left out, by relative path."""
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
        every = set(re.findall(light_headers.OPERATOR_INCLUDE.format(suffix=""), f.read()))
    kept = set(re.findall(light_headers.OPERATOR_INCLUDE.format(suffix=""), texts.get("ATen/Functions.h", "")))
    texts[LEFT_OUT] = "".join(f"{name}\n" for name in sorted(every - kept))
    return texts


def _build(directory: str, command: list[str], texts: dict[str, str], timeout_s: float,
           variants: dict[str, list[str]], listing: bool) -> str:
    """Write the headers into `directory` and precompile them (with `listing`, list what they include);
    "" on success, else why not."""
    for name, text in texts.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    header = os.path.join(directory, "torch", "extension.h")
    os.makedirs(header + ".gch", mode=0o755)

    # This directory first, as on main.cpp's path (where torch's come after, as -isystem): what is
    # precompiled is what a compile that cannot use the precompiled form parses.
    own_first = [*command[:_compiler_words(command)], "-I", directory, *command[_compiler_words(command):]]

    def precompile(variant: str) -> subprocess.CompletedProcess:
        return subprocess.run([*own_first, *variants[variant], "-x", "c++-header", header, "-o",
                               os.path.join(header + ".gch", variant)],
                              capture_output=True, text=True, timeout=timeout_s)
    try:
        with ThreadPoolExecutor(len(variants)) as pool:
            runs = list(pool.map(precompile, variants))
    except subprocess.TimeoutExpired:
        runs = None
    failed = "timed out" if runs is None else next((r.stderr.strip()[-300:] or "failed" for r in runs
                                                    if r.returncode), "")
    if not failed and listing:
        # What the header includes, as an #include in cpp_sources would name it: such an include adds nothing.
        deps = subprocess.run([*own_first, "-M", "-x", "c++", header], capture_output=True, text=True)
        failed = "" if deps.returncode == 0 else deps.stderr.strip()[-300:] or "listing its includes failed"
        dirs = [directory] + [command[i + 1] for i, a in enumerate(command[:-1]) if a == "-I"]
        names = {os.path.relpath(path, d) for path in deps.stdout.replace("\\\n", " ").split()[1:] for d in dirs
                 if path.startswith(d.rstrip("/") + "/")} | {"torch/extension.h"}
        with open(os.path.join(directory, INCLUDED), "w") as f:
            f.write("".join(f"{name}\n" for name in sorted(names)))
    if failed:
        return f"precompiling failed: {failed}"
    with open(os.path.join(directory, READY), "w") as f:
        f.write(json.dumps(command) + "\n")
    return ""
