"""The timing loops, run inside the runner (the candidate's process) and the reference worker.

In the runner everything here is untrusted output: the parent believes none of these numbers on their
own (evaluate_kernel.py's docstring says what bounds them from outside); this module only makes honest
measurements honest. The reference worker runs the same loops on the reference, so a candidate and the
reference it is compared with are measured the same way, in the same window (eval_run.py pairs them).

Three figures per callable, computed by the parent (eval_figures.runtime_figures) from the samples here:
  (a) GPU time: KernelBench's protocol (L2 flush, start event, the call, end event on its stream) with a
      lead (_GpuHold) so the host's launch latency is hidden: what the call costs the GPU;
  (b) KernelBench's current protocol as published (every fourth call of the event phase, without a lead);
  (c) steady state: calls back to back on a few pre-drawn input sets, one synchronise, the host's clock:
      what the call costs when the host is the slower side (launch-bound calls). One pass after each
      block of event calls, so the passes are spread over the whole measurement (see steady_phase).
"""
from __future__ import annotations

import os
import sys
import time

from .common import _flat, call_seed, output_digest
from .inputs import _check_outputs, _draw_sets, _make_inputs, _sync


def _time_model(model, ref_ns: dict, t: dict, device, hold: "_GpuHold | None", send, recv) -> None:
    """The whole timing conversation of a runner: event and steady phases, host rounds, revealed outputs.

    Event phase: calls on inputs drawn fresh from the seed the parent sent with "time", each after an L2
    flush and (three in four) a lead; after each, how long the whole device stayed busy beyond the call's
    stream (the tail), and a digest of its outputs. Steady phase: (c) above. Host rounds: on each "go", N
    calls back to back on inputs drawn from that message's seed, then the digests of all N outputs, which
    the parent's own clock brackets. Then "reveal" names the calls whose outputs are shipped for the
    reference worker to check against the digests.
    """
    import torch
    msg = recv()
    if msg.get("cmd") != "time":
        return
    seed = msg["seed"]
    weights: dict = {}
    kept: dict = {}  # ("t", i) or ("h", round, i) -> outputs, while within keep_bytes
    budget = {"t": [t["keep_bytes"], t["keep_bytes"]], "h": [t["keep_bytes"], 0]}  # [device, host] bytes

    def keep(key, out) -> None:
        # A copy, not a reference: a kernel may return the same buffer every call. On the device while
        # keep_bytes allows, then on the host; beyond both, a revealed call is computed again.
        # Host rounds copy only on the device: inside the parent's window, as the reference worker's rounds do.
        size, room = sum(o.numel() * o.element_size() for o in out), budget[key[0]]
        for where in (0, 1):
            if size <= room[where]:
                room[where] -= size
                kept[key] = [o.clone() if where == 0 else o.to("cpu") for o in out]
                return

    def drop_unchosen(round_: int, chosen: int) -> None:
        for key in [k for k in kept if k[0] == "h" and k[1] == round_ and k[2] != chosen]:
            budget["h"][0] += sum(o.numel() * o.element_size() for o in kept.pop(key))

    digests: list = []
    out_bytes = [0]

    def commit(i: int, out) -> None:
        tensors, problem = _check_outputs(out, device, copy=False)
        if tensors is None:
            raise RuntimeError(f"timed call {i}: {problem}")
        digests.append(output_digest(tensors, weights))
        keep(("t", i), tensors)
        out_bytes[0] = sum(o.numel() * o.element_size() for o in tensors)

    steady: list[float] = []

    def after_block(samples: list[float], last: bool) -> None:
        steady.extend(steady_phase(model, steady_sets, samples, t, device))
        if not last:  # the parent times a block of the reference here, on this device and core, while we wait
            send({"kind": "block"})
            if recv().get("cmd") != "next":
                raise RuntimeError("the timing conversation was broken off")

    with torch.no_grad():
        steady_sets = _draw_sets(ref_ns, seed ^ 0x3C3C3C3C, t["steady_sets"], device, t["on_device"])
        phase = event_phase(model, ref_ns, seed, t, device, hold, commit, tails=True, after_block=after_block)
        phase["steady_ms"] = steady
        del steady_sets
        phase["io_bytes"] = phase.pop("in_bytes") + out_bytes[0]
        send({"kind": "timed", **phase, "digests": _ints(digests), "peak_bytes": _peak_bytes(device)})
        reveal = _host_rounds(model, ref_ns, keep, drop_unchosen, weights, device, t, send, recv)
    _ship(model, ref_ns, kept, device, t, send, reveal)


