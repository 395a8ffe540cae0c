"""The worker roles: builder, runner (the candidate's process), reference worker and precompiler.

`python -I -B -c BOOT CODE_DIR --worker FD [warm PARENT_PID]` (protocol.BOOT: CODE_DIR, the private copy's
import directory, goes on the path, then main() here) reads jobs on stdin and answers on pipe FD (protocol.py
has the table of message kinds). The builder and runner execute untrusted code; the reference worker never
does, and computes every reference output and every comparison; the precompiler, confined as a builder,
runs one compiler command of the parent's on a prefix a build asked for (prefixes.py).
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import traceback
from typing import Any

from .batches import Batches, Prober, drain, module_call, release_collections, reset_persisting_l2
from .build import _exec_source, _install_build_defaults
from . import tensorfile
from .common import _flat, compare_outputs, open_lock
from .confine import confine, confine_builder, pin_threads
from .namespace import show_cpus
from . import vmm
from .host_batches import Arena, GpuArena, HostBatches, HostInputs
from .inputs import (_build_model, _check_outputs, _clone_inputs, _inputs_unchanged, _make_inputs, _poison,
                     _setup_torch, _short_traceback, _sync, perturbed_names)
from .protocol import LineReader, check_parent


def main() -> None:
    """Entry point of every worker process (argv: CODE_DIR --worker FD [warm PARENT_PID])."""
    # Started with `python -I` (no script directory, no user site, no PYTHON* variables): the import
    # directories go after the standard library and site-packages, as the private code did (protocol.BOOT),
    # so a module dropped there cannot stand in for a library one.
    sys.path += [d for d in os.environ.get("PACEVOLVE_EVAL_PATH", "").split(os.pathsep) if d]
    _become_subreaper()
    chan = os.fdopen(int(sys.argv[3]), "wb", buffering=0)
    stdin = LineReader()
    nonce_box: dict = {}

    def send(msg: dict) -> None:
        chan.write((json.dumps(dict(msg, nonce=nonce_box["n"])) + "\n").encode())

    if sys.argv[4:5] == ["warm"]:
        # A spare pays for the torch import while the previous candidate runs; CUDA waits for "prep".
        check_parent(int(sys.argv[5]))
        import torch  # noqa: F401
        import torch.utils.cpp_extension  # noqa: F401
    job = stdin.readline()
    if "role" not in job:  # the evaluator closed our stdin before giving us work
        os._exit(0)
    nonce_box["n"] = job.pop("nonce", "")
    state = None
    if job["role"] == "prep":  # a runner: get ready first, then take one job
        try:
            state = _prepare_runner(job, send, stdin)
        except BaseException as e:  # noqa: BLE001
            send({"kind": "error", "where": "runner start-up", "error": f"{type(e).__name__}: {e}"})
            os._exit(1)
        job = stdin.readline()
        if "role" not in job:
            os._exit(0)
        job.pop("nonce", None)
    os.environ.update(job.get("env", {}))  # build dir and arch list of this candidate
    role = job["role"]
    if job.get("cpus") and role in ("build", "run", "precompile"):
        show_cpus(job["cpus"])   # what counts the machine's cores (ninja, OpenMP sized by it) counts these
    if role == "build":
        # Before any candidate code: on its cores, and so is every compiler it starts (confine.py).
        confine_builder(job.get("cpus"), locks=bool(job.get("locks", True)))
        _role_build(job, send)
    elif role == "precompile":
        confine_builder(job.get("cpus"), locks=bool(job.get("locks", True)))
        _role_precompile(job, send)
    elif role == "run":
        # Before any candidate code: this process and all it starts stay on the runner's cores (confine.py).
        state["confined"] = confine(job.get("cpus"), no_processes=bool(job.get("no_processes")))
        _role_run(job, state, send, stdin.readline)
    elif role == "ref":
        if job.get("cpus"):
            pin_threads(job["cpus"])
        _role_ref(job, send, stdin.readline)
    elif role == "probe":
        if job.get("cpus"):
            pin_threads(job["cpus"])
        _role_probe(job, send, stdin)
    sys.stdout.flush()
    # The channel's write end is also held by the namespace's launcher (unshare), so closing it here is
    # no end-of-file the parent sees: an explicit last record says that nothing more is coming.
    send({"kind": "end"})
    chan.close()
    # Stay alive until the evaluator lets go (stdin closes, or it kills us): while we live, everything the
    # candidate started is our descendant, so the evaluator finds it by ancestry.
    while stdin.readline().get("cmd") != "quit":
        pass
    os._exit(0)  # skip interpreter teardown: a candidate's atexit hooks or finalizers must not run late


# ------------------------------------------------------------------------------------------ builder
def _role_build(job: dict, send) -> None:
    """Exec the candidate with no GPU visible, and construct its ModelNew once from the reference's
    get_init_inputs(), so the load_inline builds of its import and of its constructor land in the
    per-source directory (a runner may not start a compiler)."""
    record = _install_build_defaults(job["build"])
    t0 = time.perf_counter()
    try:
        ns = _exec_source(job["candidate_src"], "<candidate>")
        ok = "ModelNew" in ns
        if ok and job.get("reference_src") and "cpp_extension" in job["candidate_src"]:   # it may build
            import torch
            init = _exec_source(job["reference_src"], "<reference>")["get_init_inputs"]()
            with torch.no_grad():
                ns["ModelNew"](*init)
        send({"kind": "built", "compile_s": time.perf_counter() - t0, "has_model": ok, "calls": record["calls"],
              **_headers_used(record)})
    except BaseException as e:  # noqa: BLE001 - any failure is reported, never raised
        if record["error"]:
            send({"kind": "compile_error", "error": record["error"][-20000:], "compile_s": time.perf_counter() - t0,
                  **_headers_used(record)})
        else:  # code that needs the GPU (at import, in the constructor) fails here; the run reports it properly
            send({"kind": "built", "compile_s": time.perf_counter() - t0, "has_model": True,
                  "deferred_error": _short_traceback(e), "calls": record["calls"], **_headers_used(record)})


def _role_precompile(job: dict, send) -> None:
    """Compile a prefix a build asked for (prefixes.py) into its precompiled form, confined as a builder
    is; no candidate code runs here, and the command is the parent's (checked against its allow-list)."""
    import resource
    import subprocess
    t0 = time.perf_counter()

    def bounded() -> None:   # the compiler's memory and CPU time (its text is candidate code's choice)
        memory, seconds = int(job.get("memory", 4 << 30)), int(job.get("timeout_s", 60))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds))

    try:
        proc = subprocess.run(job["command"], capture_output=True, text=True, timeout=job.get("timeout_s", 60),
                              preexec_fn=bounded)
        send({"kind": "precompiled", "returncode": proc.returncode, "error": proc.stderr[-2000:],
              "seconds": time.perf_counter() - t0})
    except (OSError, subprocess.TimeoutExpired) as e:
        send({"kind": "precompiled", "returncode": -1, "error": f"{type(e).__name__}: {e}",
              "seconds": time.perf_counter() - t0})


