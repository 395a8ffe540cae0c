"""Tests for hcm.py (Algorithm 1 of the PACEvolve paper). Run: python3 -m pytest -q tests/test_hcm.py

The LLM is a ScriptedLLM (canned replies in order); tests assert on the prompts it received.
A generation's calls, in order: idea_generation (with the choice of idea and experiment), classification
(one call for all proposals; none on an empty pool), selection (only when the choice is missing or
repeats the log), duplicate_check (only when the log holds a similar experiment), implementation, repairs,
summary, prune.
"""
from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings, strategies as st

import hcm
import hcm_parsers
import hcm_state
from fake_llm import RuleBasedLLM, ScriptedLLM, ScriptExhausted

TASK = hcm.TaskContext("toy_scale", "BACKGROUND-MARKER: scale a tensor on a GPU.")
PARENT = hcm.Parent("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n",
                    "3.50 ms (reference)")


def prog(k: int, comment: str = "") -> str:
    return (f"import torch\n{comment}\nclass ModelNew(torch.nn.Module):\n"
            f"    def forward(self, x):\n        return x * 2 + {k}\n")


def ideas_reply(*ideas: str, choice: str | None = None, experiment: str = "") -> str:
    body = "\n".join(f"**Idea {n}**\nIdea: {idea}\nReasoning: because.\n" for n, idea in enumerate(ideas, 1))
    tail = f"\nChoice: {choice}\nExperiment: {experiment}\n" if choice else ""
    return "Let me study the program first.\n\n" + body + tail


def new_reply(desc: str) -> str:
    return f"Idea Exists: False\nIdea description: {desc}"


def merge_reply(idea_id: int, desc: str) -> str:
    return f"Idea Exists: True\nIdea ID: {idea_id}\nUpdated description: {desc}"


def batch_reply(*answers: str) -> str:
    return "\n\n".join(f"Proposal {k}\n{a}" for k, a in enumerate(answers, 1))


def select_reply(idea_id, experiment: str) -> str:
    return f"I will go with this.\n\nIdea ID: {idea_id}\nExperiment: {experiment}\n"


def code_reply(code: str) -> str:
    return f"Here it is.\n\n```python\n{code}```\n"


class Exec:
    """execute callback returning scripted Outcomes and recording the programs it saw."""

    def __init__(self, *outcomes: hcm.Outcome):
        self.outcomes, self.programs = list(outcomes), []

    def __call__(self, src: str) -> hcm.Outcome:
        self.programs.append(src)
        return self.outcomes[len(self.programs) - 1]


OK = hcm.Outcome("ok", 1.5, "2.33x speedup (1.50 ms vs 3.50 ms)", "")


def pool_with(*descs: str) -> hcm.IdeaPool:
    pool = hcm.IdeaPool()
    for d in descs:
        pool.add(d)
    return pool


def add_record(log: hcm.GlobalLog, idea: hcm.Idea, experiment: str, score: float, code: str) -> None:
    hyp = hcm.Hypothesis(experiment, hcm.program_id(code), "ok", score, f"{score} ms", f"{score} ms",
                         [f"{hcm.program_id(code)}: {score} ms"])
    hcm.record(log, idea, hyp)
    log.program_hashes.add(hcm.program_hash(code))


def run(pool, log, llm, execute, cheap=None, parent=PARENT, task=TASK, **cfg):
    cfg = {"n_proposals": 1, **cfg}
    return hcm.run_generation(pool, log, task=task, parent=parent, llm=llm, execute=execute,
                              config=hcm.HCMConfig(**cfg), cheap_llm=cheap)


def gen(k: int, idea: int = 1, desc: str = "Fuse the tail") -> list[str]:
    """Replies for one generation (one proposal merged into `idea`) that tests experiment k."""
    return [ideas_reply(f"variant {k}", choice=f"idea {idea}", experiment=f"experiment {k}"),
            merge_reply(idea, desc), code_reply(prog(k))]


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


# ---------------------------------------------------------------------------------------------- parents, records, budget

