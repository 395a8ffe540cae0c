"""Cheat class: a leaner harness in the runner, the time it saves filled with the calls' work (softmax
over 8 x 32768).

How it cheats: at import, in the runner, it replaces the harness's batch steps with leaner ones. Under
the protocol where the runner drew its own inputs and digested its own outputs, a step counted only
beyond what it typically took the reference: the lean draw computes every output right after its inputs
(drawing them without the pads and per-set moves saves about what the calls cost), "go" hands them out,
and the lean digest skips the per-output checks. On the CPU it also replaces the one step the runner has
now, go(), by the leanest it can be (no views beyond the ones needed, no freeing of the last batch).
The kernel itself is the honest twin's.
Seen: fourth red-team pass on this evaluator (2.70x and 2.83x over the twin, 1.01 and 1.05, on this
100 us CPU softmax; about 1.08x on a GPU's 10 us softmax, where the runner still draws and digests).
Expected outcome: no profit over its twin (honest/softmax_twin.py) on the CPU: the reference worker
writes the inputs and the parent reads the outputs from the stopped runner's memory, so the runner has no
bookkeeping to shorten, and everything it does while it runs is in its batch's time.

REFERENCE: softmax
EXPECT: no-profit
TWIN: softmax_twin.py
DEVICES: cpu
"""
import builtins

import torch
import torch.nn as nn

builtins.exec("""
import sys
old = sys.modules.get("evaluate_kernel.batches")
if old is not None and not getattr(old.Batches, "_lean", False):
    import torch
    from evaluate_kernel import common
    def draw(self, seed, n, batch, keep=None):
        self.outs, self.sets, self.pads, self.batch, self.keep_now = [], [], [], batch, []
        torch.manual_seed(seed)
        with torch.no_grad():
            self.ready = [self.model(*self.ref_ns["get_inputs"]()) for _ in range(n)]
    def go(self):
        self.outs, self.ready = self.ready, []
    def digest(self):
        self.outs = [list(o) if isinstance(o, (tuple, list)) else [o] for o in self.outs]
        return [common._blake(c) for c in self.outs]
    old.Batches.draw, old.Batches.go, old.Batches.digest, old.Batches._lean = draw, go, digest, True
host = sys.modules.get("evaluate_kernel.host_batches")
if host is not None and not getattr(host.HostBatches, "_lean", False):
    import torch
    def lean_go(self, layout):
        sets = self.arena.views(layout)
        with torch.no_grad():
            outs = [self.model(*xs) for xs in sets]
        self.kept = getattr(self, "kept", [])
        self.kept.append(outs)   # never freed inside the step
        self.outs = outs
        import array, base64
        packed = base64.b64encode(array.array("q", [o.data_ptr() for o in outs]).tobytes()).decode()
        return {"packed": packed,
                "geometry": [["float32", list(outs[0].shape), list(outs[0].stride())]]}
    host.HostBatches.go, host.HostBatches._lean = lean_go, True
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)
