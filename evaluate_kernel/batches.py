"""Worker side, on a GPU: one batch of calls, step by step as the parent times it (clock.py), the same code
in the runner (the candidate's process) and in the reference worker, so bookkeeping costs both sides alike.
(On the CPU the bookkeeping happens outside the runner: host_batches.py.)

    draw(seed, n, keep)   free the last batch; draw n input sets from the seed (each call gets inputs of its
                          own: nothing to answer from a cache)
    go()                  n calls back to back, every output held, one synchronise
    digest()              a digest of every output's bits (common.digests): the commitment
    ship(path, calls)     (runner) the named outputs of this batch to a file, for the reference worker

In the runner nothing here is trusted: the parent's clock brackets each step, and a step that does another
step's work is charged for it. The reference worker, told in advance (keep), holds its own outputs of the
same calls on the same inputs; check() compares the shipped ones with them and with their digests.
"""
from __future__ import annotations

import functools
import gc
import math
import time

from . import tensorfile
from .common import _flat, compare_outputs, digests
from .inputs import _check_outputs, _draw_sets, _sync


class Batches:
    """The batches of one timing conversation, in one worker."""

    def __init__(self, model, ref_ns: dict, device, on_device: bool, call=None):
        hold_collections()
        self.model, self.ref_ns, self.device, self.on_device = model, ref_ns, device, on_device
        self.call = call or module_call()
        self.batch = -1
        self.sets: list = []
        self.outs: list = []
        self.pads: list = []
        self.kept: dict[str, list] = {}   # "batch:call" -> outputs
        self.weights: dict = {}          # digest weights, per output size
        self.keep_now: list[int] = []

    def draw(self, seed: int, n: int, batch: int, keep: dict | None = None) -> None:
        """keep: {"batch": b, "calls": [...]}: outputs of this batch to hold for check() (the reference
        worker's, told in advance)."""
        import torch
        keep = keep or {}
        self.outs, self.sets, self.pads = [], [], []
        self.batch, self.keep_now = batch, list(keep.get("calls", [])) if keep.get("batch") == batch else []
        with torch.no_grad():
            # On the CPU each set lies behind a pad of random size: a process's memory layout then changes
            # from call to call, instead of favouring or hampering a whole process's calls by its luck.
            self.sets = _draw_sets(self.ref_ns, seed, n, self.device, self.on_device,
                                   pads=self.pads if self.device.type == "cpu" else None, mixed=True)
        _sync(self.device)

    def go(self) -> None:
        import torch
        sets, fn = self.sets, self.call.bind(self.model)
        with torch.no_grad():
            outs = [fn(*xs) for xs in sets]
        _sync(self.device)
        self.outs = outs

    def digest(self) -> list[int]:
        """Digests of every output; first a check that they are plain tensors on the device, each call's
        in memory of its own (a model that returns one buffer every call overwrites what it returned). The
        reference worker runs the same checks: both sides' bookkeeping must cost the same."""
        import torch
        calls, seen = [], {}
        for i, out in enumerate(self.outs):
            tensors, problem = _check_outputs(out, self.device, copy=False)
            if tensors is None:
                raise ValueError(f"call {i} of the batch: {problem}")
            for t in tensors:
                if t.numel():
                    ptr = t.untyped_storage().data_ptr()
                    if seen.setdefault(ptr, i) != i:
                        raise ValueError(f"calls {seen[ptr]} and {i} returned tensors in the same memory: return a "
                                         "new tensor from every call (every call's output is kept and checked)")
            calls.append(tensors)
        with torch.no_grad():
            values = digests(calls, self.weights)
        self.outs, self.sets, self.pads = calls, [], []
        if self.keep_now:
            self._keep(self.keep_now)
            self.keep_now = []
        return values

    def ship(self, path: str, calls: list[int]) -> None:
        gc.collect(1)   # cycles the batch left (untimed here): the young objects only, a millisecond
        self.kept = {}
        self._keep(calls)
        tensorfile.write(path, self.kept)
        self.kept = {}

    def check(self, path: str, items: list[dict], rtol: float, atol: float, l2_tol: float) -> list[dict]:
        """(Reference worker.) The shipped outputs against ours for the same calls, and against the digests
        the runner committed to; a missing or unreadable output fails."""
        gc.collect(1)   # as ship() does in the runner: the reference's batch is over, this step is not timed
        results = []
        for item in items:
            ref = self.kept.pop(item["key"], None)
            got = tensorfile.read(path, [item["key"]], tensorfile.bound(ref)).get(item["key"]) if ref is not None else None
            if got is None:
                results.append({"ok": False, "reason": "an output the evaluator asked for is missing, unreadable "
                                "or far larger than the reference's"})
                continue
            result = compare_outputs(got, ref, rtol, atol, l2_tol)
            if result["ok"] and digests([[o.to(self.device) for o in got]], self.weights)[0] != item["digest"]:
                result = {"ok": False, "reason": "the output shipped afterwards is not the one whose digest was sent "
                          "right after the batch (computed later, or changed since)"}
            results.append(result)
        return results

    def _keep(self, calls: list[int]) -> None:
        for i in calls:
            if 0 <= i < len(self.outs):
                self.kept[f"{self.batch}:{i}"] = [t for t in _flat(self.outs[i])]


