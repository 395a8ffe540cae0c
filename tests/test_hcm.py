"""Tests for hcm.py (Algorithm 1 of the PACEvolve paper): a generation's flow, its calls and their order,
broken replies and failures, and the fake LLMs the other tests rely on. Run: python3 -m pytest -q tests/test_hcm.py

The LLM is a ScriptedLLM (canned replies in order); tests assert on the prompts it received.
A generation's calls, in order: idea_generation (with the choice of idea and experiment), classification
(one call for all proposals; none on an empty pool), selection (only when the choice is missing or
repeats the log), duplicate_check (only when the log holds a similar experiment), implementation, repairs,
summary, prune. What the prompts show: test_hcm_prompts.py; the parsers: test_hcm_parsers.py; the state's
round trips: test_hcm_state.py.
"""
from __future__ import annotations

import json
import random

import pytest

import hcm
from fake_llm import RuleBasedLLM, ScriptedLLM, ScriptExhausted
from hcm_script import (OK, PARENT, TASK, Exec, add_record, batch_reply, code_reply, gen, ideas_reply, merge_reply,
                        new_reply, pool_with, prog, run, select_reply)


# ---------------------------------------------------------------------------------------------- flow

def test_full_generation_on_fresh_pool():
    pool, log = hcm.IdeaPool(), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("Fuse the epilogue", "Warp-shuffle reduction", "Fuse epilogue with float4",
                                   choice="proposal 2", experiment="one warp per row"),
                       code_reply(prog(1))])
    ex = Exec(OK)
    r = hcm.run_generation(pool, log, task=TASK, parent=PARENT, llm=llm, execute=ex)
    # an empty pool needs no classification, an empty log no duplicate check: two calls in all
    assert llm.kinds == ["idea_generation", "implementation"]
    assert r.status == "evaluated" and r.idea_id == 2 and r.outcome == OK
    assert (r.strong_calls, r.cheap_calls, r.llm_calls) == (2, 0, 2)
    assert [i.description for i in pool.ideas] == ["Fuse the epilogue", "Warp-shuffle reduction",
                                                    "Fuse epilogue with float4"]
    hyp = pool.get(2).hypotheses[0]
    assert (hyp.experiment, hyp.status, hyp.score, hyp.result) == ("one warp per row", "ok", 1.5, OK.metric)
    assert pool.get(2).best_metric == OK.metric and pool.get(2).tried == 1
    assert ex.programs == [prog(1)] and hcm.program_hash(prog(1)) in log.program_hashes
    assert [(e.idea_id, e.hypothesis.experiment) for e in log.tried] == [(2, "one warp per row")]
    ideas, code = llm.prompts
    assert "BACKGROUND-MARKER" in ideas and "(empty: no ideas yet)" in ideas and "Brainstorm 3 distinct" in ideas
    assert ideas.index("## Background") < ideas.index("## Parent program") < ideas.index("## Idea repository") \
        < ideas.index("## Your task") < ideas.index("## Answer format")
    assert "3.50 ms (reference)" in ideas and PARENT.source.strip() not in ideas   # the code comes with the implementation
    assert PARENT.source.strip() in code and "Idea 2: Warp-shuffle reduction" in code
    assert "Experiment: one warp per row" in code and "BACKGROUND-MARKER" in code


def test_calls_per_generation_by_kind_and_model():
    pool, log = pool_with("Fuse the tail", "Tile through shared memory"), hcm.GlobalLog()
    add_record(log, pool.get(1), "Unroll the channel loop by four", 2.0, prog(0))
    strong = ScriptedLLM([ideas_reply("Vectorise loads", "Use channels-last", "Warp shuffles",
                                      choice="idea 1", experiment="fuse tanh and hardswish into one pass"),
                          code_reply(prog(1))])
    cheap = ScriptedLLM([batch_reply(new_reply("Vectorise loads with float4"), merge_reply(2, "Tile, channels-last"),
                                     new_reply("Warp-shuffle statistics"))])
    r = run(pool, log, strong, Exec(OK), cheap=cheap, n_proposals=3, k_idea=10)
    # three proposals, one classification call; a dissimilar log entry costs no duplicate check
    assert strong.kinds == ["idea_generation", "implementation"] and cheap.kinds == ["classification"]
    assert (r.strong_calls, r.cheap_calls) == (2, 1) and r.status == "evaluated"
    assert r.calls == {"idea_generation": 1, "classification": 1, "implementation": 1}
    prompt = cheap.prompts[0]
    assert all(f"Proposal {k}: " in prompt for k in (1, 2, 3)) and "3 sections" in prompt
    assert [i.description for i in pool.ideas] == ["Fuse the tail", "Tile, channels-last",
                                                    "Vectorise loads with float4", "Warp-shuffle statistics"]


