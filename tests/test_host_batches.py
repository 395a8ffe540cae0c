"""The CPU batch without bookkeeping in the runner: inputs laid out in a shared-memory file
(evaluate_kernel.host_batches), outputs read from a stopped process's memory (evaluate_kernel.readout).

Tested on their own, without an Evaluator: the layout round-trips every input as drawn (strides, dtypes,
values), the claim check refuses what a runner could lie about, and what is read from another process's
memory is what it held when it was stopped, not what it computes later.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evaluate_kernel import readout
from evaluate_kernel.batches import module_call
from evaluate_kernel.host_batches import ALIGN, Arena, HostBatches, HostInputs, new_memfd, pack


CALL = module_call()


class Fn(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


def test_a_model_is_called_as_its_modules_path_would_whatever_its_class_says():
    """Both sides' models are called as nn.Module's call path would call them: a model without hooks by
    its forward, directly, so a ModelNew whose __call__ skips that path, or a candidate that puts its
    forward where the harness keeps its way of calling, saves nothing the reference pays; a model with
    hooks of its own (run in the trials) through the path, its hooks run."""
    class Skips(Fn):
        __call__ = Fn.forward
    seen = []
    assert CALL(Skips(lambda x: x + 1), torch.zeros(1)).item() == 1.0
    for m in (Skips(lambda x: x + 1), Fn(lambda x: x + 1)):
        m.register_forward_hook(lambda mod, args, out: out * 10)
        m.register_forward_pre_hook(lambda mod, args: seen.append(2))
        assert CALL(m, torch.zeros(1)).item() == 10.0
    assert seen == [2, 2]
    inner = Fn(lambda x: x * 3)
    inner.register_forward_hook(lambda mod, args, out: seen.append(3))
    assert CALL(Fn(lambda x: inner(x)), torch.ones(1)).item() == 3.0 and seen == [2, 2, 3]   # a submodule's run
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: out + 100)
    try:   # a global hook: the path, as the trials' call would take it
        assert CALL(Fn(lambda x: x + 1), torch.zeros(1)).item() == 101.0
    finally:
        handle.remove()


def _sets(n: int, seed: int = 0) -> list[list]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        a = torch.randn(5, 7, generator=g)
        out.append([a, a.t(), torch.randint(0, 9, (3,), generator=g), torch.randn(4, generator=g).to(torch.bfloat16),
                    torch.tensor(True), 3, 0.5, (1, 2), [3, (4, 5)], {"dims": (0,)}, torch.float16,
                    torch.Size([2, 3])])
    return out


@given(st.integers(min_value=1, max_value=12), st.integers(min_value=0, max_value=2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_layout_round_trips_every_input_as_drawn(n, seed):
    """Strides (a transposed view), integer, bfloat16 and 0-d inputs and plain values come back equal,
    each set's tensors on a cache line of their own, in the file at the layout's random base; the layout
    travels as JSON, and tuples among the values stay tuples (dims=(1, 2) once arrived as a list)."""
    import json
    sets = _sets(n, seed)
    arena = Arena.create(4 << 20)
    try:
        layout, block = pack(sets, arena.size)
        layout = json.loads(json.dumps(layout))
        arena.write(block, layout["base"])
        got = arena.views(layout)
        assert len(got) == n and layout["base"] % ALIGN == 0 and layout["set_bytes"] % ALIGN == 0
        for xs, ys in zip(sets, got):
            for x, y in zip(xs, ys):
                if isinstance(x, torch.Tensor):
                    assert y.dtype == x.dtype and y.shape == x.shape and y.stride() == x.stride()
                    assert torch.equal(x, y) and y.data_ptr() % ALIGN == 0
                else:
                    assert y == x and type(y) is type(x)
                    assert all(type(a) is type(b) for a, b in zip(x, y)) if isinstance(x, (list, tuple)) else True
    finally:
        arena.close()


def test_inputs_the_timing_cannot_lay_out_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="input 1 of get_inputs.. is a list holding tensors"):
        pack([[torch.zeros(2), [torch.ones(2), torch.ones(2)]]], 1 << 20)
    with pytest.raises(ValueError, match="input 1 of get_inputs.. .object. cannot be sent"):
        pack([[torch.zeros(2), object()]], 1 << 20)


def test_values_that_differ_between_sets_travel_per_set():
    sets = [[torch.zeros(2), k] for k in range(4)]
    layout, _ = pack(sets, 1 << 20)
    assert layout["items"][1] == {"values": [0, 1, 2, 3]}


def test_inputs_that_change_shape_between_calls_are_refused():
    with pytest.raises(ValueError, match="differing shapes"):
        pack([[torch.zeros(2)], [torch.zeros(3)]], 1 << 20)



def _get_inputs(body: str) -> dict:
    ns: dict = {}
    exec("import random\nimport torch\n\ndef get_inputs():\n" + textwrap.indent(body, "    ") + "\n", ns)
    return ns


def test_a_reference_parameter_s_counterpart_is_found_by_name_then_values_then_shared_words_then_order():
    """The perturbed-weights trial's mapping (inputs._counterparts): a name and shape in common first;
    else the same values, and among several with them the one whose name shares the most words with the
    reference's, else the first registered; else the same shape, in order."""
    from evaluate_kernel.inputs import _counterparts
    ones, zeros = torch.ones(4), torch.zeros(4)
    p = lambda v: torch.nn.Parameter(v.clone())
    ref = [("conv.bias", [4]), ("group_norm.weight", [4]), ("group_norm.bias", [4])]
    values = [torch.arange(4.0), ones, zeros]
    params = {"res_scale": p(ones), "conv.bias": p(torch.arange(4.0)), "gn_weight": p(ones), "gn_bias": p(zeros)}
    found, missing = _counterparts(params, ref, values)
    assert [f is params[n] for f, n in zip(found, ["conv.bias", "gn_weight", "gn_bias"])] == [True] * 3 and not missing
    # No word in common: the first registered of those with the values, as before.
    params = {"s": p(ones), "g": p(ones), "b": p(zeros), "conv.bias": p(torch.arange(4.0))}
    found, _ = _counterparts(params, ref, values)
    assert found[1] is params["s"] and found[2] is params["b"]
    # Nothing with the values: by shape, in order; a reference parameter left over is reported.
    params = {"x": p(torch.full((4,), 2.0)), "y": p(torch.full((4,), 3.0))}
    found, missing = _counterparts(params, ref, values)
    assert found[0] is params["x"] and found[1] is params["y"] and missing == ["group_norm.bias (4,)"]


