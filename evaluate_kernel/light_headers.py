"""Light headers: what a candidate's .cu file includes from torch, cut down to what it can use.

load_inline starts every .cu file with ``#include <torch/types.h>``, and candidates add
``<torch/extension.h>``. Parsing those headers is most of a build: nvcc parses them three times (the
host front end cudafe++, the device front end cicc, then the host compiler on cudafe++'s output). This
module writes a directory that goes first on the .cu file's include path and replaces three headers:

* ``torch/extension.h`` and ``torch/torch.h`` include only ``torch/types.h``. The rest (the C++ frontend's
  nn/optim/data/serialize and the pybind11 bindings) belongs in main.cpp, not in a kernel file.
* ``torch/types.h`` is torch's own, less its autograd and operator-library includes (``lean_types``), so
  ``torch::empty`` and the other factories become the ``at::`` ones they wrap. They differ only in
  ``requires_grad`` and in ``torch::tensor``'s dtype, so a source naming either keeps torch's file
  (``needs_torch_types``).
* ``ATen/Functions.h`` and ``ATen/NativeFunctions.h`` keep the include of every operator the translation
  unit names and drop the others (of about 1,340). ``names_of`` reads the candidate's own text (every
  identifier) and the torch headers it reaches (every name written after ``at::`` or ``torch::``), and
  adds the operators those operators' headers name.

* ``thrust/complex.h``, which c10's complex type includes in a .cu file for its conversions to and from
  thrust's and for its device math, is replaced by declarations alone when the source never writes
  "complex" or "thrust" (in any case) and no other torch header it reaches uses thrust: every name the
  complex headers use from it is declared, as an incomplete class template or a deleted function, so
  the headers parse and any use of them fails to compile. It and the parts of CUDA's C++ library it pulls in were about a fifth of each front end's time
  on an H200 machine.

A name's header declares all of that name's overloads. A call therefore resolves as it would with
torch's headers, or fails to compile. It cannot silently pick another function. A name the text does not
hold (pasted by a macro, or put in by a -D flag) could, so a source with ``##`` or such a flag keeps
torch's headers (``names_can_hide``). What stays possible is a source that tests what the left-out headers
define (an #ifdef on one of their macros, or a template probing for a declaration): it can tell the light
build from torch's, as any candidate can tell the evaluator's processes from others (DESIGN.md, "Who is
trusted"). The evaluator builds
with the real headers when a light build fails. On an H200 machine a candidate's .cu file compiled in
15.6 s instead of 50.1 s (each nvcc phase to about a third); BENCHMARKS.md has the figures. Standard
library only.
"""
from __future__ import annotations

import os
import re

LIGHT_EXTENSION_H = """// Written by pacevolve (light_headers.py): a kernel file needs tensors, ATen and the dispatch macros,
// not the C++ frontend or the Python bindings, which only main.cpp uses.
#pragma once
#include <torch/types.h>
"""

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
QUALIFIED = re.compile(r"\b(?:at|torch)((?:\s*::\s*\w+)+)")  # at::x, torch::y::z, at :: w
OPERATOR_INCLUDE = r"#include <ATen/ops/(\w+){suffix}\.h>\n"
ALL_OPERATORS = {"ATen/Functions.h": "", "ATen/NativeFunctions.h": "_native"}  # header -> per-op suffix
# What makes torch::x differ from at::x: autograd and torch::tensor's own dtype rule. The others are
# here because a source naming them would only fail with the lean header and pay for a second build.
NEEDS_TORCH_TYPES = re.compile(r"requires_grad|autograd|\btensor\s*\(|TORCH_LIBRARY|\bLibrary\b")
# Flags known not to put names, code or headers into a translation unit, nor to change what a precompiled
# header's declarations mean (layout flags such as -fshort-enums pass GCC's check of one): an allow-list,
# since compilers take the same thing under many spellings (-D, --define-macro, -Wp,-D, @file, -Xcompiler).
HOST_FLAG = re.compile(r"-(?:O[0-3s]?|Ofast|g[0-3]?|w|W(?:all|extra|pedantic|no-[\w-]+)|march=native|"
                       r"mtune=native|fopenmp|ffast-math|funroll-loops|fno-strict-aliasing|fno-math-errno|"
                       r"pthread|std=(?:c|gnu)\+\+\d\d)")
CUDA_FLAG = re.compile(r"-(?:O[0-3]|-?use_fast_math|lineinfo|-generate-line-info|g|G|w|-?restrict|"
                       r"-expt-relaxed-constexpr|-expt-extended-lambda|-?std=c\+\+\d\d|-?maxrregcount=\d+|"
                       r"-?(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)|res-usage|-resource-usage|"
                       r"-extra-device-vectorization|arch=(?:sm|compute)_\d+a?|"
                       r"(?:Xptxas|-ptxas-options)=[\w,=.+-]+)")