def test_duplicate_check_runs_before_the_code_is_written_only_for_similar_entries():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    add_record(log, pool.get(1), "Unroll the channel loop by four with block size 256", 2.0, prog(0))
    shared = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="Unroll the channel loop by eight, block size 256"),
                          merge_reply(1, "Fuse the tail"), "Repeat: no\nEntry: none", code_reply(prog(1))])
    r = run(pool, log, shared, Exec(OK))
    assert shared.kinds == ["idea_generation", "classification", "duplicate_check", "implementation"]
    check = shared.prompts[2]
    assert "#1 [idea 1: Fuse the tail] Unroll the channel loop by four with block size 256" in check
    assert r.status == "evaluated"
    assert hcm.similar_experiments(log, "Cache the weights in shared memory", 0.5, 8) == []
    assert hcm.similar_experiments(log, "unroll channel loop by four, block size 256", 0.5, 8) == [1, 2]   # most similar first


def test_cheap_llm_gets_classification_duplicate_summary_and_prune():
    pool, log = pool_with("Fuse the epilogue", "Tile through shared memory"), hcm.GlobalLog()
    add_record(log, pool.get(1), "first fusion of the epilogue", 2.0, prog(0))
    strong = ScriptedLLM([ideas_reply("Vectorise loads", choice="idea 1", experiment="second fusion of the epilogue"),
                          code_reply(prog(1))])
    cheap = ScriptedLLM([new_reply("Vectorise loads with float4"), "Repeat: no\nEntry: none",
                         "Key findings: fusion works.", "Dropping Ideas: [2]"])
    r = run(pool, log, strong, Exec(OK), cheap=cheap, k_idea=2, k_hyp=1)
    assert strong.kinds == ["idea_generation", "implementation"]
    assert cheap.kinds == ["classification", "duplicate_check", "summary", "prune"]
    assert (r.strong_calls, r.cheap_calls) == (2, 4) and r.status == "evaluated"
    assert pool.ids() == [1, 3]


def test_batch_classification_applies_in_order_and_choice_names_a_proposal():
    pool, log = pool_with("Fuse the elementwise tail"), hcm.GlobalLog()
    pool.next_id = 5    # ids are never reused: a pruned id 4 must not come back
    llm = ScriptedLLM([ideas_reply("Fuse tail with float4 stores", "Channels-last layout", "Fuse tail, unrolled",
                                   choice="proposal 2", experiment="NHWC input"),
                       "**Proposal 1**\n**Idea Exists:** true\n**Idea ID:** 1\n**Updated description:** Fuse the "
                       "elementwise tail with float4 stores.\n\n### Proposal 2\nidea exists: FALSE\nidea description: "
                       "Channels-last layout for contiguous channels\n\nProposal 3:\nIdea Exists: True\nIdea ID: 1\n"
                       "Updated description: Fuse the tail, float4 stores, unrolled.",
                       code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK), n_proposals=3, k_idea=2)     # |P| = K_idea: no pruning yet
    assert llm.kinds == ["idea_generation", "classification", "implementation"]
    assert [(i.id, i.description) for i in pool.ideas] == [   # both updates of idea 1 are kept, in order
        (1, "Fuse the elementwise tail with float4 stores. Fuse the tail, float4 stores, unrolled."),
        (5, "Channels-last layout for contiguous channels")]
    assert r.idea_id == 5 and pool.get(5).hypotheses[0].experiment == "NHWC input"
    assert any("merged proposal 1 into idea 1" in e for e in r.events)
    assert any("new idea 5" in e for e in r.events)