def test_the_trial_perturbs_every_parameter_the_seed_does_not_choose_whatever_its_shape():
    """inputs.perturbed_names: 1-D parameters (a seeded bias too), and parameters of any shape that a build
    from another seed leaves as they were (a LayerNorm's 3-D ones and zeros, a constant matrix); never a
    seeded weight of two or more dimensions. The reference and a candidate built with perturbation move
    them alike, so the reference's output changes and a candidate that left the affine step out is caught."""
    from evaluate_kernel.inputs import _build_model, _construct, perturbed_names
    ns: dict = {}
    exec(textwrap.dedent("""
        import torch, torch.nn as nn
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(6, 4)
                self.ln = nn.LayerNorm((2, 3, 4))
                self.mix = nn.Parameter(torch.eye(4))
            def forward(self, x):
                return self.ln(self.lin(x).reshape(-1, 2, 3, 4) @ self.mix)
        def get_init_inputs():
            return []
    """), ns)
    names = perturbed_names(ns, _construct(ns["Model"], ns, 42))
    assert names == ["mix", "lin.bias", "ln.weight", "ln.bias"]   # a module's own parameters come first
    ref, _ = _build_model(ns["Model"], ns, 7, True, torch.device("cpu"), None, names)
    plain, _ = _build_model(ns["Model"], ns, 7, False, torch.device("cpu"), None, names)
    for n in names:
        assert not torch.equal(dict(ref.named_parameters())[n], dict(plain.named_parameters())[n]), n
    assert torch.equal(ref.lin.weight, plain.lin.weight)
    # A candidate holding the same parameters under its own names takes the same deltas.
    ref_params = [(n, list(dict(plain.named_parameters())[n].shape)) for n in names]
    cls = type("ModelNew", (torch.nn.Module,), {})
    def init(self):
        torch.nn.Module.__init__(self)
        self.a = torch.nn.Linear(6, 4)
        self.w = torch.nn.Parameter(torch.ones(2, 3, 4))
        self.b = torch.nn.Parameter(torch.zeros(2, 3, 4))
        self.m = torch.nn.Parameter(torch.eye(4))
    cls.__init__ = init
    relaid: list = []
    cand, missing = _build_model(cls, ns, 7, True, torch.device("cpu"), ref_params, relaid=relaid)
    assert not missing and torch.equal(cand.w, ref.ln.weight) and torch.equal(cand.b, ref.ln.bias)
    assert relaid == []   # every counterpart in the reference's shape: nothing for the message
    assert torch.equal(cand.m, ref.mix) and torch.equal(cand.a.bias, ref.lin.bias)


@pytest.mark.parametrize("body", [
    "return [torch.randn(4, 5) * 2]",                      # something done to the draw
    "return [torch.randint(0, 4, (4, 5))]",                # another function
    "return [torch.rand(3, generator=None)]",              # a keyword of its own
    "return [torch.rand(3, requires_grad=True)]",
    "x = torch.rand(3)\nreturn [x, x]",                   # one tensor twice
    "return [torch.rand(3), random.random()]",             # a value that changes from call to call
    "return [torch.rand(random.randint(1, 10 ** 6))]",     # a size that does
    "x = torch.rand(3)\nx.mul_(2)\nreturn [x]",              # changed in place
    "raise RuntimeError('no')",
])
def test_inputs_made_any_other_way_are_drawn_set_by_set(body):
    from evaluate_kernel.inputs import _factory_plan
    assert _factory_plan(_get_inputs(body), torch.device("cpu")) is None


@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(["rand", "randn"]), st.lists(st.integers(1, 5), min_size=1, max_size=3),
              st.sampled_from(["", ", dtype=torch.float64", ", dtype=torch.float16"]), st.sampled_from(["*", "tuple", "size"])),
    st.integers(-3, 3)), min_size=1, max_size=4), st.integers(2, 9), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_inputs_of_fresh_random_tensors_are_drawn_a_column_at_once_and_alike(items, n, seed):
    """Where get_inputs() returns tensors of torch.rand or torch.randn as drawn (sizes spelt any way,
    a dtype or not) and values that do not change, the timing's sets are drawn one input for all sets at
    once: each set has the shapes, dtypes and values get_inputs() returns, each drawn tensor of its own
    set, from the same seed the same sets."""
    from evaluate_kernel.inputs import _drawn_by_plan, _factory_plan
    parts = []
    for item in items:
        if isinstance(item, int):
            parts.append(repr(item))
            continue
        fn, size, dtype, spelling = item
        args = {"*": ", ".join(map(str, size)), "tuple": repr(tuple(size)), "size": f"size={tuple(size)!r}"}[spelling]
        parts.append(f"torch.{fn}({args}{dtype})")
    ns = _get_inputs(f"return [{', '.join(parts)}]")
    plan = _factory_plan(ns, torch.device("cpu"))
    assert plan is not None
    sets = _drawn_by_plan(plan, seed, n, torch.device("cpu"), torch.device("cpu"))
    assert len(sets) == n
    want = ns["get_inputs"]()
    for xs in sets:
        assert len(xs) == len(want)
        for x, w in zip(xs, want):
            if isinstance(w, torch.Tensor):
                assert isinstance(x, torch.Tensor) and x.shape == w.shape and x.dtype == w.dtype and x.is_contiguous()
            else:
                assert x == w and type(x) is type(w)
    for j, w in enumerate(want):
        if isinstance(w, torch.Tensor) and w.numel() > 2:
            assert not torch.equal(sets[0][j], sets[1][j])
    again = _drawn_by_plan(plan, seed, n, torch.device("cpu"), torch.device("cpu"))
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
               for xs, ys in zip(sets, again) for a, b in zip(xs, ys))
    # Laid out from their columns, they are the bytes the same sets make laid out one by one.
    one_by_one = pack([list(xs) for xs in sets], 1 << 22, mix=seed)
    at_once = pack(sets, 1 << 22, mix=seed)
    assert {k: v for k, v in one_by_one[0].items() if k != "base"} == {k: v for k, v in at_once[0].items() if k != "base"}
    assert torch.equal(one_by_one[1], at_once[1])