def _headers_used(record: dict) -> dict:
    return {"headers": record.get("headers"), "light": record.get("light"), "pch": record.get("pch"),
            "binding": record.get("binding"), "prefix": record.get("prefix"),
            "optimised": record.get("optimised"), "wants_optimised": record.get("wants_optimised")}


# ------------------------------------------------------------------------------------------ runner
def _prepare_runner(prep: dict, send, stdin: LineReader) -> dict:
    """Everything a runner does before it sees a candidate: torch set up, CUDA and its libraries warm, the
    reference module loaded. A spare runner does this while no candidate waits.

    This work happens only under the device's lock: a spare takes the file lock itself, unless its job
    arrives first (the parent holds the lock for it then), so a spare warming up never overlaps a timing.
    """
    import torch
    marks = {"torch_imported": time.time()}
    device = torch.device(prep["device"])
    lock = _take_gpu_lock(prep.get("gpu_lock"), stdin)
    try:
        _setup_torch(prep, device)
        a = torch.randn(64, 64, device=device)
        (a @ a).sum().item()
        torch.nn.functional.conv2d(a.view(1, 1, 64, 64), a[:3, :3].reshape(1, 1, 3, 3)).sum().item()
        reset_persisting_l2(device)
    finally:
        if lock is not None:
            lock.close()  # closing the file releases the lock
    marks["cuda_ready"] = time.time()
    state = {"device": device, "ref_ns": _exec_source(prep["reference_src"], "<reference>"),
             "call": module_call()}   # before any candidate code: the model is called the reference's way
    marks["reference_ready"] = time.time()
    send({"kind": "ready", "marks": marks})
    return state