def test_classification_missing_or_unknown_gets_reminder_then_is_kept_as_new():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("Shared-memory tiling", "Warp shuffles", choice="idea 1", experiment="e"),
                       batch_reply(merge_reply(9, "x"), new_reply("Warp-shuffle sums")),
                       batch_reply(merge_reply(1, "Fuse the tail, tiled")),
                       code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK), n_proposals=2)
    assert "names idea 9, not in the repository" in llm.prompts[2]
    assert [i.description for i in pool.ideas] == ["Fuse the tail, tiled", "Warp shuffles"]
    assert any("classification failed: kept as new" in e for e in r.events) and r.status == "evaluated"


def test_choice_missing_falls_back_to_a_selection_call():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("Tile it"), merge_reply(1, "Fuse the tail"), select_reply(1, "tile 32x8"),
                       code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK))
    assert llm.kinds == ["idea_generation", "classification", "selection", "implementation"]
    assert r.experiment == "tile 32x8" and "valid idea ids: 1" in llm.prompts[2]
    assert prog(1).strip() not in llm.prompts[2] and PARENT.source.strip() not in llm.prompts[2]


def test_summarisation_exactly_when_history_exceeds_k_hyp():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    add_record(log, pool.get(1), "experiment 0", 1.2, prog(0))
    add_record(log, pool.get(1), "experiment 1", 2.0, prog(100))
    strong = ScriptedLLM([gen(2)[0], gen(2)[2]])
    cheap = ScriptedLLM([merge_reply(1, "Fuse the tail"), "Repeat: no"])
    run(pool, log, strong, Exec(hcm.Outcome("ok", 1.9, "1.9 ms")), cheap=cheap, k_hyp=3)
    assert "summary" not in cheap.kinds and len(pool.get(1).hypotheses) == 3    # 3 = K_hyp: not yet

    long_exp = "experiment 3: " + "a very specific change that tells two experiments apart " * 6
    strong = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment=long_exp), code_reply(prog(3))])
    cheap = ScriptedLLM([merge_reply(1, "Fuse the tail"), "Repeat: no",
                         "Here is my summary.\n- **Key findings:** fusing works; float4 did not help."])
    r = run(pool, log, strong, Exec(hcm.Outcome("incorrect", message="max rel err 0.3")), cheap=cheap, k_hyp=3,
            max_repairs=0)
    assert cheap.kinds[-1] == "summary"                                        # 4 > K_hyp
    prompt = cheap.prompts[-1]
    assert all(f"experiment {k}" in prompt for k in range(4)) and "incorrect: max rel err 0.3" in prompt
    assert " ".join(long_exp.split()) in prompt                              # whole, not cut at 150-200
    assert "Best result so far: 1.2 ms (kept beside the idea; do not restate it)" in prompt
    idea = pool.get(1)
    assert idea.hypotheses == [] and idea.tried == 4 and idea.history_size() == 1
    assert idea.summary == "fusing works; float4 did not help."             # the best result is not duplicated
    assert "best: 1.2 ms" in hcm.render_pool(pool)                          # it stays beside the idea
    assert any("summarised idea 1" in e for e in r.events)
    assert len(log.tried) == 4                                                 # the log keeps everything

    # after a summary |history| = 1 + records: the next summary comes after K_hyp more records, not before
    for k in (4, 5):
        run(pool, log, ScriptedLLM([gen(k)[0], gen(k)[2]]), Exec(OK),
            cheap=ScriptedLLM([merge_reply(1, "Fuse the tail"), "Repeat: no"]), k_hyp=3, similarity=0.99)
    assert len(pool.get(1).hypotheses) == 2
    cheap = ScriptedLLM([merge_reply(1, "Fuse the tail"), RuntimeError("cheap model down")])
    run(pool, log, ScriptedLLM([gen(6)[0], gen(6)[2]]), Exec(OK), cheap=cheap, k_hyp=3, similarity=0.99)
    assert cheap.kinds[-1] == "summary" and pool.get(1).hypotheses == []
    assert "fusing works" in pool.get(1).summary and "summary call failed" in pool.get(1).summary


