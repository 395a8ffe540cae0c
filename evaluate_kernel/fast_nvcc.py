"""A drop-in nvcc that runs the host and device front ends side by side.

For one .cu file nvcc runs seven steps one after another (see ``nvcc --dryrun``):

    host:    preprocess -> cudafe++ (parses the file, writes the host code and a module id)
    device:  preprocess -> cicc (parses the file again, reads the module id, writes PTX and a stub) -> ptxas -> fatbinary
    final:   the host compiler on cudafe++'s output, which includes the stub and the fatbinary

The two front ends each parse every header the file includes; for a PyTorch extension that is most of
the build. They depend on each other only through the module id file, so this program writes that file
itself and runs the two chains at once: the build costs max(host, device) + final instead of the sum.
The commands are nvcc's own, taken from ``nvcc --dryrun`` with the same arguments, so flags, include
paths and tool versions are exactly nvcc's. A dependency file asked for with the compile (``-MD -MF f``,
which torch's build.ninja always asks for) is listed by the two preprocessing steps as they run, and
merged as nvcc merges them (else a third, preprocess-only nvcc run writes it, beside the two chains).
Anything this program does not recognise (device linking, other dependency options, several
files, a missing tool) goes to the real nvcc unchanged.

Errors read as nvcc's would: if the host chain fails, its output is what is shown (nvcc stops there too);
a failure of the device chain alone (a device-only error) shows the device output.

The final step parses the same headers a third time. With ``--prefixes STORE``, where the store holds
a precompiled header made from exactly the headers' part of cudafe++'s output and the final step's
arguments (``split_prefix``; prefixes.py keeps the store), the final step reads that part precompiled
and parses only the file's own code, to the same object file; else, with ``--prefix-requests DIR``, it
leaves the part and its arguments in DIR for whoever keeps the store.

Use it for any torch extension build with ``PYTORCH_NVCC="python3 fast_nvcc.py"`` (torch puts that
value in build.ninja); the evaluator uses it by default (``Evaluator(..., fast_nvcc=False)`` turns it off).
On an H200 machine it compiled a candidate's .cu in 38.0 s instead of nvcc's 50.1 s with torch's headers, and
in 11.0 s instead of 15.6 s with light_headers.py's; BENCHMARKS.md has the whole builds. Standard library only.

    python3 fast_nvcc.py [--nvcc PATH] [--prefixes STORE] [--prefix-requests DIR] <nvcc arguments>
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

# nvcc flags after which this program steps aside: they change the pipeline's shape (device linking,
# dependency files other than -MD/-MMD with -MF, several outputs) or ask nvcc itself to parallelise.
_PASS_THROUGH = re.compile(r"^(-dc|-rdc|--relocatable-device-code|--device-c|-dlink|--device-link|-lib|-M\w*|"
                           r"--generate-dependencies\S*|--dependency-output|-t|--threads|-E|--preprocess|-ptx|"
                           r"-cubin|-fatbin|--dryrun|--keep|--version|-V|--help|-h|--list-gpu-\w+|-odir)(=.*)?$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Plan:
    """nvcc's steps for one .cu file, split into the two chains that may run at once and the final step."""
    env: dict[str, str]
    host: list[str] = field(default_factory=list)  # preprocess, cudafe++
    device: list[str] = field(default_factory=list)  # preprocess, cicc, ptxas, fatbinary
    final: list[str] = field(default_factory=list)  # host compile of cudafe++'s output
    module_id_file: str = ""


def _tool(command: str) -> str:
    """The program a dryrun line runs: 'cicc' for '"$CICC_PATH/cicc" ...'."""
    first = shlex.split(command)[0] if command.strip() else ""
    return os.path.basename(first)