def test_a_column_drawn_at_once_keeps_its_function_s_distribution():
    from evaluate_kernel.inputs import _drawn_by_plan, _factory_plan
    plan = _factory_plan(_get_inputs("return [torch.randn(64, 64), torch.rand(64, 64)]"), torch.device("cpu"))
    sets = _drawn_by_plan(plan, 7, 32, torch.device("cpu"), torch.device("cpu"))
    normal = torch.stack([xs[0] for xs in sets])
    uniform = torch.stack([xs[1] for xs in sets])
    assert abs(normal.mean().item()) < 0.01 and abs(normal.std().item() - 1) < 0.01
    assert uniform.min().item() >= 0 and uniform.max().item() < 1 and abs(uniform.mean().item() - 0.5) < 0.01


@pytest.mark.gpu
def test_the_timings_sets_of_a_task_are_drawn_on_the_gpu_a_column_at_once():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import tasks
    from evaluate_kernel.inputs import _draw_many, _factory_plan
    ns: dict = {}
    exec(tasks.get("softmax@v0").reference_src, ns)
    gpu = torch.device("cuda")
    assert _factory_plan(ns, gpu) is not None
    sets = _draw_many(ns, 3, 64, gpu)
    assert len(sets) == 64 and all(xs[0].is_cuda and xs[0].shape == (16, 16384) for xs in sets)
    assert len({xs[0][0, :4].sum().item() for xs in sets}) == 64

@given(st.integers(min_value=1, max_value=40), st.integers(min_value=0, max_value=2**31 - 1),
       st.sampled_from([(), (5,), (3, 4), (2, 3, 4)]))
@settings(max_examples=40, deadline=None)
def test_each_timed_set_goes_through_the_distribution_its_seed_chose(n, seed, shape):
    """The timed batches' inputs (pack with mix): set i's floating-point tensors as inputs._transform takes
    them alone under the distribution the seed chose for set i (scaled, negated, zero-mean; a scale and
    an offset per index of the first dimension), its integer tensors as drawn; strided views kept."""
    from evaluate_kernel.host_batches import _dists
    g = torch.Generator().manual_seed(seed)
    sets = [[torch.randn(shape, generator=g), torch.randint(0, 9, (3,), generator=g),
             torch.randn(4, 3, generator=g).t()] for _ in range(n)]
    arena = Arena.create(1 << 20)
    try:
        layout, block = pack(sets, arena.size, mix=seed)
        arena.write(block, layout["base"])
        got = arena.views(layout)
        for dist, xs, ys in zip(_dists(seed, n), sets, got):
            assert torch.equal(ys[1], xs[1])
            for x, y in ((xs[0], ys[0]), (xs[2], ys[2])):
                assert y.shape == x.shape and y.stride() == x.stride()
                if dist == "own" or (dist == "per_sample" and x.dim() == 0):
                    assert torch.equal(y, x)
                elif dist == "scaled":
                    assert torch.allclose(y, x * 3.0)
                elif dist == "negated":
                    assert torch.equal(y, -x)
                elif dist == "zero_mean":
                    assert torch.allclose(y, x - x.mean(), atol=1e-5)
                else:   # y = x * scale + offset, scale in [0.5, 2) and offset alike along each row of dim 0
                    rest = tuple(range(1, x.dim()))
                    if x.numel() > x.shape[0]:
                        a = (y - y.mean(dim=rest, keepdim=True)) / (x - x.mean(dim=rest, keepdim=True))
                        finite = a[torch.isfinite(a) & ((x - x.mean(dim=rest, keepdim=True)).abs() > 1e-3)]
                        assert finite.numel() == 0 or bool(((finite >= 0.49) & (finite <= 2.01)).all())
                    assert not torch.equal(y, x)
    finally:
        arena.close()


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_an_expanded_input_keeps_its_shared_memory_through_the_distributions(n, seed):
    """An input whose elements share memory (get_inputs() returning x.expand(...): a stride of 0) is laid
    out as drawn, and its memory goes through the set's distribution element by element: the elements
    sharing it stay equal. Transformed as a logical tensor, it could not be written back into that layout
    (the reference worker raised, and no candidate of such a task could be timed)."""
    from evaluate_kernel.host_batches import _dists
    g = torch.Generator().manual_seed(seed)
    sets = [[torch.randn(4, 1, generator=g).expand(4, 6)] for _ in range(n)]
    arena = Arena.create(1 << 20)
    try:
        layout, block = pack(sets, arena.size, mix=seed)
        arena.write(block, layout["base"])
        for dist, (x,), (y,) in zip(_dists(seed, n), sets, arena.views(layout)):
            assert y.shape == x.shape and y.stride() == x.stride() == (1, 0)
            memory, drawn = y[:, 0], x[:, 0]
            want = {"own": drawn, "scaled": drawn * 3.0, "negated": -drawn, "zero_mean": drawn - drawn.mean()}
            if dist in want:
                assert torch.allclose(memory, want[dist], atol=1e-6)
            else:
                assert not torch.equal(memory, drawn)
    finally:
        arena.close()