def test_pruning_to_cap_moves_ideas_to_log():
    pool, log = pool_with("A tiling", "B fusion", "C layout"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("D streams", choice="proposal 1", experiment="float4"), new_reply("D vectorised loads"),
                       code_reply(prog(1)),
                       "Looking at the results, ideas 1 and 3 are stale.\n\n**Dropping Ideas:** [1, 3, 2]\n"])
    r = run(pool, log, llm, Exec(OK), k_idea=2)
    assert llm.kinds[-1] == "prune" and "exactly 2 must be dropped" in llm.prompts[-1]
    assert "exactly 2 idea ids, e.g. [2, 5]" in llm.prompts[-1]                # the example fits the count
    assert pool.ids() == [2, 4] and [i.id for i in log.pruned] == [1, 3]
    assert any("pruned ideas [1, 3]" in e for e in r.events)
    # the next prompts show dropped ideas so they are not re-proposed
    assert "A tiling" in hcm.render_dropped(log)
    assert hcm.drop_example(1) == "[2]" and "exactly 1 idea id," in hcm.PRUNE_PROMPT.format(
        task="t", direction="d", pool="p", cap=1, n_drop=1, ids_word="id", example="[2]", legend="")


def test_pruning_fallback_when_llm_names_too_few_or_invalid_ids():
    pool, log = pool_with("old, no success", "good", "bad", "newest"), hcm.GlobalLog()
    pool.get(2).best_score, pool.get(3).best_score = 1.0, 3.0
    llm = ScriptedLLM([ideas_reply("E", choice="proposal 1", experiment="e"), new_reply("E new"), code_reply(prog(1)),
                       "Dropping Ideas: [99, 4]"])
    r = run(pool, log, llm, Exec(hcm.Outcome("compile_error", message="nvcc failed")), k_idea=2, max_repairs=0)
    # needs 3 drops: 4 (named), then weakest: 1 (no success, older than 5), then 5 (no success)
    assert sorted(i.id for i in log.pruned) == [1, 4, 5] and pool.ids() == [2, 3]
    assert any("ignored ids not in the pool: [99]" in e for e in r.events)
    assert any("also dropping weakest/oldest [1, 5]" in e for e in r.events)


def test_pruning_unparseable_reply_gets_reminder_then_deterministic_fallback():
    pool, log = pool_with("a", "b", "c"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("d", choice="proposal 1", experiment="e"), new_reply("d"), code_reply(prog(1)),
                       "I would drop the weakest ones.", "Still thinking."])
    run(pool, log, llm, Exec(OK), k_idea=3)
    assert "Format reminder" in llm.prompts[-1] and "Dropping Ideas" in llm.prompts[-1]
    assert [i.id for i in log.pruned] == [1] and len(pool.ideas) == 3


def test_duplicate_program_is_not_evaluated():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    add_record(log, pool.get(1), "first", 2.0, prog(1))
    same = prog(1, comment="# a comment the LLM added\n\n").replace("x * 2", "x   *   2")
    llm = ScriptedLLM([ideas_reply("more fusion", choice="idea 1", experiment="again"), merge_reply(1, "Fuse the tail"),
                       code_reply(same)])
    ex = Exec()
    r = run(pool, log, llm, ex)
    assert ex.programs == [] and r.status == "duplicate_program" and r.outcome is None
    assert pool.get(1).hypotheses[-1].status == "duplicate_program" and log.tried[-1].hypothesis.status == "duplicate_program"
    # the unchanged parent is a duplicate too
    parent = hcm.Parent(PARENT.source.replace("Model(", "ModelNew("), "1 ms")
    pool2, llm2 = pool_with("x"), ScriptedLLM([ideas_reply("y", choice="idea 1", experiment="no-op"), merge_reply(1, "x"),
                                               code_reply(parent.source)])
    r2 = run(pool2, hcm.GlobalLog(), llm2, ex, parent=parent)
    assert r2.status == "duplicate_program" and "parent" in pool2.get(1).hypotheses[0].result and ex.programs == []


def test_repeated_experiment_is_sent_back_before_any_code_and_exact_match_costs_no_call():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    add_record(log, pool.get(1), "Use float4 stores", 2.0, prog(0))
    llm = ScriptedLLM([ideas_reply("more", choice="idea 1", experiment="use  FLOAT4 stores"),   # exact: no check
                       merge_reply(1, "Fuse the tail"),
                       select_reply(1, "unroll by 4"), code_reply(prog(2))])
    ex = Exec(OK)
    r = run(pool, log, llm, ex)
    assert llm.kinds == ["idea_generation", "classification", "selection", "implementation"]
    assert "repeated an experiment already run" in llm.prompts[2] and "'Use float4 stores'" in llm.prompts[2]
    assert ex.programs == [prog(2)] and r.experiment == "unroll by 4" and r.status == "evaluated"


