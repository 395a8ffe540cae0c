"""Shared pytest set-up: GPU tests skip cleanly on machines without CUDA; without one, the suite runs on three
workers (pytest-xdist, `-n auto --dist loadfile` in pytest.ini), each taking a whole test file at a time.

Most of a CPU test is one process waiting on another (a worker importing torch, a build, a runner's batch,
which is timed by its CPU time), so three files at once keep two cores busy: 369-436 s instead of 627 s on
the 2-core development VM (two workers: 410-423 s; four: slower again). A test that looks at the machine's
processes looks only at its own process's descendants. Where CUDA is available the suite stays in one
process: the GPU tests time kernels on the one device, and another file's kernels beside them would be in
their measurements. The tests of a single file run in one process too. `-n 0` runs the suite in one process
anywhere; PYTEST_XDIST_AUTO_NUM_WORKERS=N sets the workers."""
import functools
import os

import pytest

CPU_WORKERS = 3


@functools.cache   # asked by both hooks below in one process
def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None   # pytest-xdist reads it
    if _cuda_available() or len(os.sched_getaffinity(0)) < 2 or _one_file(config.args):
        return 0
    return CPU_WORKERS


def _one_file(args: list[str]) -> bool:
    """The command line names tests of one file only: one worker would get them all, after the others had
    started for nothing."""
    files = {arg.split("::", 1)[0] for arg in args}
    return len(files) == 1 and os.path.isfile(next(iter(files)))


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
