"""The store of precompiled prefixes for nvcc's final step (fast_nvcc.py), kept by the parent.

A new candidate's build ends with the host compiler parsing cudafe++'s output: the headers the .cu file
includes (torch's lean types, CUDA's runtime; 6.6 MB and 222,000 lines for a typical candidate), then its
own code. For candidates with the same includes and flags that headers' part is the same text, so fast_nvcc
compiles it from a precompiled header when the store has one for exactly that text and those arguments,
and otherwise leaves a request in its builder's home. The flow, after a builder is dead:

    request = prefixes.read_request(requests, key, roots, compilers)   # text and arguments, checked
    command = prefixes.precompile_command(request, header, out)  # run in a confined worker (builds.py)
    prefixes.publish(store, request, out)                  # one rename: text, precompiled form, READY

What it guarantees:
* An entry holds GCC's compile of the text its name is the hash of (with its arguments), and nothing else:
  the builder that asked is candidate code, so its request is only text and a list of arguments; the key
  is computed here, the text in the entry is our own copy, and the compile runs in a worker of ours that
  runs no candidate code, confined as builders are (what it reads, a builder could read), with arguments
  from an allow-list (a host compiler we name, no plugin, wrapper, specs or file of options, include
  directories of torch, CUDA and Python only), one request a build, bounded in CPU time and memory
  (TIMEOUT_S, MAX_MEMORY: the text can be slow to compile on purpose). A build uses an entry only when its
  own text and arguments hash to its name (fast_nvcc.split_prefix), so what it compiles is what it would
  have compiled.
* GCC itself refuses a precompiled form made by another compiler or with incompatible options, and then
  parses the entry's text: slower, never different. A compile that fails with the entry is compiled again
  without it, and its own messages count.
* The store is bounded (MAX_ENTRIES, the least recently used go first), read-only to builders, and an
  entry appears in one rename, so no build reads one half-written.

Left open: a compiler bug that a crafted text could exploit inside the confined worker would let that
text's author choose what an entry holds for the same text; candidates with the same text would then
compile to that. A candidate can have one entry of its choosing made per build, which pushes out an entry
no build used in the last MAX_ENTRIES publications: later builds are slower, never different. Standard
library only.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

from .fast_nvcc import BUILD, MIN_PREFIX, READY, prefix_key
from .sandbox import read_plain, remove_all

MAX_ENTRIES = 6               # about 230 MB each
MAX_TEXT = 64 << 20           # a request's text, at most
MAX_GCH = 1 << 30             # a precompiled form, at most
# A request's compile, at most: its text is candidate code's choice (a constant that takes GCC seconds a
# line held two compilers for the build timeout's 600 s after the verdict). Real ones: 8-11 s, under 1 GB.
TIMEOUT_S, MAX_MEMORY = 60, 4 << 30
HEADER, GCH = "prefix.h", "prefix.h.gch"
COMPILERS = ("gcc", "g++", "c++", "cc")
# Options of nvcc's final step that change nothing but the compile itself: no file read or program run.
_PLAIN = re.compile(r"^(?:-c|-m64|-w|-pthread|-fPIC|-fpic|-fopenmp|-O[0-3sgz]?|-g[0-3]?|-std=(?:c|gnu)\+\+\w+|"
                    r"-W(?:no-)?[a-z][a-z0-9+=-]*|-f(?:no-)?[a-z][a-z0-9-]*|-fvisibility=(?:hidden|default)|"
                    r"-m(?:arch|tune)=[\w.-]+|-[DU][A-Za-z_]\w*(?:=[^\n]*)?)$")
_REFUSED = re.compile(r"^-(?:W[alp],|fplugin|fdump|fprofile|frecord|fsave|fcallgraph|fstack-usage|wrapper|B|specs)")


class Refused(ValueError):
    """A request that is not a prefix this store keeps."""


def read_request(requests: str, key: str, include_roots: list[str], compilers: list[str]) -> dict:
    """requests/<key> as {"key", "text", "arguments"}; raises Refused with the reason. include_roots: the
    trees an entry may read headers from (torch's, CUDA's, Python's); compilers: host compilers by path."""
    if not re.fullmatch(r"[0-9a-f]{40}", key):
        raise Refused(f"not a request: {key[:60]!r}")
    where = os.path.join(requests, key)
    # The builder is dead and its home no one else's: a link found here now stays what it is.
    if os.path.realpath(where) != os.path.join(os.path.realpath(os.path.dirname(requests)),
                                               os.path.basename(requests), key):
        raise Refused("its directory is a link")
    text, arguments = (read_plain(os.path.join(where, name), limit + 1)
                       for name, limit in ((HEADER, MAX_TEXT), ("arguments.json", 1 << 20)))
    if text is None or arguments is None or len(text) > MAX_TEXT or len(arguments) > 1 << 20:
        raise Refused("its files are not plain files of a bounded size")
    try:
        text, arguments = text.decode("utf-8"), json.loads(arguments)
    except ValueError as e:
        raise Refused(f"unreadable: {e}") from None
    if not (isinstance(arguments, list) and 0 < len(arguments) < 400 and
            all(isinstance(a, str) and 0 < len(a) < 4096 and "\0" not in a for a in arguments)):
        raise Refused("its arguments are not a list of strings")
    if len(text) < MIN_PREFIX or not text.startswith(f'# 1 "{BUILD}/'):
        raise Refused("its text is not the headers' part of cudafe++'s output that fast_nvcc cuts")
    check_arguments(arguments, include_roots, compilers)
    if prefix_key(arguments, text) != key:
        raise Refused("its name is not the hash of its text and arguments")
    return {"key": key, "text": text, "arguments": arguments}


def check_arguments(arguments: list[str], include_roots: list[str], compilers: list[str]) -> None:
    """Raise Refused unless `arguments` is a host compile this store may run: see the module's docstring."""
    first, rest = arguments[0], arguments[1:]
    if first not in COMPILERS and os.path.realpath(first) not in {os.path.realpath(c) for c in compilers}:
        raise Refused(f"its compiler {first[:200]!r} is not one of ours")
    roots = [os.path.realpath(d).rstrip("/") + "/" for d in include_roots if d]
    i = 0
    while i < len(rest):
        a = rest[i]
        if _REFUSED.match(a):
            raise Refused(f"option {a[:100]!r}")
        if a in ("-isystem", "-I", "-x") and i + 1 < len(rest):
            value, i = rest[i + 1], i + 1
        elif a.startswith("-I") and len(a) > 2:
            a, value = "-I", a[2:]
        elif _PLAIN.match(a):
            i += 1
            continue
        else:
            raise Refused(f"option {a[:100]!r}")
        if a == "-x":
            if value != "c++":
                raise Refused(f"language {value[:40]!r}")
        elif not value.startswith(BUILD + "/") and \
                not any((os.path.realpath(value) + "/").startswith(root) for root in roots):
            raise Refused(f"include directory {value[:200]!r} is not torch's, CUDA's or Python's")
        i += 1


def precompile_command(request: dict, header: str, out: str) -> list[str]:
    """The compiler's command that precompiles `header` (the request's text) into `out`: the final step's
    own arguments, as a header; the build's own directories left out (the text names them only in its
    line markers; nothing in it is read from there)."""
    argv, kept, i = request["arguments"], [], 1
    while i < len(argv):
        a = argv[i]
        if a in ("-isystem", "-I") and i + 1 < len(argv):
            if not argv[i + 1].startswith(BUILD + "/"):
                kept += [a, argv[i + 1]]
            i += 2
            continue
        if a == "-x" and i + 1 < len(argv):
            i += 2
            continue
        if not (a == "-c" or a.startswith(f"-I{BUILD}/")):
            kept.append(a)
        i += 1
    return [argv[0], *kept, "-x", "c++-header", header, "-o", out]


def publish(store: str, request: dict, gch: str) -> str:
    """Put the entry in place: our copy of the text, the precompiled form (moved), READY; then the least
    recently used entries beyond MAX_ENTRIES go. Returns the entry's directory."""
    os.makedirs(store, exist_ok=True)
    final = os.path.join(store, request["key"])
    if os.path.exists(os.path.join(final, READY)):
        return final
    if not os.path.isfile(gch) or os.path.islink(gch) or os.path.getsize(gch) > MAX_GCH:
        raise Refused("the precompiled form is missing or too large")
    aside = tempfile.mkdtemp(prefix=".entry-", dir=store)
    with open(os.path.join(aside, HEADER), "w", encoding="utf-8", newline="") as f:
        f.write(request["text"])
    shutil.move(gch, os.path.join(aside, GCH))
    with open(os.path.join(aside, "arguments.json"), "w") as f:
        json.dump(request["arguments"], f)
    with open(os.path.join(aside, READY), "w") as f:
        f.write(f"{time.time():.0f}\n")
    for name in os.listdir(aside):
        os.chmod(os.path.join(aside, name), 0o444)
    os.chmod(aside, 0o555)
    try:
        os.rename(aside, final)
    except OSError:   # another Evaluator's entry got there first: the same compile of the same text
        remove_all(aside)
    _bound(store)
    return final


def touch(store: str, key: str) -> None:
    """Mark an entry as used now (a build said so: at worst a candidate keeps an entry longer)."""
    if re.fullmatch(r"[0-9a-f]{40}", key):
        try:
            os.utime(os.path.join(store, key, READY))
        except OSError:
            pass


def entries(store: str) -> list[str]:
    """The store's complete entries, least recently used first."""
    try:
        names = [n for n in os.listdir(store) if re.fullmatch(r"[0-9a-f]{40}", n)]
    except OSError:
        return []
    dated = []
    for n in names:
        try:
            dated.append((os.stat(os.path.join(store, n, READY)).st_mtime, n))
        except OSError:
            continue
    return [n for _, n in sorted(dated)]


def _bound(store: str) -> None:
    # A build reading an entry that goes keeps its open files (unlinked, still whole); a build that looks
    # for it after it went compiles without it.
    for name in entries(store)[:-MAX_ENTRIES]:
        remove_all(os.path.join(store, name))
    for name in os.listdir(store):   # what an interrupted publish left aside, after an hour
        path = os.path.join(store, name)
        if name.startswith(".entry-") and time.time() - os.lstat(path).st_mtime > 3600:
            remove_all(path)
