"""The built-in tasks: the paper's 16 Table-5 problems (Appendix C.3) at two sets of sizes, plus level2 #92.

`entries()` returns one plain dict of Task fields per built-in task; `tasks.py` turns them into Tasks.
Each Table-5 problem comes twice:

- `name`: today's KernelBench sizes, inputs drawn with `torch.rand` (uniform on [0, 1));
- `name@v0`: KernelBench v0 sizes, inputs drawn with `torch.randn` (standard normal), the setting of the
  paper's Table 2 (its PyTorch column matches the v0 sizes).

The sizes are data (`CURRENT`, `V0`: builder arguments per task); the sources come from
`task_sources.py` and the prompt descriptions are written from the same numbers, so the two agree.
"""
from __future__ import annotations

import task_sources as src

# Builder arguments (task_sources.<name>) per task, without the input draw.
CURRENT: dict[str, dict] = {
    "batchnorm": dict(batch=64, features=64, dim1=512, dim2=512),
    "conv_div": dict(batch=128, c_in=8, c_out=16, depth=16, height=64, width=64),
    "conv_max": dict(batch=4, c_in=32, c_out=64, depth=32, height=128, width=128),
    "conv_t2d": dict(batch=128, c_in=64, c_out=64, side=128),
    "gelu": dict(batch=4096, dim=393216),
    "matmul": dict(m=256, n=256, k=131072 * 4),
    "maxpool": dict(batch=32, channels=64, side=512, kernel=4, stride=1, padding=1, dilation=1),
    "mlp": dict(batch=128, input_size=16384, layer_sizes=[16384, 16384], output_size=8192),
    "rmsnorm": dict(batch=112, features=64, dim1=512, dim2=512),
    "softmax": dict(batch=4096, dim=393216),
    "vgg16": dict(batch=10),
    "mean": dict(batch=128, dim1=4096, dim2=4095),
    "rnn": dict(batch=256, input_size=16384, hidden_size=16384, output_size=8192, hidden_as_input=True),
    "bmm_instancenorm": dict(batch=1024, in_features=8192, out_features=8192),
    "alexnet": dict(batch=1024),
    "layernorm": dict(batch=16, features=64, dim1=256, dim2=256),
}

# KernelBench v0 (the first version of each problem file, unchanged until the sizes were scaled up).
V0: dict[str, dict] = {
    "batchnorm": dict(batch=16, features=64, dim1=256, dim2=256),
    "conv_div": dict(batch=128, c_in=3, c_out=16, depth=16, height=32, width=32),
    "conv_max": dict(batch=128, c_in=3, c_out=16, depth=16, height=32, width=32),
    "conv_t2d": dict(batch=128, c_in=3, c_out=16, side=32),
    "gelu": dict(batch=16, dim=16384),
    "matmul": dict(m=256, n=256, k=131072),
    "maxpool": dict(batch=16, channels=32, side=128, kernel=2, stride=2, padding=1, dilation=3),
    "mlp": dict(batch=1, input_size=1000, layer_sizes=[400, 800], output_size=500),
    "rmsnorm": dict(batch=16, features=64, dim1=256, dim2=256),
    "softmax": dict(batch=16, dim=16384),
    "vgg16": dict(batch=10),
    "mean": dict(batch=16, dim1=256, dim2=256),
    "rnn": dict(batch=8, input_size=1024, hidden_size=256, output_size=128, hidden_as_input=False),
    "bmm_instancenorm": dict(batch=128, in_features=64, out_features=128),
    "alexnet": dict(batch=10),
    "layernorm": dict(batch=16, features=64, dim1=256, dim2=256),
}