def test_parent_is_named_for_what_it_is_and_the_island_best_is_located():
    pool, log = pool_with("Fuse the tail", "Tile"), hcm.GlobalLog()
    add_record(log, pool.get(2), "tile 32x8 with float4", 1.0, prog(5))
    parent = hcm.Parent(prog(9), "7.985 ms, 0.225x the reference's speed", "p9", role="parent, chosen by tournament",
                        best="1 ms, 1.8x the reference's speed", best_program_id=hcm.program_id(prog(5)))
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="e"), merge_reply(1, "Fuse the tail"),
                       code_reply(prog(1))])
    run(pool, log, llm, Exec(OK), parent=parent)
    ideas, _, code = llm.prompts
    assert "Parent, chosen by tournament: 7.985 ms, 0.225x the reference's speed." in ideas
    assert "Island best so far: 1 ms, 1.8x the reference's speed (idea 2, experiment: tile 32x8 with float4)." in ideas
    assert "## Parent program (parent, chosen by tournament): 7.985 ms, 0.225x" in code and prog(9).strip() in code
    ref = hcm.Parent(PARENT.source, "3.5 ms, 1.000x", role="parent, chosen by tournament", is_reference=True)
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="e2"), merge_reply(1, "Fuse the tail"),
                       code_reply(prog(2))])
    run(pool, log, llm, Exec(OK), parent=ref, task=hcm.TaskContext("t", "bg", reference=PARENT.source))
    assert "the PyTorch reference itself (class Model, shown above)" in llm.prompts[0]
    assert "It is the island's best program so far." in llm.prompts[0]


def test_no_prompt_carries_the_same_code_twice():
    task = hcm.TaskContext("toy", "bg", reference=PARENT.source)
    pool, log, seen = hcm.IdeaPool(), hcm.GlobalLog(), []
    inner = RuleBasedLLM([prog(k) for k in range(4)], seed=2, variants=True)

    def llm(prompt):
        seen.append(prompt)
        return inner(prompt)

    outcomes = iter(range(1000))

    def execute(src):
        k = next(outcomes)
        return hcm.Outcome("ok", 1.0 + k, f"{1.0 + k} ms") if k % 2 else hcm.Outcome("incorrect", message="off by 1")

    for parent in (hcm.Parent(PARENT.source, "3.5 ms", is_reference=True), hcm.Parent(prog(3), "2 ms", "p3")) * 3:
        hcm.run_generation(pool, log, task=task, parent=parent, llm=llm, execute=execute,
                           config=hcm.HCMConfig(k_idea=3, k_hyp=2))
    assert {hcm.prompt_kind(p) for p in seen} >= {"idea_generation", "classification", "implementation", "repair"}
    for prompt in seen:
        blocks = [" ".join(b.split()) for b in re.findall(r"^```python\n(.*?)^```", prompt, re.S | re.M)]
        assert len(blocks) == len(set(blocks)), hcm.prompt_kind(prompt)


def test_long_records_appear_whole_and_the_budget_drops_whole_records_with_a_count():
    pool = pool_with("Fuse")
    for k in range(50):
        pool.ideas[0].hypotheses.append(hcm.Hypothesis(f"exp {k} " + "x" * 300 + " END", status="ok", result="r" * 300))
    text = hcm.render_pool(pool)
    assert text.count(" END -> ") == 50                                  # no budget: everything, whole
    bounded = hcm.render_pool(pool, budget=3000)
    assert len(bounded) <= 3000 and "exp 49 " in bounded and "exp 40 " not in bounded
    shown = bounded.count(" END -> ")
    assert f"({50 - shown} earlier records not shown)" in bounded
    assert all(line.endswith("r" * 300) for line in bounded.splitlines() if line.startswith("  - "))
    pool.ideas[0].hypotheses = pool.ideas[0].hypotheses[:2]
    assert "(1 earlier record not shown)" in hcm.render_pool(pool, budget=len(hcm.render_pool(pool)) - 10)
    tiny = hcm.render_pool(pool, budget=10)                                # descriptions always stay
    assert "Description: Fuse" in tiny and "(2 records not shown)" in tiny


def test_prompts_stay_within_the_budget_as_history_grows():
    pool, log = pool_with("Fuse the tail", "Tile"), hcm.GlobalLog()
    for k in range(60):
        add_record(log, pool.get(1 + k % 2), f"experiment {k} " + "with a long, specific description " * 8, 2.0, prog(1000 + k))
    llm = RuleBasedLLM([prog(1)], seed=0, variants=True)
    prompts = []

    def spy(p):
        prompts.append(p)
        return llm(p)

    run(pool, log, spy, Exec(OK), k_hyp=100, prompt_chars=6000)
    for p in prompts:
        if hcm.prompt_kind(p) in ("idea_generation", "selection", "prune"):
            assert len(p) <= 6000, (hcm.prompt_kind(p), len(p))
    assert "earlier records not shown" in prompts[0]

