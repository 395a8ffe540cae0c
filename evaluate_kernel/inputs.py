"""What the workers draw and check: trial inputs, models with (perturbed) weights, plain-tensor outputs.

Runs in the reference worker and in runners; the reference worker's copy is the one whose results count
(it never imports candidate code). torch is imported lazily.
"""
from __future__ import annotations

import hashlib
import math
import re
import traceback
from typing import Any

from .common import _DISTS, _flat, _int_view

def _set_seed(seed: int) -> None:
    import torch
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)

def _make_inputs(ref_ns: dict, spec: dict, device) -> list:
    """Inputs for one trial: the task's own get_inputs() under a fresh seed, then a distribution transform.

    get_inputs() runs with the timing device as the default device, so its random tensors come from that
    device's generator (drawing 64 MB on the CPU took ~0.1 s, on the GPU well under a millisecond). The
    reference worker and the candidate process share the GPU and the seed, so they draw identical inputs.
    Scaled, negated, zero-mean and per-sample inputs expose shortcuts tuned to all-positive i.i.d. data;
    the seeds are drawn per evaluation, unknown when the candidate was written. With "set_index" j in the
    spec: the j-th of the sets _draw_sets() draws after one seeding (a host round's inputs).
    """
    import torch
    if "set_index" in spec:
        return _draw_sets(ref_ns, spec["seed"], spec["set_index"] + 1, device, spec.get("on_device", True))[-1]
    xs, draw_on = _draw_sets(ref_ns, spec["seed"], 1, device, spec.get("on_device", True), to_device=False)[0]
    gen = torch.Generator(device=draw_on).manual_seed(spec["seed"] + 1)
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            x = _transform(x.to(draw_on), spec["dist"], gen) if x.is_floating_point() else x
            x = x.to(device)
        out.append(x)
    return out


def _draw_sets(ref_ns: dict, seed: int, n: int, device, on_device: bool = True, to_device: bool = True,
               pads: list | None = None, mixed: bool = False) -> list:
    """n input sets from get_inputs() after one seeding, on the timing device (or the CPU when get_inputs()
    needs it); with to_device=False, one (set, device drawn on) pair instead. With `pads` (a list the
    caller keeps), each set is drawn behind a host allocation of random size (0-1 MiB, appended to pads),
    so the sets and what each call allocates start at addresses of their own. `mixed` (the timed batches):
    each set's floating-point inputs then go through a distribution of the trials' (_transform) chosen for
    that set from the seed, so a shortcut that holds only for the task's own inputs (a ReLU of all-positive
    inputs is the identity) fails the check of a timed call, not only the trials."""
    import os

    import torch
    draw_on = device if on_device else torch.device("cpu")

    def draw() -> list:
        if pads is not None:
            pads.append(torch.empty(int.from_bytes(os.urandom(2), "little") * 16, dtype=torch.uint8))
        return list(ref_ns["get_inputs"]())

    _set_seed(seed)
    try:
        with torch.device(draw_on):
            sets = [draw() for _ in range(n)]
    except Exception:  # noqa: BLE001 - a get_inputs() that needs CPU tensors (.numpy() etc.) runs on the CPU
        draw_on = torch.device("cpu")
        _set_seed(seed)
        sets = [draw() for _ in range(n)]
    if not to_device:
        return [(sets[0], draw_on)]
    if mixed:
        import random
        choose, gen = random.Random(seed), torch.Generator(device=draw_on).manual_seed(seed + 1)
        sets = [[_transform(x, dist, gen) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                 for x in xs] for xs, dist in ((xs, choose.choice(_DISTS)) for xs in sets)]
    return [[x.to(device) if isinstance(x, torch.Tensor) else x for x in xs] for xs in sets]


def _draw_many(ref_ns: dict, seed: int, n: int, device, on_device: bool = True) -> list:
    """As _draw_sets(ref_ns, seed, n, device, on_device), for the batches of a timing (host_batches.py):
    where get_inputs() returns fresh tensors of torch.rand or torch.randn and nothing else, each input of
    all n sets is one draw of n times its size, one launch an input instead of one a set (1,643 softmax
    sets drawn one by one took 26-28 ms a batch on an H200, about as long as their calls). The values
    differ from _draw_sets' (the generator is used in another order) and the distribution is the same;
    only the reference worker draws these sets, and both runners read the same bytes. Anything else
    get_inputs() does (another function, arguments of its own, a value that changes from call to call)
    keeps the set-by-set draw, and so does the CPU, where one large draw was slower (1.5 against 1.1 ms a
    softmax@v0 set on the 2-core development machine: the draw itself is the cost there, not its launch)."""
    import torch
    draw_on = device if on_device else torch.device("cpu")
    plan = _factory_plan(ref_ns, draw_on) if n > 1 and draw_on.type == "cuda" else None
    if plan is None:
        return _draw_sets(ref_ns, seed, n, device, on_device)
    return _drawn_by_plan(plan, seed, n, draw_on, device)