TABLE5 = {  # task name -> (KernelBench level, problem index, the paper's row name in Tables 2 and 5)
    "batchnorm": (1, 33, "BatchNorm"), "conv_div": (2, 8, "ConvDiv"), "conv_max": (2, 43, "ConvMax"),
    "conv_t2d": (2, 2, "ConvT2D"), "gelu": (1, 26, "GELU"), "matmul": (1, 6, "MatMul"),
    "maxpool": (1, 42, "MaxPool"), "mlp": (3, 1, "MLP"), "rmsnorm": (1, 36, "RMSNorm"),
    "softmax": (1, 23, "Softmax"), "vgg16": (3, 11, "VGG16"), "mean": (1, 48, "MeanRedu"),
    "rnn": (3, 33, "RNN"), "bmm_instancenorm": (2, 28, "BMMNorm"), "alexnet": (3, 5, "AlexNet"),
    "layernorm": (1, 40, "LayerNorm"),
}

# Longer reductions than the fp32 defaults allow for elementwise: honest kernels that sum in another order
# land a few 1e-6 (up to ~2e-5) from the reference in relative L2, within the default L2 bound (5e-5),
# while TF32/bf16 input rounding lands >= 3e-4 on zero-mean inputs.
_FP32_OVERRIDES = {
    "matmul": dict(atol=2e-4),  # K >= 131072: sequential fp32 accumulation drifts ~2e-5
}


def entries() -> list[dict]:
    """Task fields (name, reference_src, description, device, flops, source, tolerance overrides) of every
    built-in task, in registry order: conv_groupnorm, conv_groupnorm_small, the 16 at current sizes,
    then the 16 at v0 sizes."""
    out = [
        dict(name="conv_groupnorm", reference_src=src.conv_groupnorm(128, 8, 64, 128, 16),
             description=_conv_groupnorm_text(128, 8, 64, 128, 16) + " The conv output is 520 MB, so the "
             "tail is memory-bound.",
             flops=_conv_flops(128, 8, 64, (126, 126), (3, 3)), source="KernelBench level2 #92"),
        # Batch 16 instead of 128: the reference then takes a few ms on a 2-core CPU, so an evaluation
        # (several input sets plus dozens of timed calls of reference and candidate) stays under a
        # second, while each GroupNorm group still averages 2 x 30 x 30 = 1800 values.
        dict(name="conv_groupnorm_small", reference_src=src.conv_groupnorm(16, 3, 16, 32, 8),
             description=_conv_groupnorm_text(16, 3, 16, 32, 8) + " Small enough to run on a CPU.",
             device="cpu", flops=_conv_flops(16, 3, 16, (30, 30), (3, 3)),
             source="KernelBench level2 #92 (original sizes, batch 16)"),
    ]
    for version, sizes, draw in (("", CURRENT, "rand"), ("@v0", V0, "randn")):
        for name, kw in sizes.items():
            level, index, _ = TABLE5[name]
            dist = "Inputs uniform on [0, 1)." if draw == "rand" else "Inputs standard normal."
            out.append(dict(
                name=name + version, reference_src=getattr(src, name)(**kw, draw=draw),
                description=f"{_DESCRIBE[name](**kw)} {dist}", flops=_FLOPS.get(name, _no_flops)(**kw),
                source=f"KernelBench level{level} #{index}" + (" (v0 sizes)" if version else ""),
                **_FP32_OVERRIDES.get(name, {})))
    return out


# ---------------------------------------------------------------------------------------------------
# Prompt descriptions: what the function computes, its shapes and dtype, and what limits its speed.

def _conv_groupnorm_text(batch, c_in, c_out, side, groups) -> str:
    o = side - 2
    return (f"Conv2d({c_in}->{c_out}, 3x3, stride 1, no padding, with bias) on x of shape ({batch}, {c_in}, "
            f"{side}, {side}) fp32, then GroupNorm({groups} groups, eps 1e-5, affine), Tanh, HardSwish, add "
            f"the conv output back (residual of the pre-norm conv output), and LogSumExp over the {c_out} "
            f"channels (keepdim). Output ({batch}, 1, {o}, {o}) fp32.")