LEGEND = "LEGEND-MARKER: what a result's figures mean."


def _outside_code(prompt: str) -> str:
    return re.sub(r"^```[^\n]*\n.*?^```", "", prompt, flags=re.S | re.M)


def unbacked_references(prompt: str) -> list[str]:
    """Everything in a prompt that points at text, where the text it points at is not there."""
    text, problems = _outside_code(prompt), []
    has_records = bool(re.search(r"^  - \[", text, re.M))
    for m in re.finditer(r"[^\n]{0,60}\b(above|below|shown)\b[^\n]{0,40}", text):
        phrase = m.group(0)
        if "not shown" in phrase or "answer format above" in phrase and "## Answer format" in text:
            continue
        if "no record above covers" in phrase and has_records:
            continue
        if "(class Model, shown above)" in phrase and re.search(r"```python\n(?:(?!```).)*class Model\(",
                                                                 prompt[:prompt.index(phrase)], re.S):
            continue
        problems.append(phrase)
    if "Records of this idea:" in text and not has_records:
        problems.append("Records of this idea")
    for label in ("Reference program", "Parent program ("):
        if label in text and label in prompt and "```python" not in prompt[prompt.index(label):]:
            problems.append(label)
    numbers = re.findall(r"(?<![\w#])#(\d+)\b", text)
    problems += [f"#{n}" for n in numbers if not re.search(rf"^#{n} ", text, re.M)]   # log entries by number
    results = "beside it)" in text.replace(LEGEND, "")
    if ("LEGEND-MARKER" in text) != results:
        problems.append("legend without results" if not results else "results without the legend")
    return problems


class FirstReplyUnusable:
    """The rule-based LLM, except that the first prompt of each kind gets a useless reply (a reminder follows)
    and every other idea-generation reply makes no choice (a selection prompt follows)."""

    def __init__(self, inner):
        self.inner, self.kinds, self.prompts = inner, set(), []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        kind = hcm.prompt_kind(prompt)
        if kind not in self.kinds:
            self.kinds.add(kind)
            return "I need to think about this more."
        reply = self.inner(prompt)
        if kind == "idea_generation" and len(self.prompts) % 2:
            reply = re.sub(r"^Choice:.*$", "", reply, flags=re.M)
        return reply


def test_no_prompt_of_any_kind_points_at_text_it_does_not_hold():
    task = hcm.TaskContext("toy", "bg", reference=PARENT.source, legend=LEGEND)
    pool, log = hcm.IdeaPool(), hcm.GlobalLog()
    llm = FirstReplyUnusable(RuleBasedLLM([prog(k) for k in range(4)], seed=4, variants=True))
    outcomes = iter(range(1000))

    def execute(src):
        k = next(outcomes)
        return (hcm.Outcome("ok", 1.0 + k, f"{1.5 / (1 + k):.3g}x ±5% (1 ms vs reference 1.5 ms beside it)")
                if k % 3 else hcm.Outcome("incorrect", message="output 0 off by 0.2"))

    ref = hcm.Parent(PARENT.source, "the reference itself: 3.5 ms per call", is_reference=True)
    best = hcm.Parent(prog(3), "2x ±5% (1 ms vs reference 1.5 ms beside it)", "p3",
                      best="3x ±5% (0.5 ms vs reference 1.5 ms beside it)", best_program_id="p9")
    for parent in (ref, best, ref, best, ref, best, ref):
        hcm.run_generation(pool, log, task=task, parent=parent, llm=llm, execute=execute,
                           config=hcm.HCMConfig(k_idea=2, k_hyp=1, similarity=0.2))
    kinds = {hcm.prompt_kind(p) for p in llm.prompts}
    assert kinds >= {"idea_generation", "classification", "selection", "duplicate_check", "implementation",
                     "repair", "summary", "prune"}, kinds
    assert any("## Format reminder" in p for p in llm.prompts)
    for prompt in llm.prompts:
        assert unbacked_references(prompt) == [], (hcm.prompt_kind(prompt), unbacked_references(prompt))
    # the checker finds what it is for: the reference named as shown when it is not
    sel = next(p for p in llm.prompts if hcm.prompt_kind(p) == "selection")
    assert unbacked_references(sel.replace("## Parent program\n", "## Parent program\n(class Model, shown above) "))