@given(st.integers(min_value=1, max_value=30), st.integers(min_value=0, max_value=2**31 - 1),
       st.sampled_from([(), (5,), (3, 4), (2, 3, 4)]))
@settings(max_examples=30, deadline=None)
def test_the_cpu_s_sets_mixed_where_they_lie_are_the_column_s_bytes(n, seed, shape):
    """On the CPU each set is copied into its place and mixed there (host_batches._mixed_in_place); the
    same sets stacked a column at once and mixed as a whole (the GPU's way) give the same bytes, every
    one (the gaps, the integers, and the floats bit for bit)."""
    from evaluate_kernel.inputs import DrawnSets
    g = torch.Generator().manual_seed(seed)
    sets = [[torch.randn(shape, generator=g), torch.randint(0, 9, (3,), generator=g), 2.5] for _ in range(n)]
    in_place = pack([list(xs) for xs in sets], 1 << 22, mix=seed)
    columns = DrawnSets([list(xs) for xs in sets], [torch.stack([xs[0] for xs in sets]),
                                                    torch.stack([xs[1] for xs in sets]), None])
    at_once = pack(columns, 1 << 22, mix=seed)
    assert {k: v for k, v in in_place[0].items() if k != "base"} == {k: v for k, v in at_once[0].items() if k != "base"}
    assert torch.equal(in_place[1], at_once[1])
    assert all(torch.equal(x[0], y[0]) for x, y in zip(sets, columns))   # the drawn sets are left as drawn


def test_the_elements_a_strided_input_skips_are_its_own_drawn_memory():
    """A slice with gaps (every other column) goes through its set's distribution as the memory it spans:
    the skipped elements are written out from the drawn memory (here 7 before the distribution), never as
    this process's uninitialised memory, which may hold the reference's outputs."""
    from evaluate_kernel.host_batches import _dists
    n, seed = 24, 11
    sets = [[torch.full((8, 32), 7.0).normal_()[:, ::2]] for _ in range(n)]
    for (x,) in sets:   # the odd columns, which the view skips
        x.as_strided((8, 16), (32, 2), 1).fill_(7.0)
    want = {"own": 7.0, "scaled": 21.0, "negated": -7.0}
    dists = _dists(seed, n)
    assert set(want) <= set(dists)
    arena = Arena.create(1 << 20)
    try:
        layout, block = pack(sets, arena.size, mix=seed)
        arena.write(block, layout["base"])
        for dist, (y,) in zip(dists, arena.views(layout)):
            assert y.stride() == (32, 2)
            skipped = y.as_strided((8, 15), (32, 2), y.storage_offset() + 1)
            assert bool(torch.isfinite(skipped).all())
            if dist in want:
                assert bool((skipped == want[dist]).all()), dist
    finally:
        arena.close()


def test_the_bytes_no_input_covers_are_zeroed():
    from evaluate_kernel.host_batches import _zero_gaps
    rows = torch.full((3, 256), 255, dtype=torch.uint8)
    _zero_gaps(rows, [{"dtype": "float32", "offset": 64, "nbytes": 20}, {"value": 1},
                      {"dtype": "int8", "offset": 128, "nbytes": 64}, {"dtype": "int8", "offset": 192, "nbytes": 0}], 256)
    covered = torch.zeros(256, dtype=torch.bool)
    covered[64:84] = covered[128:192] = True
    assert bool((rows[:, covered] == 255).all()) and bool((rows[:, ~covered] == 0).all())


def test_a_batch_that_does_not_fit_the_file_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        pack([[torch.zeros(1000)] for _ in range(10)], 8 << 10)


def test_the_input_file_cannot_be_shrunk_under_a_mapping():
    """Sealed: a runner that truncated its file would kill the reference worker writing into it."""
    fd = new_memfd(1 << 20)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def test_both_runners_run_the_same_step_on_the_same_inputs():
    """The reference worker's fills write one draw into either runner's file; go() on either gives the same
    outputs, and the reported addresses and geometry are those of the outputs held."""
    ns: dict = {}
    exec(textwrap.dedent("""
        import torch
        def get_inputs():
            return [torch.randn(6, 5), 2.0]
    """), ns)
    model = Fn(lambda x, s: (x * s).softmax(-1))
    arenas = {"runner": Arena.create(1 << 20), "reference": Arena.create(1 << 20)}
    try:
        inputs = HostInputs(ns, arenas)
        cand, ref = HostBatches(model, arenas["runner"], CALL), HostBatches(model, arenas["reference"], CALL)
        layout = inputs.fill(123, 4, "runner")
        a = cand.go(layout)
        assert inputs.fill(123, 4, "reference") == layout   # the same draw, reused for the second side
        b = ref.go(layout)
        for x, y in zip(cand.outs, ref.outs):
            assert torch.equal(x, y)
        assert a["geometry"] == b["geometry"] == [["float32", [6, 5], [5, 1]]]
        assert [p[0] for p in readout.pointers_of(a, 1)] == [o.data_ptr() for o in cand.outs]
    finally:
        _release()