def _take_gpu_lock(path: str | None, stdin: LineReader):
    """The GPU's file lock, or None as soon as a job line is waiting (its sender holds the lock)."""
    if not path:
        return None
    f = open_lock(path)   # made by the parent; read-only in the namespace
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if stdin.wait(0.02):
                f.close()
                return None


def _role_run(job: dict, state: dict, send, recv) -> None:
    """The candidate process (also used for the baseline with the reference Model). Used once: the trials,
    then the batches the parent times, then the outputs it asks for."""
    import torch
    device, ref_ns = state["device"], state["ref_ns"]
    marks = {"job_received": time.time()}
    shared = None   # (GPU) the region the reference worker writes inputs into and reads outputs from
    try:
        if device.type == "cuda" and job.get("region"):   # mapped before any candidate code runs
            r = job["region"]
            region = vmm.Region.open(_receive_fd(int(r["channel"])), int(r["size"]), device.index or 0)
            shared = (GpuArena(region, int(r["inputs"])), vmm.Pool(region, int(r["inputs"])))
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "runner start-up", "error": f"the shared GPU memory: {_short_traceback(e)}"})
        return
    try:
        if job["mode"] == "baseline":
            cls = ref_ns["Model"]
        else:
            _install_build_defaults(dict(job["build"], prebuilt=True))
            cls = _exec_source(job["candidate_src"], "<candidate>")["ModelNew"]
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "import", "error": _short_traceback(e)})
        return
    marks["candidate_loaded"] = time.time()
    outputs, unmapped, relaid = [], [], []
    models: dict[tuple, Any] = {}
    ref_params = list(zip(job.get("ref_names") or [], job.get("ref_shapes") or []))
    own = [n for n, _ in ref_params]   # (the baseline: the reference's own model) what it perturbs
    try:
        for k, spec in enumerate(job["trials"]):
            key = (spec["weight_seed"], spec["perturb"])
            if key not in models:
                models[key], missing = _build_model(cls, ref_ns, spec["weight_seed"], spec["perturb"], device,
                                                    ref_params if job["mode"] == "candidate" else None, own, relaid)
                unmapped += missing
            model = models[key]
            xs = _make_inputs(ref_ns, spec, device)
            pristine = _clone_inputs(xs)
            _poison(device, job["poison_bytes"])
            with torch.no_grad():
                out = model(*xs)
            _sync(device)
            if not _inputs_unchanged(xs, pristine):  # it must not rewrite its inputs (it runs on copies anyway)
                send({"kind": "rejected", "error": f"inputs were modified in place (trial {k})"})
                return
            tensors, problem = _check_outputs(out, device)
            if tensors is None:
                send({"kind": "rejected", "error": problem})
                return
            outputs.append(tensors)
            marks.setdefault("first_trial_done", time.time())
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "forward", "error": _short_traceback(e)})
        return
    marks["trials_run"] = time.time()
    path = os.path.join(job["work_dir"], "trials.bin")
    tensorfile.write(path, {str(k): ts for k, ts in enumerate(outputs)})
    marks["trials_done"] = time.time()
    send({"kind": "outputs", "path": path, "unmapped": unmapped, "relaid": sorted(set(relaid)), "marks": marks,
          "confined": state.get("confined")})
    # The timed calls run on the weights the parent drew for this evaluation (built for a trial above).
    timed = job.get("timed_weights") or {"weight_seed": job["trials"][0]["weight_seed"], "perturb": False}
    model = models[(timed["weight_seed"], bool(timed["perturb"]))]
    del models, outputs
    # The reference's own runner serves many evaluations, each with its weights; a candidate's has one set.
    weigh = ((lambda seed, perturb: _build_model(cls, ref_ns, seed, perturb, device, None, own)[0])
             if job["mode"] == "baseline" else None)
    try:
        if device.type == "cpu":
            arena = job["arena"]
            _serve_host(HostBatches(model, Arena(int(arena["fd"]), int(arena["size"])), state["call"]), send, recv,
                        weigh)
        elif shared is not None:
            _serve_host(HostBatches(model, shared[0], state["call"], pool=shared[1].pool), send, recv, weigh)
        else:
            _serve_batches(Batches(model, ref_ns, device, job["on_device"], state["call"]), send, recv)
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "timing", "error": _short_traceback(e)})


