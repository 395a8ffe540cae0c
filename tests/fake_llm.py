"""Fake LLMs for tests and offline runs: plain callables `(prompt: str) -> str`, like llm.Client.

ScriptedLLM replays canned replies in order and records the prompts it received (unit tests).
RuleBasedLLM answers every HCM prompt kind (see hcm.prompt_kind) in the right format, deterministically
from a hash of the prompt text and a seed (experiments are drawn from a list of realistic changes and
parameters, so some resemble logged ones and some do not), with no state between calls: several islands (threads) can
share one instance, or one behind an HTTP server, and runs stay reproducible.
"""
from __future__ import annotations

import hashlib
import re
import threading

import hcm


class ScriptExhausted(BaseException):
    """Raised when a ScriptedLLM runs out of replies. A BaseException on purpose: HCM turns ordinary
    exceptions from the LLM into recorded failures, and an unscripted call must fail the test instead."""


class ScriptedLLM:
    """Returns `replies` in order; a reply that is an exception instance is raised instead."""

    def __init__(self, replies: list):
        self.replies = list(replies)
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._lock:
            self.prompts.append(prompt)
            if len(self.prompts) > len(self.replies):
                kind = hcm.prompt_kind(prompt)
                raise ScriptExhausted(f"ScriptedLLM ran out of replies: call {len(self.prompts)} ({kind} prompt), "
                                     f"only {len(self.replies)} scripted")
            reply = self.replies[len(self.prompts) - 1]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    @property
    def kinds(self) -> list[str]:
        return [hcm.prompt_kind(p) for p in self.prompts]

    @property
    def remaining(self) -> int:
        return len(self.replies) - len(self.prompts)


DIRECTIONS = [
    "Fuse the elementwise epilogue into one CUDA kernel so the intermediate tensor is read and written once",
    "Compute the normalisation statistics with a warp-shuffle tree reduction in a single pass",
    "Vectorise global memory access with float4 loads and stores in the fused kernel",
    "Keep the vendor convolution and replace only the tail operators with one custom kernel",
    "Tile the reduction through shared memory so each block reads its input once",
    "Use channels-last memory layout so the custom kernel reads contiguous channels",
    "Launch one block per (sample, group) and keep partial sums in registers",
    "Reduce kernel launches by merging the statistics and apply passes with a grid-wide barrier",
]