def test_the_references_batch_runs_the_picked_sets_and_checks_them_against_the_candidates(tmp_path):
    """A faster candidate's batch holds more calls than the reference's: the reference's next batch runs
    some of its sets (the checked calls' among them), in the order picked, values that differ per set
    included; each checked call is compared with the reference's call on the same set, wherever that
    lies in the reference's batch, and a call wrong beyond the reference's length is caught."""
    ns: dict = {}
    exec("import torch, random\ndef get_inputs():\n    return [torch.randn(6, 5), random.choice([1.0, 2.0, 3.0])]", ns)
    arenas = {"runner": Arena.create(1 << 20), "reference": Arena.create(1 << 20)}
    try:
        inputs = HostInputs(ns, arenas)
        wrong_late = {"k": 0}

        def cand_fn(x, s):   # right for the first 4 calls of its batch, wrong after
            wrong_late["k"] += 1
            return (x * s).softmax(-1) + (wrong_late["k"] > 4)
        cand = HostBatches(Fn(cand_fn), arenas["runner"], CALL)
        ref = HostBatches(Fn(lambda x, s: (x * s).softmax(-1)), arenas["reference"], CALL)
        mem = readout.Memory(os.getpid())
        geometry = [["float32", [6, 5], [5, 1]]]
        layout = inputs.fill(9, 8, "runner")
        views = arenas["runner"].views(layout)
        readout.write(str(tmp_path / "c"), mem, readout.claim(cand.go(layout), 8, geometry), [1, 6])
        pick = [1, 3, 6]
        ref_layout = inputs.fill(9, 8, "reference", pick)
        assert ref_layout["n"] == 3 and ref_layout["base"] == layout["base"]
        ref_views = arenas["reference"].views(ref_layout)
        for k, j in enumerate(pick):   # the picked sets, values and tensors, in order
            assert torch.equal(ref_views[k][0], views[j][0]) and ref_views[k][1] == views[j][1]
        readout.write(str(tmp_path / "r"), mem, readout.claim(ref.go(ref_layout), 3, geometry), [0, 2])
        mem.close()
        step = layout["set_bytes"]
        items = [{"call": j, "ref_call": k, "inputs": [layout["base"] + j * step, step]} for j, k in ((1, 0), (6, 2))]
        results = inputs.check(str(tmp_path / "c"), str(tmp_path / "r"), items, 1e-4, 1e-4, 1e-5)
        assert [r["ok"] for r in results] == [True, False]
        with pytest.raises(ValueError, match="picked"):
            inputs.fill(9, 8, "reference", [8])
    finally:
        _release()


def test_a_batch_of_no_calls_answers_nothing_and_frees_the_last_batchs_outputs():
    """What a batch costs outside any model's calls is measured on a batch of no calls (the last layout
    emptied): it runs nothing of the model and frees what the batch before it held, as every step does."""
    ns: dict = {}
    exec("import torch\ndef get_inputs():\n    return [torch.randn(6, 5), 2.0]", ns)
    arenas = {"runner": Arena.create(1 << 20), "reference": Arena.create(1 << 20)}
    calls = []
    try:
        inputs = HostInputs(ns, arenas)
        ref = HostBatches(Fn(lambda x, s: calls.append(1) or x * s), arenas["reference"], CALL)
        layout = inputs.fill(3, 4, "reference")
        ref.go(layout)
        assert len(ref.outs) == 4 and len(calls) == 4
        reply = ref.go(dict(layout, n=0))
        assert ref.outs == [] and len(calls) == 4
        assert reply["geometry"] == [] and readout.pointers_of(reply, 1) == []
    finally:
        _release()


def test_a_batchs_outputs_are_freed_inside_the_next_timed_step():
    """Freeing an output runs the candidate's code (a finalizer, a __del__): it happens inside go(), which
    the parent times, never in a step of its own between batches (where a finalizer pre-faulted the next
    batch's output buffers untimed: 2.3-2.5x over the twin on 256 MB outputs)."""
    import weakref
    ns: dict = {}
    exec(textwrap.dedent("""
        import torch
        def get_inputs():
            return [torch.randn(6, 5)]
    """), ns)
    events: list[str] = []

    def forward(x):
        events.append("call")
        out = x * 2
        weakref.finalize(out, events.append, "freed")
        return out
    arenas = {"runner": Arena.create(1 << 20), "reference": Arena.create(1 << 20)}
    try:
        inputs = HostInputs(ns, arenas)
        runner = HostBatches(Fn(forward), arenas["runner"], CALL)
        runner.go(inputs.fill(1, 3, "runner"))
        assert events == ["call"] * 3
        layout = inputs.fill(2, 3, "runner")   # between the steps: nothing of the runner's runs
        assert events == ["call"] * 3
        runner.go(layout)
        assert events == ["call"] * 3 + ["freed"] * 3 + ["call"] * 3
        assert not hasattr(runner, "free")   # no step of the runner's but go()
    finally:
        _release()


def _release() -> None:
    import gc

    from evaluate_kernel.batches import release_collections
    release_collections()
    gc.collect()


def test_timed_inputs_mix_the_trials_distributions_alike_on_both_sides():
    """Each set of a timed batch goes through a distribution chosen from the seed: the same on every side
    that draws from that seed, and not only the task's own (a ReLU of all-positive inputs would be the
    identity on every timed call)."""
    from evaluate_kernel.inputs import _draw_sets
    ns: dict = {}
    exec("import torch\ndef get_inputs():\n    return [torch.rand(4, 16)]", ns)
    cpu = torch.device("cpu")
    a = _draw_sets(ns, 7, 40, cpu, False, mixed=True)
    b = _draw_sets(ns, 7, 40, cpu, False, mixed=True)
    own = _draw_sets(ns, 7, 40, cpu, False)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    assert sum((x[0] < 0).any().item() for x in a) >= 5   # negated, zero-mean, per-sample sets
    assert any(torch.equal(x[0], y[0]) for x, y in zip(a, own))   # and the task's own