def _batchnorm_text(batch, features, dim1, dim2) -> str:
    n = batch * features * dim1 * dim2
    return (f"BatchNorm2d({features}) in training mode on x of shape ({batch}, {features}, {dim1}, {dim2}) "
            f"fp32: each channel is normalised with its batch mean and biased variance over (N, H, W) = "
            f"{_count(n // features)} values, eps 1e-5, affine weight/bias; running statistics are updated "
            f"but not compared. Output same shape ({_bytes(n)}). {_bound(2 * n)}")


def _conv_div_text(batch, c_in, c_out, depth, height, width) -> str:
    return (f"Conv3d({c_in}->{c_out}, 3x3x3, with bias) on x of shape ({batch}, {c_in}, {depth}, {height}, "
            f"{width}) fp32, divide by 2.0, MaxPool3d(2), global average pool to (1,1,1), add a "
            f"({c_out},1,1,1) bias parameter, sum over channels. Output ({batch}, 1, 1, 1) fp32.")


def _conv_max_text(batch, c_in, c_out, depth, height, width) -> str:
    return (f"Conv3d({c_in}->{c_out}, 3x3x3, stride 1, padding 1, with bias) on x of shape ({batch}, {c_in}, "
            f"{depth}, {height}, {width}) fp32, MaxPool3d(2, stride 2), LogSumExp over the {c_out} channels "
            f"(keepdim), ReLU. Output ({batch}, 1, {depth // 2}, {height // 2}, {width // 2}) fp32.")


def _conv_t2d_text(batch, c_in, c_out, side) -> str:
    return (f"ConvTranspose2d({c_in}->{c_out}, 3x3, stride 2, padding 1, output_padding 1, with bias) on x "
            f"of shape ({batch}, {c_in}, {side}, {side}) fp32, add a ({c_out},1,1) bias parameter, clamp to "
            f"[0,1], multiply by 2, clamp to [0,1], divide by 2. Output ({batch}, {c_out}, {2 * side}, "
            f"{2 * side}) fp32.")


def _gelu_text(batch, dim) -> str:
    return (f"Exact GELU, 0.5*x*(1+erf(x/sqrt(2))), elementwise on x of shape ({batch}, {dim}) fp32 "
            f"({_bytes(batch * dim)}). The tanh approximation is not exact enough. {_bound(2 * batch * dim)}")


def _matmul_text(m, n, k) -> str:
    return (f"C = A @ B with A of shape ({m}, {k}) and B of shape ({k}, {n}), fp32, output ({m}, {n}) fp32. "
            f"The inner dimension is huge and M, N small, so the work must be split along K (split-K) to "
            f"fill the GPU. No TF32 or lower precision.")


