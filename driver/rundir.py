"""The run directory: everything a run writes, written so that nothing is ever half-written or lost.

    rd = RunDir.create(path or None, task_name)    # refuses a non-empty directory; unique default names
    rd.save_reference(task); rd.write_config(...)  # reference.py + its sha256 and the task's settings
    rd.save_checkpoint(state)                       # checkpoint.json; the previous one stays as .prev
    rd = RunDir.open(path); state = rd.load_checkpoint()   # resume: the newest checkpoint that parses

Layout: config.json (configuration, task settings, reference hash, versions, resumes), reference.py (the
reference source the run measures against), events.jsonl (one line per generation, evaluation,
intervention, LLM failure and resume), candidates/ (every candidate's source), evals/ (every evaluation
result, written as it finishes), logs/ (the evaluator's worker logs), checkpoint.json and
checkpoint.prev.json, spend.json (the LLM bill), best.py, report.md and progress.png.

Every file is written through a temporary file and a rename (`write_atomic`), so a crash or Ctrl-C leaves
either the old or the new version, never a mix. A checkpoint that still does not parse (a disk that lied)
is named in one line, and the previous good one is used instead.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import secrets
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import hcm
import tasks

CHECKPOINT = "checkpoint.json"
PREVIOUS = "checkpoint.prev.json"
REFERENCE = "reference.py"
SPEND = "spend.json"
TASK_FIELDS = ("name", "description", "device", "rtol", "atol", "l2_tol", "flops", "source")


class RunDirError(Exception):
    """A run directory that cannot be used as asked; the message says which file and what to do."""


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file behind."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def default_path(task_name: str, root: str = "runs") -> Path:
    """runs/<task>-<date>-<time>-<random>: unique even for runs started in the same second."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{task_name}-{stamp}-{secrets.token_hex(3)}"