class DrawnSets(list):
    """n input sets drawn a column at once: `columns[j]`, where input j is a tensor, holds it for every
    set (set i's is row i), so that laying them out (host_batches.pack) need not stack them again."""

    def __init__(self, sets: list, columns: list):
        super().__init__(sets)
        self.columns = columns


def _drawn_by_plan(plan: list, seed: int, n: int, draw_on, device) -> DrawnSets:
    """n input sets as _factory_plan's plan makes them: each drawn input once for all n sets."""
    import torch
    _set_seed(seed)
    with torch.device(draw_on):
        columns = [step if kind == "value" else step[0]((n, *step[1]), **step[2]).to(device) for kind, step in plan]
    sets = [[col if kind == "value" else col[i] for (kind, _), col in zip(plan, columns)] for i in range(n)]
    return DrawnSets(sets, [col if kind == "draw" else None for (kind, _), col in zip(plan, columns)])


def _factory_plan(ref_ns: dict, draw_on) -> list | None:
    """How get_inputs() makes each input, from two calls watched by a torch function mode: ("draw",
    (torch.rand or torch.randn, size, keywords)) for a tensor returned as that function made it, ("value",
    v) for anything else it returns, the same both times. None if it calls any other torch function, passes
    a generator or any keyword but dtype and device, or returns a tensor it did something to."""
    import torch
    from torch.overrides import TorchFunctionMode
    allowed = (torch.rand, torch.randn)

    class Watch(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.made: list = []   # (output, function, size, keywords) per call; None for a call of anything else

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            size = kwargs.get("size", args[0] if len(args) == 1 and not isinstance(args[0], int) else args)
            ok = (func in allowed and set(kwargs) <= {"size", "dtype", "device"} and ("size" not in kwargs or not args)
                  and isinstance(size, (tuple, list, torch.Size)) and all(type(d) is int for d in size))
            self.made.append((out, func, tuple(size), {k: v for k, v in kwargs.items() if k != "size"}) if ok else None)
            return out

    plans = []
    for _ in range(2):
        watch = Watch()
        try:
            with torch.device(draw_on), watch:
                xs = list(ref_ns["get_inputs"]())
        except Exception:  # noqa: BLE001 - _draw_sets says what is wrong with it
            return None
        if None in watch.made:
            return None
        plan = []
        for x in xs:
            if isinstance(x, torch.Tensor):
                made = [m for m in watch.made if m[0] is x]
                if not made:
                    return None
                plan.append(("draw", made[0][1:]))
            else:
                plan.append(("value", x))
        plans.append(plan)
    try:
        same = plans[0] == plans[1]
    except Exception:  # noqa: BLE001 - values that cannot be compared are not known to repeat
        return None
    tensors = [id(x) for x in xs if isinstance(x, torch.Tensor)]
    return plans[0] if same and len(tensors) == len(set(tensors)) else None


def _transform(x, dist: str, gen):
    import torch
    if dist == "scaled":
        return x * 3.0
    if dist == "negated":
        return -x
    if dist == "zero_mean":
        return x - x.mean()
    if dist == "per_sample" and x.dim() >= 1:
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        scale = torch.rand(shape, generator=gen, dtype=x.dtype, device=x.device) * 1.5 + 0.5
        offset = torch.randn(shape, generator=gen, dtype=x.dtype, device=x.device)
        return x * scale + offset
    return x


def _build_model(cls, ref_ns: dict, weight_seed: int, perturb: bool, device,
                 ref_params: list[tuple[str, list[int]]] | None = None, own: list[str] = (),
                 relaid: list[str] | None = None):
    """KernelBench order: seed, get_init_inputs(), seed, construct; optionally perturb the parameters
    perturbed_names() picks. Returns (model on device, the reference parameters that found no counterpart).

    Re-seeded weights plus perturbed biases and norm parameters stop shortcuts tuned to seed-42 weights or
    to GroupNorm's weight=1, bias=0. The reference itself (ref_params None) perturbs its parameters named
    in `own`; the k-th of them gets the k-th delta, or the delta of the first one built with the same shape
    and values (_delta_indices). In ModelNew (ref_params: the reference's (name, shape) list) its counterpart is the
    parameter of the same name and shape, else the first not yet taken of the same shape and the same values
    (both models built from the same seed: a renamed conv bias, a norm's ones and zeros, whatever order
    ModelNew declares them in), else the first not yet taken of the same shape in registration order;
    parameters ModelNew adds (frozen constants, affine norms at identity) keep their own values, and a
    reference parameter with no counterpart is returned (the trial then cannot run as specified). A
    counterpart of another shape takes the delta in its own element order (right for a reshape, wrong for
    a permutation, which its values cannot tell apart); each is added to `relaid`, for the message.
    """
    import torch
    ref_values = _reference_values(ref_ns, weight_seed, [n for n, _ in ref_params]) \
        if perturb and ref_params is not None else None
    model = _construct(cls, ref_ns, weight_seed)
    missing: list[str] = []
    if perturb:
        if ref_params is None:
            params = dict(model.named_parameters())
            targets = [params[n] for n in own]
            ref_values = [p.detach().cpu().clone() for p in targets]
        else:
            targets, missing = _counterparts(dict(model.named_parameters()), ref_params, ref_values)
            if relaid is not None:
                named = {id(p): n for n, p in model.named_parameters()}
                relaid += [f"ModelNew's {named[id(p)]} {tuple(p.shape)} for the reference's {n} {tuple(shape)}"
                           for (n, shape), p in zip(ref_params, targets) if p is not None and list(p.shape) != list(shape)]
        delta = _delta_indices(ref_values or [])
        with torch.no_grad():
            for k, p in enumerate(targets):
                if p is None:
                    continue
                seed = int(hashlib.sha256(f"{weight_seed}:{delta.get(k, k)}".encode()).hexdigest()[:8], 16)
                g = torch.Generator().manual_seed(seed)
                p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device, p.dtype) * 0.5)
    return model.to(device), missing


