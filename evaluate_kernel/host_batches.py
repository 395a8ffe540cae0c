"""Worker side, on the CPU: batches whose bookkeeping happens outside the processes that are timed.

Both sides are timed in runners, the same kind of process running the same code: the candidate's runner
(ModelNew) and the reference's (Model, one per device, kept for the Evaluator's life). The reference
worker draws a batch's inputs from the parent's seed and writes them into the shared-memory file of the
runner whose batch comes next (each runner's file is made by the parent when it starts the runner). A
runner's whole part of a batch is go(): views over its file, n calls back to back, the outputs'
addresses. The parent reads the runner's CPU time with it stopped before and after that step, and
afterwards reads the outputs of the calls it chose from the stopped runners' memory (readout.py). Once
timing starts a runner runs only inside go(): no drawing or digesting of its own that a leaner harness
could shorten, and no untimed step to hide work in.

    fill(seed, n, target)   (reference worker; untimed, the runners stopped) draw n sets (or reuse the
                            last seed's), write them into the target runner's file
    go(layout)              (a runner, timed) free the last batch, views, n calls, addresses
    check(path, ref_path)   (reference worker) the candidate's outputs against the reference's, and its
                            inputs as written

The reference worker itself (a long-lived process that also draws, compares trials and holds their
outputs) is timed on nothing: timing the reference there read 3-5% slower than in a runner for the same
Model, whichever was measured first.
"""
from __future__ import annotations

import json
import mmap
import os
import secrets

from .common import DTYPE_SIZES, _flat, compare_outputs, torch_dtype
from .readout import load

ALIGN = 64          # every input starts on a cache line
MAX_SHIFT = 1 << 20  # a batch's layout starts at a random offset below this: addresses change per batch


class Arena:
    """A shared-memory file (memfd) mapped into this process: one batch's input sets at a layout."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._flat: dict = {}   # dtype -> a 1-D tensor over the whole mapping

    @classmethod
    def create(cls, size: int) -> "Arena":
        return cls(new_memfd(size), size)

    @classmethod
    def open(cls, path: str, size: int) -> "Arena":
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        return cls(fd, size)

    def close(self) -> None:
        self._flat.clear()
        try:
            self.map.close()
        except BufferError:   # views still alive somewhere: the mapping goes with the process
            pass
        os.close(self.fd)

    def views(self, layout: dict) -> list[list]:
        """The n input sets of a layout as tensors over the mapping (no copy)."""
        import torch
        n, step = int(layout["n"]), int(layout["set_bytes"])
        cols = []
        for item in layout["items"]:
            if "value" in item:
                cols.append([item["value"]] * n)
            elif "values" in item:
                cols.append(item["values"])
            else:
                dtype = torch_dtype(item["dtype"])
                size = torch.empty((), dtype=dtype).element_size()
                flat = self._flat.get(dtype)
                if flat is None:
                    flat = self._flat[dtype] = torch.frombuffer(self.map, dtype=torch.uint8).view(dtype)
                big = flat.as_strided([n, *item["shape"]], [step // size, *item["stride"]],
                                      (int(layout["base"]) + int(item["offset"])) // size)
                cols.append(big.unbind(0))
        return [list(xs) for xs in zip(*cols)]

    def write(self, block, base: int) -> None:
        """(Reference worker.) The batch's bytes at base, by pwrite: no page of the mapping is touched
        here, so each side's first touch of a page happens in its own go(), alike."""
        view = memoryview(block.numpy()).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], base + done)


class HostBatches:
    """(A runner: the candidate's, or the reference's own.) The batches it runs, on the CPU."""

    def __init__(self, model, arena: Arena, call):
        from .batches import hold_collections
        hold_collections()
        self.model, self.arena, self.call = model, arena, call   # call: batches.module_call(), taken early
        self.outs: list = []

    def go(self, layout: dict) -> dict:
        """n calls on the layout's sets, every output held; where they lie. The last batch's outputs are
        freed first, inside the step, on both sides alike."""
        import torch
        self.outs = []
        sets = self.arena.views(layout)
        model, call = self.model, self.call
        with torch.no_grad():
            outs = [call(model, *xs) for xs in sets]
        self.outs = outs
        first = _flat(outs[0]) if outs else []
        return {"pointers": [[t.data_ptr() for t in _flat(o)] for o in outs],
                "geometry": [[str(t.dtype).removeprefix("torch."), list(t.shape), list(t.stride())] for t in first]}