class RunDir:
    """Everything a run writes: config, reference, events, candidates with their evaluations, best.py,
    checkpoints, report."""

    def __init__(self, path: Path, eval_cache: Path | None = None):
        self.path = Path(path)
        self.candidates = self.path / "candidates"
        self.candidates.mkdir(parents=True, exist_ok=True)
        self.evals = Path(eval_cache) if eval_cache else (self.path / "evals")
        self.evals.mkdir(parents=True, exist_ok=True)
        self.logs = self.path / "logs"
        self.events_path = self.path / "events.jsonl"
        self.events_written = _count_lines(self.events_path)   # checkpoints record it; resume truncates to it
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: Path | None, task_name: str, eval_cache: Path | None = None) -> "RunDir":
        """A new run directory: `path` must not exist or be empty; None picks a unique default name."""
        path = Path(path) if path is not None else default_path(task_name)
        cls.check_new(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"--out {path}: cannot make the directory ({e.strerror})") from None
        return cls(path, eval_cache)

    @staticmethod
    def check_new(path: Path) -> None:
        """Raise RunDirError unless `path` can hold a new run (missing or an empty directory) that can be
        made and written: not under a file, not on a virtual or read-only file system, writable by this
        user. Nothing is left behind by the check."""
        if path.exists() and not path.is_dir():
            raise RunDirError(f"--out {path}: is a file, not a directory")
        if path.is_dir() and any(path.iterdir()):
            hint = (f"continue it with --resume {path}" if (path / "config.json").exists()
                    else "choose a new or empty directory")
            raise RunDirError(f"--out {path}: the directory is not empty; nothing in it was changed ({hint})")
        problem = _unwritable(path)
        if problem:
            raise RunDirError(f"--out {path}: {problem}; choose a directory on a disk you can write to")

    @classmethod
    def open(cls, path: Path, eval_cache: Path | None = None) -> "RunDir":
        """An existing run directory, for --resume."""
        path = Path(path)
        if not path.is_dir():
            raise RunDirError(f"--resume {path}: no such directory")
        if not (path / "config.json").is_file():
            raise RunDirError(f"--resume {path}: no config.json there, so this is not a run directory "
                              "(or it was interrupted before it was set up: start a new run)")
        return cls(path, eval_cache)

    def remove_leftovers(self) -> None:
        """Temporary files of writes a stop cut short (their targets are whole: the rename never came),
        and empty worker logs."""
        for folder in (self.path, self.candidates):
            for tmp in folder.glob("*.tmp"):
                tmp.unlink(missing_ok=True)
        for log in self.logs.glob("*.log") if self.logs.is_dir() else ():
            try:
                if log.stat().st_size == 0:
                    log.unlink()
            except OSError:
                pass

    # -- configuration and reference --------------------------------------------------------------

    def save_reference(self, task: tasks.Task) -> None:
        write_atomic(self.path / REFERENCE, task.reference_src)

    def write_config(self, data: dict) -> None:
        write_atomic(self.path / "config.json", json.dumps(data, indent=1, default=str))

    def read_config(self) -> dict:
        path = self.path / "config.json"
        try:
            data = json.loads(path.read_text())
            data["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RunDirError(f"{path}: unreadable or damaged ({type(e).__name__}); "
                              "the run cannot be resumed without it") from None
        return data

    def saved_task(self, config: dict) -> tuple[tasks.Task, str]:
        """The task exactly as the run started it (from reference.py and the saved settings), and a
        note when the original problem file has changed or gone since then ("" when unchanged)."""
        ref_path = self.path / REFERENCE
        if not isinstance(config.get("task"), dict) and not ref_path.exists():
            return self._task_of_an_older_run(config)
        try:
            src = ref_path.read_text()
        except OSError:
            raise RunDirError(f"{ref_path}: missing; the run cannot be resumed without its reference") \
                from None
        saved_hash = config.get("reference_sha256")
        if saved_hash and sha256(src) != saved_hash:
            raise RunDirError(f"{ref_path}: changed since the run started (sha256 no longer matches "
                              "config.json); restore it or start a new run")
        settings = config["task"]
        task = tasks.Task(reference_src=src, **{k: settings[k] for k in TASK_FIELDS if k in settings})
        original = settings.get("file")
        note = ""
        if original:
            try:
                now = sha256(Path(original).read_text())
            except OSError:
                now = None
            if now is None:
                note = f"{original} is gone; resuming against the run's copy {ref_path}"
            elif now != saved_hash:
                note = (f"{original} has changed since the run started; resuming against the run's "
                        f"copy {ref_path} (start a new run to search the edited problem)")
        elif task.name in tasks.names() and sha256(tasks.get(task.name).reference_src) != saved_hash:
            note = (f"the built-in task {task.name} has changed since the run started; resuming against "
                    f"the run's copy {ref_path}")
        return task, note

    def _task_of_an_older_run(self, config: dict) -> tuple[tasks.Task, str]:
        """Runs made before the run directory kept its reference: the task as it is now."""
        name = config["config"]["task"]
        try:
            task = tasks.get(name) if name in tasks.names() else tasks.load(name)
        except (OSError, ValueError) as e:
            raise RunDirError(f"{self.path} predates reference copies and its task {name} cannot be "
                              f"loaded ({e})") from None
        return task, f"{self.path} predates reference copies; resuming against {name} as it is now"

    # -- checkpoints -------------------------------------------------------------------------------

    def save_checkpoint(self, state: dict) -> None:
        """checkpoint.json, atomically; the one it replaces becomes checkpoint.prev.json."""
        path = self.path / CHECKPOINT
        if path.exists():
            os.replace(path, self.path / PREVIOUS)
        write_atomic(path, json.dumps(state))

    def load_checkpoint(self, warn=print) -> dict | None:
        """The newest checkpoint that parses; None when the run never reached its first checkpoint."""
        problems = []
        for name in (CHECKPOINT, PREVIOUS):
            path = self.path / name
            if not path.exists():
                continue
            try:
                state = json.loads(path.read_text())
                if isinstance(state, dict) and "round" in state and "islands" in state:
                    if problems:
                        warn(f"run.py: {problems[0]}; continuing from the previous checkpoint {path} "
                             f"(round {state['round']})")
                    return state
                problems.append(f"{path} is not a checkpoint (fields missing)")
            except (OSError, ValueError) as e:
                problems.append(f"{path} is damaged ({type(e).__name__}: {str(e)[:80]})")
        if problems:
            raise RunDirError("; ".join(problems) + ": no usable checkpoint to resume from")
        return None

    def save_spend(self, ledger: dict) -> None:
        """spend.json: every LLM call's tokens and dollars over all sessions (models.Spend); unlike the
        checkpoint it is never rolled back, since a call of an unfinished round was paid for too."""
        write_atomic(self.path / SPEND, json.dumps(ledger))

    def read_spend(self) -> dict:
        path = self.path / SPEND
        if not path.exists():
            return {}
        try:
            ledger = json.loads(path.read_text())
            if isinstance(ledger, dict):
                return ledger
            problem = "not a JSON object"
        except (OSError, ValueError) as e:
            problem = f"{type(e).__name__}: {str(e)[:80]}"
        raise RunDirError(f"{path} is damaged ({problem}): the dollars spent so far are unknown; remove it to "
                          "resume counting from $0")

    # -- events, candidates, evaluations -----------------------------------------------------------

    def event(self, kind: str, **data) -> None:
        line = json.dumps({"type": kind, "time": round(time.time(), 3), **data}, default=str)
        with self._lock, open(self.events_path, "a") as f:
            f.write(line + "\n")
            self.events_written += 1

    def events(self) -> list[dict]:
        if not self.events_path.exists():
            return []
        out = []
        for line in self.events_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass   # a line cut by a crash mid-write: it is re-written on resume
        return out

    def truncate_events(self, n: int) -> None:
        """Drop events written after the checkpoint we resume from; they will happen again."""
        if not self.events_path.exists():
            return
        with open(self.events_path) as f:
            lines = f.readlines()[:n]
        write_atomic(self.events_path, "".join(lines))
        self.events_written = len(lines)

    def save_program(self, src: str) -> str:
        pid = hcm.program_id(src)   # the id HCM records on the hypothesis, so records lead to the file
        path = self.candidates / f"{pid}.py"
        if not path.exists():
            write_atomic(path, src)
        return pid

    def program(self, pid: str) -> str:
        return (self.candidates / f"{pid}.py").read_text()

    def eval_key(self, context: str, src: str) -> str:
        return hashlib.sha256((context + "\0" + src).encode()).hexdigest()[:24]

    def load_eval(self, key: str) -> dict | None:
        path = self.evals / f"{key}.json"
        try:
            return json.loads(path.read_text()) if path.exists() else None
        except ValueError:
            return None   # a damaged entry is measured again

    def store_eval(self, key: str, result: dict) -> None:
        write_atomic(self.evals / f"{key}.json", json.dumps(result, indent=1))

    def best_text(self, best: dict, task_name: str, s0: float, hardware: str, header: str | None = None) -> str:
        """best.py's text: the program of `best` (the search's global best) with a header saying what it is
        (`header`: the caller's, e.g. run.py's with the measured figures)."""
        score, pid = best["runtime_ms"], best["program"]
        slower = ("\n# SLOWER than the reference: no correct candidate has beaten it yet; this is the "
                  "fastest one found" if score >= s0 else "")
        header = header or (f"# pacevolve best for task {task_name}: {score:.4g} ms, {s0 / score:.3f}x the PyTorch "
                            f"reference ({s0:.4g} ms) on {hardware}{slower}\n# island {best['island']}, generation "
                            f"{best['generation']}, program {pid}\n")
        return header + self.program(pid)

    def write_best_text(self, text: str) -> bool:
        """best.py as `text`; False where it already was."""
        path = self.path / "best.py"
        if path.exists() and path.read_text() == text:
            return False
        write_atomic(path, text)
        return True