def test_a_record_keeps_the_plan_and_the_implementers_own_description():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    reply = ("Implemented: one kernel for tanh and hardswish; the float4 loads of the plan did not fit the\n"
             "odd channel count, so loads stay scalar.\n\n```python\n" + prog(1) + "```\n")
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="fuse tanh and hardswish with float4 loads"),
                       merge_reply(1, "Fuse the tail"), reply])
    run(pool, log, llm, Exec(OK))
    h = pool.get(1).hypotheses[0]
    assert h.experiment == "fuse tanh and hardswish with float4 loads"
    assert h.implemented == ("one kernel for tanh and hardswish; the float4 loads of the plan did not fit the "
                             "odd channel count, so loads stay scalar.")
    line = hcm.render_record(h)
    assert "fuse tanh and hardswish with float4 loads | built: one kernel" in line and OK.metric in line
    assert "Implemented: <one or two sentences" in llm.prompts[-1]
    assert hcm.Hypothesis.from_dict(h.to_dict()) == h and log.tried[0].hypothesis.implemented == h.implemented


def test_a_repair_that_says_what_it_built_replaces_the_description():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="e"), merge_reply(1, "Fuse the tail"),
                       "Implemented: a fused kernel.\n\n```python\n" + prog(1) + "```\n",
                       "Cause: an off-by-one.\nImplemented: the fused kernel, bounds fixed.\n\n```python\n"
                       + prog(2) + "```\n"])
    run(pool, log, llm, Exec(hcm.Outcome("incorrect", message="off"), OK))
    assert pool.get(1).hypotheses[0].implemented == "the fused kernel, bounds fixed."


def test_a_cut_record_says_so_and_is_cut_at_a_word():
    long = "Key findings: " + "the warp-shuffle reduction helped; " * 60
    found = hcm.parse_summary(long)
    assert found.endswith("more characters]") and "[cut: " in found
    kept = found[:found.index(" [cut: ")]
    assert len(kept) <= 800 and long.split(": ", 1)[1].startswith(kept) and kept.endswith(("helped;", "reduction"))
    ex = Exec(hcm.Outcome("incorrect", message="error: " + "x" * 2000))
    pool, log = pool_with("Fuse"), hcm.GlobalLog()
    run(pool, log, ScriptedLLM([ideas_reply("x", choice="idea 1", experiment="e"), merge_reply(1, "Fuse"),
                                code_reply(prog(1))]), ex, max_repairs=0)
    assert "[cut: 1,607 more characters]" in pool.get(1).hypotheses[0].result


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=300), st.integers(5, 200))
def test_clip_keeps_what_fits_and_marks_what_it_cuts(text, limit):
    one_line = " ".join(text.split())
    out = hcm.clip(text, limit)
    if len(one_line) <= limit:
        assert out == one_line
    else:
        kept, mark = out.rsplit(" [cut: ", 1)
        assert one_line.startswith(kept) and len(kept) <= limit
        assert mark == f"{len(one_line) - len(kept):,} more characters]"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["Fuse the tail.", "Use float4 loads.", "Keep sums in registers.",
                                 "Tile by 32."]), min_size=1, max_size=4),
       st.lists(st.sampled_from(["Fuse the tail.", "Unroll by 4.", "use FLOAT4 loads.", "Tile by 32."]),
                min_size=1, max_size=4))
def test_merged_descriptions_keep_every_sentence_of_both_once(a, b):
    first, second = " ".join(dict.fromkeys(a)), " ".join(dict.fromkeys(b))
    merged = hcm.merge_descriptions(first, second)
    assert merged.startswith(first)
    keys = [x.lower() for x in re.split(r"(?<=\.)\s+", merged)]
    assert {x.lower() for x in a + b} == set(keys) and len(keys) == len(set(keys))
    assert hcm.merge_descriptions(merged, second) == merged


def test_unusable_replies_are_counted_per_prompt_kind():
    pool, log = pool_with("Fuse the tail"), hcm.GlobalLog()
    llm = ScriptedLLM(["no format", ideas_reply("x", choice="idea 1", experiment="e"), "???", "still ???",
                       "no code here", code_reply(prog(1))])
    r = run(pool, log, llm, Exec(OK))
    assert hcm.count_unusable(r.events) == {"idea_generation": 1, "classification": 2, "implementation": 1}
    assert any(e == "no usable classification reply after 1 format reminder" for e in r.events)


# ---------------------------------------------------------------------------------------------- parsers