class HostInputs:
    """(The reference worker.) The inputs of a timing's batches, written into both runners' files, and the
    check of what the parent read from them."""

    def __init__(self, ref_ns: dict, arenas: dict[str, Arena]):
        from .batches import hold_collections
        hold_collections()
        self.ref_ns, self.arenas = ref_ns, arenas
        self.drawn: tuple | None = None   # ((seed, n), layout, bytes) of the last draw

    def fill(self, seed: int, n: int, target: str) -> dict:
        """n input sets from the seed, written into the target's file. The parent asks for each side's
        file right before that side's batch, so both find their inputs equally fresh in the caches; the
        sets of the last seed are kept for the second side."""
        import torch

        from .inputs import _draw_sets
        if self.drawn is None or self.drawn[0] != (seed, n):
            self.drawn = None   # the last batch's bytes go before the next are drawn
            with torch.no_grad():
                sets = _draw_sets(self.ref_ns, seed, n, torch.device("cpu"), False, mixed=True)
            self.drawn = ((seed, n), *pack(sets, min(a.size for a in self.arenas.values())))
        _, layout, block = self.drawn
        self.arenas[target].write(block, layout["base"])
        return layout

    def check(self, path: str, ref_path: str, items: list[dict], rtol: float, atol: float,
              l2_tol: float) -> list[dict]:
        """The outputs the parent read from the stopped candidate's runner against those it read from the
        reference's, call by call (the same inputs), and the candidate's inputs of those calls against what
        was written there (a call may not use its inputs' memory, as scratch or for its outputs)."""
        import gc
        gc.collect(1)   # not timed: the young objects the fills left
        problem = "an output the evaluator asked for is missing"
        try:
            got = load(path)
        except (OSError, ValueError) as e:
            got, problem = {}, f"the outputs read from the runner are unreadable: {e}"
        ref = load(ref_path)   # ours: an error here is the evaluator's
        results = []
        for item in items:
            j = item["call"]
            if j not in got:
                results.append({"ok": False, "reason": problem})
                continue
            result = compare_outputs(got[j], ref[j], rtol, atol, l2_tol)
            if result["ok"] and not self._inputs_intact(j, *item["inputs"]):
                result = {"ok": False, "reason": "the call changed its inputs (a timed call may not write into them)"}
            results.append(result)
        return results

    def _inputs_intact(self, j: int, at: int, nbytes: int) -> bool:
        """The candidate runner's file holds, for set j, the bytes written there."""
        block = self.drawn[2] if self.drawn is not None else None
        if block is None or (j + 1) * nbytes > len(block):
            return False
        return os.pread(self.arenas["runner"].fd, nbytes, at) == block[j * nbytes:(j + 1) * nbytes].numpy().tobytes()


def pack(sets: list[list], capacity: int) -> tuple[dict, object]:
    """The layout of n input sets (every set alike: the same shapes, dtypes and strides) and the bytes to
    write: set i's j-th tensor at base + i * set_bytes + offset_j, its storage span as it is (strides
    kept). Values that are not tensors travel in the layout, once if every set has the same."""
    import torch
    n = len(sets)
    first = sets[0]
    items, offset = [], 0
    for j, x in enumerate(first):
        if isinstance(x, torch.Tensor):
            name = str(x.dtype).removeprefix("torch.")
            if name not in DTYPE_SIZES:
                raise ValueError(f"input {j} has dtype {x.dtype}, which the CPU timing cannot lay out")
            items.append({"dtype": name, "shape": list(x.shape), "stride": list(x.stride()), "offset": offset,
                          "nbytes": _extent(x) * x.element_size()})
            offset += -(-items[-1]["nbytes"] // ALIGN) * ALIGN
        else:
            values = [xs[j] for xs in sets]
            items.append({"value": x} if all(v == x for v in values) else {"values": values})
            json.dumps(items[-1])   # a value the runner cannot be sent fails here, in the reference worker
    set_bytes = max(ALIGN, offset)
    room = capacity - n * set_bytes
    if room < 0:
        raise ValueError(f"{n} input sets of {set_bytes} bytes do not fit the {capacity}-byte input file")
    base = secrets.randbelow(min(room, MAX_SHIFT) // ALIGN + 1) * ALIGN
    block = torch.zeros(n * set_bytes, dtype=torch.uint8)
    for j, item in enumerate(items):
        if "dtype" not in item:
            continue
        for i, xs in enumerate(sets):
            x = xs[j]
            if not (isinstance(x, torch.Tensor) and str(x.dtype).removeprefix("torch.") == item["dtype"]
                    and list(x.shape) == item["shape"] and list(x.stride()) == item["stride"]):
                raise ValueError("get_inputs() returns inputs of differing shapes, dtypes or strides from one call to "
                                 "the next; the CPU timing needs every call's inputs alike")
            span = x.detach().as_strided((_extent(x),), (1,), x.storage_offset()).contiguous().view(-1)
            if item["nbytes"]:
                start = i * set_bytes + item["offset"]
                block[start:start + item["nbytes"]] = span.view(torch.uint8)
    layout = {"n": n, "set_bytes": set_bytes, "base": base,
              "items": [{k: v for k, v in it.items() if k != "nbytes"} for it in items]}
    return layout, block


def new_memfd(size: int) -> int:
    """A shared-memory file of `size` bytes (sparse: pages exist once written), its size sealed so no
    process that holds it can shrink it under another's mapping."""
    import fcntl
    fd = os.memfd_create("pacevolve-inputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def _extent(x) -> int:
    """Elements of storage a tensor spans from its first element."""
    if x.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))
