"""Evaluation on a Ray cluster: one long-lived actor per GPU, each owning an evaluate_kernel.Evaluator.

    ev = RayEvaluator.for_task(task, address="auto", log_dir=...)   # actors started, one GPU model checked
    s0 = ev.baseline_ms()            # the reference timed by one actor on its GPU
    result = ev.evaluate(src)        # an EvalResult from the least-busy actor; thread-safe
    ev.close()

The search itself (islands, HCM, every LLM call) stays in the driver; only evaluation crosses to the
cluster, so the object above offers what run.py uses from a local Evaluator (evaluate, baseline_ms,
device_info, opts.cpu_threads, close) and run.py does not know where candidates run.

Design:
* Actors. One per GPU of the cluster (`num_gpus=1`: Ray gives each its own GPU through
  CUDA_VISIBLE_DEVICES, so its Evaluator owns cuda:0), or for a CPU task one per `cpus_per_actor` CPUs.
  Each owns an Evaluator: its baseline, build cache (per node), spare runners and timing lock. An actor
  takes several evaluations at once (max_concurrency): the Evaluator is thread-safe and times one candidate
  at a time while others build, as a local one does. The GPU actors of one node split its cores between
  them, so each Evaluator reserves a timing core of its own instead of all picking the same one.
* Dispatch. Each candidate goes to the ready actor with the fewest evaluations in flight.
* Baselines. Each Evaluator times the reference on its own GPU, and a result's baseline_ms and speedup
  come from the GPU that timed the candidate. Runtimes from different GPU models do not compare, so a
  cluster that mixes models is refused at start-up (a replacement actor on another model is dropped).
* Faults. Ray never restarts an actor (max_restarts=0) nor re-sends a call (max_task_retries=0): a
  crashing candidate is never re-run behind the search's back. When an actor or its node dies during an
  evaluation, the driver replaces the actor (same resource request) and runs the evaluation once more on
  another actor; a candidate whose evaluation kills two actors is recorded as a runtime_error saying so.
  The run goes on as long as some actor can start.
* What travels. To an actor: the reference source, the Evaluator's options (device, tolerances, TF32, log
  and import folders) and candidate sources; back: EvalResult dicts. Never the driver's environment: the
  code travels as a Ray working_dir (the repository, run directories and caches left out), and an actor drops
  credential-looking variables (the names the evaluator keeps from candidates) that it inherited from
  whoever started Ray on its node, before it starts anything.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions

import evaluate_kernel
from evaluate_kernel import EvalResult
from evaluate_kernel.evaluator import task_settings

ACTOR_PREFIX = "pacevolve-eval-"
# the names the evaluator also keeps from candidate processes
CREDENTIAL = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
MAX_DEATHS = 2            # actors an evaluation may kill before it counts as the candidate's fault
LOCAL = "local"           # --ray local: start a Ray instance on this machine
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
_NOT_SHIPPED = [".git", "runs", ".cache", ".hypothesis", ".pytest_cache", ".benchmarks", "__pycache__", "*.pyc",
                "*.png", "*.html"]


class ClusterError(RuntimeError):
    """The cluster cannot serve this run (none found, no GPU, mixed GPU models, no actor starts)."""


@dataclass
class _Slot:
    """One actor as the driver sees it."""
    index: int
    name: str
    actor: Any
    ready: Any                      # the ObjectRef of actor.info(): resolves once its Evaluator is up
    info: dict | None = None        # set when ready
    in_flight: int = 0


@dataclass
class _Options:
    cpu_threads: int = 1            # what prompt_background.device_facts reads from a local Evaluator's opts


@dataclass
class Stats:
    reruns: int = 0                 # evaluations run again after their actor died
    replaced: int = 0               # actors started in place of dead ones
    deaths: list[str] = field(default_factory=list)


class RayEvaluator:
    """The driver's side: actors, dispatch to the least busy, replacement of dead ones."""

    def __init__(self, reference_src: str, *, address: str = "auto", device: str = "cuda",
                 cpus_per_actor: int = 1, max_actors: int | None = None, max_concurrency: int = 8,
                 start_timeout_s: float = 600.0, owns_ray: bool = False, **evaluator_kwargs):
        """owns_ray: Ray was started for this run by a caller's connect() and is shut down by close()."""
        self.device = device
        self._started_ray = connect(address) or owns_ray
        kw = dict(evaluator_kwargs, device=device)
        if kw.get("log_dir"):
            kw["log_dir"] = os.path.abspath(kw["log_dir"])
        kw["import_dirs"] = [os.path.abspath(d) for d in kw.get("import_dirs") or []]
        self._payload = {"reference_src": reference_src, "evaluator_kwargs": kw,
                         "driver_node": ray.get_runtime_context().get_node_id()}
        resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": cpus_per_actor}
        self._options = dict(resources, max_restarts=0, max_task_retries=0, max_concurrency=max_concurrency)
        self._token = secrets.token_hex(4)
        self._lock = threading.Lock()
        self._start_timeout_s = start_timeout_s
        self.stats = Stats()
        self.model: str | None = None
        self.slots: list[_Slot] = []
        try:
            count = _actor_count(device, cpus_per_actor, max_actors)
            self.slots = [self._start(i) for i in range(count)]
            self._wait_all_ready()
        except BaseException:
            self.close()
            raise
        self.opts = _Options(cpu_threads=int(kw.get("cpu_threads") or 1))

    @classmethod
    def for_task(cls, task, **overrides) -> "RayEvaluator":
        return cls(task.reference_src, **dict(task_settings(task), **overrides))

    # ---------------------------------------------------------------- the Evaluator's interface
    def evaluate(self, candidate_src: str) -> EvalResult:
        """The candidate's result from one actor; an actor that dies costs one run elsewhere."""
        deaths: list[str] = []
        while True:
            slot = self._take()
            try:
                raw = ray.get(slot.actor.evaluate.remote(candidate_src))
            except ray.exceptions.RayActorError as e:
                deaths.append(f"{slot.name} on {_host(slot)}: {_first_line(e)}")
                self._replace(slot, deaths[-1])
                if len(deaths) >= MAX_DEATHS:
                    return EvalResult("runtime_error", message=(
                        f"the candidate's evaluation killed {len(deaths)} evaluation workers in a row "
                        f"({'; '.join(deaths)}); it is not run again"), details={"ray": {"deaths": deaths}})
                with self._lock:
                    self.stats.reruns += 1
                continue
            except ray.exceptions.RayTaskError as e:   # the Evaluator raised: as a local one would
                self._release(slot)
                raise e.as_instanceof_cause() from None
            self._release(slot)
            result = EvalResult.from_dict(raw)
            result.details["ray"] = {"actor": slot.name, "node": _host(slot), "reruns": len(deaths),
                                     "deaths": deaths}
            return result

    def baseline_ms(self, gpu: int | None = None) -> float:
        """The reference's runtime on one actor's GPU (actor `gpu`, else the least busy)."""
        slot = self._take(self.slots[gpu] if gpu is not None else None)
        try:
            return ray.get(slot.actor.baseline_ms.remote())
        finally:
            self._release(slot)

    def device_info(self) -> dict:
        """The GPU facts of the cluster's model (all actors have the same)."""
        ready = [s for s in self.slots if s.info]
        return dict(ready[0].info["device_info"]) if ready else {}

    def actor_infos(self) -> list[dict]:
        return [dict(s.info, name=s.name) for s in self.slots if s.info]

    def close(self) -> None:
        slots, self.slots = self.slots, []
        closing = [s.actor.close.remote() for s in slots if s.info]
        try:
            ray.wait(closing, num_returns=len(closing), timeout=30)
        except Exception:
            pass
        for s in slots:
            _kill(s.actor)
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> "RayEvaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- actors
    def _start(self, index: int) -> _Slot:
        name = f"{ACTOR_PREFIX}{self._token}-{index}-{secrets.token_hex(2)}"
        actor = ray.remote(EvalActor).options(name=name, **self._options).remote(**self._payload)
        return _Slot(index, name, actor, actor.info.remote())

    def _wait_all_ready(self) -> None:
        refs = [s.ready for s in self.slots]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=self._start_timeout_s)
        if pending:
            raise ClusterError(f"{len(pending)} of {len(refs)} evaluation actors did not start within "
                               f"{self._start_timeout_s:g} s (resources requested per actor: "
                               f"{_resources(self._options)})")
        for slot in self.slots:
            try:
                slot.info = ray.get(slot.ready)
            except ray.exceptions.RayError as e:
                raise ClusterError(f"an evaluation actor did not start: {_first_line(e)}") from None
        if self.device == "cuda":
            self.model = one_gpu_model([s.info for s in self.slots])

    def _take(self, wanted: _Slot | None = None) -> _Slot:
        """The ready actor with the fewest evaluations in flight (or `wanted`), counted as one busier."""
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            self._poll_starting()
            with self._lock:
                ready = [s for s in self.slots if s.info is not None]
                if wanted is not None:
                    ready = [s for s in ready if s is wanted]
                if ready:
                    slot = min(ready, key=lambda s: (s.in_flight, s.index))
                    slot.in_flight += 1
                    return slot
                starting = [s.ready for s in self.slots if s.info is None]
            if not starting or time.monotonic() > deadline:
                raise ClusterError("no evaluation actor is alive, and none started within "
                                   f"{self._start_timeout_s:g} s (resources requested per actor: "
                                   f"{_resources(self._options)})")
            ray.wait(starting, num_returns=1, timeout=2.0)

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            slot.in_flight -= 1

    def _poll_starting(self) -> None:
        """Replacement actors that finished starting become ready (or are dropped, with their reason)."""
        with self._lock:
            starting = [s for s in self.slots if s.info is None]
        if not starting:
            return
        done, _ = ray.wait([s.ready for s in starting], num_returns=len(starting), timeout=0)
        for slot in (s for s in starting if s.ready in done):
            try:
                info = ray.get(slot.ready)
            except ray.exceptions.RayError as e:
                self._replace(slot, f"a replacement actor did not start: {_first_line(e)}")
                continue
            model = str(info["device_info"].get("device_name"))
            if self.model is not None and model != self.model:
                logging.warning("ray_evaluator: a replacement actor landed on a %s, not a %s: dropped", model,
                                self.model)
                with self._lock:
                    self.slots = [s for s in self.slots if s is not slot]
                _kill(slot.actor)
                continue
            with self._lock:
                slot.info = info

    def _replace(self, slot: _Slot, why: str) -> None:
        """The dead actor's place goes to a new one with the same resource request."""
        _kill(slot.actor)
        with self._lock:
            if slot not in self.slots:
                return   # another evaluation on the same actor replaced it already
            self.stats.deaths.append(why)
            if len(self.stats.deaths) > 10 * max(1, len(self.slots)) + 10:
                self.slots = [s for s in self.slots if s is not slot]
                logging.warning("ray_evaluator: evaluation actors keep dying; not replacing %s (%s)", slot.name, why)
                return
            fresh = self._start(slot.index)
            self.slots = [fresh if s is slot else s for s in self.slots]
            self.stats.replaced += 1


