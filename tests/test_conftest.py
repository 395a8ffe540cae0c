"""How many workers the suite runs on (tests/conftest.py): three files at a time on a CPU-only machine with
two or more cores, one process where CUDA is available, on one core, or for the tests of a single file,
and pytest-xdist's own reading where PYTEST_XDIST_AUTO_NUM_WORKERS is set.
Run: python3 -m pytest -q tests/test_conftest.py
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

import conftest

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def machine(monkeypatch):
    """Sets what the hook sees: (CUDA available, cores)."""
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)

    def set_machine(cuda: bool, cores: int):
        monkeypatch.setattr(conftest, "_cuda_available", lambda: cuda)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    return set_machine


def workers(*args: str):
    return conftest.pytest_xdist_auto_num_workers(SimpleNamespace(args=list(args)))


def test_three_files_at_a_time_on_a_cpu_machine(machine):
    machine(cuda=False, cores=2)
    assert workers() == conftest.CPU_WORKERS == 3
    assert workers(TESTS) == 3
    assert workers(os.path.join(TESTS, "test_momentum.py"), os.path.join(TESTS, "test_crossover.py")) == 3


def test_one_process_with_cuda_or_one_core(machine):
    machine(cuda=True, cores=16)
    assert workers() == 0
    machine(cuda=False, cores=1)
    assert workers() == 0


def test_one_process_for_the_tests_of_one_file(machine):
    machine(cuda=False, cores=2)
    one = os.path.join(TESTS, "test_momentum.py")
    assert workers(one) == 0
    assert workers(f"{one}::test_a", f"{one}::test_b") == 0
    assert workers(one, f"{one}::test_a", os.path.join(TESTS, "test_crossover.py")) == 3


def test_the_environment_variable_is_left_to_pytest_xdist(machine, monkeypatch):
    machine(cuda=False, cores=2)
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")
    assert workers() is None