def test_experiment_judged_repeat_too_often_is_recorded_and_no_code_is_written():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    add_record(log, pool.get(1), "Use float4 vector stores", 2.0, prog(0))
    replies = [ideas_reply("more", choice="idea 1", experiment="float4 vector stores 0"), merge_reply(1, "Fuse the tail"),
               "**Repeat:** Yes\n**Entry:** 1"]
    for k in (1, 2):
        replies += [select_reply(1, f"float4 vector stores {k}"), "**Repeat:** Yes\n**Entry:** 1"]
    llm, ex = ScriptedLLM(replies), Exec()
    r = run(pool, log, llm, ex, max_duplicate_retries=2)
    assert llm.remaining == 0 and ex.programs == [] and r.status == "duplicate_experiment"
    assert "implementation" not in llm.kinds                      # the check came before any code was written
    assert pool.get(1).hypotheses[-1].status == "duplicate_experiment"
    assert "Use float4 vector stores" in pool.get(1).hypotheses[-1].result


def test_failed_candidate_is_recorded_on_idea_and_log():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="fused"), merge_reply(1, "Fuse the tail"),
                       code_reply(prog(1))])
    bad = hcm.Outcome("compile_error", None, "", "kernel.cu(12): error: identifier \"blockDim\" is undefined")
    r = run(pool, log, llm, Exec(bad), max_repairs=0)
    hyp = pool.get(1).hypotheses[0]
    assert r.status == "evaluated" and r.outcome == bad
    assert hyp.status == "compile_error" and hyp.score is None and "identifier" in hyp.result
    assert log.tried[0].hypothesis == hyp and hcm.program_hash(prog(1)) in log.program_hashes
    assert pool.get(1).best_score is None and "[compile_error] fused" in hcm.render_pool(pool)


def test_repair_succeeds_on_second_attempt():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    task = hcm.TaskContext("toy_scale", "BACKGROUND-MARKER", reference=PARENT.source)
    bad = hcm.Outcome("incorrect", message="max relative error 3.1e-02 on input set 2 (scaled by 3)")
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="fused"), merge_reply(1, "Fuse the tail"),
                       code_reply(prog(1)), "The reduction dropped the last partial sum.\n```python\n" + prog(2) + "```"])
    ex = Exec(bad, OK)
    r = run(pool, log, llm, ex, task=task)
    repair = llm.prompts[-1]
    assert hcm.prompt_kind(repair) == "repair"
    assert bad.message in repair and prog(1).strip() in repair and "status: incorrect" in repair
    assert PARENT.source.strip() in repair                       # the reference, for correctness failures
    assert ex.programs == [prog(1), prog(2)] and r.program == prog(2) and r.outcome == OK
    assert [a["status"] for a in r.attempts] == ["incorrect", "ok"]
    hyp = pool.get(1).hypotheses[0]
    assert hyp.status == "ok" and "(after 1 repair)" in hyp.result and len(hyp.attempts) == 2
    assert "incorrect" in hyp.attempts[0] and len(log.program_hashes) == 2 and len(log.tried) == 1


def test_repairs_are_bounded_and_every_attempt_recorded():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    fail = hcm.Outcome("runtime_error", message="illegal memory access")
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="fused"), merge_reply(1, "Fuse the tail"),
                       code_reply(prog(1)), f"```python\n{prog(2)}```", f"```python\n{prog(3)}```"])
    ex = Exec(fail, fail, fail)
    r = run(pool, log, llm, ex, max_repairs=2)
    assert llm.remaining == 0 and len(ex.programs) == 3 and len(r.attempts) == 3
    assert pool.get(1).hypotheses[0].status == "runtime_error" and len(pool.get(1).hypotheses[0].attempts) == 3
    assert "(after 2 repairs)" in pool.get(1).hypotheses[0].result


def test_repair_exception_is_recorded_failure():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    fail = hcm.Outcome("compile_error", message="nvcc error")
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="fused"), merge_reply(1, "Fuse the tail"),
                       code_reply(prog(1)), TimeoutError("read timed out")])
    r = run(pool, log, llm, Exec(fail))
    assert r.status == "evaluated" and r.outcome == fail and pool.get(1).hypotheses[0].status == "compile_error"
    assert any("TimeoutError: read timed out" in e for e in r.events)


