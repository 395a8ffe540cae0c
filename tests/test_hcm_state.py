"""HCM's state (hcm_state.py): the idea pool and the permanent log round-trip through JSON after real
generations and for any content (hypothesis), a program's hash ignores comments and layout but not code, and
programs parse from several threads at once.
Run: python3 -m pytest -q tests/test_hcm_state.py
"""
from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

import hcm
import hcm_state
from fake_llm import RuleBasedLLM
from hcm_script import PARENT, TASK, prog


def test_whole_state_json_round_trip_after_real_generations():
    programs = [prog(k) for k in range(4)]
    pool, log, outcomes = hcm.IdeaPool(), hcm.GlobalLog(), iter(range(1000))

    def execute(src):
        k = next(outcomes)
        return hcm.Outcome("ok", 1.0 + k, f"{1.0 + k} ms") if k % 3 else hcm.Outcome("incorrect", message="off")

    llm = RuleBasedLLM(programs, seed=2, variants=True)   # a seed whose 8 generations also summarise
    for _ in range(8):
        hcm.run_generation(pool, log, task=TASK, parent=PARENT, llm=llm, execute=execute,
                           config=hcm.HCMConfig(k_idea=3, k_hyp=1))
    assert log.pruned and log.tried and any(i.summary for i in pool.ideas + log.pruned)
    state = json.loads(json.dumps({"pool": pool.to_dict(), "log": log.to_dict()}))
    assert state["pool"]["version"] == hcm_state.STATE_VERSION
    assert hcm.IdeaPool.from_dict(state["pool"]) == pool and hcm.GlobalLog.from_dict(state["log"]) == log


hyp_st = st.builds(hcm.Hypothesis, st.text(max_size=20), st.text(max_size=12), st.sampled_from(["ok", "incorrect"]),
                   st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)), st.text(max_size=10),
                   st.text(max_size=10), st.lists(st.text(max_size=8), max_size=3))
idea_st = st.builds(hcm.Idea, st.integers(1, 10**6), st.text(max_size=30), st.lists(hyp_st, max_size=4),
                    st.text(max_size=20), st.integers(0, 100))


@settings(max_examples=60, deadline=None)
@given(st.lists(idea_st, max_size=4), st.lists(idea_st, max_size=3), st.sets(st.text(max_size=64), max_size=4),
       st.lists(st.tuples(st.one_of(st.none(), st.integers(1, 99)), st.text(max_size=10), hyp_st), max_size=4))
def test_state_round_trip_property(ideas, pruned, hashes, entries):
    pool = hcm.IdeaPool(ideas, next_id=10**6 + 1)
    log = hcm.GlobalLog([hcm_state.LogEntry(*e) for e in entries], pruned, hashes)
    assert hcm.IdeaPool.from_dict(json.loads(json.dumps(pool.to_dict()))) == pool
    assert hcm.GlobalLog.from_dict(json.loads(json.dumps(log.to_dict()))) == log


CUDA_PROGRAM = '''import torch
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>
// scale kernel
__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;  /* global index */
    if (i < n) y[i] = 2.0f * x[i];
}
"""

class ModelNew(torch.nn.Module):
    def forward(self, x):  # launch
        return x * 2
'''


def test_program_hash_ignores_comments_and_layout_but_not_code():
    noisy = (CUDA_PROGRAM.replace("// scale kernel", "// a different comment\n\n")
             .replace("/* global index */", "").replace("    if (i < n)", "      if (i<n)  ".replace("i<n", "i < n"))
             .replace("  # launch", "") + "\n\n# trailing comment\n")
    assert hcm.program_hash(noisy) == hcm.program_hash(CUDA_PROGRAM)
    assert hcm.program_hash(CUDA_PROGRAM.replace("2.0f", "3.0f")) != hcm.program_hash(CUDA_PROGRAM)
    assert hcm.program_hash(CUDA_PROGRAM.replace("x * 2", "x * 3")) != hcm.program_hash(CUDA_PROGRAM)
    assert len(hcm.program_id(CUDA_PROGRAM)) == 12


_line = st.sampled_from(["x = 1", "y = x  +  2", "# note", "", "z = 'a  //c\\n  b'", "def f(a):\n    return a",
                         "s = '''/* c */ int k;   \\n\\n  k++;'''"])


@settings(max_examples=100, deadline=None)
@given(st.lists(_line, max_size=8), st.lists(st.sampled_from(["", "# c", "   "]), max_size=8))
def test_normalise_is_idempotent_and_comment_blind(lines, noise):
    src = "\n".join(lines) + "\n"
    noisy = "\n".join(a for pair in zip(lines, noise + [""] * len(lines)) for a in pair) + "\n"
    once = hcm_state.normalise_program(src)
    assert hcm_state.normalise_program(once) == once
    assert hcm_state.normalise_program(noisy) == once


def test_programs_parse_in_threads_at_once():
    """The islands hash and extract programs in threads while evaluations screen theirs. CPython 3.11 before
    3.11.8 fails such parses ("AST constructor recursion depth mismatch") when a collection runs
    Python code mid-parse and another thread parses meanwhile; a collector callback makes that happen often
    here. On a fixed CPython this shows nothing either way."""
    import difflib
    import gc
    import threading

    from evaluate_kernel.screen import screen
    import hcm_parsers

    def switch_threads(phase, info):   # Python code inside a collection: the interpreter may switch threads
        list(difflib.unified_diff([str(k) for k in range(40)], [str(k + 1) for k in range(40)]))

    helpers = (f"\n\ndef helper_{k}(x):\n    return [x * {k} + i for i in range(3) if i != {k}]\n" for k in range(100))
    source, failures = prog(3) + "".join(helpers), []   # long enough that collections fall inside its parse

    def parse(k: int):
        try:
            for _ in range(5):
                if k % 3 == 0:
                    hcm_state.program_hash(source)
                elif k % 3 == 1:
                    hcm_parsers.extract_code(f"```python\n{source}```")
                else:
                    screen(source)
        except SystemError as e:
            failures.append(e)

    gc.callbacks.append(switch_threads)
    thresholds = gc.get_threshold()
    gc.set_threshold(200)   # collections every few hundred allocations: many fall inside a parse
    try:
        threads = [threading.Thread(target=parse, args=(k,)) for k in range(9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(switch_threads)
        gc.set_threshold(*thresholds)
    assert not failures, failures[0]