CODE = prog(7)


def test_extract_code_long_reasoning_without_code():
    text = ("Let me analyse the kernel. The ModelNew class should fuse the operations. " * 50 +
            "\nI think the best plan is to use shared memory, class ModelNew will need a new forward.")
    assert hcm.extract_code(text) is None and "no fenced code block" in hcm.code_problem(text)


def test_extract_code_truncated_inside_fence():
    text = f"Here is the program:\n```python\n{CODE}" + "    def helper(self):\n        return torch.zer"
    assert hcm.extract_code(text) is None and "unterminated" in hcm.code_problem(text)
    earlier = f"Draft:\n```python\n{CODE}```\nFinal:\n```python\n{CODE}    # more"
    assert hcm.extract_code(earlier) is None


def test_extract_code_several_blocks_takes_last_modelnew_that_parses():
    first, second = prog(1), prog(2)
    broken = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n"
    text = (f"Old version:\n```python\n{first}```\nNew version:\n```py\n{second}```\n"
            f"Oops, a broken retry:\n```python\n{broken}```\nUsage:\n```python\nm = ModelNew()\nprint(m)\n```\n"
            "```cuda\n__global__ void k() {}\n```\nDone.")
    assert hcm.extract_code(text) == second
    assert "does not parse (line 3" in hcm.code_problem(f"```python\n{broken}```")
    assert hcm.extract_code(f"```python\n{broken}```") is None


def test_extract_code_fence_variants():
    assert hcm.extract_code(f"~~~python\n{CODE}~~~") == CODE
    assert hcm.extract_code(f"```\n{CODE}```") == CODE
    assert hcm.extract_code(f"``` Python\n{CODE}```") == CODE
    crlf = f"Reasoning.\r\n\r\n```python\r\n{CODE}```\r\nThanks.".replace("\n", "\r\n").replace("\r\r\n", "\r\n")
    assert hcm.extract_code(crlf) == CODE
    # a four-backtick fence may contain a triple-backtick string
    inner = CODE + 'DOC = """\n```\nnot a fence end\n```\n"""\n'
    assert hcm.extract_code(f"````python\n{inner}````") == inner
    assert hcm.extract_code(CODE) == CODE                       # a bare program is accepted
    assert hcm.extract_code("```python\nclass Model:\n    pass\n```") is None
    assert hcm.extract_code("```python\ndef f():\n    class ModelNew: pass\n```") is None   # not top level
    assert hcm.extract_code("") is None and hcm.extract_code(None) is None


MESSY_IDEAS = """I looked at the profile first; the epilogue dominates.

### **Idea 1:** Fused epilogue
**Idea:** Fuse Tanh, HardSwish and the residual add into a single kernel
that reads the conv output once.
**Reasoning:** three passes over 520 MB become one.

2. **Idea**: Compute GroupNorm statistics with warp shuffles.
   **Reasoning**: fewer shared-memory round trips.

Option 3 — Use channels-last layout so loads are contiguous

reasoning: coalescing.

Overall I expect idea 1 to win."""


def test_parse_ideas_messy_markdown():
    assert hcm.parse_ideas(MESSY_IDEAS) == [
        "Fuse Tanh, HardSwish and the residual add into a single kernel that reads the conv output once.",
        "Compute GroupNorm statistics with warp shuffles.",
        "Use channels-last layout so loads are contiguous"]
    assert hcm.parse_ideas(MESSY_IDEAS.replace("\n", "\r\n"))[1] == "Compute GroupNorm statistics with warp shuffles."
    assert hcm.parse_ideas("IDEA: one\nREASONING: r\nidea: One\n") == ["one"]          # case-insensitive dedup
    assert hcm.parse_ideas("Idea-level thinking is hard. I have no proposals.") == []
    assert hcm.parse_ideas("Hypothesis: tile it. Reasoning: reuse.\n1) Idea: unroll **Reasoning:** ILP") == ["tile it.", "unroll"]
    assert hcm.parse_ideas("```python\nIdea: inside code\n```") == []


