"""Parent side, on the CPU: the outputs of a batch's chosen calls, read from the stopped runner's memory.

After its go() step (host_batches.py) the runner is stopped, and what it said is only a claim: for each
call the addresses of its outputs, the first call's dtypes, shapes and strides, and the strides of any
call whose outputs are laid out otherwise. The claim must give every call memory of its own (no two calls'
outputs overlap), shapes and dtypes as the reference's, and spans of sane size; then the chosen calls'
bytes are read from /proc/PID/mem while the runner stays stopped. What is read is what the memory held when the batch ended: an output computed
later, lazily, elsewhere or never reads as whatever was there. The reference worker compares what was read
with its own outputs for the same inputs (host_batches.HostBatches.check); this process never imports torch
for it.

File format, for the reference worker: one JSON line {"calls": {call: [[dtype, shape, stride, nbytes], ...]}},
then every output's bytes in that order.
"""
from __future__ import annotations

import array
import base64
import binascii
import bisect
import functools
import json
import operator
import os

from .common import DTYPE_SIZES, torch_dtype

DENSE = 4   # an output whose storage spans more than this many times its bytes is read row by row
MAX_BYTES = 4 << 30   # an output larger than this is not read (no honest task comes near)


class Claim:
    """A runner's go() reply, checked: per call, per output, (address, span in bytes)."""

    def __init__(self, pointers: list[list[int]], geometry: list[list], strides: dict | None = None):
        self.pointers, self.geometry = pointers, geometry
        self.strides: dict[int, list[list[int]]] = strides or {}   # call -> its outputs' strides, where not the first call's
        self.layout: dict = {}   # the layout of the batch's inputs (the evaluation sets it)
        self.nbytes = _spans(geometry)

    def geometry_of(self, call: int) -> list[list]:
        """[dtype, shape, stride] of each of the call's outputs."""
        strides = self.strides.get(call)
        return self.geometry if strides is None else [[g[0], g[1], s] for g, s in zip(self.geometry, strides)]

    def nbytes_of(self, call: int) -> list[int]:
        """The storage span, in bytes, of each of the call's outputs."""
        return self.nbytes if call not in self.strides else _spans(self.geometry_of(call))



# What claim() refuses that an honest program can do (an output buffer reused from call to call, outputs
# allocated outside torch's allocator): the message says how to fix it, without calling it forged.
HONEST_MISTAKES = ("returned outputs in the same memory", "returned an output outside the memory the evaluator reads")

def claim(reply: dict, n: int, reference: list, inputs: list[tuple[int, int]] = (),
          views: set[int] = frozenset(), within: int | None = None) -> Claim | str:
    """The runner's reply as a Claim, or what is wrong with it. reference: the reference's geometry for
    the same model call ([dtype, shape, stride] per output); inputs: the address ranges where the runner
    has its input file mapped. No output may lie there (one written over its own inputs saves the memory
    and the writes the reference pays for) but those in `views`: the outputs the reference itself returns
    as views of its inputs (a flatten), which the candidate may too. within (GPU): the addresses are
    offsets into a region of this many bytes, the only memory the reference worker reads; every output
    lies inside it, aligned to its element. What is checked is what will be read, whatever the runner
    says its region's address is."""
    geometry = reply.get("geometry")
    strides = _strides(reply.get("strides", {}), geometry, n) if isinstance(geometry, list) else None
    if not (isinstance(geometry, list) and len(geometry) == len(reference)
            and all(_geometry_ok(g) for g in geometry)) or strides is None:
        return "the runner described its outputs in a form the evaluator cannot read"
    flat = _flat_pointers(reply, len(geometry))
    for k, (g, r) in enumerate(zip(geometry, reference)):
        if g[0] != r[0] or list(g[1]) != list(r[1]):
            return (f"output {k} of the timed calls is {g[0]} {tuple(g[1])}, the reference's {r[0]} {tuple(r[1])} "
                    "(the trials passed with other outputs)")
        if _numel(g[1]) * DTYPE_SIZES[g[0]] > MAX_BYTES:
            return f"output {k} is larger than the {MAX_BYTES >> 30} GiB the evaluator reads"
    k = len(geometry)
    if flat is None or len(flat) != n * k or (n and not ((0 if within is not None else 1) <= min(flat)
                                                          and max(flat) < 1 << 57)):
        return "the runner sent output addresses for another number of calls or outputs than it made"
    pointers = [[a] for a in flat] if k == 1 else [list(flat[i:i + k]) for i in range(0, len(flat), k)]
    c = Claim(pointers, geometry, strides)
    # One output a call laid out alike (the usual case, thousands of calls a batch for a small kernel):
    # checked on the sorted addresses at C speed; whatever that does not pass is looked at call by call.
    if k == 1 and not strides and _one_output_ok(sorted(flat), c.nbytes[0], DTYPE_SIZES[geometry[0][0]],
                                                 inputs, 0 in views, within):
        return c
    return _problem(pointers, geometry, c.nbytes_of, inputs, views, within) or c