def plan_from_dryrun(text: str, base_env: dict[str, str]) -> Plan | None:
    """Parse ``nvcc --dryrun`` output into a Plan, or None when its shape is not the one described above."""
    env, commands = dict(base_env), []
    for line in text.splitlines():
        if not line.startswith("#$ "):
            continue
        line = line[3:].strip()
        if _ASSIGNMENT.match(line) and " " not in line.split("=", 1)[0]:
            name, value = line.split("=", 1)
            words = shlex.split(value) if value.strip() else [""]
            if len(words) == 1:  # the multi-word ones (INCLUDES=...) are already spelled out in the commands
                env[name] = os.path.expandvars(words[0]) if "$" in words[0] else words[0]
            continue
        if _tool(line) != "rm":  # nvcc's clean-up of its temp files; the scratch directory goes as a whole
            commands.append(line)
    tools = [_tool(c) for c in commands]
    if tools.count("cudafe++") != 1 or "cicc" not in tools or "nvlink" in tools:
        return None
    split = tools.index("cudafe++") + 1
    plan = Plan(env=env, host=commands[:split], device=commands[split:-1], final=commands[-1:])
    if [_tool(c) for c in plan.device].count("cudafe++") or "-c" not in shlex.split(plan.final[0]) or \
            _tool(plan.final[0]) in ("cicc", "ptxas", "fatbinary"):
        return None
    host_front = plan.host[-1]
    ids = {m.group(1) for c in (host_front, *plan.device) for m in re.finditer(r'--module_id_file_name "([^"]+)"', c)}
    if "--gen_module_id_file" not in host_front or len(ids) != 1:
        return None
    plan.module_id_file = ids.pop()
    # cudafe++ would write the module id and cicc read it; written here, both only read it.
    plan.host[-1] = host_front.replace("--gen_module_id_file", "", 1)
    return plan


def _module_id(source: str) -> str:
    # Any string unique to this compilation works; nvcc's own are shaped like this one.
    stem = re.sub(r"\W", "_", os.path.basename(source))
    return f"_{secrets.token_hex(4)}_{len(stem)}_{stem}"