class EvalActor:
    """Runs on a cluster node: one Evaluator for the GPU (or CPUs) Ray gave this process."""

    def __init__(self, reference_src: str, evaluator_kwargs: dict, driver_node: str):
        self.dropped = drop_credentials(os.environ)
        here = ray.get_runtime_context().get_node_id()
        kw = dict(evaluator_kwargs)
        if kw.get("device") == "cuda":
            _take_core_share(here)
            kw["gpus"] = [0]   # the one GPU Ray made visible
        if kw.get("log_dir") and here != driver_node:   # the run directory lives on the driver's host
            kw["log_dir"] = os.path.join(tempfile.gettempdir(), "pacevolve-ray-logs",
                                         os.path.basename(os.path.dirname(kw["log_dir"])) or "run")
        self.evaluator = evaluate_kernel.Evaluator(reference_src, **kw)
        self.host = socket.gethostname()
        self._busy = 0
        self._lock = threading.Lock()

    def info(self) -> dict:
        ev = self.evaluator
        device = dict(ev.device_info()) if callable(getattr(ev, "device_info", None)) else (
            dict(ev.devices[0].info) if getattr(ev, "devices", None) else {})
        return {"device_info": device, "host": self.host, "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "env_names": sorted(os.environ),
                "dropped": self.dropped}

    def evaluate(self, candidate_src: str) -> dict:
        with self._lock:
            self._busy += 1
        try:
            return self.evaluator.evaluate(candidate_src).to_dict()
        finally:
            with self._lock:
                self._busy -= 1

    def baseline_ms(self) -> float:
        return self.evaluator.baseline_ms()

    def busy(self) -> int:
        """Evaluations in flight here (answered at once: the actor serves calls on several threads)."""
        return self._busy

    def close(self) -> None:
        self.evaluator.close()