def _one_output_ok(addresses: list[int], nb: int, size: int, inputs, is_view: bool, within: int | None) -> bool:
    """(One output a call, addresses sorted) True if every check of _problem passes."""
    if not addresses:
        return True
    if within is not None and (functools.reduce(operator.or_, addresses) & (size - 1)
                               or addresses[-1] + max(nb, size) > within):
        return False
    if not nb:
        return True
    if len(addresses) > 1 and min(map(operator.sub, addresses[1:], addresses)) < nb:
        return False
    if not is_view:
        for lo, hi in inputs:   # an output [a, a + nb) meets [lo, hi) where lo - nb < a < hi
            j = bisect.bisect_right(addresses, lo - nb)
            if j < len(addresses) and addresses[j] < hi:
                return False
    return True


def _problem(pointers: list[list[int]], geometry: list, nbytes_of, inputs, views, within) -> str | None:
    """What is wrong with a claim's addresses, call by call; None if nothing. nbytes_of(call): the spans
    of its outputs."""
    if within is not None:
        for i, p in enumerate(pointers):
            for a, nb, g in zip(p, nbytes_of(i), geometry):
                if not (a % DTYPE_SIZES[g[0]] == 0 and a + max(nb, DTYPE_SIZES[g[0]]) <= within):
                    return (f"call {i} returned an output outside the memory the evaluator reads: allocate outputs "
                            "with torch (torch.empty, torch::empty, ...) in the calling thread, inside the call")
    spans = sorted((a, a + nb, i, k) for i, p in enumerate(pointers) for k, (a, nb) in enumerate(zip(p, nbytes_of(i)))
                   if nb)
    end, owner = -1, -1   # the furthest end so far, and its call: a span of another call starting before it overlaps
    for a, e, i, _ in spans:
        if a < end and i != owner:
            return (f"calls {min(i, owner)} and {max(i, owner)} returned outputs in the same memory: return a new "
                    "tensor from every call (every call's output is kept and may be checked)")
        if e > end:
            end, owner = e, i
    for a, e, i, k in spans:
        if k not in views and any(a < hi and lo < e for lo, hi in inputs):
            return (f"call {i} returned memory of the input file: a timed call may neither return its inputs' "
                    "memory nor write its outputs there")
    return None


def pointers_of(reply: dict, k: int) -> list[list[int]] | None:
    """A go() reply's addresses, per call, k outputs each: n x k 64-bit integers, base64 ("packed"); None
    if they cannot be read so."""
    flat = _flat_pointers(reply, k)
    return None if flat is None else [list(flat[i:i + k]) for i in range(0, len(flat), k)]


def _flat_pointers(reply: dict, k: int) -> array.array | None:
    """pointers_of's addresses in one array, call after call."""
    try:
        raw = base64.b64decode(reply.get("packed", ""), validate=True)
    except (binascii.Error, ValueError, TypeError):
        return None
    if k <= 0 or len(raw) % (8 * k):
        return None
    flat = array.array("q")
    flat.frombytes(raw)
    return flat


def views_of_inputs(reply: dict, inputs: list[tuple[int, int]]) -> set[int]:
    """(The reference's runner, trusted.) The outputs whose first call's address lies in its input file."""
    first = (pointers_of(reply, len(reply.get("geometry") or [])) or [[]])[0]
    return {k for k, a in enumerate(first) if any(lo <= a < hi for lo, hi in inputs)}