@pytest.mark.parametrize("text, expected", [
    ("Idea Exists: True\nIdea ID: 3\nUpdated description: Fuse the tail.", (True, 3, "Fuse the tail.")),
    ("**Idea Exists:** yes\n**Idea ID:** #3\n**Updated description:** Fuse the tail\nwith float4 stores.\n\n"
     "I merged it because both fuse the tail.", (True, 3, "Fuse the tail with float4 stores.")),
    ("## Classification\n- Idea Exists: TRUE\n- Idea ID: [2]\n- Updated description: x", (True, 2, "x")),
    ("After comparing, this is new.\n\nIdea exists: False\nIdea description: Use CUDA graphs.\n\nThanks!",
     (False, None, "Use CUDA graphs.")),
    ("Idea Exists: False\nIdea Description: A\r\nReasoning: b", (False, None, "A")),
])
def test_parse_classification_variants(text, expected):
    c = hcm_parsers.parse_classification(text)
    assert (c.exists, c.idea_id, c.description) == expected


@pytest.mark.parametrize("text", ["Idea Exists: True\nUpdated description: no id", "Idea Exists: False",
                                  "I think it is similar to the first idea.", ""])
def test_parse_classification_rejects_non_answers(text):
    assert hcm_parsers.parse_classification(text) is None


@pytest.mark.parametrize("text, idea_id, experiment", [
    ("**Idea ID:** 2\n**Experiment:** unroll the inner loop by 4\nand use __ldg.\n\n```python\n" + CODE + "```",
     2, "unroll the inner loop by 4 and use __ldg."),
    ("## Idea ID\n3\n\n## Experiment description: tile 32x32\n```python\n" + CODE + "```", 3, "tile 32x32"),
    ("Selected idea: #4 (tiling)\nExperiment - tile 32x32\n```python\n" + CODE + "```", 4, "tile 32x32"),
    ("Idea: tile 32x32 blocks\nIdea ID: [5]\nExperiment: x\n```python\n" + CODE + "```", 5, "x"),
])
def test_parse_selection_variants(text, idea_id, experiment):
    s = hcm.parse_selection(text)
    assert (s.idea_id, s.experiment, s.code) == (idea_id, experiment, CODE)


def test_parse_selection_partial_and_empty():
    s = hcm.parse_selection("Idea ID: 2\nExperiment: fuse\n\n(code to follow)")
    assert (s.idea_id, s.experiment, s.code) == (2, "fuse", None)
    assert hcm.parse_selection("no structure at all") is None
    assert hcm.parse_selection("```python\n# Idea ID: 3\n" + CODE + "```") is None   # labels inside code ignored


@pytest.mark.parametrize("text, expected", [
    ("Dropping Ideas: [1, 3]", [1, 3]),
    ("After review:\n\n**Dropping Ideas:** [Idea 2, Idea 4]\n\nThese were stale.", [2, 4]),
    ("### Dropping ideas\ndropping ideas: 2 and 5", [2, 5]),
    ("Dropping Ideas: []", []),
    ("Dropping Ideas: none", []),
    ("I would drop these: [3]", [3]),
    ("Dropping Ideas:\r\n[7]", [7]),
    ("I am not sure which ideas to drop.", None),
])
def test_parse_drop_list_variants(text, expected):
    assert hcm.parse_drop_list(text) == expected


def test_parse_duplicate_verdict_and_summary():
    assert hcm.parse_duplicate_verdict("**Repeat:** Yes\nEntry: #4") == (True, 4)
    assert hcm.parse_duplicate_verdict("repeat: no\nentry: none") == (False, None)
    assert hcm.parse_duplicate_verdict("Probably a repeat.") is None
    assert hcm.parse_summary("Thinking...\n- Results: best 1.2 ms;\nfloat4 failed") == "best 1.2 ms; float4 failed"
    assert hcm.parse_summary("nothing useful") is None


# ---------------------------------------------------------------------------------------------- prompts

def test_every_template_has_its_marker_and_prompt_kind_survives_reminders():
    templates = {"idea_generation": hcm.IDEA_GEN_PROMPT, "classification": hcm.CLASSIFY_PROMPT,
                 "selection": hcm.SELECT_PROMPT, "duplicate_check": hcm.DUPLICATE_PROMPT,
                 "implementation": hcm.IMPLEMENT_PROMPT, "repair": hcm.REPAIR_PROMPT,
                 "summary": hcm.SUMMARY_PROMPT, "prune": hcm.PRUNE_PROMPT}
    for kind, template in templates.items():
        assert hcm.prompt_kind(template) == kind
        assert hcm.prompt_kind(template + hcm.REMINDER.format(reason="x")) == kind
    assert hcm.prompt_kind("hello") == "unknown"


# ---------------------------------------------------------------------------------------------- state

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
