"""Scripted replies and callbacks shared by the HCM tests (test_hcm*.py): a toy task and parent, replies in
the formats of HCM's prompts, an evaluation callback that returns scripted outcomes, and a generation runner
with test defaults (one proposal per generation)."""
from __future__ import annotations

import hcm

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
