"""The background section of a kernel task's prompts: the device as measured, the KernelBench contract and
the evaluator's rules, written for the device the candidates actually run on.

    facts = prompt_background.device_facts(evaluator, device)      # gathered once: a plain dict
    text = prompt_background.kernel_background(facts, task.description)

`device_facts` reads the machine: for a GPU the evaluator's measured device info (name, SMs, memory,
bandwidth when measured, L2, compute capability); for the CPU the threads the evaluator times with, the
instruction sets in /proc/cpuinfo, the C++ compiler and the flags torch's load_inline compiles with.
`kernel_background` is pure (facts in, text out), so every wording is testable without the device.
"""
from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import tempfile

# Instruction-set extensions worth naming to a kernel writer, in the order they are listed.
CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl",
                "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd", "sve")


def kernel_background(facts: dict, task_description: str, tolerance: str = "about 1e-4 relative") -> str:
    """Returns the background: device, task, contract and rules, for a GPU or a CPU as `facts` says."""
    gpu = facts.get("kind") == "cuda"
    return BACKGROUND.format(
        target="GPU" if gpu else "CPU", device=describe_device(facts), task=task_description.strip(),
        custom=("Custom CUDA/C++ goes through `torch.utils.cpp_extension.load_inline` (give the extension a "
                "unique name); mixing custom kernels with PyTorch or cuDNN calls is allowed." if gpu else
                "Custom C++ goes through `torch.utils.cpp_extension.load_inline` (give the extension a unique "
                "name); mixing custom code with PyTorch calls is allowed."),
        where="already on the GPU" if gpu else "on the CPU",
        timing=("measured over batches of back-to-back calls, each on fresh inputs, by the host's clock until "
                "the GPU is idle again (work still running on any stream counts), alternating with the "
                "reference's batches; the score is the speedup over the reference" if gpu else
                f"the process's CPU time over batches of back-to-back calls, each on fresh inputs, alternating "
                f"with the reference's, with PyTorch limited to {_threads(facts)}: plan for single-threaded "
                f"code, extra threads gain nothing"),
        hidden=("extra threads or CUDA streams that hide work from the timer" if gpu else
                "extra threads or processes that hide work from the timer"),
        tolerance=tolerance)


def kernel_brief(facts: dict, task_description: str) -> str:
    """Returns the short background for prompts that plan rather than write code: device and task."""
    gpu = facts.get("kind") == "cuda"
    return (f"The program runs on this {'GPU' if gpu else 'CPU'}. {describe_device(facts)}\n\n"
            f"Task: {task_description.strip()}\n\nCandidates must keep full fp32 accuracy and do all their work "
            f"inside the timed call, on {'the default stream' if gpu else 'the calling thread'}; the score is the "
            f"measured runtime.")


def describe_device(facts: dict) -> str:
    """Returns the device paragraph of the background from the facts `device_facts` gathered."""
    if facts.get("kind") == "cuda":
        parts = [facts.get("name") or "an NVIDIA GPU"]
        if facts.get("capability"):
            parts.append("compute capability " + ".".join(map(str, facts["capability"])))
        if facts.get("sms"):
            parts.append(f"{facts['sms']} SMs")
        if facts.get("total_mem"):
            parts.append(f"{facts['total_mem'] / 2**30:.0f} GiB memory")
        if facts.get("mem_bw_bytes_per_s"):
            parts.append(f"{facts['mem_bw_bytes_per_s'] / 1e9:,.0f} GB/s memory bandwidth (measured)")
        if facts.get("l2_bytes"):
            parts.append(f"{facts['l2_bytes'] / 2**20:.0f} MiB L2 cache")
        return "GPU: " + ", ".join(parts) + "."
    cpu = facts.get("cpu") or facts.get("machine") or "a CPU"
    lines = [f"CPU: {cpu}; {_threads(facts)} used for timing"
             + (f" (the machine has {facts['cores']} cores)" if facts.get("cores") else "") + "."]
    if facts.get("isa") is not None:
        lines.append("Instruction sets: " + (", ".join(facts["isa"]) or "none of " + ", ".join(CPU_FEATURES[:5]))
                     + ".")
    if facts.get("compiler"):
        flags = facts.get("cflags")
        lines.append(f"Compiler: {facts['compiler']}. load_inline compiles C++ with `{flags}`"
                     + (" and no optimisation flag, so the compiler's default (-O0 for GCC) applies unless "
                        "you pass extra_cflags such as -O3 or -march=native." if flags is not None
                        and not re.search(r"(^|\s)-O", flags) else ".")
                     if flags is not None else f"Compiler: {facts['compiler']}.")
    return " ".join(lines)