def perturbed_names(ref_ns: dict, model) -> list[str]:
    """The reference's parameters the perturbed-weights trial moves, in registration order: every one of
    at most one dimension (biases, a norm's vectors), and every one whose values the seed does not choose
    (built again from another seed, it is the same), whatever its shape: a LayerNorm over (C, H, W) holds
    its ones and zeros in 3-D tensors, which a kernel that left them out (an affine step skipped) matched
    in every trial while only 1-D parameters were moved (thirty-fifth red team: 1.19x over its twin on
    the CPU). model: the reference built from seed 42."""
    other = dict(_construct(ref_ns["Model"], ref_ns, 4242).named_parameters())
    out = []
    for name, p in model.named_parameters():
        q = other.get(name)
        if p.dim() <= 1 or (q is not None and q.shape == p.shape and _same(q.detach(), p.detach())):
            out.append(name)
    return out


def _same(a, b) -> bool:
    """Equal tensors (a seeded weight differs in its first elements already: the whole is compared only then)."""
    import torch
    return torch.equal(a.reshape(-1)[:64].cpu(), b.reshape(-1)[:64].cpu()) and torch.equal(a.cpu(), b.cpu())


def _construct(cls, ref_ns: dict, weight_seed: int):
    """The model as KernelBench builds it: seed, get_init_inputs(), seed, construct (on the CPU)."""
    import torch
    _set_seed(weight_seed)
    init = ref_ns["get_init_inputs"]()
    _set_seed(weight_seed)
    with torch.no_grad():
        return cls(*init)


def _delta_indices(values: list) -> dict[int, int]:
    """k -> the first j with the same shape and values as the reference's k-th parameter: which delta it
    gets. Parameters nothing tells apart (two norms' ones, built alike) get the same delta, so a ModelNew
    that renames them and declares them in another order is not judged by which of them got which."""
    import torch
    out: dict[int, int] = {}
    for k, v in enumerate(values):
        out[k] = next((j for j in range(k) if values[j].shape == v.shape and torch.equal(values[j], v)), k)
    return out


