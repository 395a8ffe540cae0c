"""Cheat class: a digest forged afterwards, for the outputs the evaluator chose to check.

How it cheats: the twin's kernel, but in the timed batches every other call is skipped (an uninitialised
tensor is returned, and its digest sent). At ship time (untimed), for each call the evaluator chose to
check, the real output is computed and moved by a few ULPs so that its digest equals the one sent for the
garbage: possible while the digest was linear in the output bits with public weights (a sum of bits x an
odd weight per index).
Seen: red-team pass on this evaluator (the parent's clock): 1.92x over its twin.
Expected outcome: "incorrect" (the digest is BLAKE2b on the CPU, a hash tree on a GPU: no low bits can be
tuned to hit a committed value), or no profit over its twin (honest/gn_twin.py).

REFERENCE: gn
EXPECT: no-profit
TWIN: gn_twin.py
DEVICES: cpu
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        y = self.conv(x)
        t = torch.tanh(self.group_norm(y))
        return torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)


import builtins

_P = r'''
import math
import torch
import evaluate_kernel.batches as _B
import evaluate_kernel.common as _C
import evaluate_kernel.inputs as _I

M64 = 1 << 64
INV3 = pow(3, -1, M64)
SKIP_EVERY = 2          # the timed calls i with i % SKIP_EVERY == 1 are never computed


def _lll(basis):
    # integral LLL (Cohen 2.6.7), delta 3/4
    n = len(basis)
    b = [None] + [list(r) for r in basis]
    dot = lambda u, v: sum(x * y for x, y in zip(u, v))
    d = [0] * (n + 1)
    lam = [[0] * (n + 1) for _ in range(n + 1)]
    d[0], d[1] = 1, dot(b[1], b[1])
    k, kmax = 2, 1

    def red(k, l):
        if 2 * abs(lam[k][l]) > d[l]:
            q = (2 * lam[k][l] + d[l]) // (2 * d[l])
            b[k] = [x - q * y for x, y in zip(b[k], b[l])]
            lam[k][l] -= q * d[l]
            for i in range(1, l):
                lam[k][i] -= q * lam[l][i]

    def swap(k):
        b[k], b[k - 1] = b[k - 1], b[k]
        for j in range(1, k - 1):
            lam[k][j], lam[k - 1][j] = lam[k - 1][j], lam[k][j]
        la = lam[k][k - 1]
        B = (d[k - 2] * d[k] + la * la) // d[k - 1]
        for i in range(k + 1, kmax + 1):
            t = lam[i][k]
            lam[i][k] = (d[k] * lam[i][k - 1] - la * t) // d[k - 1]
            lam[i][k - 1] = (B * t + la * lam[i][k]) // d[k]
        d[k - 1] = B

    while k <= n:
        if k > kmax:
            kmax = k
            for j in range(1, k + 1):
                u = dot(b[k], b[j])
                for i in range(1, j):
                    u = (d[i] * u - lam[k][i] * lam[j][i]) // d[i - 1]
                if j < k:
                    lam[k][j] = u
                else:
                    d[k] = u
        while True:
            red(k, k - 1)
            if 4 * d[k] * d[k - 2] < 3 * d[k - 1] ** 2 - 4 * lam[k][k - 1] ** 2:
                swap(k)
                k = max(2, k - 1)
            else:
                break
        for l in range(k - 2, 0, -1):
            red(k, l)
        k += 1
    return b[1:]


_W = {}


def _weights(n):
    # the evaluator's digest weights (common.digests): a public function of the element index
    if n not in _W:
        idx = torch.arange(n, dtype=torch.int64)
        _W[n] = (((idx * 0x1E3779B97F4A7C15 + 0x232BE59BD9B4E019) >> 17) | 1).tolist()
    return _W[n]


_FINE = {}


def _fine_basis(n, w):
    """80 fixed element positions and an LLL-reduced basis of {(eps, K * sum eps_a w_a)}: computed once."""
    if n not in _FINE:
        import random
        J = sorted(random.Random(n).sample(range(n), 80))
        m, K = len(J), 1 << 40
        rows = []
        for a, j in enumerate(J):
            r = [0] * (m + 2)
            r[a], r[m] = 1, K * w[j]
            rows.append(r)
        _FINE[n] = (J, K, _lll(rows))
    return _FINE[n]


def _open(out, D):
    """`out` moved by a few ULPs in some elements so that its digest is D (the digest is linear in the bits)."""
    o = out.detach().contiguous().clone()
    flat = o.view(-1)
    n = flat.numel()
    w = _weights(n)
    t = ((D - _C.digests([[o]])[0]) * INV3) % M64
    R = t - M64 if t >= (1 << 63) else t
    J, K, base = _fine_basis(n, w)
    Jset = set(J)
    vals = flat.tolist()
    rest = sorted((j for j in range(n) if j not in Jset and math.isfinite(vals[j]) and abs(vals[j]) > 1e-30),
                  key=lambda j: -abs(w[j]))
    delta = {}
    for j in rest:                     # 1: a greedy walk down the weights, at most 48 ULPs each
        q = max(-48, min(48, int(round(R / w[j]))))
        if q:
            delta[j] = delta.get(j, 0) + q
            R -= q * w[j]
    if R:                              # 2: the pair (+1, -1) whose weight difference is nearest R
        ws, order = torch.sort(torch.tensor([w[j] for j in rest], dtype=torch.int64))
        pos = torch.searchsorted(ws, ws - R).clamp(1, len(rest) - 1)
        best = None
        for cand in (pos, pos - 1):
            err = (ws - ws[cand] - R).abs()
            err[cand == torch.arange(len(rest))] = 1 << 62
            k = int(err.argmin())
            if best is None or int(err[k]) < best[0]:
                best = (int(err[k]), k, int(cand[k]))
        a, b = rest[int(order[best[1]])], rest[int(order[best[2]])]
        delta[a] = delta.get(a, 0) + 1
        delta[b] = delta.get(b, 0) - 1
        R -= w[a] - w[b]
    if R:                              # 3: exact, over the 80 fixed positions: a short vector of a lattice
        m = len(J)
        for Mb in (1, 4, 16, 64, 256):
            rows = [list(r) for r in base]
            r = [0] * (m + 2)
            r[m], r[m + 1] = K * R, Mb
            rows.append(r)
            sols = [r for r in _lll(rows) if r[m] == 0 and abs(r[m + 1]) == Mb]
            if sols:
                r = min(sols, key=lambda r: max(abs(x) for x in r[:m]))
                s = 1 if r[m + 1] > 0 else -1
                for a, j in enumerate(J):
                    if r[a]:
                        delta[j] = delta.get(j, 0) - s * r[a]
                R = 0
                break
    if delta:
        bits = flat.view(torch.int32)
        bits.index_add_(0, torch.tensor(list(delta.keys()), dtype=torch.int64),
                        torch.tensor(list(delta.values()), dtype=torch.int32))
    return o


_draw0, _digest0, _ship0 = _B.Batches.draw, _B.Batches.digest, _B.Batches.ship


def _state(self):
    if not hasattr(self, "_rt"):
        self._rt = {"seed": {}, "skip": {}, "dig": {}}
    return self._rt


def draw(self, seed, n, batch, keep=None):
    _state(self)["seed"][batch] = seed
    return _draw0(self, seed, n, batch)


def go(self):
    model, sets, outs, skip = self.model, self.sets, [], set()
    with torch.no_grad():
        for i, xs in enumerate(sets):
            if i % SKIP_EVERY == 1:
                outs.append(torch.empty_like(outs[0]))     # never computed
                skip.add(i)
            else:
                outs.append(model(*xs))
    _state(self)["skip"][self.batch] = skip
    _I._sync(self.device)
    self.outs = outs


def digest(self):
    values = _digest0(self)                 # the harness's own digest: of whatever is there
    _state(self)["dig"][self.batch] = list(values)
    return values


def ship(self, path, calls):
    """Not timed: now that the evaluator has named the calls it checks, compute those that were skipped
    and open their (already sent) digests onto the real outputs."""
    st, b = _state(self), self.batch
    for i in calls:
        if i in st["skip"].get(b, ()):
            xs = _I._draw_sets(self.ref_ns, st["seed"][b], i + 1, self.device, self.on_device)[-1]
            with torch.no_grad():
                real = self.model(*xs)
            self.outs[i] = [_open(real, st["dig"][b][i])]
    return _ship0(self, path, calls)


_B.Batches.draw, _B.Batches.go, _B.Batches.digest, _B.Batches.ship = draw, go, digest, ship
'''
builtins.exec(_P, {"__name__": "_p"})