def test_hallucinated_idea_id_gets_reminder_then_valid_answer():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("x", choice="idea 7", experiment="fused"), merge_reply(1, "Fuse the tail"),
                       select_reply(7, "fused"), select_reply(1, "fused"), code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK))
    assert "Idea ID 7 is not in the repository (valid ids: [1])" in llm.prompts[3]
    assert r.idea_id == 1 and r.status == "evaluated" and len(pool.ideas) == 1


def test_hallucinated_idea_id_twice_becomes_its_own_idea():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("x"), merge_reply(1, "Fuse the tail"), select_reply(7, "Use tensor cores"),
                       select_reply(8, "Use tensor cores"), code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK))
    assert r.status == "evaluated" and r.idea_id == 2 and pool.get(2).description == "Use tensor cores"
    assert pool.get(1).hypotheses == [] and pool.get(2).hypotheses[0].status == "ok"
    assert any("unknown idea id 8" in e for e in r.events)


def test_no_code_after_reminder_is_recorded_no_program():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    rambling = ("Let me think step by step about the memory traffic. "
                "The conv output is 520 MB, so each extra pass costs ... " * 20)
    truncated = "Here:\n\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def fo"
    llm, ex = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="fuse everything"),
                           merge_reply(1, "Fuse the tail"), rambling, truncated]), Exec()
    r = run(pool, log, llm, ex)
    assert "no fenced code block" in llm.prompts[3] and "Format reminder" in llm.prompts[3]
    assert r.status == "no_program" and ex.programs == [] and r.idea_id == 1
    hyp = pool.get(1).hypotheses[0]
    assert hyp.status == "no_program" and "unterminated" in hyp.result and log.tried[0].hypothesis == hyp


def test_llm_exception_in_generation_on_fresh_pool():
    pool, log = hcm.IdeaPool(), hcm.GlobalLog()
    r = run(pool, log, ScriptedLLM([ConnectionError("HTTP 503 from server")]), Exec())
    assert r.status == "llm_error" and pool.ideas == [] and log.tried == []
    assert any("ConnectionError: HTTP 503" in e for e in r.events) and r.strong_calls == 1


def test_llm_exception_in_selection_keeps_pool_consistent_and_prunes():
    pool, log = pool_with("a", "b"), hcm.GlobalLog()
    llm = ScriptedLLM([RuntimeError("rate limited"), ValueError("bad gateway"), "Dropping Ideas: [1]"])
    r = run(pool, log, llm, Exec(), k_idea=1)
    assert llm.kinds == ["idea_generation", "selection", "prune"]   # generation failed: pool still usable
    assert r.status == "llm_error" and r.idea_id is None and pool.ids() == [2]
    restored = hcm.IdeaPool.from_dict(json.loads(json.dumps(pool.to_dict())))
    assert restored == pool


def test_execute_exception_is_recorded():
    pool, log = pool_with("a"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="e"), merge_reply(1, "a"), code_reply(prog(1))])

    def boom(src):
        raise OSError("GPU worker died")

    r = run(pool, log, llm, boom)
    assert r.status == "execute_error" and "GPU worker died" in r.outcome.message
    assert log.program_hashes == set()          # not evaluated, so it may be tried again


def test_scripted_llm_reports_running_out():
    llm = ScriptedLLM(["only one"])
    llm("first")
    with pytest.raises(ScriptExhausted, match="ran out of replies: call 2"):
        llm(hcm.SELECT_PROMPT)


# ---------------------------------------------------------------------------------------------- fakes