def test_a_call_that_wrote_into_its_inputs_fails_the_check(tmp_path):
    """The reference worker compares the candidate runner's file, for a checked call, with what it wrote
    there: a ReLU computed in place over its input is right, and still fails."""
    ns: dict = {}
    exec("import torch\ndef get_inputs():\n    return [torch.randn(6, 5)]", ns)
    arenas = {"runner": Arena.create(1 << 20), "reference": Arena.create(1 << 20)}
    try:
        inputs = HostInputs(ns, arenas)
        cand = HostBatches(Fn(lambda x: x.relu_()), arenas["runner"], CALL)   # in place, in the runner's file
        ref = HostBatches(Fn(lambda x: x.relu()), arenas["reference"], CALL)
        mem = readout.Memory(os.getpid())
        geometry = [["float32", [6, 5], [5, 1]]]
        layout = inputs.fill(5, 3, "runner")
        readout.write(str(tmp_path / "c"), mem, readout.claim(cand.go(layout), 3, geometry), [0, 1])
        inputs.fill(5, 3, "reference")
        readout.write(str(tmp_path / "r"), mem, readout.claim(ref.go(layout), 3, geometry), [0, 1])
        mem.close()
        items = [{"call": j, "ref_call": j, "inputs": [layout["base"] + j * layout["set_bytes"], layout["set_bytes"]]}
                 for j in (0, 1)]
        results = inputs.check(str(tmp_path / "c"), str(tmp_path / "r"), items, 1e-4, 1e-4, 1e-5)
        assert [r["ok"] for r in results] == [False, False]
        assert all("changed its inputs" in r["reason"] for r in results)
    finally:
        _release()


# ------------------------------------------------------------------------------------------ the claim
REF_GEOMETRY = [["float32", [4, 8], [8, 1]]]


def _reply(pointers, geometry=None):
    """A go() reply: the addresses packed as the runner packs them (n x k 64-bit integers, base64)."""
    return {"packed": packed(pointers), "geometry": geometry if geometry is not None else REF_GEOMETRY}


def packed(pointers) -> str:
    import array
    import base64
    return base64.b64encode(array.array("q", [a for p in pointers for a in p]).tobytes()).decode()


def test_a_claim_of_disjoint_outputs_is_accepted():
    c = readout.claim(_reply([[4096], [4096 + 128], [8192]]), 3, REF_GEOMETRY)
    assert isinstance(c, readout.Claim) and c.nbytes == [128]


@pytest.mark.parametrize("reply, n, why", [
    (_reply([[4096], [4096 + 64]]), 2, "same memory"),                       # calls overlap
    (_reply([[4096]] * 2), 2, "same memory"),                                # one buffer for every call
    (_reply([[4096]]), 2, "another number"),                                 # fewer calls than made
    (_reply([[4096, 8192]]), 1, "another number"),                           # more outputs than described
    (_reply([[-1]]), 1, "another number"),                                   # not an address
    ({"packed": "not base64!", "geometry": REF_GEOMETRY}, 1, "another number"),  # not the packing
    ({"packed": "AAAA", "geometry": REF_GEOMETRY}, 1, "another number"),         # 3 bytes: no whole integer
    ({"pointers": [[4096]], "geometry": REF_GEOMETRY}, 1, "another number"),     # a list is not read
    (_reply([[4096]], [["float64", [4, 8], [8, 1]]]), 1, "the reference's"),  # another dtype
    (_reply([[4096]], [["float32", [8, 4], [4, 1]]]), 1, "the reference's"),  # another shape
    (_reply([[4096]], [["complex256", [4, 8], [8, 1]]]), 1, "cannot read"),   # no such dtype
    (_reply([[4096]], "garbage"), 1, "cannot read"),
])
def test_a_false_claim_is_refused(reply, n, why):
    problem = readout.claim(reply, n, REF_GEOMETRY)
    assert isinstance(problem, str) and why in problem


def test_an_output_inside_another_calls_span_is_found():
    """Call 1's second output lies inside call 0's first, between spans of call 0's own: the sweep keeps
    the furthest end so far (neighbours alone would miss it)."""
    geometry = [["float32", [4, 8], [8, 1]], ["float32", [1], [1]]]
    problem = readout.claim(_reply([[4096, 4100], [8192, 4200]], geometry), 2, geometry)
    assert isinstance(problem, str) and "same memory" in problem


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 600), min_size=0, max_size=40), st.sampled_from([0, 1, 2, 3, 4, 6, 8]),
       st.sampled_from(["float32", "float16", "int8", "float64"]),
       st.lists(st.tuples(st.integers(0, 600), st.integers(1, 120)), max_size=3), st.booleans(),
       st.one_of(st.none(), st.integers(0, 700)))
@example([96], 0, "float32", [], False, 99)          # no bytes, yet an element's room past the region's end
@example([85], 4, "float32", [(100, 10)], False, None)   # its last byte is the input file's first
def test_a_claim_is_judged_alike_call_by_call_and_at_once(slots, elements, dtype, ranges, is_view, within):
    """One output a call is checked on the sorted addresses at once (thousands of calls a batch); the
    verdict is the call-by-call check's (readout._problem) on any addresses: overlaps, the input file,
    alignment and the region's end."""
    size = readout.DTYPE_SIZES[dtype]
    geometry = [[dtype, [elements], [1]]]
    pointers = [[a] for a in slots]   # byte addresses: some misaligned, some a byte into another span
    inputs = [(lo, lo + w) for lo, w in ranges]
    views = {0} if is_view else set()
    region = within
    if region is None:
        pointers = [[max(1, p[0])] for p in pointers]   # host addresses: never 0
    got = readout.claim(_reply(pointers, geometry), len(pointers), geometry, inputs, views, within=region)
    want = readout._problem(pointers, geometry, lambda call: [elements * size], inputs, views, region)
    assert (got if isinstance(got, str) else None) == want


def test_an_output_too_large_to_read_is_refused():
    geometry = [["float32", [1 << 21, 1 << 10], [1 << 10, 1]]]   # 8 GiB
    problem = readout.claim(_reply([[4096]], geometry), 1, geometry)
    assert isinstance(problem, str) and "larger than" in problem


