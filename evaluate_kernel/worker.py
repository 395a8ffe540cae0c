"""The worker roles: builder, runner (the candidate's process) and reference worker.

`python -I -B -c BOOT CODE_DIR --worker FD [warm PARENT_PID]` (protocol.BOOT: CODE_DIR, the private copy's
import directory, goes on the path, then main() here) reads jobs on stdin and answers on pipe FD (protocol.py
has the table of message kinds). The builder and runner execute untrusted code; the reference worker never
does, and computes every reference output and every comparison.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

from .build import _exec_source, _install_build_defaults
from .common import _flat, compare_outputs, output_digest
from .inputs import (_build_model, _check_outputs, _clone_inputs, _inputs_unchanged, _make_inputs, _poison,
                         _setup_torch, _short_traceback, _sync)
from .protocol import _LineReader, _check_parent
from .timing import _make_hold, _reset_persisting_l2, _time_model, host_round, time_reference

class _Guard:
    """Identity of timing/comparison functions and thread counts, captured before the candidate is imported.

    Covers monkey-patched timers or comparisons (hack 6) and background threads finishing work after the
    timer stops (hack 4).
    """

    def __init__(self):
        import torch
        self._targets = {
            "torch.cuda.Event.record": (torch.cuda.Event, "record"),
            "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
            "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
            "torch.cuda.synchronize": (torch.cuda, "synchronize"),
            "torch.cuda.Event": (torch.cuda, "Event"),
            "time.perf_counter": (time, "perf_counter"),
            "time.monotonic": (time, "monotonic"),
            "torch.allclose": (torch, "allclose"),
            "torch.save": (torch, "save"),
            "torch.Tensor.cpu": (torch.Tensor, "cpu"),
            "torch.Tensor.__eq__": (torch.Tensor, "__eq__"),
            "torch.Tensor.clone": (torch.Tensor, "clone"),
            "json.dumps": (json, "dumps"),
            "os.write": (os, "write"),
        }
        self._ids = {k: id(getattr(obj, attr)) for k, (obj, attr) in self._targets.items()}
        self.py_threads = threading.active_count()
        self.os_threads = self._os_threads()

    @staticmethod
    def _os_threads() -> int:
        try:
            return len(os.listdir("/proc/self/task"))
        except OSError:
            return threading.active_count()

    def problems(self, when: str) -> list[str]:
        import torch
        out = [f"{k} was replaced ({when})" for k, (obj, attr) in self._targets.items()
               if id(getattr(obj, attr, None)) != self._ids[k]]
        # A torch function/dispatch mode left active intercepts every op, our checks included (hack 5).
        for probe in ("_len_torch_function_stack", "_len_torch_dispatch_stack"):
            if getattr(torch._C, probe, lambda: 0)() > 0:
                out.append(f"a torch function/dispatch mode is active ({when})")
        if threading.active_count() > self.py_threads:
            out.append(f"Python thread count grew {self.py_threads} -> {threading.active_count()} ({when})")
        if self._os_threads() > self.os_threads:
            out.append(f"OS thread count grew {self.os_threads} -> {self._os_threads()} ({when})")
        return out


def _role_build(job: dict, send) -> None:
    """Exec the candidate with no GPU visible, so its load_inline builds land in the per-source directory."""
    record = _install_build_defaults(job["build"])
    t0 = time.perf_counter()
    try:
        ns = _exec_source(job["candidate_src"], "<candidate>")
        ok = "ModelNew" in ns
        send({"kind": "built", "compile_s": time.perf_counter() - t0, "has_model": ok, "calls": record["calls"],
              **_headers_used(record)})
    except BaseException as e:  # noqa: BLE001 - any failure is reported, never raised
        if record["error"]:
            send({"kind": "compile_error", "error": record["error"][-20000:], "compile_s": time.perf_counter() - t0,
                  **_headers_used(record)})
        else:  # module-level code that needs the GPU fails here; the run reports it properly
            send({"kind": "built", "compile_s": time.perf_counter() - t0, "has_model": True,
                  "deferred_error": _short_traceback(e), "calls": record["calls"], **_headers_used(record)})


def _headers_used(record: dict) -> dict:
    return {"headers": record.get("headers"), "light": record.get("light")}


def _prepare_runner(prep: dict, send, stdin: "_LineReader") -> dict:
    """Everything a runner does before it sees a candidate: torch set up, CUDA and its libraries warm, the
    reference module loaded, the guard snapshot taken. A spare runner does this while no candidate waits.

    This work happens only under the device's lock: a spare takes the file lock itself, unless its job
    arrives first (the parent holds the lock for it then), so a spare warming up never overlaps a timing.
    """
    import torch
    marks = {"torch_imported": time.time()}
    device = torch.device(prep["device"])
    lock = _take_gpu_lock(prep.get("gpu_lock"), stdin)
    try:
        _setup_torch(prep, device)
        # Warm the libraries before the guard snapshot, so their own helper threads are not blamed on the candidate.
        a = torch.randn(64, 64, device=device)
        (a @ a).sum().item()
        torch.nn.functional.conv2d(a.view(1, 1, 64, 64), a[:3, :3].reshape(1, 1, 3, 3)).sum().item()
        _reset_persisting_l2(device)
        hold = _make_hold(device)  # before any candidate code runs in this process
    finally:
        if lock is not None:
            lock.close()  # closing the file releases the lock
    marks["cuda_ready"] = time.time()
    state = {"device": device, "ref_ns": _exec_source(prep["reference_src"], "<reference>"), "guard": _Guard(),
             "hold": hold}
    marks["reference_ready"] = time.time()
    send({"kind": "ready", "marks": marks})
    return state


def _take_gpu_lock(path: str | None, stdin: "_LineReader"):
    """The GPU's file lock, or None as soon as a job line is waiting (its sender holds the lock)."""
    if not path:
        return None
    f = open(path, "a")
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if stdin.wait(0.02):
                f.close()
                return None