def _serve_host(batches: HostBatches, send, recv, weigh=None) -> None:
    """(CPU, and a GPU with shared memory) go, as many batches as the parent asks for: the parent stops
    this process between them. With weigh (the reference's runner), also new weights between timings."""
    import torch
    while True:
        req = recv()
        if req.get("cmd") == "weights" and weigh is not None:
            try:
                batches.model = None   # (GPU) the old weights' memory goes back before the new are made
                batches.model = weigh(int(req["weight_seed"]), bool(req["perturb"]))
                if batches.pool is not None:   # (GPU) its copies to the device are over before the answer
                    torch.cuda.synchronize()
                send({"kind": "weighed"})
            except BaseException as e:  # noqa: BLE001
                send({"kind": "error", "where": "weights", "error": _short_traceback(e)})
            continue
        if req.get("cmd") != "go":
            return
        try:
            reply = {"kind": "done", **batches.go(req["layout"])}
        except torch.cuda.OutOfMemoryError as e:   # (GPU) its outputs outgrew the region: the parent may ask
            reply = {"kind": "error", "where": "timing", "error": _short_traceback(e), "out_of_memory": True}
        send(reply)   # for fewer calls a batch (Steps._fitting_cand_batch)


def _serve_batches(batches: Batches, send, recv) -> None:
    """(GPU) draw / go / digest, as many batches as the parent asks for, then ship."""
    while True:
        req = recv()
        cmd = req.get("cmd")
        if cmd == "draw":
            reset_persisting_l2(batches.device)
            batches.draw(req["seed"], req["n"], req["batch"])
            send({"kind": "drawn"})
        elif cmd == "go":
            batches.go()
            send({"kind": "done"})
        elif cmd == "digest":
            send({"kind": "digests", "digests": batches.digest()})
        elif cmd == "ship":
            batches.ship(req["path"], list(req.get("calls") or []))
            send({"kind": "shipped"})
        else:
            return


