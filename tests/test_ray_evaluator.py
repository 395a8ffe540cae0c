"""--ray on the CPU: a local Ray instance (2 CPUs) started here, two evaluation actors on conv_groupnorm_small,
the rule-based LLM over a local HTTP server. Actors are killed by the test in the middle of evaluations."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from driver import cli  # noqa: E402
from driver import ray_evaluator  # noqa: E402
import run  # noqa: E402
import tasks  # noqa: E402
from fake_llm import RuleBasedLLM  # noqa: E402
from test_run import HONEST, PROGRAMS, _serve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-test-must-never-reach-an-actor"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # Set before Ray starts: its processes inherit the environment of whoever started them, as on a real
    # cluster where `ray start` runs in a shell that may hold keys.
    os.environ["PACEVOLVE_TEST_API_KEY"] = SECRET
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             object_store_memory=128 << 20,   # results are small
             runtime_env=ray_evaluator.runtime_env())
    yield
    ray.shutdown()
    os.environ.pop("PACEVOLVE_TEST_API_KEY", None)


def _kill_busy(times: int, stop: threading.Event) -> list[str]:
    """In a thread: ray.kill an actor while it evaluates, `times` times; returns the killed names."""
    killed: list[str] = []

    def watch():
        while len(killed) < times and not stop.is_set() and ray.is_initialized():
            actors = {}
            for name in ray.util.list_named_actors():
                if name.startswith(ray_evaluator.ACTOR_PREFIX) and name not in killed:
                    try:
                        actors[name] = ray.get_actor(name)
                    except ValueError:   # gone meanwhile
                        pass
            asked = {actor.busy.remote(): name for name, actor in actors.items()}
            # asked at once: an actor still starting must not hold up the question to the others
            done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0.2) if asked else ([], [])
            for ref in done:
                try:
                    busy = ray.get(ref)
                except ray.exceptions.RayError:
                    continue
                if busy:
                    ray.kill(actors[asked[ref]], no_restart=True)
                    killed.append(asked[ref])
                    break
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return killed


class TestEvaluator:
    """RayEvaluator itself: two actors for the class, closed before the runs below need the CPUs."""

    @pytest.fixture(scope="class")
    def ev(self, tmp_path_factory):
        evaluator = ray_evaluator.RayEvaluator.for_task(tasks.get("conv_groupnorm_small"), address="auto",
                                                   log_dir=str(tmp_path_factory.mktemp("logs")))
        yield evaluator
        evaluator.close()

    def test_two_actors_and_baseline_of_the_timing_actor(self, ev):
        assert len(ev.slots) == 2 and all(s.info for s in ev.slots)
        r = ev.evaluate(HONEST)
        assert r.status == "ok" and r.details["ray"]["reruns"] == 0
        assert r.speedup == pytest.approx(r.baseline_ms / r.runtime_ms, rel=0.05)   # median of ratios, near the medians' ratio
        assert ev.baseline_ms() > 0 and ev.opts.cpu_threads == 1

    def test_no_credential_reaches_an_actor(self, ev):
        for info in ev.actor_infos():
            assert "PACEVOLVE_TEST_API_KEY" in info["dropped"]   # Ray handed it over: the actor removed it
            assert not [n for n in info["env_names"] if "KEY" in n.upper()]
        assert SECRET.encode() not in pickle.dumps(ev._payload)

    def test_a_candidate_that_kills_two_workers_is_a_runtime_error(self, ev):
        stop = threading.Event()
        killed = _kill_busy(2, stop)
        r = ev.evaluate(HONEST.replace("6.0", "6.000"))
        stop.set()
        assert len(killed) == 2
        assert r.status == "runtime_error" and "killed 2 evaluation workers" in r.message
        assert all(name in r.message for name in killed)
        # both dead actors were replaced, and the replacements serve (one kill alone costs a re-run: the
        # run-level test below)
        assert len(ev.slots) == 2 and ev.stats.replaced == 2 and ev.stats.reruns == 1
        assert ev.evaluate(HONEST).status == "ok"


def _args(base_url, out, cache, generations=1, ray_address="auto"):
    args = ["--task", "conv_groupnorm_small", "--islands", "2", "--generations", str(generations),
            "--base-url", base_url, "--model", "fake-model", "--seed", "4", "--out", str(out),
            "--eval-cache", str(cache), "--quiet", "--head-to-head", "0"]   # shapes compare: no noise-dependent events
    return args + (["--ray", ray_address] if ray_address else [])


def _shape(out: Path) -> dict:
    """What a run's event log holds, less the values: keys per event type, islands and generations."""
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    keys: dict[str, set] = {}
    for e in events:
        keys.setdefault(e["type"], set()).update(set(e) - {"cached"})
    gens = sorted((e["island"], e["generation"]) for e in events if e["type"] == "generation")
    return {"keys": keys, "generations": gens}


