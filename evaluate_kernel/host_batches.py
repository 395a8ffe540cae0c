"""Worker side: batches whose bookkeeping happens outside the processes that are timed (the CPU, and a GPU
where its memory can be shared by file descriptor: vmm.py).

Both sides are timed in runners, the same kind of process running the same code: the candidate's runner
(ModelNew) and the reference's (Model, one per device, kept for the Evaluator's life). The reference
worker draws a batch's inputs from the parent's seed and writes them into the memory of the runner whose
batch comes next: on the CPU a shared-memory file the parent made when it started the runner, on a GPU a
region of device memory the reference worker made and the runner maps. A runner's whole part of a batch
is go(): views over that memory, n calls back to back, where the outputs lie (on a GPU, allocated in the
same region, one synchronise at the end). The parent times that step with the runner stopped before and
after it (CPU: its CPU time; GPU: the parent's clock, and the device drained after it), and afterwards the
outputs of the calls it chose are read from the stopped runner's memory (CPU: readout.py; GPU: by the
reference worker, from its own mapping of the region). Once timing starts a runner runs only inside
go(): no drawing or digesting of its own that a leaner harness could shorten, and no untimed step to
hide work in.

    fill(seed, n, target)   (reference worker; untimed, the runners stopped) draw n sets (or reuse the
                            last seed's), write them (or those picked) into the target runner's memory
    go(layout)              (a runner, timed) free the last batch, views, n calls, addresses
    check(...)              (reference worker) the candidate's outputs against the reference's, and its
                            inputs as written

The reference worker itself (a long-lived process that also draws, compares trials and holds their
outputs) is timed on nothing: timing the reference there read 3-5% slower than in a runner for the same
Model, whichever was measured first.
"""
from __future__ import annotations

import array
import base64
import json
import mmap
import os
import secrets

from .common import _DISTS, DTYPE_SIZES, _flat, compare_outputs, torch_dtype
from .inputs import _transform
from .readout import _extent as _span, load

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

    def views(self, layout: dict) -> list[tuple]:
        """The n input sets of a layout as tensors over the mapping (no copy)."""
        import torch
        return _views(self._flat, lambda: torch.frombuffer(self.map, dtype=torch.uint8), layout)

    def write(self, block, base: int) -> None:
        """(Reference worker.) The batch's bytes at base, by pwrite: no page of the mapping is touched
        here, so each side's first touch of a page happens in its own go(), alike."""
        view = memoryview(block.numpy()).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], base + done)


class GpuArena:
    """(GPU) A region of device memory shared with the reference worker (vmm.Region): a batch's input sets
    at a layout below `inputs` bytes, the runner's allocations in the calls above it."""

    def __init__(self, region, inputs: int):
        self.region, self.size = region, inputs   # size: what a layout may fill (the input part)
        self.base = region.ptr
        self._flat: dict = {}

    def views(self, layout: dict) -> list[tuple]:
        return _views(self._flat, lambda: self.region.bytes, layout)

    def write(self, block, base: int) -> None:
        """(Reference worker.) The batch's bytes at base (a device-to-device copy)."""
        self.region.bytes[base:base + block.numel()].copy_(block)

    def read(self, offset: int, geometry: list):
        """(Reference worker.) An output the runner said lies at offset, as a tensor over the region (no
        copy; the claim was checked to lie inside, aligned)."""
        import torch
        dtype, shape, stride = geometry
        t = torch_dtype(dtype)
        size = torch.empty((), dtype=t).element_size()
        span = _span(shape, stride) * size
        flat = self.region.bytes[offset:offset + max(span, size)].view(t)
        return flat.as_strided(shape, stride) if span else torch.empty(shape, dtype=t, device=flat.device)

    def intact(self, at: int, expected) -> bool:
        import torch
        return bool(torch.equal(self.region.bytes[at:at + expected.numel()], expected))

    def close(self) -> None:
        self._flat.clear()   # the region itself is the reference worker's, kept across timings


