"""Leaf: tensors in a file that a runner writes and the reference worker reads, with nothing to execute.

    write(path, groups)    {key: [tensor, ...]} -> one file: an 8-byte header length, a JSON header naming
                           each tensor's dtype, shape and byte range, then the tensors' bytes
    read(path, max_bytes)  the same dict, as CPU tensors; None when the file is missing, not a plain
                           file, malformed or larger than max_bytes

The writer is the candidate's process, so the reader trusts nothing in the file: it opens only a plain file
(no link at its last step, never blocking on a FIFO), parses JSON (no pickle, so no object of the writer's
choosing is ever built, however a loader restricts it), accepts only listed dtypes and a byte range that
matches dtype x shape and lies inside the file, and reads no more than max_bytes in all (a header that
declares terabytes costs nothing). The bytes are copied as they are: what they mean is for the checks that
follow (comparison with the reference's outputs, the digests the runner committed to).
"""
from __future__ import annotations

import json
import os
import stat

ALIGN = 64
DTYPES = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int16",
          "uint16", "int32", "uint32", "int64", "uint64", "bool", "complex64", "complex128")
_MAX_HEADER = 1 << 20


def write(path: str, groups: dict[str, list]) -> None:
    import torch
    header, blobs, offset = {}, [], 0
    for key, tensors in groups.items():
        entries = []
        for t in tensors:
            data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
            entries.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                            "offset": offset, "nbytes": len(data)})
            pad = -len(data) % ALIGN
            blobs += [data, b"\0" * pad]
            offset += len(data) + pad
        header[key] = entries
    head = json.dumps(header).encode()
    head += b" " * (-(8 + len(head)) % ALIGN)   # the data starts aligned
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for b in blobs:
            f.write(b)


def read(path: str, max_bytes: int = 4 << 30) -> dict[str, list] | None:
    import torch
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n <= _MAX_HEADER else None
        except (ValueError, UnicodeDecodeError, RecursionError):   # a header nested a million deep
            return None
        if not isinstance(header, dict) or not all(isinstance(v, list) for v in header.values()):
            return None
        out, total = {}, 0
        for key, entries in header.items():
            tensors = []
            for e in entries:
                layout = _layout(e, torch)
                if layout is None:
                    return None
                dtype, shape, offset, nbytes = layout
                total += nbytes
                if total > max_bytes or 8 + n + offset + nbytes > size:
                    return None
                f.seek(8 + n + offset)
                data = bytearray(nbytes)
                if f.readinto(data) != nbytes:
                    return None
                flat = torch.frombuffer(data, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
                # a bool byte other than 0 or 1 is no value torch defines: read as what it means, nonzero
                t = (flat != 0) if dtype is torch.bool else flat.view(dtype)
                tensors.append(t.reshape(shape))
            out[str(key)] = tensors
        return out


def _layout(e, torch):
    """(dtype, shape, offset, nbytes) of one header entry, or None unless every field is what it must be:
    a listed dtype, a shape of non-negative ints, an offset, and nbytes = numel x the dtype's size."""
    if not isinstance(e, dict) or e.get("dtype") not in DTYPES or not hasattr(torch, e["dtype"]):
        return None
    shape, offset, nbytes = e.get("shape"), e.get("offset"), e.get("nbytes")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) \
            or type(offset) is not int or offset < 0 or type(nbytes) is not int:
        return None
    dtype = getattr(torch, e["dtype"])
    numel = 1
    for d in shape:
        numel *= d
    if numel * torch.empty((), dtype=dtype).element_size() != nbytes:
        return None
    return dtype, shape, offset, nbytes