def _threads(facts: dict) -> str:
    n = int(facts.get("threads") or 1)
    return f"{n} thread" + ("s" if n != 1 else "")


BACKGROUND = """Write fast, correct {target} code for PyTorch. {device}

Task: {task}

The program: one self-contained Python module defining `class ModelNew(torch.nn.Module)` with `Model`'s
constructor and forward arguments, computing the same function, its parameters created as `Model` creates
them (same modules, same order: both models get the same seeded weights). {custom} Inputs are float32
tensors {where}; outputs float32 with the reference's shapes.

The evaluator compares outputs with the reference within {tolerance} on several input distributions and
re-seeded weights, its biases and norm parameters perturbed after construction: read the parameters in
forward, do not fold them into constants (fp16, bf16 or TF32 arithmetic usually fails). Runtime is {timing}. Rejected: try/except
fallbacks, {hidden}, caching outputs between calls, subclassing or calling `Model`, tensor subclasses,
patching timers."""


# ----------------------------------------------------------------------------------------------------
# Gathering the facts (I/O: the evaluator, /proc/cpuinfo, the compiler, torch's build rules).

def device_facts(evaluator, device: str) -> dict:
    """Returns the facts of the device candidates are timed on, as a plain dict for kernel_background."""
    if device == "cuda":
        return gpu_facts(_gpu_info(evaluator))
    opts = getattr(evaluator, "opts", None)
    return cpu_facts(threads=int(getattr(opts, "cpu_threads", 1) or 1))


def gpu_facts(info: dict) -> dict:
    """Returns GPU facts from an evaluator's device info (keys device_name, capability, sms, total_mem,
    l2_bytes and, when measured, mem_bw_bytes_per_s)."""
    return {"kind": "cuda", "name": info.get("device_name"), "capability": info.get("capability"),
            "sms": info.get("sms"), "total_mem": info.get("total_mem"), "l2_bytes": info.get("l2_bytes"),
            "mem_bw_bytes_per_s": info.get("mem_bw_bytes_per_s")}


def cpu_facts(threads: int = 1) -> dict:
    """Returns CPU facts read from this machine: model, cores, instruction sets, compiler, load_inline flags."""
    flags, model = set(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
                elif key.strip() == "model name" and not model:
                    model = value.strip()
    except OSError:
        pass
    return {"kind": "cpu", "cpu": model or platform.processor() or platform.machine(),
            "machine": platform.machine(), "cores": os.cpu_count(), "threads": threads,
            "isa": [f for f in CPU_FEATURES if f in flags] if flags else None,
            "compiler": _compiler_version(), "cflags": load_inline_cflags()}


def _gpu_info(evaluator) -> dict:
    if callable(getattr(evaluator, "device_info", None)):
        return dict(evaluator.device_info())
    devices = getattr(evaluator, "devices", None)
    return dict(devices[0].info) if devices else {}


def _compiler_version() -> str | None:
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def load_inline_cflags() -> str | None:
    """Returns the C++ flags torch's load_inline passes by default on this torch, include paths and the
    extension-name defines left out: read from the build file torch itself writes. None when unknown."""
    try:
        from torch.utils import cpp_extension as ce
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "build.ninja")
            ce._write_ninja_file_to_build_library(path, "probe", [os.path.join(tmp, "probe.cpp")],
                                                  [], [], [], [], [], False, False, False)
            text = open(path).read()
    except Exception:  # a private torch function: another torch may differ; then the flags go unstated
        return None
    m = re.search(r"^cflags = (.*)$", text, re.M)
    if not m:
        return None
    words, kept = shlex.split(m.group(1)), []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w in ("-isystem", "-I"):
            skip = True
        elif not w.startswith(("-I", "-isystem", "-DTORCH_EXTENSION_NAME", "-DTORCH_API_INCLUDE")):
            kept.append(w)
    return " ".join(kept)