class _Chain(threading.Thread):
    """Runs commands one after another; stops at the first failure; keeps their stdout and stderr."""

    def __init__(self, commands: list[str], env: dict[str, str]):
        super().__init__(daemon=True)
        self.commands, self.env = commands, env
        self.out, self.err, self.returncode = b"", b"", 0
        self._lock, self._proc, self._stopped = threading.Lock(), None, False

    def run(self) -> None:
        for command in self.commands:
            with self._lock:
                if self._stopped:
                    self.returncode = self.returncode or 1
                    return
                # exec: the shell (needed for "$CICC_PATH/cicc") becomes the tool, so killing it kills the tool.
                proc = self._proc = subprocess.Popen(["/bin/sh", "-c", "exec " + command], env=self.env,
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = proc.communicate()
            self.out, self.err = self.out + out, self.err + err
            if proc.returncode != 0:
                self.returncode = proc.returncode
                return

    def show(self) -> None:
        sys.stdout.buffer.write(self.out)
        sys.stdout.flush()
        sys.stderr.buffer.write(self.err)
        sys.stderr.flush()

    def stop(self) -> None:
        """Kill the running step and start no other."""
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()


_WITH_DEPS = {"-MD": "-M", "--generate-dependencies-with-compile": "-M",
              "-MMD": "-MM", "--generate-nonsystem-dependencies-with-compile": "-MM"}


def split_dependencies(args: list[str]) -> tuple[list[str], list[str] | None]:
    """(the compile's own arguments, nvcc arguments that write the same dependency file), or (args, None).

    ``nvcc -MD -MF f -c x.cu -o x.o`` writes f as ``nvcc -M -MT x.o -c x.cu -o f`` would (the rule's target
    is the -o path as written, unless -MT names one), so that run can go beside the compile.
    """
    rest, mode, depfile, target, i = [], None, None, None, 0
    while i < len(args):
        a = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        if a in _WITH_DEPS:
            if mode not in (None, _WITH_DEPS[a]):
                return args, None  # -MD and -MMD together: nvcc's call
            mode = _WITH_DEPS[a]
        elif a in ("-MF", "--dependency-output") and value is not None:
            depfile, i = value, i + 1
        elif a in ("-MT", "--dependency-target-name") and value is not None:
            target, i = value, i + 1
        else:
            rest.append(a)
        i += 1
    if mode is None and depfile is None and target is None:
        return args, None
    outputs = [rest[k + 1] for k, a in enumerate(rest[:-1]) if a in ("-o", "--output-file")]
    if mode is None or depfile is None or len(outputs) != 1:
        return args, None  # nvcc's own defaults for these cases are left to nvcc
    compile_only = [a for a in rest if a not in ("-c", "--compile")]
    k = max(k for k, a in enumerate(compile_only) if a in ("-o", "--output-file"))
    deps = [mode, "-MT", target or outputs[0], *compile_only[:k], *compile_only[k + 2:], "-o", depfile]
    return rest, deps


def _listing_dependencies(plan: Plan, dep_args: list[str], scratch: str) -> list[str] | None:
    """Ask the host's and the device's preprocessing (gcc -E, the first step of each chain) to list the
    files they read (-MD, or -MMD for -MM); returns the lists' paths, device first, or None when the plan
    is not that shape. nvcc -M runs the same two preprocessings and merges their lists in that order, so
    the merged file lists nvcc's files in nvcc's order without running them twice: byte for byte nvcc's
    own for ordinary names (tested against the real nvcc); a name holding $, # or a backslash keeps gcc's
    escapes, which ninja reads, where nvcc writes it raw."""
    mode, target = dep_args[0], dep_args[2]
    steps = [plan.host[0] if plan.host else "", *[c for c in plan.device if "-E" in shlex.split(c)]]
    if len(steps) != 2 or "-E" not in shlex.split(steps[0]) or plan.device[0] != steps[1]:
        return None
    flag = "-MD" if mode == "-M" else "-MMD"
    lists = [os.path.join(scratch, "device.d"), os.path.join(scratch, "host.d")]
    plan.device[0] += f" {flag} -MF {shlex.quote(lists[0])} -MT {shlex.quote(target)}"
    plan.host[0] += f" {flag} -MF {shlex.quote(lists[1])} -MT {shlex.quote(target)}"
    return lists


def _write_dependencies(path: str, target: str, lists: list[str]) -> None:
    """nvcc's dependency file from gcc's lists: one rule, each file once, in the order first read."""
    files: dict[str, None] = {}
    for name in lists:
        with open(name) as f:
            text = f.read().replace("\\\n", " ")
        # the rule's target is written as given (-MT), whatever it holds; a space inside a name is written
        # as a backslash and the space: names are kept as gcc wrote them
        rest = text[len(target) + 1:] if text.startswith(target + ":") else text.partition(": ")[2]
        files.update(dict.fromkeys(re.findall(r"(?:\\.|[^\s\\])+", rest)))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{target} : " + " \\\n    ".join(files) + "\n")
    os.replace(tmp, path)


def _cancel(*chains: _Chain) -> None:
    for chain in chains:
        chain.stop()
        chain.join()


# ---------------------------------------------------------------- the final step's precompiled prefix
# cudafe++'s output is the preprocessed headers, then the file's own code; for two candidates with the same
# includes and flags the headers' part is the same text but for the build directory's name in its line
# markers. GCC can take that part from a precompiled header (#include "prefix.h" first), which saves most of
# the final step's parse; the store of such headers is made by a process that trusts nothing a build wrote
# but the text it compiles, and a build uses an entry only when its own part is that text exactly.
MIN_PREFIX = 1 << 20      # bytes; below this a precompiled prefix saves too little for its 200 MB
BUILD = "@BUILD@"         # the build directory's place in a normalised prefix and argument list
READY = "READY"           # the store entry's last file
_FIRST = re.compile(r'# 1 "([^"\\\n]+)/([^"\\/\n]+)"\n')
_MARKER = re.compile(r'^# \d+ "[^\n]*$', re.M)


@dataclass
class Prefix:
    """The final step's input cut in two: `text` (normalised) and `rest`, with the key naming them."""
    key: str
    arguments: list[str]   # the final command without its input and output, normalised
    text: str
    rest: str
    source: str            # the input file (cudafe++'s output)


def split_prefix(final: str, module_id: str = "") -> Prefix | None:
    """The final command's input cut before the first line after the first that puts the main file in a
    line marker (where the file's own code starts, or code between its includes), the part before it
    normalised; None when the command or the text is not that shape, the part is small, or it holds this
    compile's module id (cudafe++ names a header's anonymous namespaces after it: no other compile has
    that text, so an entry for it would never serve)."""
    if "$" in final or "`" in final:
        return None
    argv = shlex.split(final)
    inputs = [a for a in argv if a.endswith(".cudafe1.cpp")]
    if len(inputs) != 1 or argv.count("-o") != 1:
        return None
    try:
        with open(inputs[0], encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    first = _FIRST.match(text)
    if first is None:
        return None
    directory = first.group(1)
    main = f"{directory}/{first.group(2)}"
    cut = re.compile(r'^# \d+ "%s"' % re.escape(main), re.M).search(text, first.end())
    if cut is None or cut.start() < MIN_PREFIX:
        return None
    if module_id and module_id in text[:cut.start()] or not _pragmas_keep(text[:cut.start()]):
        return None
    normal = _MARKER.sub(lambda m: m.group(0).replace(f'"{directory}/', f'"{BUILD}/', 1), text[:cut.start()])
    k = argv.index("-o")
    arguments = [a.replace(directory + "/", BUILD + "/") for a in argv[:k] + argv[k + 2:] if a != inputs[0]]
    return Prefix(prefix_key(arguments, normal), arguments, normal, text[cut.start():], inputs[0])


def _pragmas_keep(text: str) -> bool:
    """Whether GCC compiles what follows `text` alike from its text and from it precompiled. GCC 12 drops
    some pragmas' state at a precompiled header's end (pack, visibility; a struct after it had another
    size): only diagnostics, which change no code, and visibility pushed and popped within may appear."""
    depth = 0
    for m in re.finditer(r"^[ \t]*#[ \t]*pragma\b[ \t]*(.*)$", text, re.M):
        words = m.group(1).replace("(", " ").split()
        if words[:2] == ["GCC", "diagnostic"]:
            continue
        if words[:3] not in (["GCC", "visibility", "push"], ["GCC", "visibility", "pop"]):
            return False
        depth += 1 if words[2] == "push" else -1
        if depth < 0:
            return False
    return depth == 0


def prefix_key(arguments: list[str], text: str) -> str:
    """The store's name for a prefix compiled with these arguments (the builder's and the store's alike)."""
    return hashlib.sha256(json.dumps(arguments).encode() + b"\n" + text.encode()).hexdigest()[:40]


def _final(plan: Plan, prefixes: str, requests: str) -> int:
    """nvcc's last step, with the headers' part of its input from the store where it has that part."""
    final = plan.final[0]
    try:
        with open(plan.module_id_file) as f:
            module_id = f.read().strip()
    except OSError:
        module_id = ""
    prefix = split_prefix(final, module_id) if prefixes or requests else None
    entry = os.path.join(prefixes, prefix.key) if prefix and prefixes else ""
    if entry and os.path.exists(os.path.join(entry, READY)) and '"' not in entry and "\n" not in entry:
        # In the input's place, under its name (the object names a function after it), the whole kept aside.
        whole = prefix.source + ".whole"
        os.rename(prefix.source, whole)
        with open(prefix.source, "w", encoding="utf-8", newline="") as f:
            f.write(f'#include "{entry}/prefix.h"\n' + prefix.rest)
        quick = _Chain(plan.final, plan.env)
        quick.run()
        if quick.returncode == 0:
            _note(requests, f"used-{prefix.key}")
            quick.show()
            return 0
        # A compile that fails with the stored part is compiled as nvcc would: its own messages count.
        _note(requests, f"failed-{prefix.key}")
        os.replace(whole, prefix.source)
    elif prefix and requests:
        _request(requests, prefix)
    plain = _Chain(plan.final, plan.env)
    plain.run()
    plain.show()
    return plain.returncode


def _note(requests: str, name: str) -> None:
    if requests:
        try:
            os.makedirs(requests, exist_ok=True)
            open(os.path.join(requests, name), "w").close()
        except OSError:
            pass


def _request(requests: str, prefix: Prefix) -> None:
    """Ask for this prefix: its text and arguments in requests/<key>, written aside and renamed."""
    try:
        os.makedirs(requests, exist_ok=True)
        if os.path.exists(os.path.join(requests, prefix.key)):
            return
        aside = tempfile.mkdtemp(prefix=".request-", dir=requests)
        with open(os.path.join(aside, "prefix.h"), "w", encoding="utf-8", newline="") as f:
            f.write(prefix.text)
        with open(os.path.join(aside, "arguments.json"), "w") as f:
            json.dump(prefix.arguments, f)
        os.rename(aside, os.path.join(requests, prefix.key))
    except OSError:
        pass   # no request: this build compiled as it would have


def run(args: list[str], nvcc: str, prefixes: str = "", requests: str = "") -> int:
    """Compile like ``nvcc args``; returns the exit status. The tools' stdout and stderr pass through.
    prefixes: a store of precompiled prefixes for the final step (read only); requests: where to ask for
    this compile's prefix when the store has none."""
    compile_args, dep_args = split_dependencies(args)
    sources = [a for a in compile_args if a.endswith((".cu", ".cuh"))]
    if len(sources) != 1 or "-c" not in compile_args or any(_PASS_THROUGH.match(a) for a in compile_args):
        return subprocess.call([nvcc, *args])
    args = compile_args
    scratch = tempfile.mkdtemp(prefix="fast_nvcc_")
    try:
        env = dict(os.environ, TMPDIR=scratch)  # nvcc names its intermediate files after TMPDIR
        dry = subprocess.run([nvcc, "--dryrun", *args], env=env, capture_output=True, text=True)
        plan = plan_from_dryrun(dry.stderr + dry.stdout, env) if dry.returncode == 0 else None
        if plan is None:
            return subprocess.call([nvcc, *args])
        with open(plan.module_id_file, "w") as f:
            f.write(_module_id(sources[0]))
        # The dependency file: listed by the two preprocessing steps as they run, else by nvcc's own
        # preprocess-only run beside them (no commands to run: an empty chain).
        lists = _listing_dependencies(plan, dep_args, scratch) if dep_args else None
        host, device = _Chain(plan.host, plan.env), _Chain(plan.device, plan.env)
        deps = _Chain([shlex.join([nvcc, *dep_args])] if dep_args and lists is None else [], env)
        for chain in (host, device, deps):
            chain.start()
        host.join()
        if host.returncode:
            _cancel(device, deps)  # nvcc would have stopped here; their errors would repeat the host's
            host.show()
            return host.returncode
        device.join()
        host.show()
        device.show()
        if device.returncode:
            _cancel(deps)
            return device.returncode
        deps.join()
        if deps.returncode:
            deps.show()
            return deps.returncode
        if lists is not None:
            _write_dependencies(dep_args[-1], dep_args[2], lists)
        return _final(plan, prefixes, requests)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> int:
    nvcc, options = shutil.which("nvcc") or "nvcc", {}
    while argv[:1] and argv[0] in ("--nvcc", "--prefixes", "--prefix-requests") and len(argv) > 1:
        options[argv[0]], argv = argv[1], argv[2:]
    return run(argv, options.get("--nvcc", nvcc), options.get("--prefixes", ""), options.get("--prefix-requests", ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