CUDA_PAIR = {"-Xptxas": re.compile(r"[\w,=.+-]+"), "--ptxas-options": re.compile(r"[\w,=.+-]+"),
             "-gencode": re.compile(r"arch=compute_\d+a?,code=(?:sm|compute)_\d+a?"),
             "-Xcompiler": None, "--compiler-options": None}   # None: host flags, comma-separated
# Environment a compiler reads for include paths or extra flags.
COMPILER_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "NVCC_PREPEND_FLAGS",
                "NVCC_APPEND_FLAGS", "GCC_EXEC_PREFIX", "COMPILER_PATH")
NAMES_COMPLEX = re.compile(r"complex|thrust", re.I)  # a source naming these keeps thrust/complex.h
THRUST_NAME = re.compile(r"\bthrust\s*::\s*(\w+)(\s*<)?")
THRUST_USE = re.compile(r"\bthrust\s*::|^[ \t]*#[ \t]*include[ \t]*[<\"]thrust/", re.M)


def torch_include_dirs() -> list[str]:
    """Where torch's headers are, in the order torch's own builds search them."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    root = os.path.join(os.path.dirname(spec.origin), "include") if spec and spec.origin else ""
    return [root, os.path.join(root, "torch", "csrc", "api", "include")] if root else []


def needs_torch_types(source: str) -> bool:
    return bool(NEEDS_TORCH_TYPES.search(source))


def names_can_hide(source: str, flags: list[str], env: dict | None = None) -> bool:
    """Whether the translation unit may hold a name its text does not: pasted by a macro (##, or its
    digraph and trigraph spellings), read from a file of the candidate's (a quoted #include), or put in by a
    flag or the environment (any flag off the allow-list, an include path). The scan reads names from the
    text, so such a source keeps torch's headers."""
    return bool(re.search(r"##|%:|\?\?=|^[ \t]*#[ \t]*include[ \t]*\"", source, re.M)) \
        or not cuda_flags_allowed(flags) or compiler_env_set(os.environ if env is None else env)


def host_flags_allowed(flags: list[str]) -> bool:
    return all(HOST_FLAG.fullmatch(str(flag)) or not str(flag).strip() for flag in flags)   # [""]: nothing


def cuda_flags_allowed(flags: list[str]) -> bool:
    flags, i = [str(f) for f in flags], 0
    while i < len(flags):
        flag = flags[i]
        if flag in CUDA_PAIR and i + 1 < len(flags):
            value, rule = flags[i + 1], CUDA_PAIR[flag]
            if not (rule.fullmatch(value) if rule else host_flags_allowed(value.split(","))):
                return False
            i += 2
            continue
        value = flag.split("=", 1)[1] if flag.startswith(("-Xcompiler=", "--compiler-options=")) else None
        if not (CUDA_FLAG.fullmatch(flag) or not flag.strip()
                or (value is not None and host_flags_allowed(value.split(",")))):
            return False
        i += 1
    return True


def compiler_env_set(env) -> bool:
    return any(env.get(name) for name in COMPILER_ENV)


def lean_types(types_h: str) -> str:
    """torch/types.h without autograd (variable.h, the variable factories) and the operator library."""
    return re.sub(r"^[ \t]*#[ \t]*include[ \t]*<torch/(?:csrc/autograd/[\w/]+|library)\.h>[^\n]*\n", "",
                  types_h, flags=re.M)


def only_operators(all_operators_h: str, names: set[str], suffix: str = "") -> str:
    """ATen/Functions.h (or NativeFunctions.h, suffix "_native") including only the given operators."""
    kept = re.sub(OPERATOR_INCLUDE.format(suffix=suffix),
                  lambda m: m.group(0) if m.group(1) in names else "", all_operators_h)
    return f"// Written by pacevolve (light_headers.py): {len(names)} operators named by the source.\n" + kept


def qualified_names(text: str) -> set[str]:
    """Every name in an at::/torch:: chain, except at::_ops::<op> (declared where it is used)."""
    names: set[str] = set()
    for chain in QUALIFIED.findall(text):
        parts = IDENTIFIER.findall(chain)
        if parts[0] != "_ops":
            names.update(parts)
    return names