def time_reference(model, ref_ns: dict, seed: int, t: dict, device, hold: "_GpuHold | None") -> dict:
    """One block of the reference's half of a paired measurement: event calls as a runner makes them (the
    parent puts these blocks between the candidate's), then its steady passes (t["steady_passes"]). Nothing is committed: this process never runs candidate code."""
    import torch
    weights: dict = {}
    kept: list = []
    room = [t["keep_bytes"]]

    def commit(i: int, out) -> None:
        # What a runner does after each call (a digest, a copy kept), so both time their calls between
        # the same work: on the CPU it decides what the caches hold when the next call starts.
        tensors = [o for o in _flat(out)]
        output_digest(tensors, weights)
        size = sum(o.numel() * o.element_size() for o in tensors)
        if size <= room[0]:
            room[0] -= size
            kept.append([o.clone() for o in tensors])

    steady: list[float] = []

    def after_block(samples: list[float], last: bool) -> None:
        if t["steady_passes"]:
            sets = _draw_sets(ref_ns, seed ^ 0x3C3C3C3C, t["steady_sets"], device, t["on_device"])
            steady.extend(steady_phase(model, sets, samples, t, device))

    with torch.no_grad():
        phase = event_phase(model, ref_ns, seed, dict(t, blocks=1), device, hold, commit, tails=False,
                            after_block=after_block)
        phase["steady_ms"] = steady
    phase.pop("in_bytes")
    kept.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the flush buffer goes back: the candidate's runner shares this GPU
    return phase


