"""Parent side, on the CPU: the outputs of a batch's chosen calls, read from the stopped runner's memory.

After its go() step (host_batches.py) the runner is stopped, and what it said is only a claim: for each
call the addresses of its outputs, and the first call's dtypes, shapes and strides (every call alike).
The claim must give every call memory of its own (no two calls' outputs overlap), shapes and dtypes as
the reference's, and spans of sane size; then the chosen calls' bytes are read from /proc/PID/mem while
the runner stays stopped. What is read is what the memory held when the batch ended: an output computed
later, lazily, elsewhere or never reads as whatever was there. The reference worker compares what was read
with its own outputs for the same inputs (host_batches.HostBatches.check); this process never imports torch
for it.

File format, for the reference worker: one JSON line {"calls": {call: [[dtype, shape, stride, nbytes], ...]}},
then every output's bytes in that order.
"""
from __future__ import annotations

import json
import os

from .common import DTYPE_SIZES, torch_dtype
SPAN_SLACK = 8   # an output may span up to this many times its elements (a view into a padded buffer)


class Claim:
    """A runner's go() reply, checked: per call, per output, (address, bytes)."""

    def __init__(self, pointers: list[list[int]], geometry: list[list]):
        self.pointers, self.geometry = pointers, geometry
        self.nbytes = [_extent(shape, stride) * DTYPE_SIZES[dtype] for dtype, shape, stride in geometry]


def claim(reply: dict, n: int, reference: list) -> Claim | str:
    """The runner's reply as a Claim, or what is wrong with it. reference: the reference worker's
    geometry for the same model call ([dtype, shape, stride] per output)."""
    pointers, geometry = reply.get("pointers"), reply.get("geometry")
    if not (isinstance(geometry, list) and len(geometry) == len(reference)
            and all(_geometry_ok(g) for g in geometry)):
        return "the runner described its outputs in a form the evaluator cannot read"
    for k, (g, r) in enumerate(zip(geometry, reference)):
        if g[0] != r[0] or list(g[1]) != list(r[1]):
            return (f"output {k} of the timed calls is {g[0]} {tuple(g[1])}, the reference's {r[0]} {tuple(r[1])} "
                    "(the trials passed with other outputs)")
        numel = 1
        for s in g[1]:
            numel *= s
        if _extent(g[1], g[2]) > SPAN_SLACK * numel + 4096:
            return f"output {k}'s strides {tuple(g[2])} span far more memory than its {numel} elements"
    if not (isinstance(pointers, list) and len(pointers) == n
            and all(isinstance(p, list) and len(p) == len(geometry)
                    and all(type(a) is int and 0 < a < 1 << 57 for a in p) for p in pointers)):
        return "the runner sent output addresses for another number of calls or outputs than it made"
    c = Claim(pointers, geometry)
    spans = sorted((a, a + nb, i) for i, p in enumerate(pointers) for a, nb in zip(p, c.nbytes) if nb)
    for (a0, e0, i0), (a1, e1, i1) in zip(spans, spans[1:]):
        if a1 < e0 and i0 != i1:
            return (f"calls {min(i0, i1)} and {max(i0, i1)} returned outputs in the same memory: return a new "
                    "tensor from every call (every call's output is kept and may be checked)")
    return c


class Memory:
    """Another process's memory, read through /proc/PID/mem (its ancestor may; the kernel checks at open)."""

    def __init__(self, pid: int):
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, address: int, nbytes: int) -> bytes:
        chunks, done = [], 0
        while done < nbytes:
            chunk = os.pread(self.fd, min(nbytes - done, 64 << 20), address + done)
            if not chunk:
                raise OSError(f"nothing readable at {address + done:#x}")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self.fd)


def write(path: str, mem: Memory, c: Claim, calls: list[int]) -> str | None:
    """The chosen calls' outputs, read from the stopped runner, to path; or what could not be read."""
    header: dict = {"calls": {}}
    blobs = []
    for i in calls:
        rows = []
        for (dtype, shape, stride), address, nbytes in zip(c.geometry, c.pointers[i], c.nbytes):
            try:
                blobs.append(mem.read(address, nbytes) if nbytes else b"")
            except OSError as e:
                return f"the memory call {i} said holds its output could not be read ({e.strerror or e})"
            rows.append([dtype, list(shape), list(stride), nbytes])
        header["calls"][str(i)] = rows
    with open(path, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        for b in blobs:
            f.write(b)
    return None


def load(path: str) -> dict[int, list]:
    """(Reference worker.) The file write() made: call -> its outputs as tensors."""
    import torch
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        out: dict[int, list] = {}
        for key, rows in header["calls"].items():
            tensors = []
            for dtype, shape, stride, nbytes in rows:
                t = torch_dtype(dtype)
                if nbytes == 0:
                    tensors.append(torch.empty(shape, dtype=t))
                    continue
                data = f.read(nbytes)
                if len(data) != nbytes:
                    raise ValueError("the file ends early")
                flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(t)
                tensors.append(flat.as_strided(shape, stride))
            out[int(key)] = tensors
    return out


def _geometry_ok(g) -> bool:
    return (isinstance(g, list) and len(g) == 3 and g[0] in DTYPE_SIZES and isinstance(g[1], list)
            and isinstance(g[2], list) and len(g[1]) == len(g[2]) and len(g[1]) <= 16
            and all(type(v) is int and 0 <= v < 1 << 40 for v in g[1] + g[2]))


def _extent(shape: list[int], stride: list[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))