def test_ray_run_survives_a_killed_actor_and_resumes(tmp_path):
    with _serve(RuleBasedLLM(PROGRAMS, seed=3, variants=True)) as base_url:
        assert run.main(_args(base_url, tmp_path / "local", tmp_path / "c1", ray_address=None)) == 0
        stop = threading.Event()
        killed = _kill_busy(1, stop)
        out = tmp_path / "ray"
        assert run.main(_args(base_url, out, tmp_path / "c2")) == 0
        stop.set()
        assert killed, "no evaluation was in flight to kill"
        assert _shape(out) == _shape(tmp_path / "local")
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        assert {e["status"] for e in events if e["type"] == "evaluation"} <= {"ok", "incorrect"}
        stored = [json.loads(p.read_text()) for p in (tmp_path / "c2").glob("*.json")]
        reruns = [d["details"]["ray"]["reruns"] for d in stored if "ray" in d.get("details", {})]
        assert 1 in reruns and set(reruns) <= {0, 1}
        # resume: the saved --ray is kept; one more generation
        assert run.main(["--resume", str(out), "--generations", "2", "--quiet"]) == 0
        state = json.loads((out / "checkpoint.json").read_text())
        assert state["round"] == 2
        assert _shape(out)["generations"] == sorted((i, g) for i in range(2) for g in range(1, 3))
        assert json.loads((out / "config.json").read_text())["config"]["ray"] == "auto"


def test_one_gpu_model_or_a_clear_refusal():
    info = lambda name: {"device_info": {"device_name": name}}
    assert ray_evaluator.one_gpu_model([info("NVIDIA H200"), info("NVIDIA H200")]) == "NVIDIA H200"
    with pytest.raises(ray_evaluator.ClusterError, match="mixes GPU models .*1 x NVIDIA A100, 1 x NVIDIA H200"):
        ray_evaluator.one_gpu_model([info("NVIDIA H200"), info("NVIDIA A100")])


def test_ray_may_change_on_resume():
    saved = {"task": "conv_groupnorm_small", "ray": "auto"}
    cfg, changes = cli.resume_config(saved, cli.parse_args(["--resume", "x", "--ray", "ray://head:10001"]),
                                     {"resume", "ray"})
    assert cfg.ray == "ray://head:10001" and changes == {"ray": ("auto", "ray://head:10001")}
    cfg, changes = cli.resume_config(saved, cli.parse_args(["--resume", "x"]), {"resume"})
    assert cfg.ray == "auto" and not changes


def test_without_ray_nothing_imports_it():
    code = ("import sys, run; from driver import cli; cli.parse_args(['--task', 'conv_groupnorm_small']); "
            "print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_an_actor_drops_credentials_but_keeps_rays_own_settings():
    env = {"GEMINI_API_KEY": "k", "OPENAI_API_KEY": "k", "HF_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
           "RAY_AUTH_TOKEN": "cluster", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "1"}
    gone = ray_evaluator.drop_credentials(env)
    assert sorted(gone) == ["AWS_SECRET_ACCESS_KEY", "GEMINI_API_KEY", "HF_TOKEN", "OPENAI_API_KEY"]
    assert env == {"RAY_AUTH_TOKEN": "cluster", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "1"}