def _counterparts(params: dict, ref_params: list, ref_values: list | None = None) -> tuple[list, list[str]]:
    """For each (name, shape) of the reference, ModelNew's parameter by name, else by shape and the same
    values (ref_values: the reference's, in the same order), else by size and the same values in another
    shape, else by shape and order. Where several fit a step, the one whose name shares the most words
    with the reference's (a norm's ones as `gn_weight` rather than a scale of ModelNew's own, `res_scale`,
    registered first), else the first registered."""
    import torch
    taken: set[str] = set()
    found: list = [None] * len(ref_params)
    for k, (name, shape) in enumerate(ref_params):
        p = params.get(name)
        if p is not None and list(p.shape) == list(shape):
            found[k] = p
            taken.add(name)

    def same_values(p, k: int) -> bool:
        v = ref_values[k] if ref_values is not None and k < len(ref_values) else None
        return v is not None and v.numel() == p.numel() and torch.equal(p.detach().cpu().reshape(-1).to(v.dtype),
                                                                         v.reshape(-1))

    def same_shape(p, shape) -> bool:
        return list(p.shape) == list(shape)

    def same_size(p, shape) -> bool:   # a bias kept as (1, N) for broadcasting: the same delta, reshaped
        return p.numel() == math.prod(shape)

    for shaped, matches in ((same_shape, same_values), (same_size, same_values), (same_shape, lambda p, k: True)):
        for k, (name, shape) in enumerate(ref_params):
            if found[k] is None:
                fits = [n for n, p in params.items() if n not in taken and shaped(p, shape) and matches(p, k)]
                other = max(fits, key=lambda n: len(_words(n) & _words(name)), default=None)
                if other is not None:
                    found[k] = params[other]
                    taken.add(other)
    return found, [f"{n} {tuple(s)}" for (n, s), p in zip(ref_params, found) if p is None]


def _words(name: str) -> set[str]:
    """A parameter name's words: group_norm.weight -> {group, norm, weight}."""
    return {w for w in re.split(r"[._\d]+", name.lower()) if w}


def _reference_values(ref_ns: dict, weight_seed: int, names: list[str]) -> list:
    """The reference's named parameters, in that order, as the same seed makes them, on the CPU."""
    params = dict(_construct(ref_ns["Model"], ref_ns, weight_seed).named_parameters())
    return [params[n].detach().cpu() for n in names]


def _inputs_unchanged(xs: list, pristine: list) -> bool:
    """Bit-exact comparison with a pristine copy, on the device (a hash of GBs on the host is too slow)."""
    import torch
    for x, p in zip(xs, pristine):
        if isinstance(x, torch.Tensor):
            if x.shape != p.shape or x.dtype != p.dtype:
                return False
            a, b = x.detach().reshape(-1), p.reshape(-1)
            if a.is_floating_point():  # compare bits, so NaN == NaN and -0.0 != 0.0
                a, b = a.view(_int_view(a)), b.view(_int_view(b))
            if not torch.equal(a, b):
                return False
        elif x != p:
            return False
    return True


def _clone_inputs(xs: list) -> list:
    import torch
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def _poison(device, nbytes: int) -> None:
    """Hand the allocator's free memory back full of NaN (hack 1: outputs left in stale memory).

    empty_cache() returns cached blocks; a large NaN-filled allocation then overwrites what the caching
    allocator will hand out next, so an unwritten output reads as NaN and fails the finiteness check.
    """
    import torch
    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    n = max(1, min(nbytes, int(free * 0.5)) // 4)
    buf = torch.empty(n, dtype=torch.float32, device=device)
    buf.fill_(float("nan"))
    del buf
    torch.cuda.synchronize()


def _check_outputs(out: Any, device, copy: bool = True) -> tuple[list | None, str]:
    """Plain tensors with real storage on the expected device (not lazy tensor subclasses); copies on the
    host unless copy=False."""
    import torch
    tensors = []
    for i, o in enumerate(_flat(out)):
        if type(o) is not torch.Tensor:
            return None, f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"
        if o.numel() and o.untyped_storage().size() == 0:
            return None, f"output {i} has no storage"
        if o.device.type != device.type:
            return None, f"output {i} is on {o.device}, expected {device.type}"
        tensors.append(o.detach().clone().cpu() if copy else o.detach())
    return tensors, ""


def _short_traceback(exc: BaseException) -> str:
    """The exception plus the candidate's own frames (file "<candidate>"), for the LLM."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<candidate>"]
    where = "; ".join(f"candidate line {f.lineno} in {f.name}: {(f.line or '').strip()[:100]}" for f in frames[-3:])
    text = f"{type(exc).__name__}: {str(exc).strip()[:700]}"
    return text + (f" [{where}]" if where else "")

def _setup_torch(job: dict, device) -> None:
    import torch
    torch.set_num_threads(job["cpu_threads"])
    # The precision policy is pinned here, not left to defaults (cuDNN convolutions default to TF32).
    tf32 = bool(job["allow_tf32"])
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if device.type == "cuda":
        torch.cuda.set_device(device)