def _maxpool_text(batch, channels, side, kernel, stride, padding, dilation) -> str:
    o = (side + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return (f"MaxPool2d(kernel {kernel}, stride {stride}, padding {padding}, dilation {dilation}) on x of "
            f"shape ({batch}, {channels}, {side}, {side}) fp32. Output ({batch}, {channels}, {o}, {o}) fp32. "
            f"{_bound(batch * channels * (side * side + o * o))}")


def _mlp_text(batch, input_size, layer_sizes, output_size) -> str:
    sizes = [input_size, *layer_sizes]
    hidden = ", ".join(f"Linear({a}->{b})+ReLU" for a, b in zip(sizes, sizes[1:]))
    return (f"MLP on x of shape ({batch}, {input_size}) fp32: {hidden}, Linear({sizes[-1]}->{output_size}). "
            f"Output ({batch}, {output_size}) fp32. A chain of {len(sizes)} GEMMs. No TF32.")


def _rmsnorm_text(batch, features, dim1, dim2) -> str:
    return (f"RMS norm over the {features} channels (dim 1) of x of shape ({batch}, {features}, {dim1}, "
            f"{dim2}) fp32: x / sqrt(mean(x^2 over dim 1) + 1e-5). Output same shape "
            f"({_bytes(batch * features * dim1 * dim2)}). {_bound(2 * batch * features * dim1 * dim2)}")


def _softmax_text(batch, dim) -> str:
    return (f"Softmax over dim 1 of x of shape ({batch}, {dim}) fp32 (rows of {dim} values; outputs "
            f"average 1/{dim}, so the check is relative). Output same shape. {_bound(2 * batch * dim)}")


def _vgg16_text(batch) -> str:
    return (f"VGG16 on x of shape ({batch}, 3, 224, 224) fp32: 13 conv3x3(padding 1)+ReLU layers in five "
            f"blocks each ending in MaxPool2d(2,2), flatten (channel-major), then Linear(25088->4096)+ReLU, "
            f"Linear(4096->4096)+ReLU, Linear(4096->1000); dropout p=0. Output ({batch}, 1000) fp32.")


def _mean_text(batch, dim1, dim2) -> str:
    return (f"Mean over dim 1 of x of shape ({batch}, {dim1}, {dim2}) fp32 ({_bytes(batch * dim1 * dim2)}). "
            f"Output ({batch}, {dim2}) fp32. {_bound(batch * dim1 * dim2)}")


def _rnn_text(batch, input_size, hidden_size, output_size, hidden_as_input) -> str:
    start = (f"inputs x ({batch}, {input_size}) and h0 ({batch}, {hidden_size}) fp32; the hidden state is "
             f"set to h0" if hidden_as_input else
             f"input x ({batch}, {input_size}) fp32; the hidden state is the ({batch}, {hidden_size}) tensor "
             f"drawn in the constructor (every call starts from it)")
    return (f"One vanilla-RNN step: {start}, hidden = tanh(Linear({input_size + hidden_size}->{hidden_size})"
            f"(cat(x, hidden))), output = Linear({hidden_size}->{output_size})(hidden). Output ({batch}, "
            f"{output_size}) fp32. Dominated by two GEMMs. No TF32.")


def _bmm_instancenorm_text(batch, in_features, out_features) -> str:
    return (f"Inputs x ({batch}, {in_features}) and y ({batch}, {out_features}) fp32: "
            f"Linear({in_features}->{out_features}), then normalise each row by its own mean and biased "
            f"variance (InstanceNorm2d on a ({batch},1,1,{out_features}) view, eps 1e-5, no affine), then "
            f"(row + y) * y. Output ({batch}, {out_features}) fp32.")


def _alexnet_text(batch) -> str:
    return (f"AlexNet on x of shape ({batch}, 3, 224, 224) fp32: conv 11x11/4 (96) + ReLU + maxpool 3/2, "
            f"conv 5x5 (256) + ReLU + maxpool, conv 3x3 (384, 384, 256) + ReLU, maxpool, flatten, "
            f"Linear(9216->4096)+ReLU, Linear(4096->4096)+ReLU, Linear(4096->1000); dropout p=0. "
            f"Output ({batch}, 1000) fp32.")


def _layernorm_text(batch, features, dim1, dim2) -> str:
    return (f"LayerNorm over the last three dims ({features}, {dim1}, {dim2}) of x of shape ({batch}, "
            f"{features}, {dim1}, {dim2}) fp32: each of the {batch} samples "
            f"({_count(features * dim1 * dim2)} values) is normalised with its mean and biased variance, eps 1e-5, then multiplied by a "
            f"({features},{dim1},{dim2}) weight and a bias added. Output same shape. Only {batch} rows, so a "
            f"row-per-block reduction leaves the GPU idle: split each row.")


_DESCRIBE = {
    "batchnorm": _batchnorm_text, "conv_div": _conv_div_text, "conv_max": _conv_max_text,
    "conv_t2d": _conv_t2d_text, "gelu": _gelu_text, "matmul": _matmul_text, "maxpool": _maxpool_text,
    "mlp": _mlp_text, "rmsnorm": _rmsnorm_text, "softmax": _softmax_text, "vgg16": _vgg16_text,
    "mean": _mean_text, "rnn": _rnn_text, "bmm_instancenorm": _bmm_instancenorm_text,
    "alexnet": _alexnet_text, "layernorm": _layernorm_text,
}


def _bound(numel: int) -> str:
    """What limits a bandwidth-bound function at this size: below ~100 MB an H100 moves the data in tens
    of microseconds, as long as a few kernel launches take."""
    if numel * 4 >= 100e6:
        return "Memory-bound."
    return f"Small ({_bytes(numel)} read and written): launch overhead weighs as much as memory traffic."


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


def _bytes(numel: int, itemsize: int = 4) -> str:
    b = numel * itemsize
    return f"{b / 1e9:.1f} GB" if b >= 1e9 else f"{b / 1e6:.1f} MB" if b >= 1e6 else f"{b / 1e3:.0f} KB"


# ---------------------------------------------------------------------------------------------------
# FLOP counts. Two FLOPs per multiply-add of the *direct* algorithm of the dominant conv/matmul layers
# only (elementwise tails, norms and pools are left out), so each figure is a lower bound on the work
# of the whole function. Winograd/FFT convolutions do fewer multiplications than this; the evaluator
# must keep a generous margin when it turns these into a time floor.

def _conv_flops(batch: int, c_in: int, c_out: int, out_spatial: tuple[int, ...],
                kernel: tuple[int, ...], groups: int = 1) -> float:
    macs_per_output = (c_in // groups)
    for k in kernel:
        macs_per_output *= k
    outputs = batch * c_out
    for s in out_spatial:
        outputs *= s
    return 2.0 * outputs * macs_per_output


def _linear_flops(batch: int, in_features: int, out_features: int) -> float:
    return 2.0 * batch * in_features * out_features


def _vgg16_flops(batch: int) -> float:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    total, c_in, side = 0.0, 3, 224
    for v in cfg:
        if v == "M":
            side //= 2
        else:
            total += _conv_flops(batch, c_in, int(v), (side, side), (3, 3))
            c_in = int(v)
    return total + sum(_linear_flops(batch, i, o)
                       for i, o in ((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)))


def _alexnet_flops(batch: int) -> float:
    convs = ((3, 96, 55, 11), (96, 256, 27, 5), (256, 384, 13, 3), (384, 384, 13, 3), (384, 256, 13, 3))
    total = sum(_conv_flops(batch, ci, co, (s, s), (k, k)) for ci, co, s, k in convs)
    return total + sum(_linear_flops(batch, i, o)
                       for i, o in ((256 * 6 * 6, 4096), (4096, 4096), (4096, 1000)))


def _no_flops(**_) -> float:
    return 0.0


_FLOPS = {
    "conv_div": lambda batch, c_in, c_out, depth, height, width: _conv_flops(
        batch, c_in, c_out, (depth - 2, height - 2, width - 2), (3, 3, 3)),
    "conv_max": lambda batch, c_in, c_out, depth, height, width: _conv_flops(
        batch, c_in, c_out, (depth, height, width), (3, 3, 3)),
    # Transposed conv: each input pixel scatters C_out*k*k multiply-adds per input channel.
    "conv_t2d": lambda batch, c_in, c_out, side: _conv_flops(batch, c_in, c_out, (side, side), (3, 3)),
    "matmul": lambda m, n, k: _linear_flops(m, k, n),
    "mlp": lambda batch, input_size, layer_sizes, output_size: sum(
        _linear_flops(batch, a, b) for a, b in zip([input_size, *layer_sizes], [*layer_sizes, output_size])),
    "vgg16": lambda batch: _vgg16_flops(batch),
    "rnn": lambda batch, input_size, hidden_size, output_size, hidden_as_input: (
        _linear_flops(batch, input_size + hidden_size, hidden_size)
        + _linear_flops(batch, hidden_size, output_size)),
    "bmm_instancenorm": lambda batch, in_features, out_features: _linear_flops(
        batch, in_features, out_features),
    "alexnet": lambda batch: _alexnet_flops(batch),
}