def one_gpu_model(infos: list[dict]) -> str:
    """The GPU model all actors have; ClusterError naming the models when they differ."""
    models: dict[str, int] = {}
    for info in infos:
        model = str(info["device_info"].get("device_name"))
        models[model] = models.get(model, 0) + 1
    if len(models) != 1:
        raise ClusterError("the Ray cluster mixes GPU models (" + ", ".join(
            f"{n} x {m}" for m, n in sorted(models.items())) + "); runtimes from different models do not "
            "compare: run on GPUs of one model (e.g. one cluster per model)")
    return next(iter(models))


def drop_credentials(environ) -> list[str]:
    """Remove from `environ` every variable whose name looks like a credential; returns the names.
    Ray's own settings (RAY_*, e.g. a cluster's RAY_AUTH_TOKEN) stay with the actor that Ray runs; the
    evaluator still keeps them from candidate processes."""
    gone = [k for k in list(environ) if CREDENTIAL.search(k) and not k.startswith("RAY_")]
    for k in gone:
        del environ[k]
    return gone


# ----------------------------------------------------------------------------- helpers

def runtime_env() -> dict:
    """The code every actor runs: the repository, shipped by Ray (needed where nodes have no copy of it)."""
    return {"working_dir": _HERE, "excludes": _NOT_SHIPPED}