def event_phase(model, ref_ns: dict, seed: int, t: dict, device, hold, commit, tails: bool,
                after_block=None) -> dict:
    """Warm-up, then t["iters"] calls on fresh inputs in t["blocks"] blocks, after_block(samples so far,
    last) after each; (a) and (b) samples, and on a GPU the tails."""
    import torch
    on_device = t["on_device"]

    def draw(s: int, i: int) -> list:
        return _make_inputs(ref_ns, {"seed": call_seed(s, i), "dist": "own", "on_device": on_device}, device)

    flush = torch.empty(t["flush_bytes"] // 4, dtype=torch.float32, device=device) if device.type == "cuda" else None
    samples, plain, tail_ms = [], [], []
    # Warm-up: at least `warmup` calls and `warmup_ms` of work, so clocks and caches reach steady state.
    t_end, i = time.perf_counter() + t["warmup_ms"] / 1e3, 0
    while i < t["warmup"] or time.perf_counter() < t_end:
        xs = draw(seed ^ 0x5A5A5A5A, i)
        if flush is not None:
            flush.fill_(0.0)
        model(*xs)
        _sync(device)
        i += 1
    cycles_per_ms = _spin_cycles_per_ms() if flush is not None and tails else 0.0
    lead_ms = t.get("lead_ms", 0.0) if hold is not None else 0.0
    per_block = -(-t["iters"] // t["blocks"])
    for i in range(t["iters"]):
        if i and i % per_block == 0 and after_block is not None:
            after_block(samples, False)
        # The CPU: a pad of random size (0-1 MiB) ahead of each call's inputs moves them and what the call
        # allocates to new addresses. Without it a process kept its addresses call after call, and fresh
        # runners' fastest calls read up to 16% slower than the reference worker's for the same model, a
        # whole process at a time (4 of 20 evaluations under load; with it, none in 20, within 7%).
        pad = torch.empty(int.from_bytes(os.urandom(2), "little") * 16, dtype=torch.uint8) if flush is None else None
        xs = draw(seed, i)
        if flush is not None:
            start, end, device_end, idle, idle_end = (torch.cuda.Event(enable_timing=True) for _ in range(5))
            torch.cuda.synchronize()
            flush.fill_(float(i))  # L2 flush: >= 2x the L2 size, outside the timed window
            # (a): the GPU held for lead_ms before the start event, so the call's first launches are
            # queued before the GPU reaches them. Without it the host's latency to its first kernel showed
            # whenever it exceeded the flush: it moves in phases of seconds on these machines and moved
            # 30-call medians by 2-3% (0.1% with this lead). (b): every fourth call as KernelBench times it.
            with_lead = bool(lead_ms) and i % 4 != 3
            if with_lead:
                hold(lead_ms)
            start.record()
            out = model(*xs)
            end.record()
            if tails:
                # Then the whole device: work still running on another stream makes the device finish after
                # the call's stream, a tail, which the parent rejects when it is systematic. The host's own
                # delay in noticing that the device is done (0.02-0.1 ms, varying from second to second) is
                # measured right after by waiting as long for a GPU spin, and taken off: it is not work.
                torch.cuda.synchronize()
                device_end.record()
                ms = start.elapsed_time(end)
                torch.cuda._sleep(int(min(ms, 5.0) * cycles_per_ms))
                idle.record()
                torch.cuda.synchronize()
                idle_end.record()
                idle_end.synchronize()
                tail_ms.append(end.elapsed_time(device_end) - idle.elapsed_time(idle_end))
            else:
                end.synchronize()
                ms = start.elapsed_time(end)
            (samples if with_lead or not lead_ms else plain).append(ms)
        else:
            t0 = time.perf_counter()
            out = model(*xs)
            samples.append((time.perf_counter() - t0) * 1e3)
        if commit is not None:
            commit(i, out)
        del out, pad
    if after_block is not None:
        after_block(samples, True)
    in_bytes = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    return {"samples": samples, "plain_samples": plain, "tails": tail_ms, "lead_ms": lead_ms, "in_bytes": in_bytes}


def steady_phase(model, sets: list, samples: list[float], t: dict, device) -> list[float]:
    """(c): per-call host time of calls back to back, one synchronise per pass; one figure per pass.

    The input sets are drawn before the event phase and cycled (as a model serving a stream of requests
    sees them). A pass lasts about steady_ms and at least steady_min_calls calls, so what a pass costs once
    (the first launch reaching an idle GPU, the synchronise) is a small part of it (0.5% of a 1.5 ms call
    in 13 calls); an untimed call on each set before it brings them back into the caches.
    The runner makes one such slot after each block of event calls, the reference worker one per block of
    its own, and the best pass counts: on the GPU machines a process's host speed moves by up to 40% in
    phases of about a second (the same 10 µs call read 9.5 and 14 µs per call on a pinned core in two
    evaluations, each with two passes back to back agreeing within 0.1%), and passes spread over the
    measurement's second see its fast phases. (Timing n and 2n calls and taking the difference cancels
    the pass's own cost exactly, but read 20-50% below an independent timer for 10 µs calls on an H200.)"""
    ordered = sorted(samples)
    per_call = ordered[len(ordered) // 2] if ordered else 1.0
    n = int(min(t["steady_max_calls"], max(t["steady_min_calls"], t["steady_ms"] / max(per_call, 1e-3))))
    for xs in sets:
        model(*xs)
    out = []
    for _ in range(t["steady_passes"]):
        _sync(device)
        t0 = time.perf_counter()
        for i in range(n):
            model(*sets[i % len(sets)])
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3 / n)
    return out


def _ints(digests: list) -> list[str]:
    import torch
    return [str(v) for v in torch.stack(digests).tolist()] if digests else []


def _host_rounds(model, ref_ns: dict, keep, drop_unchosen, weights: dict, device, t: dict, send, recv) -> dict:
    """On each "go": host_round(), then the N digests.

    The inputs are unknown before "go" and the digests commit to every output's bits, so the work cannot
    happen before the parent's clock starts or after it stops; the parent keeps the fastest round.
    """
    while True:
        msg = recv()
        if msg.get("cmd") != "go":
            return msg  # the next command: "reveal"
        if msg.get("chosen"):
            drop_unchosen(*msg["chosen"])
        digests = host_round(model, ref_ns, msg, t, device, weights, lambda i, out: keep(("h", msg["round"], i), out))
        send({"kind": "round", "digests": digests})


def host_round(model, ref_ns: dict, msg: dict, t: dict, device, weights: dict, keep) -> list[str]:
    """N calls back to back on inputs drawn from msg's seed, a digest and a copy of each output, one sync.

    The reference worker runs the very same steps on the reference, between the runner's rounds, so the
    parent can take the rounds' own bookkeeping off by difference (eval_figures.host_rounds_details)."""
    n = msg.get("calls", t["host_calls"])
    # Distinct contents for every call (the parent asks for as many calls as sets fit in host_bytes): a
    # cache keyed on contents or pointers has nothing to find.
    sets = _draw_sets(ref_ns, msg["seed"], min(n, msg["sets"]), device, t["on_device"])
    digests = []
    for i in range(n):
        out = _flat(model(*sets[i % len(sets)]))
        digests.append(output_digest(out, weights))
        keep(i, out)
    _sync(device)
    return _ints(digests)


def _reset_persisting_l2(device) -> None:
    # Hack 15: lines marked persisting survive an L2 flush; with a zero persisting limit none can exist.
    # The screen rejects the APIs; this reset covers anything set before (torch has no public setter).
    if device.type != "cuda":
        return
    import ctypes
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaDeviceSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(0))  # cudaLimitPersistingL2CacheSize
        return


def _ship(model, ref_ns: dict, kept: dict, device, t: dict, send, msg: dict) -> None:
    """Save the outputs of the calls the parent names now; a call not kept is computed again from its inputs
    (its digest, sent long before, says whether the result is the same)."""
    import torch
    if msg.get("cmd") != "reveal":
        return
    shipped = []
    with torch.no_grad():
        for call in msg["calls"]:
            key = tuple(call["key"])
            out = kept.get(key)
            if out is not None:   # copies kept on the host go back: the checks expect the timing device
                out = [o.to(device) for o in out]
            else:
                out = _flat(model(*_make_inputs(ref_ns, dict(call["spec"], on_device=t["on_device"]), device)))
            tensors, problem = _check_outputs(out, device)
            if tensors is None:
                raise RuntimeError(f"timed call {key}: {problem}")
            shipped.append(tensors)
    path = os.path.join(t["work_dir"], "shipped.pt")
    torch.save({"shipped": shipped}, path)
    send({"kind": "shipped", "path": path})


# Every thread spins until one deadline, set by whichever thread starts first (compare-and-swap on a zeroed
# slot), so all blocks leave together: none frees its SM early for someone else's kernel.
_HOLD_PTX = """.version 7.0
.target sm_70
.address_size 64
.visible .entry pacevolve_hold(.param .u64 ns, .param .u64 slot)
.maxnreg 32
{
    .reg .u64 %now, %deadline, %first, %addr;
    .reg .pred %wait;
    ld.param.u64 %deadline, [ns];
    ld.param.u64 %addr, [slot];
    cvta.to.global.u64 %addr, %addr;
    mov.u64 %now, %globaltimer;
    add.u64 %deadline, %deadline, %now;
    atom.global.cas.b64 %first, [%addr], 0, %deadline;
    setp.ne.u64 %wait, %first, 0;
    @%wait mov.u64 %deadline, %first;
SPIN:
    mov.u64 %now, %globaltimer;
    setp.lt.u64 %wait, %now, %deadline;
    @%wait bra SPIN;
    ret;
}
"""


def _make_hold(device) -> "_GpuHold | None":
    if device.type != "cuda":
        return None
    try:
        return _GpuHold(device)
    except Exception as e:  # noqa: BLE001 - then KernelBench's protocol without a lead; timing says lead_ms 0
        print(f"pacevolve: no timing lead ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


class _GpuHold:
    """A kernel that fills every warp slot of every SM and spins for a given time: the timing's lead.

    While it runs the call's first launches are queued behind it, so the host's latency cannot show in the
    sample; and since no SM has room for another block, work the candidate might start on a stream of its
    own during the lead cannot run either. (torch.cuda._sleep, a single thread, would leave the GPU free
    for that.) PTX loaded through the driver, so nothing is compiled.
    """

    def __init__(self, device):
        import ctypes
        import torch
        props = torch.cuda.get_device_properties(device)
        per_sm = getattr(props, "max_threads_per_multi_processor", 0) or 2048
        self.block = next(b for b in (1024, 768, 512, 256, 128, 64, 32) if per_sm % b == 0)
        self.grid = props.multi_processor_count * (per_sm // self.block)
        self._slot = torch.zeros(1, dtype=torch.int64, device=device)
        cuda = ctypes.CDLL("libcuda.so.1")
        module, self._fn = ctypes.c_void_p(), ctypes.c_void_p()
        torch.cuda.current_stream(device).synchronize()  # the primary context is current on this thread
        for call, args in ((cuda.cuModuleLoadData, (ctypes.byref(module), ctypes.c_char_p(_HOLD_PTX.encode()))),
                           (cuda.cuModuleGetFunction, (ctypes.byref(self._fn), module, b"pacevolve_hold"))):
            err = call(*args)
            if err:
                raise RuntimeError(f"{call.__name__} failed with CUDA error {err}")
        self._cuda, self._ctypes, self._torch, self._device = cuda, ctypes, torch, device
        self(0.01)  # loaded now (lazy module loading would otherwise delay the first lead)
        torch.cuda.current_stream(device).synchronize()

    def __call__(self, ms: float) -> None:
        """Queue the hold on the current stream."""
        c = self._ctypes
        self._slot.zero_()
        ns, slot = c.c_uint64(int(ms * 1e6)), c.c_uint64(self._slot.data_ptr())
        params = (c.c_void_p * 2)(c.cast(c.pointer(ns), c.c_void_p), c.cast(c.pointer(slot), c.c_void_p))
        stream = c.c_void_p(self._torch.cuda.current_stream(self._device).cuda_stream)
        err = self._cuda.cuLaunchKernel(self._fn, c.c_uint(self.grid), c.c_uint(1), c.c_uint(1), c.c_uint(self.block),
                                        c.c_uint(1), c.c_uint(1), c.c_uint(0), stream, params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err}")


def _spin_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured now (the clock moves with load)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / max(start.elapsed_time(end), 1e-3)


def _peak_bytes(device) -> int:
    """Peak memory so far: the GPU's allocations, or on the CPU the process's resident set (informational:
    run.py reports it for the reference; nothing is judged by it)."""
    import torch
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024   # Linux reports KiB