def test_rule_based_llm_is_deterministic_and_answers_every_kind():
    llm = RuleBasedLLM([prog(1), prog(2)], seed=3)
    pool = pool_with("a", "b", "c")
    sel = hcm.SELECT_PROMPT.format(task="t", background="b", parent="p", pool=hcm.render_pool(pool), dropped="",
                                   note="", valid_ids="1, 2, 3", legend="", uncovered="")
    assert llm(sel) == llm(sel) == RuleBasedLLM([prog(1), prog(2)], seed=3)(sel)
    s = hcm.parse_selection(llm(sel))
    assert s.idea_id in (1, 2, 3) and s.experiment and s.code is None
    ideas = llm(hcm.IDEA_GEN_PROMPT.replace("{n}", "4").replace("{valid_ids}", " (ids: 1, 2, 3)"))
    assert len(hcm.parse_ideas(ideas)) == 4 and hcm.parse_choice(ideas) is not None
    cls = llm(hcm.CLASSIFY_PROMPT.format(task="t", pool=hcm.render_pool(pool, records=False), count="2 sections",
                                         proposals="Proposal 1: use streams\nProposal 2: tile"))
    assert set(hcm.parse_classifications(cls, 2)) == {1, 2}
    prune = hcm.PRUNE_PROMPT.format(task="t", direction="d", pool=hcm.render_pool(pool), cap=1, n_drop=2,
                                    ids_word="ids", example="[2, 5]", legend="")
    assert hcm.parse_drop_list(llm(prune)) == [1, 2]
    for template in (hcm.IMPLEMENT_PROMPT, hcm.REPAIR_PROMPT, "some other prompt"):
        assert hcm.extract_code(llm(template)) in (prog(1), prog(2))
    assert hcm.parse_summary(llm(hcm.SUMMARY_PROMPT)) and hcm.parse_duplicate_verdict(llm(hcm.DUPLICATE_PROMPT))
    with pytest.raises(ValueError):
        RuleBasedLLM([])


def test_stable_rule_based_llm_ignores_measured_numbers_but_not_the_rest():
    programs = [prog(k) for k in range(1, 9)]
    fast, slow = (f"Parent program: 1.{d}23 ms, speedup 0.9{d}x\n" + hcm.IMPLEMENT_PROMPT for d in (1, 7))
    stable = RuleBasedLLM(programs, seed=3, stable=True)
    assert hcm.extract_code(stable(fast)) == hcm.extract_code(stable(slow))
    texts = [f"Idea {w}\n" + hcm.IMPLEMENT_PROMPT for w in "abcdefghijklmnop"]
    assert len({hcm.extract_code(stable(t)) for t in texts}) > 1   # words still choose
    plain = RuleBasedLLM(programs, seed=3)
    assert len({hcm.extract_code(plain(f"{k} ms\n" + hcm.IMPLEMENT_PROMPT)) for k in range(16)}) > 1
    tagged = RuleBasedLLM(programs, seed=3, variants=True, stable=True)
    assert tagged(fast) != tagged(slow)   # the variant tags still differ: no duplicate programs


def test_rule_based_runs_are_reproducible():
    def one_run():
        pool, log = hcm.IdeaPool(), hcm.GlobalLog()
        llm, rng = RuleBasedLLM([prog(k) for k in range(3)], seed=0, variants=True), random.Random(0)
        results = [hcm.run_generation(pool, log, task=TASK, parent=PARENT, llm=llm,
                                      execute=lambda s: hcm.Outcome("ok", float(len(s) % 7), "m"), rng=rng)
                   for _ in range(5)]
        return [r.to_dict() for r in results], pool.to_dict(), log.to_dict()

    first = one_run()
    assert first == one_run()
    assert all(r["status"] == "evaluated" for r in first[0])


def test_unusable_idea_generation_on_fresh_pool_gets_one_reminder_then_no_ideas():
    pool, log = hcm.IdeaPool(), hcm.GlobalLog()
    llm = ScriptedLLM(["I need to think more about this problem before proposing anything.",
                       "Here are my thoughts: shared memory might help, or not."])
    r = run(pool, log, llm, Exec())
    assert r.status == "no_ideas" and llm.kinds == ["idea_generation", "idea_generation"]
    assert "no 'Idea: ...' entries found" in llm.prompts[1] and pool.ideas == []


def test_selection_without_experiment_line_still_runs_and_skips_duplicate_check():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    add_record(log, pool.get(1), "earlier", 2.0, prog(0))
    llm = ScriptedLLM([ideas_reply("x"), merge_reply(1, "Fuse the tail"), "Idea ID: 1", "Idea ID: 1\nI will fuse.",
                       code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK))
    assert "no 'Experiment: ...' line" in llm.prompts[3]
    assert r.status == "evaluated" and "duplicate_check" not in llm.kinds
    assert pool.get(1).hypotheses[-1].experiment == "(experiment not described)"


