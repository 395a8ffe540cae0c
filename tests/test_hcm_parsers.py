"""HCM's parsers against what LLMs really write (hcm_parsers.py): code blocks cut short or several, ideas in
messy markdown, classifications, selections, drop lists, verdicts and summaries in their variants, and the
non-answers they must refuse. Run: python3 -m pytest -q tests/test_hcm_parsers.py
"""
from __future__ import annotations

import pytest

import hcm
import hcm_parsers
from hcm_script import prog


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
