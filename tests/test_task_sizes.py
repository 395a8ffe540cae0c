"""The 16 Table-5 tasks at current and at KernelBench v0 sizes, checked against KernelBench's problem text.

The tables below are facts read from KernelBench's problem files: v0 is each file's first version (the
commit that added the problems), "current" its latest. Per task: input shapes in get_inputs() order, the
constructor arguments, the function drawing the inputs (torch.rand or torch.randn), the random draws the
constructor makes itself (before its layers), the output shape, and the count and total size of the
parameters. The reference sources are traced on the meta device (no memory), with torch.rand/randn
recording what they are asked for, so every test here is fast.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import NamedTuple

import pytest
import torch

import task_catalog
import tasks


class Facts(NamedTuple):
    inputs: list
    init: list
    draw: str
    init_draws: list
    output: tuple
    params: tuple  # (number of parameter tensors, total elements)


V0 = {
    "batchnorm": Facts([(16, 64, 256, 256)], [64], "randn", [], (16, 64, 256, 256), (2, 128)),
    "conv_div": Facts([(128, 3, 16, 32, 32)], [3, 16, (3, 3, 3), 2.0, (2, 2, 2), (16, 1, 1, 1), 1], "randn",
                      [(16, 1, 1, 1)], (128, 1, 1, 1), (3, 1328)),
    "conv_max": Facts([(128, 3, 16, 32, 32)], [3, 16, 3, 1, 1], "randn", [], (128, 1, 8, 16, 16), (2, 1312)),
    "conv_t2d": Facts([(128, 3, 32, 32)], [3, 16, 3, 2, 1, 1, (16, 1, 1), 2.0], "randn", [(16, 1, 1)],
                      (128, 16, 64, 64), (3, 464)),
    "gelu": Facts([(16, 16384)], [], "randn", [], (16, 16384), (0, 0)),
    "matmul": Facts([(256, 131072), (131072, 256)], [], "randn", [], (256, 256), (0, 0)),
    "maxpool": Facts([(16, 32, 128, 128)], [2, 2, 1, 3], "randn", [], (16, 32, 64, 64), (0, 0)),
    "mlp": Facts([(1, 1000)], [1000, [400, 800], 500], "randn", [], (1, 500), (6, 1121700)),
    "rmsnorm": Facts([(16, 64, 256, 256)], [64], "randn", [], (16, 64, 256, 256), (0, 0)),
    "softmax": Facts([(16, 16384)], [], "randn", [], (16, 16384), (0, 0)),
    "vgg16": Facts([(10, 3, 224, 224)], [1000], "randn", [], (10, 1000), (32, 138357544)),
    "mean": Facts([(16, 256, 256)], [1], "randn", [], (16, 256), (0, 0)),
    "rnn": Facts([(8, 1024)], [1024, 256, 128], "randn", [(8, 256)], (8, 128), (4, 360832)),
    "bmm_instancenorm": Facts([(128, 64), (128, 128)], [64, 128], "randn", [], (128, 128), (2, 8320)),
    "alexnet": Facts([(10, 3, 224, 224)], [1000], "randn", [], (10, 1000), (16, 62378344)),
    "layernorm": Facts([(16, 64, 256, 256)], [(64, 256, 256)], "randn", [], (16, 64, 256, 256), (2, 8388608)),
}

CURRENT = {
    "batchnorm": Facts([(64, 64, 512, 512)], [64], "rand", [], (64, 64, 512, 512), (2, 128)),
    "conv_div": Facts([(128, 8, 16, 64, 64)], [8, 16, (3, 3, 3), 2.0, (2, 2, 2), (16, 1, 1, 1), 1], "rand",
                      [(16, 1, 1, 1)], (128, 1, 1, 1), (3, 3488)),
    "conv_max": Facts([(4, 32, 32, 128, 128)], [32, 64, 3, 1, 1], "rand", [], (4, 1, 16, 64, 64), (2, 55360)),
    "conv_t2d": Facts([(128, 64, 128, 128)], [64, 64, 3, 2, 1, 1, (64, 1, 1), 2.0], "rand", [(64, 1, 1)],
                      (128, 64, 256, 256), (3, 36992)),
    "gelu": Facts([(4096, 393216)], [], "rand", [], (4096, 393216), (0, 0)),
    "matmul": Facts([(256, 524288), (524288, 256)], [], "rand", [], (256, 256), (0, 0)),
    "maxpool": Facts([(32, 64, 512, 512)], [4, 1, 1, 1], "rand", [], (32, 64, 511, 511), (0, 0)),
    "mlp": Facts([(128, 16384)], [16384, [16384, 16384], 8192], "rand", [], (128, 8192), (6, 671129600)),
    "rmsnorm": Facts([(112, 64, 512, 512)], [64], "rand", [], (112, 64, 512, 512), (0, 0)),
    "softmax": Facts([(4096, 393216)], [], "rand", [], (4096, 393216), (0, 0)),
    "vgg16": Facts([(10, 3, 224, 224)], [1000], "rand", [], (10, 1000), (32, 138357544)),
    "mean": Facts([(128, 4096, 4095)], [1], "rand", [], (128, 4095), (0, 0)),
    "rnn": Facts([(256, 16384), (256, 16384)], [16384, 16384, 8192], "rand", [(256, 16384)], (256, 8192),
                 (4, 671113216)),
    "bmm_instancenorm": Facts([(1024, 8192), (1024, 8192)], [8192, 8192], "rand", [], (1024, 8192),
                              (2, 67117056)),
    "alexnet": Facts([(1024, 3, 224, 224)], [1000], "rand", [], (1024, 1000), (16, 62378344)),
    "layernorm": Facts([(16, 64, 256, 256)], [(64, 256, 256)], "rand", [], (16, 64, 256, 256), (2, 8388608)),
}

# The paper's Table 2 rows (same names as Table 5) and their KernelBench problems.
TABLE2_ROWS = {
    "BatchNorm": (1, 33), "ConvDiv": (2, 8), "ConvMax": (2, 43), "ConvT2D": (2, 2), "GELU": (1, 26),
    "MatMul": (1, 6), "MaxPool": (1, 42), "MLP": (3, 1), "RMSNorm": (1, 36), "Softmax": (1, 23),
    "VGG16": (3, 11), "MeanRedu": (1, 48), "RNN": (3, 33), "BMMNorm": (2, 28), "AlexNet": (3, 5),
    "LayerNorm": (1, 40),
}


@contextmanager
def _recording_draws(log: list):
    """torch.rand/randn record (function, shape) and return meta tensors."""
    saved = {"rand": torch.rand, "randn": torch.randn}

    def recorder(fn_name):
        def draw(*size, **kw):
            shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
            log.append((fn_name, shape))
            return saved[fn_name](*size, **{**kw, "device": "meta"})
        return draw

    torch.rand, torch.randn = recorder("rand"), recorder("randn")
    try:
        yield
    finally:
        torch.rand, torch.randn = saved["rand"], saved["randn"]


def _trace(src: str) -> Facts:
    ns: dict = {}
    exec(compile(src, "<reference>", "exec"), ns)
    init = ns["get_init_inputs"]()
    init_draws, input_draws = [], []
    with _recording_draws(init_draws), torch.device("meta"):
        model = ns["Model"](*init)
    with _recording_draws(input_draws):
        xs = ns["get_inputs"]()
    with torch.device("meta"), torch.no_grad():
        out = model(*xs)
    assert all(x.device.type == "meta" and x.dtype == torch.float32 for x in xs)
    assert [shape for _, shape in input_draws] == [tuple(x.shape) for x in xs]  # drawn in list order
    draws = {fn for fn, _ in input_draws}
    assert len(draws) == 1, draws
    params = list(model.parameters())
    return Facts([tuple(x.shape) for x in xs], init, draws.pop(), [s for _, s in init_draws],
                 tuple(out.shape), (len(params), sum(math.prod(p.shape) for p in params)))


@pytest.mark.parametrize("name", list(V0))
def test_v0_variant_matches_kernelbench_v0(name):
    assert _trace(tasks.get(name + "@v0").reference_src) == V0[name]


@pytest.mark.parametrize("name", list(CURRENT))
def test_current_variant_matches_kernelbench_today(name):
    assert _trace(tasks.get(name).reference_src) == CURRENT[name]


def test_every_table5_task_has_both_variants_and_table2_row():
    assert set(V0) == set(CURRENT) == set(task_catalog.TABLE5)
    assert {row: (lvl, idx) for lvl, idx, row in task_catalog.TABLE5.values()} == TABLE2_ROWS
    for name, (level, index, _) in task_catalog.TABLE5.items():
        assert tasks.get(name).source == f"KernelBench level{level} #{index}"
        assert tasks.get(name + "@v0").source == f"KernelBench level{level} #{index} (v0 sizes)"


@pytest.mark.parametrize("name", list(V0))
def test_descriptions_state_the_variant_shapes_and_distribution(name):
    for variant, facts, dist in (("", CURRENT, "uniform on [0, 1)"), ("@v0", V0, "standard normal")):
        text = tasks.get(name + variant).description
        assert str(facts[name].inputs[0]) in text, (name + variant, text)
        assert str(facts[name].output) in text or "same shape" in text, (name + variant, text)
        assert f"Inputs {dist}." in text and "fp32" in text


def test_v0_rnn_restarts_from_the_constructor_state_on_every_call():
    """v0 stores the new hidden state on the module; the evaluator calls one model many times, so the
    restatement must return v0's first-call output every time."""
    ns: dict = {}
    exec(tasks.get("rnn@v0").reference_src, ns)
    torch.manual_seed(42)
    model = ns["Model"](*ns["get_init_inputs"]())
    torch.manual_seed(0)
    (x,) = ns["get_inputs"]()
    with torch.no_grad():
        first, second = model(x), model(x)
        expected = model.h2o(torch.tanh(model.i2h(torch.cat((x, model.hidden), dim=1))))
    assert torch.equal(first, second)
    assert torch.allclose(first, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["conv_t2d", "rnn", "mlp"])
def test_v0_weights_follow_kernelbench_draw_order(name):
    """Seed 42, then construct: layers and explicit draws consume the generator in constructor order."""
    ns: dict = {}
    exec(tasks.get(name + "@v0").reference_src, ns)
    torch.manual_seed(42)
    model = ns["Model"](*ns["get_init_inputs"]())
    torch.manual_seed(42)
    if name == "conv_t2d":
        conv = torch.nn.ConvTranspose2d(3, 16, 3, stride=2, padding=1, output_padding=1)
        bias = torch.randn(16, 1, 1)
        assert torch.equal(model.bias, bias) and torch.equal(model.conv_transpose.weight, conv.weight)
    elif name == "rnn":
        hidden = torch.randn(8, 256)
        i2h = torch.nn.Linear(1280, 256)
        assert torch.equal(model.hidden, hidden) and torch.equal(model.i2h.weight, i2h.weight)
    else:
        first = torch.nn.Linear(1000, 400)
        assert torch.equal(model.network[0].weight, first.weight)