# File systems that hold no files of ours: the kernel's views and device nodes
VIRTUAL_FS = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
              "pstore", "bpf", "configfs", "fusectl", "mqueue", "efivarfs", "binfmt_misc", "autofs", "nsfs"}


def _unwritable(path: Path) -> str:
    """Why no run directory can be made at `path` ("" when one can): checked on the nearest existing
    folder, by reading the mount table and by making (and removing) a probe directory there."""
    path = Path(os.path.abspath(path))
    existing = path if path.exists() else next((p for p in path.parents if p.exists()), Path("/"))
    if not existing.is_dir():
        return f"{existing} is a file, so nothing can be made under it"
    fstype = _fs_type(existing)
    if fstype in VIRTUAL_FS:
        return f"{existing} is on a virtual file system ({fstype}), which holds no ordinary files"
    try:
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return f"{existing} is on a read-only file system"
    except OSError:
        pass
    probe = None
    try:
        probe = tempfile.mkdtemp(prefix=".pacevolve-probe-", dir=existing)
    except OSError as e:
        return f"cannot write in {existing} ({e.strerror})"
    finally:   # even on Ctrl-C: the check leaves nothing behind
        if probe:
            os.rmdir(probe)
    return ""


def _fs_type(path: Path) -> str:
    """The file-system type of the mount holding `path`, from /proc/self/mounts ("" when unknown)."""
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return ""
    return kind


def task_settings(task: tasks.Task) -> dict:
    """What config.json keeps of the task, so a resume needs neither the problem file nor this version
    of the built-in tasks."""
    d = {k: v for k, v in asdict(task).items() if k in TASK_FIELDS}
    if task.name not in tasks.names() or task.source.endswith(".py"):
        d["file"] = os.path.abspath(task.source) if task.source else None
    return d


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def hardware_name(device: str) -> str:
    if device == "cuda":
        try:
            import torch
            return torch.cuda.get_device_name(0)
        except Exception:
            return "an NVIDIA GPU"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def versions(device: str) -> dict:
    v = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch
        v.update(torch=torch.__version__, cuda=torch.version.cuda)
        if device == "cuda" and torch.cuda.is_available():
            v["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return v