def test_no_output_may_lie_in_the_input_file():
    """An output written over its call's inputs (in the runner's input file) saves the output's memory and
    the cold writes the reference pays for: refused wherever the runner has the file mapped."""
    inputs = [(1 << 20, 2 << 20)]
    assert isinstance(readout.claim(_reply([[4096]]), 1, REF_GEOMETRY, inputs), readout.Claim)
    problem = readout.claim(_reply([[(1 << 20) + 64]]), 1, REF_GEOMETRY, inputs)
    assert isinstance(problem, str) and "input file" in problem


def test_an_output_the_reference_returns_as_a_view_of_its_input_may_be_one():
    """A flatten: the reference's own output lies in its input file, so the candidate's may too."""
    inputs = [(1 << 20, 2 << 20)]
    assert readout.views_of_inputs(_reply([[(1 << 20) + 64]]), inputs) == {0}
    assert isinstance(readout.claim(_reply([[(1 << 20) + 64]]), 1, REF_GEOMETRY, inputs, {0}), readout.Claim)


def test_the_input_file_is_found_in_the_process_maps(tmp_path):
    """Every mapping of the file counts (a runner may map it again elsewhere)."""
    import mmap
    fd = new_memfd(1 << 16)
    try:
        a, b = mmap.mmap(fd, 1 << 16), mmap.mmap(fd, 1 << 16)
        st = os.fstat(fd)
        found = readout.mappings(os.getpid(), st.st_dev, st.st_ino)
        assert len(found) == 2 and all(hi - lo == 1 << 16 for lo, hi in found)
        a.close()
        b.close()
    finally:
        os.close(fd)


def test_outputs_of_one_call_may_share_memory():
    """(y, y[0]): two outputs of one call in one buffer are honest."""
    geometry = [["float32", [4, 8], [8, 1]], ["float32", [8], [1]]]
    c = readout.claim(_reply([[4096, 4096], [8192, 8192]], geometry), 2, geometry)
    assert isinstance(c, readout.Claim)


# ------------------------------------------------------------------------------------------ the memory
CHILD = textwrap.dedent("""
    import os, sys, time, torch
    out = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    sys.stdout.write(f"{out.data_ptr()}\\n"); sys.stdout.flush()
    sys.stdin.readline()
    out.fill_(-1.0)      # "computed later": after the parent stopped and read us, this is too late
    time.sleep(60)
""")


PADDED = textwrap.dedent("""
    import sys, torch
    buf = torch.arange(4 * 80, dtype=torch.float32).reshape(4, 80)
    out = buf[:, :8]     # an honest narrow view of a padded buffer
    sys.stdout.write(f"{out.data_ptr()}\\n"); sys.stdout.flush()
    sys.stdin.readline()
""")


def test_a_narrow_view_of_a_padded_buffer_is_read_row_by_row(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", PADDED], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        address = int(p.stdout.readline())
        os.kill(p.pid, signal.SIGSTOP)
        geometry = [["float32", [4, 8], [80, 1]]]
        c = readout.claim(_reply([[address]], geometry), 1, [["float32", [4, 8], [8, 1]]])
        mem = readout.Memory(p.pid)
        assert readout.write(str(tmp_path / "o"), mem, c, [0]) is None
        mem.close()
        got = readout.load(str(tmp_path / "o"))[0][0]
        assert torch.equal(got, torch.arange(4 * 80, dtype=torch.float32).reshape(4, 80)[:, :8])
    finally:
        p.kill()
        p.wait()


def test_outputs_are_read_from_the_stopped_process_as_they_were():
    """What the parent reads is the memory when the process was stopped; the file the reference worker
    loads holds those bytes at the claimed geometry; an address with nothing mapped is reported."""
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        address = int(p.stdout.readline())
        os.kill(p.pid, signal.SIGSTOP)
        p.stdin.write(b"go\n")
        p.stdin.flush()
        mem = readout.Memory(p.pid)
        c = readout.claim(_reply([[address]]), 1, REF_GEOMETRY)
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"readout-{os.getpid()}.out")
        assert readout.write(path, mem, c, [0]) is None
        os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.3)   # it overwrites its output now: the file keeps what it held when stopped
        got = readout.load(path)
        assert torch.equal(got[0][0], torch.arange(32, dtype=torch.float32).reshape(4, 8))
        bad = readout.claim(_reply([[8]]), 1, REF_GEOMETRY)   # page zero: never mapped
        assert "could not be read" in readout.write(path, mem, bad, [0])
        mem.close()
        os.remove(path)
    finally:
        p.kill()
        p.wait()


def test_a_sparse_claimed_stride_is_read_element_by_element():
    """An output claimed with a huge stride within its rows (over memory that reads as zeros) is read one
    element at a time, never the gaps: a claimed stride of 2^31 elements had the parent read gigabytes a row."""
    from evaluate_kernel import readout

    class Zeros:
        def __init__(self):
            self.sizes = []

        def read(self, address, nbytes):
            self.sizes.append(nbytes)
            return bytes(nbytes)

    mem = Zeros()
    shape, stride, size = [3, 5], [1 << 33, 1 << 31], 4
    span = size * (1 + sum((d - 1) * st for d, st in zip(shape, stride)))
    data, strides = readout._read_output(mem, 0, span, size, shape, stride)
    assert len(data) == 15 * size and strides == [5, 1]
    assert max(mem.sizes) == size and len(mem.sizes) == 15