def _role_run(job: dict, state: dict, send, recv) -> None:
    """The candidate process (also used for the baseline with the reference Model). Used once."""
    import torch
    device, ref_ns, guard = state["device"], state["ref_ns"], state["guard"]
    marks = {"job_received": time.time()}
    flags: list[str] = []
    t0 = time.perf_counter()
    try:
        if job["mode"] == "baseline":
            cls = ref_ns["Model"]
        else:
            _install_build_defaults(dict(job["build"], prebuilt=True))
            cls = _exec_source(job["candidate_src"], "<candidate>")["ModelNew"]
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "import", "error": _short_traceback(e)})
        return
    flags += guard.problems("after import")
    load_s = time.perf_counter() - t0
    marks["candidate_loaded"] = time.time()

    outputs, small, t_check = [], ([], []), time.perf_counter()
    models: dict[tuple, Any] = {}
    try:
        for k, spec in enumerate(job["trials"]):
            key = (spec["weight_seed"], spec["perturb"])
            if key not in models:
                models[key] = _build_model(cls, ref_ns, spec["weight_seed"], spec["perturb"], device)
                if spec["perturb"]:
                    small = models[key][1:]
            model = models[key][0]
            xs = _make_inputs(ref_ns, spec, device)
            pristine = _clone_inputs(xs)
            _poison(device, job["poison_bytes"])
            with torch.no_grad():
                out = model(*xs)
            _sync(device)
            # Hack 2: the candidate must not rewrite its inputs (it runs on its own copies anyway).
            if not _inputs_unchanged(xs, pristine):
                flags.append(f"inputs were modified in place (trial {k})")
            tensors, problem = _check_outputs(out, device)
            if tensors is None:
                send({"kind": "rejected", "error": problem, "flags": flags})
                return
            outputs.append(tensors)
            flags += guard.problems(f"after trial {k}")
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "forward", "error": _short_traceback(e), "flags": flags})
        return
    path = os.path.join(job["work_dir"], "trials.pt")
    torch.save({"outputs": outputs}, path)
    marks["trials_done"] = time.time()
    send({"kind": "outputs", "path": path, "names": small[0], "shapes": small[1], "flags": flags, "load_s": load_s,
          "check_s": time.perf_counter() - t_check, "marks": marks})
    timing = dict(job["timing"], work_dir=job["work_dir"])
    try:
        _time_model(models[(job["trials"][0]["weight_seed"], False)][0], ref_ns, timing, device, state["hold"],
                    send, recv)
    except BaseException as e:  # noqa: BLE001
        send({"kind": "error", "where": "timing", "error": _short_traceback(e), "flags": flags})
        return
    send({"kind": "done", "flags": flags + guard.problems("after timing")})