class HostBatches:
    """(A runner: the candidate's, or the reference's own.) The batches it runs, on the CPU."""

    def __init__(self, model, arena, call, pool=None):
        from .batches import hold_collections
        hold_collections()
        self.model, self.arena, self.call = model, arena, call   # call: batches.module_call(), taken early
        self.pool = pool   # (GPU) the MemPool over the arena's output part (vmm.Pool)
        self.base = getattr(arena, "base", 0)   # (GPU) addresses are told as offsets into the region
        self.outs: list = []

    def go(self, layout: dict) -> dict:
        """n calls on the layout's sets, every output held; where they lie (offsets into the region on a
        GPU), packed: n x k 64-bit integers, base64 (readout.pointers_of), cheap to make inside the step;
        the first call's dtypes, shapes and strides, and the strides of any call whose differ from those.
        The last batch's outputs are freed first, inside the step, on both sides alike: freeing runs the
        candidate's code (a finalizer, a __del__), which an untimed step of its own left free to prepare
        the next batch (thirteenth red team: pre-faulted 256 MB output buffers, 2.3-2.5x over the twin)."""
        import torch
        self.outs = []
        sets = self.arena.views(layout)
        fn = self.call.bind(self.model)
        if self.pool is None:
            with torch.no_grad():
                outs = [fn(*xs) for xs in sets]
        else:
            with torch.no_grad(), torch.cuda.use_mem_pool(self.pool):
                outs = [fn(*xs) for xs in sets]
            if not sets:   # a batch of no calls (the reference's runner, in the baseline's run): one trivial
                # kernel, so that it pays the GPU's switch back to this context as every batch does
                torch.cuda._sleep(1)
        self.outs = outs
        first = _flat(outs[0]) if outs else []
        base = self.base
        if all(type(o) is torch.Tensor for o in outs):   # the usual case, without a list per call
            packed = array.array("q", [o.data_ptr() - base for o in outs])
            s0 = first[0].stride() if first else ()
            odd = [i for i, o in enumerate(outs) if o.stride() != s0]
        else:
            packed = array.array("q", [t.data_ptr() - base for o in outs for t in _flat(o)])
            s0 = [t.stride() for t in first]
            odd = [i for i, o in enumerate(outs) if [t.stride() for t in _flat(o)] != s0]
        reply = {"packed": base64.b64encode(packed.tobytes()).decode(),
                 "geometry": [[str(t.dtype).removeprefix("torch."), list(t.shape), list(t.stride())] for t in first]}
        if odd:   # an honest kernel may lay its outputs out differently from call to call
            reply["strides"] = {str(i): [list(t.stride()) for t in _flat(outs[i])] for i in odd}
        if self.pool is not None:   # (GPU) the last thing before the answer: nothing of ours lies between the
            torch.cuda.synchronize()   # calls' end and the drain, which a call's work left running could use
        return reply


class HostInputs:
    """(The reference worker.) The inputs of a timing's batches, written into both runners' memories, and
    the check of their outputs (CPU: what the parent read from them; GPU: read here, from the regions)."""

    def __init__(self, ref_ns: dict, arenas: dict, device=None, on_device: bool = True):
        from .batches import hold_collections
        hold_collections()
        self.ref_ns, self.arenas = ref_ns, arenas   # "runner", "reference": Arena (CPU) or GpuArena
        self.device, self.on_device = device, on_device   # None: the CPU
        self.drawn: tuple | None = None   # ((seed, n), layout, bytes) of the last draw

    def fill(self, seed: int, n: int, target: str, pick: list[int] | None = None) -> dict:
        """n input sets from the seed, written into the target's file. The parent asks for each side's
        file right before that side's batch, so both find their inputs equally fresh in the caches; the
        sets of the last seed are kept for the second side. With `pick`, only those of the n sets, in that
        order (the reference's batch after the candidate's: its checked calls' sets among them); the
        candidate's sets stay what its inputs are checked against."""
        import torch

        from .inputs import _draw_many
        if self.device is not None:   # no line the last batch (either side's) marked persisting stays so
            from .batches import reset_persisting_l2
            reset_persisting_l2(self.device)
        if self.drawn is None or self.drawn[0] != (seed, n):
            self.drawn = None   # the last batch's bytes go before the next are drawn
            with torch.no_grad():
                if self.device is None:
                    sets = _draw_many(self.ref_ns, seed, n, torch.device("cpu"), False)
                else:
                    sets = _draw_many(self.ref_ns, seed, n, self.device, self.on_device)
                self.drawn = ((seed, n), *pack(sets, min(a.size for a in self.arenas.values()), mix=seed))
        _, layout, block = self.drawn
        if pick is not None:
            layout, block = _picked(layout, block, pick)
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
            result = compare_outputs(got[j], ref[item["ref_call"]], rtol, atol, l2_tol)
            if result["ok"] and not self._inputs_intact(j, *item["inputs"]):
                result = {"ok": False, "reason": "the call changed its inputs (a timed call may not write into them)"}
            results.append(result)
        return results

    def check_regions(self, items: list[dict], rtol: float, atol: float, l2_tol: float) -> list[dict]:
        """(GPU) As check(), the outputs read here from both runners' regions, at the offsets and in the
        layouts the parent checked (readout.claim; each item's "cand" and "geometry", "ref" and
        "ref_geometry") while both runners were stopped and the device idle."""
        import gc
        gc.collect(1)
        cand, ref = self.arenas["runner"], self.arenas["reference"]
        results = []
        for item in items:
            got = [cand.read(off, g) for off, g in zip(item["cand"], item["geometry"])]
            want = [ref.read(off, g) for off, g in zip(item["ref"], item["ref_geometry"])]
            result = compare_outputs(got, want, rtol, atol, l2_tol)
            if result["ok"] and not self._inputs_intact(item["call"], *item["inputs"]):
                result = {"ok": False, "reason": "the call changed its inputs (a timed call may not write into them)"}
            results.append(result)
        return results

    def _inputs_intact(self, j: int, at: int, nbytes: int) -> bool:
        """The candidate runner's memory holds, for set j, the bytes written there."""
        block = self.drawn[2] if self.drawn is not None else None
        if block is None or (j + 1) * nbytes > len(block):
            return False
        if self.device is not None:
            return self.arenas["runner"].intact(at, block[j * nbytes:(j + 1) * nbytes])
        return os.pread(self.arenas["runner"].fd, nbytes, at) == block[j * nbytes:(j + 1) * nbytes].numpy().tobytes()