def module_call():
    """How both sides call their model in a batch: as nn.Module's own call path would, without its cost.
    That path (hooks checked, then forward) costs about a microsecond a call, and the harness's handle on
    whatever path it takes lives in the candidate's process: taking nn.Module's path early stopped a
    ModelNew whose __call__ skipped it (1.11-1.17x on a 6 us ReLU, sixth red team), but a candidate that
    reached the handle and put its forward there still read 1.02-1.06x its twin on a 12 us softmax
    (twentieth). So a model without hooks of its own has its forward called directly, which leaves nothing
    to skip; one with hooks (run in the trials, which call the model) goes through the path taken here,
    before any candidate code ran."""
    import functools

    import torch
    from torch.nn.modules import module as nn_module
    path = torch.nn.Module._call_impl
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    globals_ = [getattr(nn_module, k) for k in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                "_global_backward_hooks", "_global_backward_pre_hooks")
                if isinstance(getattr(nn_module, k, None), dict)]

    def bind(model):
        """The callable a batch calls `model` by, resolved once a batch (resolving it every call cost both
        sides about a microsecond of a 15 us softmax call on an H100's host)."""
        d = model.__dict__
        if any(d.get(h) for h in hooks) or any(globals_):
            return functools.partial(path, model)
        return model.forward

    def call(model, *xs):
        return bind(model)(*xs)
    call.bind = bind
    return call


def hold_collections() -> None:
    """No cyclic garbage collection while batches are timed, on either side. In a process that imported
    torch a full collection walks hundreds of thousands of objects, tens of milliseconds, and a draw of
    thousands of input sets sets one off every few batches: it lands in whichever step it falls in, one
    side's batch at random. What exists now is moved out of the collector's sight (freeze); the young
    objects a batch leaves are collected in the untimed steps (ship, check)."""
    gc.disable()
    gc.freeze()


def release_collections() -> None:
    """(Reference worker, after a timing.) Back to normal collection."""
    gc.unfreeze()
    gc.enable()


class Prober:
    """(The prober: a CUDA context of its own.) Is the device idle? A trivial kernel, and a 1 MiB copy each
    way between pinned host memory and the device, each timed from an idle stream of ours: tens of
    microseconds, unless another context's work occupies the engine it needs, which then serves that
    work first or time-slices with ours. The kernel sees kernels and device-to-device copies; only the
    copies see copies between host and device (another context's host-to-device copies left the kernel
    probe at its idle time while they slowed other contexts' work by 6-13%: twelfth red team)."""

    def __init__(self, device):
        import torch
        self.host = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        self.dev = torch.empty(1 << 20, dtype=torch.uint8, device=device)

    def probe(self) -> dict[str, float]:
        """Milliseconds each step took: ms (the kernel), h2d, d2h."""
        return {"ms": _timed(lambda: __import__("torch").cuda._sleep(100)),
                "h2d": _timed(lambda: self.dev.copy_(self.host, non_blocking=True)),
                "d2h": _timed(lambda: self.host.copy_(self.dev, non_blocking=True))}


def drain(probe, limits: dict, first_limits: dict, runs: int, max_s: float, check: dict | None = None,
          yield_s: float = 0.00005, now=None, sleep=None) -> dict:
    """(The prober) Probe back to back until `runs` probes in a row are quiet (every step within its limit;
    the first probe against first_limits, as it also waits for the GPU to switch contexts), then leave the
    GPU idle for a moment (yield_s) and probe once more, against `check`: a context whose work was put
    off while ours ran takes the GPU back in that pause, and this probe waits for it, or for the switch
    back. Such a probe starts the run again; max_s passing ends the drain unquiet.

    The device counts as busy from the first probe's end until the quiet run's first probe began, and
    after a check that found it busy, from that check's start until the next quiet run: timed here, with
    nothing between two probes but this loop, so work that ran between two probes still counts. (Sent
    one probe at a time from the parent, the round trip between two was blind: a call's work left running
    past "done" finished there, +4.8% on a 1.7 ms call. And the GPU serves a waiting context between
    another's kernels: the last call's final kernel waited while our probes ran, then ran uncharged once
    they were done, +2% on the same call. A pause of half a millisecond, charged, cost honest batches up
    to 1.4 ms where a check came out slow by chance.)

    Returns {"first": the first probe's steps, "busy_s": that time, "probes": how many, "quiet": whether a
    quiet run came, "quiet_at": when the device was found quiet (this machine's monotonic clock)}."""
    now, sleep = now or time.monotonic, sleep or time.sleep
    check = check or limits
    start = now()
    first, resume, since, busy, run, n = None, 0.0, 0.0, 0.0, 0, 0
    while True:
        t0 = now()
        steps = probe()
        t1 = now()
        n += 1
        if first is None:
            first, resume = steps, t1
        lim = first_limits if n == 1 else limits
        quiet = all(steps.get(k, math.inf) <= v for k, v in lim.items())
        if quiet and run == 0:
            since = t0
        run = run + 1 if quiet else 0
        if run >= runs:
            busy += max(0.0, since - resume)
            sleep(yield_s)
            resume = now()
            steps = probe()
            n += 1
            if all(steps.get(k, math.inf) <= v for k, v in check.items()):
                return {"first": first, "busy_s": busy, "probes": n, "quiet": True, "quiet_at": now()}
            run = 0
        if now() - start > max_s:
            return {"first": first, "busy_s": None, "probes": n, "quiet": False}


def _timed(step) -> float:
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def reset_persisting_l2(device) -> None:
    """Lines another context marked persisting would shrink the L2 the next batch sees: reset them all, and
    the limit, before every batch (both sides)."""
    if device.type != "cuda":
        return
    import ctypes
    lib = _cudart()
    if lib is not None:
        lib.cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(0))  # cudaLimitPersistingL2CacheSize
        lib.cudaCtxResetPersistingL2Cache()


@functools.lru_cache(maxsize=1)
def _cudart():
    """The CUDA runtime torch loaded (found by its soname among the loaded libraries), or None."""
    import ctypes
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