# ------------------------------------------------------------------------------------------ reference worker
def _role_ref(job: dict, send, recv) -> None:
    """Persistent reference worker: device info, reference outputs, its half of every timing, every
    comparison. Never sees candidates."""
    import torch
    device = torch.device(job["device"])
    _setup_torch(job, device)
    ref_ns = _exec_source(job["reference_src"], "<reference>")
    model = _build_model(ref_ns["Model"], ref_ns, 42, False, device, None)[0]
    names = perturbed_names(ref_ns, model)
    params = dict(model.named_parameters())
    shapes = [list(params[n].shape) for n in names]
    models: dict[tuple, Any] = {(42, False): model}
    prepared: dict[str, list] = {}
    xs = _make_inputs(ref_ns, {"seed": 0, "dist": "own", "on_device": job.get("on_device", True)}, device)
    in_bytes = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    with torch.no_grad():
        out = [o for o in _flat(model(*xs)) if isinstance(o, torch.Tensor)]  # CUDA and the kernels warm up
    out_bytes = sum(o.numel() * o.element_size() for o in out)
    del out
    peak_bytes = _peak_bytes(model, xs, device)
    del xs
    info = {"ref_names": names, "ref_shapes": shapes, "in_bytes": in_bytes, "out_bytes": out_bytes,
            "peak_bytes": peak_bytes, **_device_info(device)}
    own_cpus = _affinity()
    batches: Batches | HostInputs | None = None
    arenas: dict = {}   # (during a timing) both runners' input files (CPU) or regions (GPU)
    regions: dict[int, vmm.Region] = {}   # (GPU) every runner's region, made here, by id
    if device.type == "cuda":
        info["shared_memory"] = _can_share(device)
    send({"kind": "ready", **info})
    while True:
        req = recv()
        cmd = req.get("cmd")
        if cmd == "quit":
            return
        try:
            if cmd == "timing":  # a new conversation: fresh batches, on the runner's cores
                pin_threads(req.get("cpus") or own_cpus)
                if device.type == "cpu":   # the runners' input files, opened through the parent
                    _close_arenas(arenas)
                    arenas.update({side: Arena.open(a["path"], int(a["size"])) for side, a in req["arenas"].items()})
                    batches = HostInputs(ref_ns, arenas)
                elif req.get("regions"):   # the runners' regions, made here
                    _close_arenas(arenas)
                    arenas.update({side: GpuArena(regions[int(r["id"])], int(r["inputs"]))
                                   for side, r in req["regions"].items()})
                    batches = HostInputs(ref_ns, arenas, device,
                                         job.get("on_device", True))
                else:
                    batches = Batches(_timing_model(ref_ns, models, device, req.get("weights"), names), ref_ns, device,
                                      job.get("on_device", True))
                reply = {"kind": "timing"}
            elif cmd == "fill":   # (CPU) the next batch's inputs, into the file of the runner named
                reply = {"kind": "filled", "layout": batches.fill(req["seed"], req["n"], req["target"],
                                                                   req.get("pick"))}
            elif cmd == "draw":
                reset_persisting_l2(device)
                batches.draw(req["seed"], req["n"], req["batch"], req.get("keep"))
                send({"kind": "drawn"})   # at once: the parent's clock runs
                continue
            elif cmd == "go":
                batches.go()
                send({"kind": "done"})
                continue
            elif cmd == "digest":
                batches.digest()
                send({"kind": "digests"})
                continue
            elif cmd == "region":   # (GPU) a runner's memory; the parent takes our descriptor for it
                r = vmm.Region.make(int(req["size"]), device.index or 0)
                regions[id(r)] = r
                reply = {"kind": "region", "id": id(r), "fd": r.fd, "size": r.size}
            elif cmd == "region_taken":   # the parent holds the descriptor now: ours goes
                r = regions[int(req["id"])]
                os.close(r.fd)
                r.fd = -1
                reply = {"kind": "ok"}
            elif cmd == "free_region":   # its runner is gone
                r = regions.pop(int(req["id"]), None)
                if r is not None:
                    r.close()
                reply = {"kind": "ok"}
            elif cmd == "check" and req.get("in_regions"):   # (GPU, shared memory) read here, from the regions
                reply = {"kind": "checked", "results": batches.check_regions(
                    req["items"], req["rtol"], req["atol"], req["l2_tol"])}
            elif cmd == "check":
                paths = [req["path"], req["ref_path"]] if isinstance(batches, HostInputs) else [req["path"]]
                reply = {"kind": "checked", "results": batches.check(*paths, req["items"], req["rtol"],
                                                                     req["atol"], req["l2_tol"])}
            elif cmd == "pin":  # back to our own cores (null) and to normal collection after a timing
                pin_threads(req.get("cpus") or own_cpus)
                batches = None
                _close_arenas(arenas)
                release_collections()
                reply = {"kind": "pinned"}
            elif cmd == "prepare":
                prepared.clear()  # at most one evaluation's reference outputs are kept
                held, cap, outs = 0, req.get("max_bytes", 1 << 31), None
                for item in req["items"]:
                    outs = _reference_outputs(item, ref_ns, models, device, names)
                    held += sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))
                    if held > cap:
                        break  # big outputs: the rest is computed at comparison time, one at a time
                    prepared[_item_key(item)] = outs
                del outs
                reply = {"kind": "prepared", "count": len(prepared)}
            else:
                reply = _ref_compare(req, ref_ns, models, prepared, device, names)
        except BaseException as e:  # noqa: BLE001
            reply = {"kind": "error", "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:]}
        if device.type == "cuda":
            # Memory goes back to the device between evaluations (a runner shares it), never during a
            # timing: the next batch would pay cudaMalloc for every input and output the cache had held
            # (a 10 us softmax read 2.7x slower on the reference's side).
            if cmd in ("compare", "pin"):
                torch.cuda.empty_cache()
            torch.cuda.synchronize()  # all our GPU work is over before the reply: a timing may start on it
        send(reply)


def _role_probe(job: dict, send, stdin: LineReader) -> None:
    """(GPU) A CUDA context of its own that probes the device on request (batches.Prober): after either
    side's steps, so both pay the same switches of the GPU from one context to another, and neither's own
    work is idle time for the other."""
    import torch
    device = torch.device(job["device"])
    torch.cuda.set_device(device)
    prober = Prober(device)
    for _ in range(5):
        prober.probe()
    runs = [prober.probe() for _ in range(9)]
    idle = {k: sorted(r[k] for r in runs)[4] for k in runs[0]}
    send({"kind": "ready", "probe_ms": idle["ms"], "probe_copy_ms": {"h2d": idle["h2d"], "d2h": idle["d2h"]}})
    while (req := stdin.readline()).get("cmd") in ("drain", "now"):
        if req["cmd"] == "now":   # the parent's start of an armed drain that the runner's answer started
            continue
        if req.get("armed"):   # start the moment the runner answers, or the parent says (Device.drain)
            watched = _receive_fd(job["channel"]) if req.get("watch") else -1
            try:
                _await_answer(stdin, watched)
            finally:
                if watched >= 0:
                    os.close(watched)
        send({"kind": "drained", **drain(prober.probe, req["limits"], req["first_limits"], int(req["runs"]),
                                         float(req["max_s"]), check=req.get("check"))})


def _await_answer(stdin: LineReader, watched: int) -> None:
    """(The prober) Poll, never sleep, until anything waits on the runner's results' pipe (`watched`,
    looked at, never read: the parent reads it) or a line waits on our stdin. Any byte, not a whole
    answer: the parent reads what arrives, whole lines or not, so a runner that wrote its answer in two
    parts left nothing whole to see (nineteenth red team, when the prober peeked at a socket for whole
    lines). A runner that writes early only starts the drain early: it then probes while the calls run,
    and a drain found quiet before the runner has stopped is followed by another (drains.Drains._drain)."""
    import select
    while not stdin.wait(0):
        if watched >= 0 and select.select([watched], [], [], 0)[0]:
            return
        os.sched_yield()


def _peak_bytes(model, xs: list, device) -> int:
    """(GPU) The most memory one call of the reference holds at once beyond its inputs (its outputs and
    temporaries): what a region must leave for a call (Device.region_layout)."""
    import torch
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        out = model(*xs)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return max(0, int(peak))


def _receive_fd(channel: int) -> int:
    """The descriptor the parent sent on our descriptor channel (before the job that names it)."""
    import socket
    chan = socket.socket(fileno=channel)
    chan.settimeout(60)
    try:
        _, fds, _, _ = socket.recv_fds(chan, 16, 1)
    finally:
        chan.detach()
    if not fds:
        raise OSError("no descriptor arrived on the channel")
    return fds[0]


def _can_share(device) -> str:
    """(GPU) "yes" if this process can make device memory another process maps by descriptor, else why not."""
    try:
        vmm.Region.make(1, device.index or 0).close()
        return "yes"
    except (OSError, RuntimeError, AttributeError) as e:
        return f"no: {e}"


def _close_arenas(arenas: dict) -> None:
    for a in arenas.values():
        a.close()
    arenas.clear()


def _timing_model(ref_ns: dict, models: dict, device, weights: dict | None, names: list[str]):
    """The reference with the weights the runners' timed calls run on (the evaluation's: weights;
    the seed-42 ones without)."""
    key = (int(weights["weight_seed"]), bool(weights["perturb"])) if weights else (42, False)
    if key not in models:
        models.clear()  # keep at most one set of weights resident
        models[key] = _build_model(ref_ns["Model"], ref_ns, key[0], key[1], device, None, names)[0]
    return models[key]


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def _item_key(item: dict) -> str:
    spec = item["spec"]
    return json.dumps([spec["seed"], spec["dist"], spec["weight_seed"], bool(spec["perturb"])])


def _reference_outputs(item: dict, ref_ns: dict, models: dict, device, names: list[str]) -> list:
    import torch
    spec = item["spec"]
    key = (spec["weight_seed"], bool(spec["perturb"]))
    if key not in models:
        models.clear()  # keep at most one set of weights resident
        models[key] = _build_model(ref_ns["Model"], ref_ns, spec["weight_seed"], key[1], device, None, names)[0]
    xs = _make_inputs(ref_ns, spec, device)
    with torch.no_grad():
        return [r.detach() for r in _flat(models[key](*xs))]


def _ref_compare(req: dict, ref_ns: dict, models: dict, prepared: dict, device, names: list[str]) -> dict:
    """Compare the trials' saved outputs with the reference's, one trial at a time (a trial's outputs are
    read only once the reference's are known: their size bounds what is read)."""
    results = []
    for item in req["items"]:
        ref = prepared.pop(_item_key(item), None)
        if ref is None:
            ref = _reference_outputs(item, ref_ns, models, device, names)
        key = str(item["index"])
        got = tensorfile.read(req["path"], [key], tensorfile.bound(ref)).get(key)
        if got is None:
            results.append({"ok": False, "reason": "an output the evaluator asked for is missing, unreadable or "
                            "far larger than the reference's"})
            continue
        results.append(compare_outputs(got, ref, req["rtol"], req["atol"], req["l2_tol"]))
    return {"kind": "compared", "results": results}


def _device_info(device) -> dict:
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device_name": "cpu"}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device_name=p.name, capability=[p.major, p.minor], total_mem=p.total_memory,
                    l2_bytes=getattr(p, "L2_cache_size", 50 << 20), sms=p.multi_processor_count,
                    cudnn=torch.backends.cudnn.version(), mem_bw_bytes_per_s=_copy_bandwidth(device))
    return info


def _copy_bandwidth(device, nbytes: int = 256 << 20, tries: int = 5) -> float:
    """Bytes moved per second by a device-to-device copy of nbytes (read + write), best of a few."""
    import torch
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(tries):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (best / 1e3)


def _become_subreaper() -> None:
    """Orphans of our descendants (a daemon that forked twice, setsid or not) are re-parented to us, not to
    init, so they stay in our tree for the evaluator's sweep."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