def pack(sets: list[list], capacity: int, mix: int | None = None) -> tuple[dict, object]:
    """The layout of n input sets (every set alike: the same shapes, dtypes and strides) and the bytes to
    write: set i's j-th tensor at base + i * set_bytes + offset_j, its storage span as it is (strides
    kept). Values that are not tensors travel in the layout, once if every set has the same. With `mix` (a
    seed: the timed batches), each set's floating-point tensors first go through a distribution of the
    trials' chosen for that set (inputs._transform, _mixed), so a shortcut that holds only for the task's
    own inputs (a ReLU of all-positive inputs is the identity) fails the check of a timed call.

    A column of tensors (input j of every set) is stacked and written at once, a few operations a
    column rather than a few a set: on a GPU each is a launch, and a batch of 1,868 softmax calls spent
    twice its calls' time drawing and writing its inputs set by set."""
    import torch
    n = len(sets)
    first = sets[0]
    items, offset = [], 0
    for j, x in enumerate(first):
        if isinstance(x, torch.Tensor):
            name = str(x.dtype).removeprefix("torch.")
            if name not in DTYPE_SIZES:
                raise ValueError(f"input {j} has dtype {x.dtype}, which the timing cannot lay out")
            items.append({"dtype": name, "shape": list(x.shape), "stride": list(x.stride()), "offset": offset,
                          "nbytes": _extent(x) * x.element_size()})
            offset += -(-items[-1]["nbytes"] // ALIGN) * ALIGN
        else:
            values = [xs[j] for xs in sets]
            if _holds_tensor(x):
                raise ValueError(f"input {j} of get_inputs() is a {type(x).__name__} holding tensors: the timing lays out "
                                 "tensors passed as arguments of their own (pass each tensor as an argument)")
            items.append({"value": _encode(x)} if all(v == x for v in values) else {"values": _encode(values)})
            try:
                json.dumps(items[-1])
            except (TypeError, ValueError) as e:   # in the reference worker, before any candidate runs
                raise ValueError(f"input {j} of get_inputs() ({type(x).__name__}) cannot be sent to the timed "
                                 f"process: {e}") from None
    set_bytes = max(ALIGN, offset)
    room = capacity - n * set_bytes
    if room < 0:
        raise ValueError(f"{n} input sets of {set_bytes} bytes do not fit the {capacity}-byte input memory")
    base = secrets.randbelow(min(room, MAX_SHIFT) // ALIGN + 1) * ALIGN
    on = next((x.device for x in first if isinstance(x, torch.Tensor)), torch.device("cpu"))
    cpu = on.type == "cpu"
    # On the CPU the bytes no input covers are zeroed alone (the rest is written below): zeroing the whole
    # block took 7-25 ms of a 50 MB softmax batch. Never left as they were: this process's free memory may
    # hold the reference's outputs.
    block = (torch.empty if cpu else torch.zeros)(n * set_bytes, dtype=torch.uint8, device=on)
    rows = block.view(n, set_bytes)
    if cpu:
        _zero_gaps(rows, items, set_bytes)
    dists = _dists(mix, n) if mix is not None else None
    gen = torch.Generator(device=on).manual_seed(mix + 1) if mix is not None else None
    for j, item in enumerate(items):
        if "dtype" not in item:
            continue
        shape, stride = torch.Size(item["shape"]), tuple(item["stride"])
        drawn = getattr(sets, "columns", None)   # inputs.DrawnSets: the column as drawn, every set alike
        if drawn is not None and drawn[j] is not None and drawn[j].device == on:
            whole = drawn[j]
        else:
            col = [xs[j] for xs in sets]
            for x in col:
                if not (isinstance(x, torch.Tensor) and str(x.dtype).removeprefix("torch.") == item["dtype"]
                        and x.shape == shape and x.stride() == stride):
                    raise ValueError("get_inputs() returns inputs of differing shapes, dtypes or strides from one "
                                     "call to the next; the timing needs every call's inputs alike")
            if not item["nbytes"]:
                continue
            if cpu and first[j].is_contiguous():
                # Each set straight into its row and mixed there: stacking the column, mixing copies of
                # its rows and copying the result in took 55-75 ms of a 50 MB softmax batch, and 12 ms so.
                into = rows[:, item["offset"]:item["offset"] + item["nbytes"]].view(first[j].dtype).view(n, *shape)
                for i, x in enumerate(col):
                    into[i].copy_(x.detach())
                if dists is not None and into.is_floating_point():
                    _mixed_in_place(into, dists, gen)
                continue
            whole = torch.stack([x.detach().to(on) for x in col]) if first[j].is_contiguous() else None
        if whole is not None:   # the usual case: the column at once
            if dists is not None and whole.is_floating_point():
                whole = _mixed(whole, dists, gen)
            rows[:, item["offset"]:item["offset"] + item["nbytes"]].copy_(whole.reshape(n, -1).view(torch.uint8))
            continue
        for i, x in enumerate(col):   # a view with strides of its own: its storage span as it is, set by set
            if dists is not None and x.is_floating_point():
                x = _transformed_as_laid_out(x, dists[i], gen)
            span = x.detach().as_strided((_extent(x),), (1,), x.storage_offset()).contiguous().view(-1)
            start = i * set_bytes + item["offset"]
            block[start:start + item["nbytes"]] = span.view(torch.uint8).to(on)
    layout = {"n": n, "set_bytes": set_bytes, "base": base,
              "items": [{k: v for k, v in it.items() if k != "nbytes"} for it in items]}
    return layout, block


def _dists(seed: int, n: int) -> list[str]:
    """The distribution each of n sets' floating-point inputs go through, from the seed."""
    import random
    choose = random.Random(seed)
    return [choose.choice(_DISTS) for _ in range(n)]


def _mixed(whole, dists: list[str], gen):
    """A stacked column (n, *shape), row i through dists[i] as inputs._transform would take it alone: the
    rows of one distribution gathered, changed at once and put back."""
    import torch
    for dist in ("scaled", "negated", "zero_mean", "per_sample"):
        rows = [i for i, d in enumerate(dists) if d == dist]
        if not rows or (dist == "per_sample" and whole.dim() < 2):
            continue
        index = torch.tensor(rows, dtype=torch.long, device=whole.device)
        part = whole.index_select(0, index)
        if dist == "scaled":
            part = part * 3.0
        elif dist == "negated":
            part = -part
        elif dist == "zero_mean":
            part = part - part.mean(dim=tuple(range(1, part.dim())), keepdim=True) if part.dim() > 1 else part - part
        else:   # a scale and an offset per sample: per index of each set's first dimension
            shape = (len(rows), whole.shape[1]) + (1,) * (whole.dim() - 2)
            scale = torch.rand(shape, generator=gen, dtype=whole.dtype, device=whole.device) * 1.5 + 0.5
            offset = torch.randn(shape, generator=gen, dtype=whole.dtype, device=whole.device)
            part = part * scale + offset
        whole.index_copy_(0, index, part)
    return whole


def _mixed_in_place(into, dists: list[str], gen) -> None:
    """(CPU) As _mixed, on the rows where they lie: the same distributions, the generator drawn in the same
    order, each changed row read and written once."""
    import torch
    for dist in ("scaled", "negated", "zero_mean", "per_sample"):
        rows = [i for i, d in enumerate(dists) if d == dist]
        if not rows or (dist == "per_sample" and into.dim() < 2):
            continue
        if dist == "per_sample":
            shape = (len(rows), into.shape[1]) + (1,) * (into.dim() - 2)
            scale = torch.rand(shape, generator=gen, dtype=into.dtype, device=into.device) * 1.5 + 0.5
            offset = torch.randn(shape, generator=gen, dtype=into.dtype, device=into.device)
        for k, i in enumerate(rows):
            row = into[i]
            if dist == "scaled":
                row.mul_(3.0)
            elif dist == "negated":
                row.neg_()
            elif dist == "zero_mean":
                row.sub_(row.mean() if row.dim() else row)
            else:
                row.mul_(scale[k]).add_(offset[k])


def _zero_gaps(rows, items: list[dict], set_bytes: int) -> None:
    """The bytes of each set (a row) that no input of it covers, zeroed."""
    spans = sorted((it["offset"], it["offset"] + it["nbytes"]) for it in items if "dtype" in it and it["nbytes"])
    at = 0
    for start, end in spans + [(set_bytes, set_bytes)]:
        if start > at:
            rows[:, at:start].zero_()
        at = max(at, end)


def _transformed_as_laid_out(x, dist: str, gen):
    """x through the distribution, with x's strides. Where x's elements share memory (an expanded input,
    a stride of 0), the memory itself goes through it, element by element, so that elements sharing it
    stay equal (a scale per index of the first dimension is then one per element of that memory)."""
    import torch
    if torch._debug_has_internal_overlap(x) == 0:
        return _strided_like(_transform(x, dist, gen), x)
    span = x.detach().as_strided((_extent(x),), (1,), x.storage_offset())
    return _transform(span.clone(), dist, gen).as_strided(x.shape, x.stride(), 0)


def _strided_like(y, x):
    """y's values laid out with x's strides (a transform returns a contiguous tensor)."""
    import torch
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    out.copy_(y)
    return out


def _picked(layout: dict, block, pick: list[int]) -> tuple[dict, object]:
    """Some of a packed batch's sets, in the given order, as a layout and bytes of their own (at the same
    base: fewer sets fit wherever all of them did)."""
    import torch
    n, step = int(layout["n"]), int(layout["set_bytes"])
    if not pick or any(not 0 <= j < n for j in pick):
        raise ValueError(f"sets {pick} picked from a batch of {n}")
    index = torch.tensor(pick, dtype=torch.long, device=block.device)
    items = [dict(it, values=_encode([_decode(it["values"])[j] for j in pick])) if "values" in it else it
             for it in layout["items"]]
    return dict(layout, n=len(pick), items=items), block.view(n, step).index_select(0, index).reshape(-1)


def _holds_tensor(v) -> bool:
    import torch
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return any(_holds_tensor(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_tensor(x) for x in v.values())
    return False


def _encode(v):
    """A value that is not a tensor, for JSON with its tuples, torch.Size and torch.dtype kept (a reduction's
    dims=(1, 2) arrived as a list in the timed calls, where the trials had passed it a tuple)."""
    if isinstance(v, tuple):
        return {"size" if type(v).__name__ == "Size" else "tuple": [_encode(x) for x in v]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {"dict": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if type(v).__name__ == "dtype" and type(v).__module__ == "torch":
        return {"dtype": str(v).removeprefix("torch.")}
    return v


def _decode(v):
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if isinstance(v, dict) and set(v) == {"tuple"}:
        return tuple(_decode(x) for x in v["tuple"])
    if isinstance(v, dict) and set(v) == {"size"}:
        import torch
        return torch.Size(v["size"])
    if isinstance(v, dict) and set(v) == {"dict"}:
        return {_decode(k): _decode(x) for k, x in v["dict"]}
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return torch_dtype(v["dtype"])
    return v


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


def _views(cache: dict, whole, layout: dict) -> list[tuple]:
    """The n input sets of a layout as tensors over a whole memory (whole(): its bytes as a uint8 tensor;
    cache: dtype -> that memory as a tensor of dtype, kept between batches)."""
    import torch
    n, step = int(layout["n"]), int(layout["set_bytes"])
    cols = []
    for item in layout["items"]:
        if "value" in item:
            cols.append([_decode(item["value"])] * n)
        elif "values" in item:
            cols.append(_decode(item["values"]))
        else:
            dtype = torch_dtype(item["dtype"])
            size = torch.empty((), dtype=dtype).element_size()
            flat = cache.get(dtype)
            if flat is None:
                flat = cache[dtype] = whole().view(dtype)
            big = flat.as_strided([n, *item["shape"]], [step // size, *item["stride"]],
                                  (int(layout["base"]) + int(item["offset"])) // size)
            cols.append(big.unbind(0))
    return list(zip(*cols))
