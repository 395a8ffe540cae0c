"""Leaf: tensors in a file that a runner writes and the reference worker reads, with nothing to execute.

    write(path, groups)             {key: [tensor, ...]} -> one file: an 8-byte header length, a JSON
                                    header naming each tensor's dtype, shape and byte range, then the bytes
    read(path, keys, max_bytes)     {key: [tensor, ...]} for the keys asked for, as CPU tensors; a key is
                                    absent when the file is missing, not a plain file, malformed, or when
                                    its tensors would pass max_bytes
    bound(reference)                the max_bytes to ask for one call's outputs: twice the reference's

The writer is the candidate's process, so the reader trusts nothing in the file: it opens only a plain file
(no link at its last step, never blocking on a FIFO), parses JSON (no pickle, so no object of the writer's
choosing is ever built, however a loader restricts it), accepts only torch dtypes by name and a byte range
that matches dtype x shape and lies inside the file, and reads only the keys asked for, at most max_bytes
of them (the caller's bound: what the reference's own outputs take, with room for a wrong shape to be
reported as such; a header that declares terabytes, or entries nobody asked for, cost nothing). The bytes
are copied as they are, bools included: what they mean is for the checks that follow (the comparison with
the reference's outputs, the digests the runner committed to, which cover the raw bytes).
"""
from __future__ import annotations

import json
import os
import stat

_MAX_HEADER = 1 << 20
_MAX_DIMS = 64


def write(path: str, groups: dict[str, list]) -> None:
    """One tensor at a time onto the file: no second copy of all the outputs in memory."""
    header, offset = {}, 0
    for key, tensors in groups.items():
        header[key] = []
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            header[key].append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                "offset": offset, "nbytes": nbytes})
            offset += nbytes
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for tensors in groups.values():
            for t in tensors:
                if t.numel():
                    host = t.detach().resolve_conj().resolve_neg().contiguous().cpu()
                    f.write(memoryview(host.reshape(-1).view(_uint8()).numpy()))


def read(path: str, keys: list[str], max_bytes: int) -> dict[str, list]:
    import torch
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {}
        try:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n <= _MAX_HEADER else None
        except (ValueError, UnicodeDecodeError, RecursionError):   # a header nested a million deep
            return {}
        if not isinstance(header, dict):
            return {}
        out, total = {}, 0
        for key in keys:
            entries = header.get(key)
            layouts = [_layout(e, torch) for e in entries] if isinstance(entries, list) else [None]
            if any(x is None for x in layouts):
                continue
            size = sum(x[3] for x in layouts)
            if total + size > max_bytes or any(8 + n + x[2] + x[3] > st.st_size for x in layouts):
                continue
            total += size
            tensors = []
            for dtype, shape, offset, nbytes in layouts:
                data = torch.empty(nbytes, dtype=torch.uint8)
                f.seek(8 + n + offset)
                if nbytes and f.readinto(memoryview(data.numpy())) != nbytes:
                    break
                try:
                    tensors.append(data.view(dtype).reshape(shape))
                except (RuntimeError, TypeError, ValueError, OverflowError):   # a shape torch cannot make
                    break
            else:
                out[key] = tensors
        return out


def bound(reference: list) -> int:
    """What a reader asks of one call's outputs, given the reference's: twice their bytes and a MiB, so an
    output of the wrong shape or dtype is still read and reported as such."""
    return 2 * sum(t.numel() * t.element_size() for t in reference) + (1 << 20)


def _layout(e, torch):
    """(dtype, shape, offset, nbytes) of one header entry, or None unless every field is what it must be:
    a torch dtype's name, a shape of at most 64 non-negative ints, an offset, nbytes = numel x itemsize."""
    if not isinstance(e, dict) or not isinstance(e.get("dtype"), str):
        return None
    dtype = _dtypes(torch).get(e["dtype"])
    shape, offset, nbytes = e.get("shape"), e.get("offset"), e.get("nbytes")
    if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or len(shape) > _MAX_DIMS \
            or not all(type(d) is int and 0 <= d < 1 << 62 for d in shape) \
            or type(offset) is not int or offset < 0 or type(nbytes) is not int:
        return None
    numel = 1
    for d in shape:
        numel *= d
    if numel * dtype.itemsize != nbytes:
        return None
    return dtype, shape, offset, nbytes


def _dtypes(torch) -> dict:
    """torch's dtypes by name, from the module's own namespace: never getattr(torch, name), which for some
    names imports a submodule (torch._inductor, torch._dynamo) in the reading process (eleventh red team)."""
    return {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _uint8():
    import torch
    return torch.uint8