def test_rule_based_llm_shared_by_concurrent_islands_is_reproducible():
    from concurrent.futures import ThreadPoolExecutor
    llm = RuleBasedLLM([prog(k) for k in range(3)], seed=7, variants=True)

    def island(i: int) -> dict:
        pool, log = hcm.IdeaPool(), hcm.GlobalLog()
        task = hcm.TaskContext(f"island{i}", "bg")
        for _ in range(4):
            hcm.run_generation(pool, log, task=task, parent=PARENT, llm=llm,
                               execute=lambda s: hcm.Outcome("ok", 1.0, "1 ms"), config=hcm.HCMConfig(k_idea=2))
        return {"pool": pool.to_dict(), "log": log.to_dict()}

    sequential = [island(i) for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        assert list(ex.map(island, range(4))) == sequential


def test_merge_pools_copies_new_ideas_with_fresh_ids_and_prune_pool_caps():
    mine, theirs = pool_with("Fuse the tail", "Tile"), pool_with("fuse  the TAIL", "Use CUDA graphs", "Vectorise")
    theirs.get(2).hypotheses.append(hcm.Hypothesis("graph capture", status="ok", score=1.0, result="1 ms"))
    theirs.get(2).best_score = 1.0
    assert hcm.merge_pools(mine, theirs) == [3, 4]
    assert [(i.id, i.description) for i in mine.ideas][2:] == [(3, "Use CUDA graphs"), (4, "Vectorise")]
    assert mine.get(3).hypotheses[0].experiment == "graph capture" and mine.next_id == 5
    assert theirs.get(2).id == 2                                # the partner's pool is untouched
    log, llm = hcm.GlobalLog(), ScriptedLLM(["Dropping Ideas: [2]"])
    assert hcm.prune_pool(mine, log, llm=llm, config=hcm.HCMConfig(k_idea=4)) == []   # at the cap: no call
    assert llm.prompts == []
    notes = hcm.prune_pool(mine, log, llm=llm, config=hcm.HCMConfig(k_idea=3))
    assert mine.ids() == [1, 3, 4] and [i.id for i in log.pruned] == [2] and "pruned ideas [2]" in notes[-1]


def test_merge_pools_keeps_every_record_of_a_matching_idea_and_follows_lineage():
    mine, theirs = pool_with("Fuse the tail", "Tile"), pool_with("fuse  the TAIL", "Vectorise")
    mine.get(1).hypotheses.append(hcm.Hypothesis("my fusion", "p1", "ok", 3.0, "3 ms", "3 ms"))
    mine.get(1).tried, mine.get(1).best_score, mine.get(1).best_metric = 1, 3.0, "3 ms"
    for k in range(3):
        theirs.get(1).hypotheses.append(hcm.Hypothesis(f"their fusion {k}", f"t{k}", "ok", 2.0 - k, f"{2 - k} ms", "r"))
    theirs.get(1).tried, theirs.get(1).summary = 5, "their findings"   # 2 summarised earlier
    merged = hcm.merge_pools(mine, theirs, src_name="island 1", dst_name="island 0")
    assert merged == [1, 3] and mine.ids() == [1, 2, 3] and mine.next_id == 4
    fused = mine.get(1)
    assert [h.experiment for h in fused.hypotheses] == ["my fusion"] + [f"their fusion {k}" for k in range(3)]
    assert fused.tried == 1 + 5 and fused.best_score == 0.0 and "their findings" in fused.summary
    assert "island 1#1" in fused.origins and mine.get(3).origins == ["island 1#2"]
    # the same crossover again brings nothing new and counts nothing twice
    assert hcm.merge_pools(mine, theirs, src_name="island 1", dst_name="island 0") == []
    assert fused.tried == 6 and len(fused.hypotheses) == 4
    # lineage: the partner renamed its copy of our idea 2; its new record still lands on idea 2
    back = hcm.IdeaPool()
    hcm.merge_pools(back, mine, src_name="island 0", dst_name="island 1")
    copy = next(i for i in back.ideas if "island 0#2" in i.origins)
    copy.description = "Tile through shared memory, 32x8"
    copy.hypotheses.append(hcm.Hypothesis("tile 32x8", "t9", "ok", 1.0, "1 ms", "1 ms"))
    assert hcm.merge_pools(mine, back, src_name="island 1", dst_name="island 0") == [2]
    assert mine.get(2).description == "Tile" and mine.get(2).hypotheses[-1].experiment == "tile 32x8"
    assert hcm.IdeaPool.from_dict(json.loads(json.dumps(mine.to_dict()))) == mine