def connect(address: str) -> bool:
    """Connect to the cluster (or start a local instance for `local`); True when this call started Ray.
    Ray ships a working_dir only for a whole job, so a caller that connects first passes runtime_env().
    A failure is a ClusterError in run.py's words (Ray's own advice names flags run.py does not have)."""
    if ray.is_initialized():   # a caller (a test, a script) connected already
        return False
    kw = dict(logging_level=logging.WARNING, log_to_driver=False, runtime_env=runtime_env())
    try:
        if address == LOCAL:
            ray.init(include_dashboard=False, **kw)
        else:
            ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        text = _first_line(e)
        if "Could not find any running Ray instance" in text:
            text = "no Ray cluster is running on this machine"
        else:
            text = f"cannot reach a Ray cluster there ({text})"
        raise ClusterError(f"{text}; start one with `ray start --head` and pass --ray auto, reach one from "
                           "outside with --ray ray://HEAD:10001, or use --ray local to start Ray on this "
                           "machine alone") from None
    return True


def check_capacity(device: str, cpus_per_actor: int, max_actors: int | None) -> int:
    """The number of evaluation actors the connected cluster can hold; ClusterError when none."""
    return _actor_count(device, cpus_per_actor, max_actors)


def _actor_count(device: str, cpus_per_actor: int, max_actors: int | None) -> int:
    total = ray.cluster_resources()
    if device == "cuda":
        count = int(total.get("GPU", 0))
        if count == 0:
            raise ClusterError("the Ray cluster has no GPU: on each GPU host run `ray start "
                               "--address=HEAD:6379` (Ray finds its GPUs), or use --device cpu")
    else:
        count = int(total.get("CPU", 0) // cpus_per_actor)
        if count == 0:
            raise ClusterError(f"the Ray cluster has {total.get('CPU', 0):g} CPUs, fewer than --ray-cpus "
                               f"{cpus_per_actor} for one actor")
    return min(count, max_actors) if max_actors else count


def _take_core_share(node_id: str) -> None:
    """Restrict this process (and the workers it starts) to its share of the node's cores, by GPU index."""
    try:
        gpus_here = next(int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes()
                         if n.get("NodeID") == node_id and n.get("Alive"))
        position = int(ray.get_gpu_ids()[0]) % max(1, gpus_here)
        cores = sorted(os.sched_getaffinity(0))
    except (StopIteration, IndexError, ValueError, AttributeError, OSError):
        return
    if gpus_here < 2 or len(cores) < 2 * gpus_here:
        return
    share = len(cores) // gpus_here
    os.sched_setaffinity(0, cores[position * share:(position + 1) * share])


def _kill(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:   # gone already
        pass


def _host(slot: _Slot) -> str:
    return (slot.info or {}).get("host", "?")


def _resources(options: dict) -> str:
    return ", ".join(f"{k}={options[k]}" for k in ("num_gpus", "num_cpus") if k in options)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    return text[:300]