def test_a_runner_whose_outputs_outgrow_its_memory_says_so_and_serves_on():
    """(The GPU's shared region, simulated) An out-of-memory in a batch step is answered as such, and the
    runner waits for the next step: the parent may ask for fewer calls a batch. Any other error ends it."""
    from evaluate_kernel.worker import _serve_host

    class Steps:
        def __init__(self, errors):
            self.errors = errors

        def go(self, layout):
            e = self.errors.pop(0)
            if e is not None:
                raise e
            return {"packed": "", "geometry": []}

    sent = []
    reqs = iter([{"cmd": "go", "layout": {}}, {"cmd": "go", "layout": {}}, {"cmd": "stop"}])
    _serve_host(Steps([torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), None]),
                sent.append, lambda: next(reqs))
    assert sent[0]["kind"] == "error" and sent[0]["out_of_memory"] is True and "out of memory" in sent[0]["error"]
    assert sent[1]["kind"] == "done" and len(sent) == 2
    with pytest.raises(ValueError):
        _serve_host(Steps([ValueError("the candidate's own")]), sent.append,
                    lambda: {"cmd": "go", "layout": {}})


@given(st.integers(min_value=1, max_value=300), st.data())
@settings(max_examples=60, deadline=None)
def test_the_reference_runs_every_checked_set_and_as_many_as_its_batch_holds(n_cand, data):
    from evaluate_kernel.timing import Timing
    n_ref = data.draw(st.integers(min_value=1, max_value=n_cand))
    chosen = sorted(data.draw(st.sets(st.integers(0, n_cand - 1), min_size=1, max_size=min(2, n_ref))))
    pick = Timing._pick(n_cand, n_ref, chosen)
    assert len(pick) == n_ref and pick == sorted(set(pick)) and set(chosen) <= set(pick)
    assert all(0 <= j < n_cand for j in pick)


# ------------------------------------------------------------------------------------------ layouts per call
def test_calls_laid_out_otherwise_than_the_first_are_described_and_read_as_laid_out(tmp_path):
    """A model whose output is row-major at one call and column-major at the next: the reply names the
    strides of the calls laid out otherwise (only those), the claim takes them, and each checked call is
    read in its own layout, so the values compare equal to the reference's."""
    ns: dict = {}
    exec("import torch\ndef get_inputs():\n    return [torch.randn(6, 5)]", ns)
    calls = {"k": 0}

    def alternating(x):
        calls["k"] += 1
        y = x.softmax(-1)
        return y if calls["k"] % 2 else torch.empty_strided((6, 5), (1, 6)).copy_(y)
    arenas = {"runner": Arena.create(1 << 20), "reference": Arena.create(1 << 20)}
    try:
        inputs = HostInputs(ns, arenas)
        cand = HostBatches(Fn(alternating), arenas["runner"], CALL)
        ref = HostBatches(Fn(lambda x: x.softmax(-1)), arenas["reference"], CALL)
        geometry = [["float32", [6, 5], [5, 1]]]
        layout = inputs.fill(5, 6, "runner")
        reply = cand.go(layout)
        assert reply["geometry"] == geometry
        assert reply["strides"] == {str(i): [[1, 6]] for i in (1, 3, 5)}
        c = readout.claim(reply, 6, geometry)
        assert isinstance(c, readout.Claim) and c.geometry_of(3) == [["float32", [6, 5], [1, 6]]]
        assert c.geometry_of(2) == geometry and c.nbytes_of(3) == c.nbytes_of(2) == [120]
        mem = readout.Memory(os.getpid())
        assert readout.write(str(tmp_path / "c"), mem, c, [2, 3, 5]) is None
        assert inputs.fill(5, 6, "reference") == layout
        ref_reply = ref.go(layout)
        assert "strides" not in ref_reply   # every call alike: nothing more in the reply
        assert readout.write(str(tmp_path / "r"), mem, readout.claim(ref_reply, 6, geometry), [2, 3, 5]) is None
        mem.close()
        step = layout["set_bytes"]
        items = [{"call": j, "ref_call": j, "inputs": [layout["base"] + j * step, step]} for j in (2, 3, 5)]
        results = inputs.check(str(tmp_path / "c"), str(tmp_path / "r"), items, 1e-4, 1e-4, 5e-5)
        assert [r["ok"] for r in results] == [True, True, True]
    finally:
        _release()


@pytest.mark.parametrize("strides", [
    {"0": [[1, 4]]},          # the first call's layout is the geometry's
    {"3": [[1, 4]]},          # no such call
    {"1": [[1, 4], [1]]},     # more outputs than described
    {"1": [[1]]},             # a stride for another number of dimensions
    {"1": [[-1, 4]]},         # not a stride
    {"x": [[1, 4]]},          # not a call
    {"²": [[1, 4]]},          # a digit int() does not read
    {"9" * 5000: [[1, 4]]},   # longer than int() reads
    [[1, 4]],                 # not a mapping
    None,
])
def test_a_layout_per_call_in_another_form_is_refused(strides):
    reply = dict(_reply([[4096], [4096 + 128], [4096 + 512]]), strides=strides)
    problem = readout.claim(reply, 3, REF_GEOMETRY)
    assert isinstance(problem, str) and "cannot read" in problem


def test_a_call_is_checked_in_its_own_layout():
    """Call 1's own strides (rows 64 elements apart) make its span reach call 2's memory: refused, where the
    first call's layout would have passed it."""
    reply = _reply([[4096], [4096 + 128], [4096 + 512]])
    assert isinstance(readout.claim(reply, 3, REF_GEOMETRY), readout.Claim)
    problem = readout.claim(dict(reply, strides={"1": [[64, 1]]}), 3, REF_GEOMETRY)
    assert isinstance(problem, str) and "calls 1 and 2 returned outputs in the same memory" in problem


def test_a_call_laid_out_past_the_region_is_refused():
    """(GPU) A call whose own layout reaches past the region's end is refused, as the first call's would be."""
    reply = dict(_reply([[0], [256]]), strides={"1": [[64, 1]]})
    assert isinstance(readout.claim(dict(reply, strides={}), 2, REF_GEOMETRY, within=1024), readout.Claim)
    problem = readout.claim(reply, 2, REF_GEOMETRY, within=1024)
    assert isinstance(problem, str) and "outside the memory" in problem
