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

main.o of a CUDA candidate then took 3.8-4.1 s instead of about 10 on an H200 machine (BENCHMARKS.md).

A build uses it when cpp_sources includes nothing but the standard library and torch headers this one
includes already, calls or qualifies no operator it leaves out (``usable``), and needs none of torch's
own factories (light_headers.needs_torch_types). A name it lacks fails to compile rather than bind to something
else, and the build is then made again with torch's header (build.py). GPU Evaluators build the directory
once per machine, torch and compiler, outside the namespace; builders see it read-only. Standard library
only.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

from . import light_headers

SOURCE = ("#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n"
          "#include <torch/csrc/Exceptions.h>\n")
EXTENSION_H = ("// Written by pacevolve (binding_header.py): what load_inline's main.cpp uses to bind kernel functions.\n"
               "#ifndef PACEVOLVE_BINDING_HEADER\n#define PACEVOLVE_BINDING_HEADER\n" + SOURCE + "#endif\n")
VARIANTS = {"plain": [], "o2": ["-O2"]}   # file in extension.h.gch -> extra flags
FORMAT = 1                                # of the directory: a change here makes a new one
LEFT_OUT = "operators-left-out"           # the operators this header does not declare, one a line
INCLUDED = "included"                     # torch's headers it includes, as an #include names them
READY = "READY"
MEMBER_OR_STD = re.compile(r"(?:\.|->)\s*\w+|\bstd\s*::\s*\w+")
CALLED_OR_QUALIFIED = re.compile(r"\b(\w+)\s*[(<]|::\s*(\w+)")
STANDARD = re.compile(r"\w+(?:\.h)?")   # <vector>, <cmath>, <stdint.h>: the standard library's spelling


def default_root() -> str:
    """Beside the default cache, not in it: $XDG_CACHE_HOME/pacevolve/headers or ~/.cache/pacevolve/headers."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pacevolve", "headers")


def usable(cpp_sources: str, directory: str) -> bool:
    """Whether main.cpp with these cpp_sources may try the binding header in `directory`."""
    if light_headers.needs_torch_types(cpp_sources):
        return False
    try:
        with open(os.path.join(directory, LEFT_OUT)) as f:
            left_out = set(f.read().split())
        with open(os.path.join(directory, INCLUDED)) as f:
            included = set(f.read().split())
    except OSError:
        return False
    if not all(name in included or STANDARD.fullmatch(name) for name in light_headers.INCLUDE.findall(cpp_sources)):
        return False
    # A method (x.size()) is declared with Tensor whatever the operators kept, and std::exp is no operator.
    # An operator is used by calling it (relu(x), found by ADL) or naming it qualified (at::relu, &at::relu);
    # a parameter or variable that shares its name (norm, t) uses nothing. A use the scan cannot see (a
    # macro pasting the name) finds no declaration and fails to compile: torch's header then decides.
    free = MEMBER_OR_STD.sub(" ", cpp_sources)
    return not {called or qualified for called, qualified in CALLED_OR_QUALIFIED.findall(free)} & left_out


def prepare(torch_root: str, root: str | None = None, timeout_s: float = 600) -> tuple[str, str]:
    """(directory, "") with the binding header ready, else ("", why not). Builds it when this torch and
    compiler have none yet (tens of seconds, once), under a lock shared by the machine's Evaluators."""
    command = torch_command(torch_root)
    if command is None:
        return "", "torch's precompiled header is missing or its signature reads otherwise"
    texts = _texts()
    if texts is None:
        return "", "torch's headers were not found"
    version = subprocess.run([*command[:_compiler_words(command)], "--version"], capture_output=True,
                             text=True).stdout
    with open(os.path.join(torch_root, "version.py"), "rb") as f:
        torch_version = f.read().decode(errors="replace")
    key = hashlib.sha256(json.dumps([FORMAT, command, texts, version, torch_version, VARIANTS],
                                    sort_keys=True).encode()).hexdigest()[:16]
    root = root or default_root()
    directory = os.path.join(root, key)
    if os.path.isfile(os.path.join(directory, READY)):
        return directory, ""
    os.makedirs(root, mode=0o700, exist_ok=True)
    with open(os.path.join(root, key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(directory, READY)):
            return directory, ""   # another Evaluator built it meanwhile
        why = _build(directory, command, texts, timeout_s)
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
    import tempfile
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


def _build(directory: str, command: list[str], texts: dict[str, str], timeout_s: float) -> str:
    """Write the headers into `directory` and precompile them; "" on success, else why not (then removed)."""
    import shutil
    shutil.rmtree(directory, ignore_errors=True)   # a build that died half way
    for name, text in texts.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    header = os.path.join(directory, "torch", "extension.h")
    os.makedirs(header + ".gch", mode=0o755)

    def precompile(variant: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "-I", directory, *VARIANTS[variant], "-x", "c++-header", header, "-o",
                               os.path.join(header + ".gch", variant)],
                              capture_output=True, text=True, timeout=timeout_s)
    try:
        with ThreadPoolExecutor(len(VARIANTS)) as pool:
            runs = list(pool.map(precompile, VARIANTS))
    except subprocess.TimeoutExpired:
        runs = None
    failed = "timed out" if runs is None else next((r.stderr.strip()[-300:] or "failed" for r in runs
                                                    if r.returncode), "")
    if not failed:
        # What the header includes, as an #include in cpp_sources would name it: such an include adds nothing.
        deps = subprocess.run([*command, "-I", directory, "-M", "-x", "c++", header], capture_output=True, text=True)
        failed = "" if deps.returncode == 0 else deps.stderr.strip()[-300:] or "listing its includes failed"
        dirs = [directory] + [command[i + 1] for i, a in enumerate(command[:-1]) if a == "-I"]
        names = {os.path.relpath(path, d) for path in deps.stdout.replace("\\\n", " ").split()[1:] for d in dirs
                 if path.startswith(d.rstrip("/") + "/")} | {"torch/extension.h"}
        with open(os.path.join(directory, INCLUDED), "w") as f:
            f.write("".join(f"{name}\n" for name in sorted(names)))
    if failed:
        shutil.rmtree(directory, ignore_errors=True)
        return f"precompiling failed: {failed}"
    with open(os.path.join(directory, READY), "w") as f:
        f.write(json.dumps(command) + "\n")
    return ""