def names_of(source: str, search_dirs: list[str], replaced: dict[str, str], operators: set[str],
             torch_dirs: list[str], reached: dict[str, str] | None = None) -> set[str]:
    """The operators a translation unit can name: source + the headers it reaches, to a fixed point.

    `replaced` maps an include name to the text the compiler will read instead of torch's. Files outside
    `torch_dirs` are the candidate's: every identifier in them counts. An include that does not resolve
    (system, CUDA) names no operator. `reached`, if given, receives the text of every header found.
    """
    chosen = set(IDENTIFIER.findall(source)) & operators
    pending = INCLUDE.findall(source) + [f"ATen/ops/{n}.h" for n in chosen]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        text, own = _text_of(name, search_dirs, replaced, torch_dirs)
        if text is None:
            continue
        if reached is not None:
            reached[name] = text
        new = ((set(IDENTIFIER.findall(text)) if own else qualified_names(text)) & operators) - chosen
        chosen |= new
        pending += INCLUDE.findall(text) + [f"ATen/ops/{n}.h" for n in new]
    return chosen


def _text_of(name: str, search_dirs: list[str], replaced: dict[str, str],
             torch_dirs: list[str]) -> tuple[str | None, bool]:
    """(text, written by the candidate) of an include as the compiler would find it."""
    if name in replaced:
        return replaced[name], False
    for d in search_dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                text = f.read()
            return text, not any(os.path.abspath(path).startswith(os.path.abspath(t) + os.sep) for t in torch_dirs)
    return None, False


def write(out_dir: str, source: str, extra_include_dirs: list[str] | None = None,
          torch_dirs: list[str] | None = None) -> dict:
    """Write the light headers for one .cu source into out_dir; returns what was written.

    `source` is the whole file as load_inline writes it. The include path to use is out_dir first.
    """
    torch_dirs = torch_dirs if torch_dirs is not None else torch_include_dirs()

    def torch_s(name: str) -> str | None:
        return _text_of(name, torch_dirs, {}, torch_dirs)[0]

    replaced = {"torch/extension.h": LIGHT_EXTENSION_H, "torch/torch.h": LIGHT_EXTENSION_H}
    reached: dict[str, str] = {}
    types_h = torch_s("torch/types.h")
    lean = types_h is not None and not needs_torch_types(source)
    if lean:
        replaced["torch/types.h"] = lean_types(types_h)
    everything = {h: torch_s(h) for h in ALL_OPERATORS}
    operators = set(re.findall(OPERATOR_INCLUDE.format(suffix=""), everything["ATen/Functions.h"] or ""))
    names: set[str] = set()
    if operators:  # else this torch has no per-operator headers: its Functions.h stays as it is
        search = list(extra_include_dirs or []) + torch_dirs
        # The all-operator headers count for their own code only: their operator includes are being chosen.
        bodies = {h: only_operators(text, set(), suffix) for h, suffix in ALL_OPERATORS.items()
                  if (text := everything[h]) is not None}
        names = names_of(source, search, {**replaced, **bodies}, operators, torch_dirs, reached)
        for header, suffix in ALL_OPERATORS.items():
            if everything[header] is not None:
                replaced[header] = only_operators(everything[header], names, suffix)
    # The candidate's own header directories are not searched for the words: with any, thrust stays. So
    # it does when a torch header beyond c10's complex type uses thrust (ATen/native's pair and tuple):
    # its own thrust headers would meet the declarations.
    complex_family = {name: text for name, text in reached.items() if "complex" in os.path.basename(name)}
    elsewhere = any(THRUST_USE.search(text) for name, text in reached.items() if name not in complex_family)
    declare = not extra_include_dirs and not NAMES_COMPLEX.search(source) and not elsewhere
    stub = thrust_declarations(complex_family.values()) if declare else None
    if stub is not None:
        replaced["thrust/complex.h"] = stub
    for name, text in replaced.items():
        _write_text(os.path.join(out_dir, name), text)
    return {"lean_types": lean, "operators": len(names) if operators else None, "of": len(operators),
            "thrust": "declared" if stub is not None else "kept"}


def thrust_declarations(texts) -> str | None:
    """thrust/complex.h as declarations only of what the given headers name in thrust:: (None if nothing):
    an incomplete class template for a name followed by <, a deleted function template for the others.
    Qualified calls and casts in torch's templates then parse, and any instantiation of them fails."""
    classes: set[str] = set()
    functions: set[str] = set()
    for text in texts:
        for name, angle in THRUST_NAME.findall(text):
            (classes if angle else functions).add(name)
    if not classes | functions:
        return None
    lines = ["// Written by pacevolve (light_headers.py): the source names no complex number, so thrust's",
             "// complex type is declared and never defined; using it fails to compile.", "#pragma once",
             "namespace thrust {"]
    lines += [f"template <typename... T> struct {n};" for n in sorted(classes)]
    lines += [f"template <typename... A> void {n}(A&&...) = delete;" for n in sorted(functions - classes)]
    return "\n".join(lines + ["}  // namespace thrust", ""])


def _write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # a concurrent reader never sees half a header