def _role_ref(job: dict, send, recv) -> None:
    """Persistent reference worker: device info, reference outputs and every comparison. Never sees candidates."""
    import torch
    device = torch.device(job["device"])
    _setup_torch(job, device)
    ref_ns = _exec_source(job["reference_src"], "<reference>")
    model, names, shapes = _build_model(ref_ns["Model"], ref_ns, 42, False, device)
    models: dict[tuple, Any] = {(42, False): model}
    prepared: dict[str, list] = {}
    xs = _make_inputs(ref_ns, {"seed": 0, "dist": "own", "on_device": job.get("on_device", True)}, device)
    in_bytes = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    with torch.no_grad():
        models[(42, False)](*xs)  # CUDA and the reference's kernels warm before the first comparison
    del xs
    hold = _make_hold(device)  # the timing lead, as in a runner
    digest_weights: dict = {}
    own_cpus = _affinity()
    send({"kind": "ready", "ref_names": names, "ref_shapes": shapes, "in_bytes": in_bytes, **_device_info(device)})
    while True:
        req = recv()
        if req.get("cmd") == "quit":
            return
        try:
            if req.get("cmd") == "time":
                reply = _ref_time(req, ref_ns, models, device, hold)
            elif req.get("cmd") == "round":  # the reference's host round, between two of the runner's
                busy_ms = _gpu_busy_ms(device)
                with torch.no_grad():
                    digests = host_round(_timing_model(ref_ns, models, device), ref_ns, req, req["timing"], device,
                                         digest_weights, lambda i, out: [o.clone() for o in out])
                send({"kind": "round", "digests": digests, "gpu_busy_ms": busy_ms})  # at once: the clock runs
                continue
            elif req.get("cmd") == "pin":  # onto the runner's cores for its rounds (null: back to ours)
                _pin_all_threads(req.get("cpus") or own_cpus)
                reply = {"kind": "pinned"}
            elif req.get("cmd") == "prepare":
                prepared.clear()  # at most one evaluation's reference outputs are kept
                held, cap, outs = 0, req.get("max_bytes", 1 << 31), None
                for item in req["items"]:
                    outs = _reference_outputs(item, ref_ns, models, device)
                    held += sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))
                    if held > cap:
                        break  # big outputs: the rest is computed at comparison time, one at a time
                    prepared[_item_key(item)] = outs
                del outs
                reply = {"kind": "prepared", "count": len(prepared)}
            else:
                reply = _ref_compare(req, ref_ns, models, prepared, device)
        except BaseException as e:  # noqa: BLE001
            reply = {"kind": "error", "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:]}
        if device.type == "cuda":
            if req.get("cmd") != "prepare":
                torch.cuda.empty_cache()
            torch.cuda.synchronize()  # all our GPU work is over before the reply: a timing may start on it
        send(reply)


def _ref_time(req: dict, ref_ns: dict, models: dict, device, hold) -> dict:
    """One block of the paired measurement, on the runner's core while the runner waits (our own cores
    may be busy with builds), then back on ours."""
    own = _affinity()
    if req.get("cpus"):
        _pin_all_threads(req["cpus"])
    try:
        busy_ms = _gpu_busy_ms(device)
        phase = time_reference(_timing_model(ref_ns, models, device), ref_ns, req["seed"], req["timing"], device, hold)
        busy_ms = max(busy_ms, _gpu_busy_ms(device))
    finally:
        if own:
            _pin_all_threads(own)
    return {"kind": "ref_timed", "gpu_busy_ms": busy_ms, **phase}


def _gpu_busy_ms(device) -> float:
    """How long a trivial kernel of ours takes to run from an idle stream: tens of microseconds, unless
    another process (the runner, whose host side sits idle now) left work running on the GPU, which the
    GPU then serves first or time-slices with ours. The parent rejects a candidate whose work was found
    running while its reference was being timed."""
    import torch
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(100)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _timing_model(ref_ns: dict, models: dict, device):
    """The reference with the seed-42 weights, as runners time it (the comparisons may have swapped in
    perturbed weights since)."""
    key = (42, False)
    if key not in models:
        models.clear()
        models[key] = _build_model(ref_ns["Model"], ref_ns, 42, False, device)[0]
    return models[key]


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def _perturbed(item: dict) -> bool:
    return bool(item["spec"]["perturb"])


def _item_key(item: dict) -> str:
    spec = item["spec"]
    return json.dumps([spec["seed"], spec["dist"], spec["weight_seed"], _perturbed(item), spec.get("set_index")])


def _reference_outputs(item: dict, ref_ns: dict, models: dict, device) -> list:
    import torch
    spec = item["spec"]
    perturb = _perturbed(item)
    key = (spec["weight_seed"], perturb)
    if key not in models:
        models.clear()  # keep at most one set of weights resident
        models[key] = _build_model(ref_ns["Model"], ref_ns, spec["weight_seed"], perturb, device)[0]
    xs = _make_inputs(ref_ns, spec, device)
    with torch.no_grad():
        return [r.detach() for r in _flat(models[key](*xs))]


def _ref_compare(req: dict, ref_ns: dict, models: dict, prepared: dict, device) -> dict:
    """Compare the saved outputs with the reference's; where an item carries a digest, the saved output must
    also be the one the runner committed to while it was timed (digest recomputed here, on our device)."""
    import torch
    loaded = torch.load(req["path"], map_location="cpu", weights_only=True)  # tensors only: nothing executes
    if not isinstance(loaded, dict):
        raise ValueError("output file is not a dict")
    results = []
    produced = loaded.get(req["field"], [])
    for item in req["items"]:
        if item["index"] >= len(produced) or not isinstance(produced[item["index"]], list):
            results.append({"ok": False, "reason": "an output the evaluator asked for is missing"})
            continue
        ref = prepared.pop(_item_key(item), None)
        if ref is None:
            ref = _reference_outputs(item, ref_ns, models, device)
        got = produced[item["index"]]
        result = compare_outputs(got, ref, req["rtol"], req["atol"], req["l2_tol"])
        if result["ok"] and "digest" in item:
            on_device = [o.to(device) for o in got]
            if str(int(output_digest(on_device))) != item["digest"]:
                result = {"ok": False, "reason": "the output shipped afterwards is not the one whose digest was sent "
                          "right after the call (computed later, or changed since)"}
        results.append(result)
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


def _pin_all_threads(cpus: list[int]) -> None:
    # A prepared runner already has CUDA's and torch's helper threads; each thread has its own affinity.
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass

def main() -> None:
    """Entry point of every worker process (argv: CODE_DIR --worker FD [warm PARENT_PID])."""
    # Started with `python -I` (no script directory, no user site, no PYTHON* variables): the import
    # directories go after the standard library and site-packages, as the private code did (protocol.BOOT),
    # so a module dropped there cannot stand in for a library one.
    sys.path += [d for d in os.environ.get("PACEVOLVE_EVAL_PATH", "").split(os.pathsep) if d]
    _become_subreaper()
    fd = int(sys.argv[3])
    chan = os.fdopen(fd, "wb", buffering=0)
    stdin = _LineReader()
    nonce_box: dict = {}

    def send(msg: dict) -> None:
        chan.write((json.dumps(dict(msg, nonce=nonce_box["n"])) + "\n").encode())

    if sys.argv[4:5] == ["warm"]:
        # A spare pays for the torch import while the previous candidate runs; CUDA waits for "prep".
        _check_parent(int(sys.argv[5]))
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
    if job.get("cpus"):
        _pin_all_threads(job["cpus"])  # also inherited by compilers the candidate's build starts
    os.environ.update(job.get("env", {}))  # build dir and arch list of this candidate
    role = job["role"]
    if role == "build":
        _role_build(job, send)
    elif role == "run":
        _role_run(job, state, send, stdin.readline)
    elif role == "ref":
        _role_ref(job, send, stdin.readline)
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


def _become_subreaper() -> None:
    """Orphans of our descendants (a daemon that forked twice, setsid or not) are re-parented to us, not to
    init, so they stay in our tree for the evaluator's sweep."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
