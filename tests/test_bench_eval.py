"""scripts/bench_eval.py's phase table, from results shaped like the evaluator's (the benchmark itself needs
a GPU: scripts/gpu_suite.sh)."""
from __future__ import annotations

import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_eval  # noqa: E402


def _result(build=None, timing=2.0, ref_calls=500.0, cand_calls=300.0, digest=100.0):
    details = {"phases": {"trials": 0.3, "compare": 0.05, "timing": timing},
               "timing_overhead_s": {"ship": 0.1, "stop": 0.05, "check": 0.2, "candidate batch": 0.001},
               "timing": {"batches_ref_ms": [{"calls": ref_calls, "draw": 10.0, "settle": 0.0, "digest": digest,
                                              "probe": 5.0}],
                          "batches_cand_ms": [{"calls": cand_calls, "draw": 10.0, "settle": 5.0, "digest": digest,
                                               "probe": 5.0}]}}
    if build is not None:
        details["build_wall_s"] = build
    return types.SimpleNamespace(details=details)


def test_cost_rows_split_the_timing_and_account_for_the_wall():
    rows = bench_eval.cost_rows(_result(build=10.0), wall_s=13.0)
    assert rows["build"] == 10.0 and rows["trials"] == 0.3
    assert abs(rows["timing: calls"] - 0.8) < 1e-9 and abs(rows["timing: digest"] - 0.2) < 1e-9
    assert rows["timing: ship"] == 0.1 and rows["timing: stop"] == 0.05 and rows["timing: check"] == 0.2
    assert "timing: candidate batch" not in rows   # inside the batches' own rows already
    assert abs(rows["timing: exchanges, the rest"] - (2.0 - 0.8 - 0.02 - 0.005 - 0.2 - 0.01 - 0.35)) < 1e-9
    assert abs(sum(rows.values()) - 13.0) < 1e-9          # "other" closes the account
    assert "timing" not in rows


def test_the_trials_row_is_split_where_the_result_splits_it():
    r = _result(build=10.0)
    r.details["trials_split_s"] = {"first": 0.2, "others": 0.08, "outputs_written": 0.02}
    rows = bench_eval.cost_rows(r, wall_s=13.0)
    assert "trials" not in rows
    assert (rows["trials: first"], rows["trials: others"], rows["trials: outputs written"]) == (0.2, 0.08, 0.02)
    assert abs(sum(rows.values()) - 13.0) < 1e-9


def test_phase_table_names_each_columns_three_biggest_costs():
    md = bench_eval.phase_table({"cold": (_result(build=10.0), 13.0), "cached": (_result(timing=2.5), 3.0)})
    lines = md.splitlines()
    assert lines[0] == "| phase (s) | cold | cached |"
    build = next(line for line in lines if line.startswith("| build |"))
    assert build == "| build | 10.00 |  |"             # the cached run has no build
    assert "- cold: biggest costs build 10.00 s, timing: calls 0.80 s, other 0.65 s" in md
    assert "- cached: biggest costs timing: exchanges, the rest 1.11 s, timing: calls 0.80 s" in md