class RuleBasedLLM:
    """Answers HCM prompts in the expected format. Selection and repair replies carry one of `programs`,
    chosen from a hash of the prompt, so identical prompts always get identical replies."""

    def __init__(self, programs: list[str], seed: int = 0, variants: bool = False, stable: bool = False):
        if not programs or not all(isinstance(p, str) and p.strip() for p in programs):
            raise ValueError("RuleBasedLLM needs at least one non-empty program source")
        self.programs = list(programs)
        self.seed = seed
        self.variants = variants   # True: tag each reply's program with a constant, so none is a duplicate
        # True: every choice ignores the numbers in the prompt (measured times, speedups: each number counts as
        # one "#", whatever its digits), so what the replies are does not move with timing noise; only the
        # variant tags still differ between such prompts.
        self.stable = stable

    def _h(self, prompt: str, salt: str = "") -> int:
        if self.stable and salt != "variant":
            prompt = re.sub(r"\d+(?:\.\d+)?", "#", prompt)
        digest = hashlib.sha256(f"{self.seed}|{salt}|{prompt}".encode("utf-8", "replace")).digest()
        return int.from_bytes(digest[:8], "big")

    def __call__(self, prompt: str) -> str:
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        kind = hcm.prompt_kind(prompt)
        handler = getattr(self, f"_{kind}", self._unknown)
        return handler(prompt)

    # one method per prompt kind -------------------------------------------------------------------
    def _idea_generation(self, prompt: str) -> str:
        m = re.search(r"Brainstorm (\d+) distinct", prompt)
        n = max(1, min(int(m.group(1)) if m else 3, 8))
        start = self._h(prompt) % len(DIRECTIONS)
        parts = ["Let me think about where time goes in the current program.\n"]
        for k in range(n):
            idea = DIRECTIONS[(start + k) % len(DIRECTIONS)]
            parts.append(f"**Idea {k + 1}**\nIdea: {idea}.\nReasoning: it removes memory traffic.\n")
        ids = [int(x) for x in re.findall(r"\d+", m.group(1))] if (m := re.search(r"\(ids: ([\d, ]+)\)", prompt)) else []
        pick = self._h(prompt, "choice") % (n + len(ids))
        choice = f"proposal {pick + 1}" if pick < n else f"idea {ids[pick - n]}"
        parts.append(f"Choice: {choice}\nExperiment: {self._experiment(prompt)}\n")
        return "\n".join(parts)

    def _experiment(self, prompt: str) -> str:
        h = self._h(prompt, "experiment")
        return (f"{_CHANGES[h % len(_CHANGES)]}, with {_PARAMETERS[(h // 7) % len(_PARAMETERS)]}")

    def _classification(self, prompt: str) -> str:
        ids = _pool_ids(prompt)
        proposals = re.findall(r"^Proposal (\d+): (.*)$", prompt, re.M)
        parts = []
        for k, proposal in proposals:
            parts.append(f"Proposal {k}")
            if ids and self._h(prompt, k) % 2 == 0:
                idea_id = ids[self._h(prompt, "id" + k) % len(ids)]
                parts.append(f"Idea Exists: True\nIdea ID: {idea_id}\nUpdated description: {proposal[:200]}\n")
            else:
                parts.append(f"Idea Exists: False\nIdea description: {proposal[:200] or 'a new idea'}\n")
        return "\n".join(parts) or "Idea Exists: False\nIdea description: a new idea"

    def _program(self, prompt: str) -> str:
        program = self.programs[self._h(prompt, "program") % len(self.programs)].strip()
        return f"{program}\n\n_VARIANT = {self._h(prompt, 'variant') % 10**9}" if self.variants else program

    def _selection(self, prompt: str) -> str:
        m = re.search(r"valid idea ids: ([\d, ]+)", prompt)
        ids = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else _pool_ids(prompt) or [1]
        idea_id = ids[self._h(prompt) % len(ids)]
        return f"Idea ID: {idea_id}\nExperiment: {self._experiment(prompt)}\n"

    def _implementation(self, prompt: str) -> str:
        planned = m.group(1).strip() if (m := re.search(r"^Experiment: (.+)$", prompt, re.M)) else "the change"
        return (f"Implemented: {planned[0].lower()}{planned[1:]}, as planned, in the parent's kernel.\n\n"
                f"```python\n{self._program(prompt)}\n```\n")

    def _repair(self, prompt: str) -> str:
        return (f"Cause: the failure comes from the kernel launch.\nImplemented: the same change with the launch "
                f"fixed.\n\n```python\n{self._program(prompt)}\n```\n")

    def _duplicate_check(self, prompt: str) -> str:
        return "Repeat: no\nEntry: none"

    def _summary(self, prompt: str) -> str:
        return "Key findings: fusing helped most; the other variants did not beat the best result."

    def _prune(self, prompt: str) -> str:
        m = re.search(r"exactly (\d+) must be dropped", prompt)
        n = int(m.group(1)) if m else 1
        return f"Dropping Ideas: {_pool_ids(prompt)[:n]}"

    def _unknown(self, prompt: str) -> str:
        # Not an HCM prompt (e.g. a caller's own): answer with a program so code extraction still works.
        return f"Here is a program.\n\n```python\n{self._program(prompt)}\n```\n"


_CHANGES = [
    "Fuse GroupNorm's statistics pass into the convolution epilogue",
    "Replace the shared-memory reduction with warp shuffles",
    "Load the input through float4 vector loads",
    "Process two samples per thread block",
    "Precompute the per-channel affine scale and shift once per forward",
    "Unroll the innermost channel loop",
    "Keep the LogSumExp running maximum in registers",
    "Store the conv output in channels-last order",
    "Move the HardSwish and Tanh into one fused elementwise pass",
    "Cache the conv weights in shared memory",
]
_PARAMETERS = ["block size 128", "block size 256", "block size 512", "an unroll factor of 4",
               "an unroll factor of 8", "one warp per group", "two warps per group", "a tile of 32 x 8"]


def _pool_ids(prompt: str) -> list[int]:
    return list(dict.fromkeys(int(x) for x in re.findall(r"^Idea ID: (\d+) \|", prompt, re.M)))


class OpenAIServer:
    """A local OpenAI-compatible chat server answering with `llm` (any `(prompt) -> str`, or a dict of them
    by the model name asked for: one server for several models); `requests` keeps every prompt it was
    sent, in order. An exception from `llm` (or an unknown model) is answered with HTTP 400 and its text
    (a failure the client does not retry). Use as a context manager; `url` is the --base-url to pass."""

    def __init__(self, llm):
        import http.server
        import json

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = "\n".join(m["content"] for m in body["messages"] if m["role"] != "assistant")
                with server._lock:
                    server.requests.append(prompt)
                try:
                    text = (llm[body["model"]] if isinstance(llm, dict) else llm)(prompt)
                except Exception as e:
                    self._send(400, {"error": {"message": str(e), "type": "invalid_request_error"}})
                    return
                reply = {"id": "chatcmpl-fake", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}],
                         "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4,
                                   "total_tokens": (len(prompt) + len(text)) // 4}}
                self._send(200, reply)

            def _send(self, status: int, reply: dict) -> None:
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> "OpenAIServer":
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