def mappings(pid: int, dev: int, ino: int) -> list[tuple[int, int]]:
    """The address ranges where process pid maps the file (dev, ino), from /proc/PID/maps (read while it
    is stopped: it may map its input file more than once)."""
    tag = f"{os.major(dev):02x}:{os.minor(dev):02x} {ino} "
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) >= 5 and f"{parts[3]} {parts[4]} " == tag:
                lo, hi = parts[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


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
        for (dtype, shape, stride), address, nbytes in zip(c.geometry_of(i), c.pointers[i], c.nbytes_of(i)):
            try:
                data, stride = _read_output(mem, address, nbytes, DTYPE_SIZES[dtype], shape, stride)
            except OSError as e:
                return f"the memory call {i} said holds its output could not be read ({e.strerror or e})"
            blobs.append(data)
            rows.append([dtype, list(shape), list(stride), len(data)])
        header["calls"][str(i)] = rows
    # A fresh plain file, never through a link or into a FIFO (the directory is ours; this holds anyway).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        for b in blobs:
            f.write(b)
    return None


def load(path: str) -> dict[int, list]:
    """(Reference worker.) The file write() made: call -> its outputs as tensors."""
    import stat

    import torch
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{os.path.basename(path)} is not a plain file")
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


def _read_output(mem: Memory, address: int, span: int, size: int, shape: list[int],
                 stride: list[int]) -> tuple[bytes, list[int]]:
    """One output's bytes and the strides to read them with: its whole span where that is dense enough,
    else (a narrow view of a padded buffer) its rows one by one, stored contiguous."""
    count = _numel(shape)
    if span <= DENSE * count * size + 4096:
        return mem.read(address, span), list(stride)
    inner = shape[-1] if shape else 1
    step = stride[-1] if stride else 1
    rows = []
    for index in _outer_indices(shape[:-1]):
        start = address + sum(i * st for i, st in zip(index, stride)) * size
        if (inner - 1) * step + 1 <= DENSE * inner:
            row = mem.read(start, ((inner - 1) * step + 1) * size)
            rows.append(row if step == 1 else b"".join(row[j * step * size:(j * step + 1) * size] for j in range(inner)))
        else:   # sparse within a row too: element by element, never the gaps (a claimed stride of 2^31
            # elements over an empty mapping had us read gigabytes per row)
            rows.append(b"".join(mem.read(start + j * step * size, size) for j in range(inner)))
    contiguous = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        contiguous[d] = contiguous[d + 1] * shape[d + 1]
    return b"".join(rows), contiguous


def _outer_indices(dims: list[int]):
    if not dims:
        yield ()
        return
    for i in range(dims[0]):
        for rest in _outer_indices(dims[1:]):
            yield (i, *rest)


def _numel(shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _strides(raw, geometry: list, n: int) -> dict[int, list[list[int]]] | None:
    """A reply's "strides" ({call: [stride of each output]}, the calls laid out otherwise than the first)
    as a dict by call; None if it is not that."""
    if not isinstance(raw, dict) or len(raw) > n:
        return None
    out = {}
    for key, strides in raw.items():
        call = int(key) if isinstance(key, str) and len(key) <= 12 and key.isdecimal() else -1   # not "²"
        if not (0 < call < n and isinstance(strides, list) and len(strides) == len(geometry)
                and all(isinstance(g, list) and len(g) == 3 and _geometry_ok([g[0], g[1], s])
                        for g, s in zip(geometry, strides))):
            return None
        out[call] = [list(s) for s in strides]
    return out


def _spans(geometry: list) -> list[int]:
    return [_extent(shape, stride) * DTYPE_SIZES[dtype] for dtype, shape, stride in geometry]


def _geometry_ok(g) -> bool:
    return (isinstance(g, list) and len(g) == 3 and g[0] in DTYPE_SIZES and isinstance(g[1], list)
            and isinstance(g[2], list) and len(g[1]) == len(g[2]) and len(g[1]) <= 16
            and all(type(v) is int and 0 <= v < 1 << 40 for v in g[1] + g[2]))


def _extent(shape: list[int], stride: list[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))
