"""What HCM's prompts show (hcm.py, hcm_prompts.py; App. B.2 of the PACEvolve paper): the parent named for what
it is, the island's best located, no code twice, whole records within the size budget, no prompt pointing at
text it does not hold, records that keep the plan and the implementer's description, every template's marker.
Run: python3 -m pytest -q tests/test_hcm_prompts.py
"""
from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

import hcm
from fake_llm import RuleBasedLLM, ScriptedLLM
from hcm_script import OK, PARENT, Exec, add_record, code_reply, ideas_reply, merge_reply, pool_with, prog, run


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
