"""KernelBench-format optimisation tasks for the kernel search (PACEvolve paper, Appendix C.3, Table 5).

A task is a PyTorch reference program in KernelBench's problem format (`class Model(nn.Module)`,
module-level size constants, `get_inputs()` building CPU tensors with `torch.rand`, `get_init_inputs()`),
plus a prompt description, a default device, the correctness tolerances the evaluator applies and the
arithmetic the function needs (a runtime floor). Built in:

- `conv_groupnorm`: KernelBench level2 #92 at current sizes (the project's headline task);
- `conv_groupnorm_small`: the same model at its original small sizes, cheap enough for CPU runs and CI;
- the paper's 16 Table-5 problems at current KernelBench sizes, under the paper's short names.

The reference sources are re-statements of the KernelBench problems written for this project; they keep
KernelBench's constructor signatures and random-number draw order (weights are made with the same seed
for the reference and the candidate, so a candidate must draw exactly as the reference does).

Left out: KernelBench's other ~230 problems (load any of them with `load(path)`), fp16/bf16 variants,
and the v0 problem sizes the paper's Table 2 may have used.
"""
from __future__ import annotations

import ast
import os
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str                 # "conv_groupnorm"
    reference_src: str        # a KernelBench problem file: Model, get_inputs(), get_init_inputs()
    description: str          # a short paragraph for prompts (what it computes, shapes, dtype)
    device: str = "cuda"      # default device ("cuda" or "cpu")
    rtol: float = 1e-4        # elementwise: |out-ref| <= rtol*|ref| + atol*RMS(ref)
    atol: float = 1e-4
    l2_tol: float = 1e-5      # ||out-ref|| / ||ref||
    flops: float = 0.0        # arithmetic the function needs (0 = unknown); used for a runtime floor
    source: str = ""          # "KernelBench level2 #92" or a file path


REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


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


# ---------------------------------------------------------------------------------------------------
# Reference sources (KernelBench problem format).

def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _conv_groupnorm_src(batch: int, c_in: int, c_out: int, side: int, groups: int) -> str:
    return _src(f'''
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            """Conv2d -> GroupNorm -> Tanh -> HardSwish -> residual add of the conv output -> LogSumExp
            over channels (KernelBench level2 #92)."""

            def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
                super(Model, self).__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
                self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
                self.tanh = nn.Tanh()
                self.hard_swish = nn.Hardswish()

            def forward(self, x):
                x_conv = self.conv(x)
                x_norm = self.group_norm(x_conv)
                x_tanh = self.tanh(x_norm)
                x_hard_swish = self.hard_swish(x_tanh)
                x_res = x_conv + x_hard_swish
                x_logsumexp = torch.logsumexp(x_res, dim=1, keepdim=True)
                return x_logsumexp


        batch_size = {batch}
        in_channels = {c_in}
        out_channels = {c_out}
        height, width = {side}, {side}
        kernel_size = 3
        groups = {groups}


        def get_inputs():
            return [torch.rand(batch_size, in_channels, height, width)]


        def get_init_inputs():
            return [in_channels, out_channels, kernel_size, groups]
        ''')


_BATCHNORM = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Batch normalisation over (N, H, W) per channel. KernelBench never calls .eval(), so the
        forward uses batch statistics (biased variance) and updates the running statistics."""

        def __init__(self, num_features: int):
            super(Model, self).__init__()
            self.bn = nn.BatchNorm2d(num_features=num_features)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(x)


    batch_size = 64
    features = 64
    dim1 = 512
    dim2 = 512


    def get_inputs():
        x = torch.rand(batch_size, features, dim1, dim2)
        return [x]


    def get_init_inputs():
        return [features]
    ''')

_CONV_DIV = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Conv3d, divide by a constant, 3-D max pool, global average pool, add a bias, sum over a dim."""

        def __init__(self, in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim):
            super(Model, self).__init__()
            self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
            self.divisor = divisor
            self.max_pool = nn.MaxPool3d(pool_size)
            self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))
            self.bias = nn.Parameter(torch.randn(bias_shape))
            self.sum_dim = sum_dim

        def forward(self, x):
            x = self.conv(x)
            x = x / self.divisor
            x = self.max_pool(x)
            x = self.global_avg_pool(x)
            x = x + self.bias
            x = torch.sum(x, dim=self.sum_dim)
            return x


    batch_size = 128
    in_channels = 8
    out_channels = 16
    depth, height, width = 16, 64, 64
    kernel_size = (3, 3, 3)
    divisor = 2.0
    pool_size = (2, 2, 2)
    bias_shape = (out_channels, 1, 1, 1)
    sum_dim = 1


    def get_inputs():
        return [torch.rand(batch_size, in_channels, depth, height, width)]


    def get_init_inputs():
        return [in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim]
    ''')

_CONV_MAX = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Conv3d, 2x2x2 max pool, log-sum-exp over channels, ReLU."""

        def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
            super(Model, self).__init__()
            self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
            self.max_pool = nn.MaxPool3d(kernel_size=2, stride=2)

        def forward(self, x):
            x = self.conv(x)
            x = self.max_pool(x)
            x = torch.logsumexp(x, dim=1, keepdim=True)
            x = torch.relu(x)
            return x


    batch_size = 4
    in_channels = 32
    out_channels = 64
    depth, height, width = 32, 128, 128
    kernel_size = 3
    stride = 1
    padding = 1


    def get_inputs():
        return [torch.rand(batch_size, in_channels, depth, height, width)]


    def get_init_inputs():
        return [in_channels, out_channels, kernel_size, stride, padding]
    ''')

_CONV_T2D = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """ConvTranspose2d, add a per-channel bias, clamp to [0, 1], scale, clamp to [0, 1], divide."""

        def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding,
                     bias_shape, scaling_factor):
            super(Model, self).__init__()
            self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                     padding=padding, output_padding=output_padding)
            self.bias = nn.Parameter(torch.randn(bias_shape))
            self.scaling_factor = scaling_factor

        def forward(self, x):
            x = self.conv_transpose(x)
            x = x + self.bias
            x = torch.clamp(x, min=0.0, max=1.0)
            x = x * self.scaling_factor
            x = torch.clamp(x, min=0.0, max=1.0)
            x = x / self.scaling_factor
            return x


    batch_size = 128
    in_channels = 64
    out_channels = 64
    height = width = 128
    kernel_size = 3
    stride = 2
    padding = 1
    output_padding = 1
    bias_shape = (out_channels, 1, 1)
    scaling_factor = 2.0


    def get_inputs():
        return [torch.rand(batch_size, in_channels, height, width)]


    def get_init_inputs():
        return [in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape,
                scaling_factor]
    ''')

_GELU = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Exact (erf) GELU, elementwise."""

        def __init__(self):
            super(Model, self).__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(x)


    batch_size = 4096
    dim = 393216


    def get_inputs():
        x = torch.rand(batch_size, dim)
        return [x]


    def get_init_inputs():
        return []
    ''')

_MATMUL = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """C = A @ B with a very large inner dimension K."""

        def __init__(self):
            super(Model, self).__init__()

        def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
            return torch.matmul(A, B)


    M = 256
    N = 256
    K = 131072 * 4


    def get_inputs():
        A = torch.rand(M, K)
        B = torch.rand(K, N)
        return [A, B]


    def get_init_inputs():
        return []
    ''')

_MAXPOOL = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """2-D max pooling."""

        def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
            super(Model, self).__init__()
            self.maxpool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding,
                                        dilation=dilation)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.maxpool(x)


    batch_size = 32
    channels = 64
    height = 512
    width = 512
    kernel_size = 4
    stride = 1
    padding = 1
    dilation = 1


    def get_inputs():
        x = torch.rand(batch_size, channels, height, width)
        return [x]


    def get_init_inputs():
        return [kernel_size, stride, padding, dilation]
    ''')

_MLP = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Multi-layer perceptron: Linear+ReLU per hidden size, then a final Linear."""

        def __init__(self, input_size, layer_sizes, output_size):
            super(Model, self).__init__()
            layers = []
            current_input_size = input_size
            for layer_size in layer_sizes:
                layers.append(nn.Linear(current_input_size, layer_size))
                layers.append(nn.ReLU())
                current_input_size = layer_size
            layers.append(nn.Linear(current_input_size, output_size))
            self.network = nn.Sequential(*layers)

        def forward(self, x):
            return self.network(x)


    batch_size = 128
    input_size = 16384
    layer_sizes = [16384, 16384]
    output_size = 8192


    def get_inputs():
        return [torch.rand(batch_size, input_size)]


    def get_init_inputs():
        return [input_size, layer_sizes, output_size]
    ''')

_RMSNORM = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """RMS normalisation over the feature dimension (dim 1), no affine parameters."""

        def __init__(self, num_features: int, eps: float = 1e-5):
            super(Model, self).__init__()
            self.num_features = num_features
            self.eps = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
            return x / rms


    batch_size = 112
    features = 64
    dim1 = 512
    dim2 = 512


    def get_inputs():
        x = torch.rand(batch_size, features, dim1, dim2)
        return [x]


    def get_init_inputs():
        return [features]
    ''')

_SOFTMAX = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Softmax over dim 1 of a (batch, dim) matrix."""

        def __init__(self):
            super(Model, self).__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x, dim=1)


    batch_size = 4096
    dim = 393216


    def get_inputs():
        x = torch.rand(batch_size, dim)
        return [x]


    def get_init_inputs():
        return []
    ''')

_VGG16 = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """VGG16: thirteen 3x3 convolutions with ReLU in five blocks, each ending in a 2x2 max pool,
        then three fully connected layers (dropout probability 0)."""

        def __init__(self, num_classes=1000):
            super(Model, self).__init__()
            cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
            layers = []
            in_channels = 3
            for v in cfg:
                if v == "M":
                    layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                else:
                    layers.append(nn.Conv2d(in_channels, v, kernel_size=3, padding=1))
                    layers.append(nn.ReLU(inplace=True))
                    in_channels = v
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(
                nn.Linear(512 * 7 * 7, 4096),
                nn.ReLU(inplace=True),
                nn.Dropout(p=0.0),
                nn.Linear(4096, 4096),
                nn.ReLU(inplace=True),
                nn.Dropout(p=0.0),
                nn.Linear(4096, num_classes),
            )

        def forward(self, x):
            x = self.features(x)
            x = torch.flatten(x, 1)
            x = self.classifier(x)
            return x


    batch_size = 10
    num_classes = 1000


    def get_inputs():
        return [torch.rand(batch_size, 3, 224, 224)]


    def get_init_inputs():
        return [num_classes]
    ''')

_MEAN = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Mean over one dimension."""

        def __init__(self, dim: int):
            super(Model, self).__init__()
            self.dim = dim

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.mean(x, dim=self.dim)


    batch_size = 128
    dim1 = 4096
    dim2 = 4095


    def get_inputs():
        x = torch.rand(batch_size, dim1, dim2)
        return [x]


    def get_init_inputs():
        return [1]
    ''')

# KernelBench level3 #33 draws `self.hidden` (module-level batch_size) before the Linear layers; the
# draw order decides the Linear weights, so it is kept exactly.
_RNN = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """One step of a vanilla RNN cell: hidden = tanh(i2h([x, hidden])), output = h2o(hidden)."""

        def __init__(self, input_size: int, hidden_size: int, output_size: int):
            super(Model, self).__init__()
            self.input_size = input_size
            self.hidden_size = hidden_size
            self.output_size = output_size
            self.hidden = torch.randn((batch_size, hidden_size))
            self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
            self.h2o = nn.Linear(hidden_size, output_size)
            self.tanh = nn.Tanh()

        def forward(self, x: torch.Tensor, initial_hidden=None) -> torch.Tensor:
            if initial_hidden is not None:
                self.hidden.copy_(initial_hidden)
            self.hidden = self.hidden.to(x.device).to(x.dtype)
            combined = torch.cat((x, self.hidden), dim=1)
            self.hidden = self.tanh(self.i2h(combined))
            output = self.h2o(self.hidden)
            return output


    batch_size = 256
    input_size = 16384
    hidden_size = 16384
    output_size = 8192
    sequence_length = 256


    def get_inputs():
        return [torch.rand(batch_size, input_size), torch.rand(batch_size, hidden_size)]


    def get_init_inputs():
        return [input_size, hidden_size, output_size]
    ''')

_BMM_INSTANCENORM = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Linear layer, instance norm of each row (via a (B, 1, 1, F) view), add y, multiply by y."""

        def __init__(self, in_features, out_features, eps=1e-5, momentum=0.1):
            super(Model, self).__init__()
            self.bmm = nn.Linear(in_features, out_features)
            self.instance_norm = nn.InstanceNorm2d(out_features, eps=eps, momentum=momentum)

        def forward(self, x, y):
            x = self.bmm(x)
            x = self.instance_norm(x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
            x = x + y
            x = x * y
            return x


    batch_size = 1024
    in_features = 8192
    out_features = 8192


    def get_inputs():
        return [torch.rand(batch_size, in_features), torch.rand(batch_size, out_features)]


    def get_init_inputs():
        return [in_features, out_features]
    ''')

_ALEXNET = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """AlexNet: five convolutions with ReLU and three max pools, then three fully connected layers
        (dropout probability 0)."""

        def __init__(self, num_classes=1000):
            super(Model, self).__init__()
            self.conv1 = nn.Conv2d(in_channels=3, out_channels=96, kernel_size=11, stride=4, padding=2)
            self.relu1 = nn.ReLU(inplace=True)
            self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
            self.conv2 = nn.Conv2d(in_channels=96, out_channels=256, kernel_size=5, padding=2)
            self.relu2 = nn.ReLU(inplace=True)
            self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
            self.conv3 = nn.Conv2d(in_channels=256, out_channels=384, kernel_size=3, padding=1)
            self.relu3 = nn.ReLU(inplace=True)
            self.conv4 = nn.Conv2d(in_channels=384, out_channels=384, kernel_size=3, padding=1)
            self.relu4 = nn.ReLU(inplace=True)
            self.conv5 = nn.Conv2d(in_channels=384, out_channels=256, kernel_size=3, padding=1)
            self.relu5 = nn.ReLU(inplace=True)
            self.maxpool3 = nn.MaxPool2d(kernel_size=3, stride=2)
            self.fc1 = nn.Linear(in_features=256 * 6 * 6, out_features=4096)
            self.relu6 = nn.ReLU(inplace=True)
            self.dropout1 = nn.Dropout(p=0.0)
            self.fc2 = nn.Linear(in_features=4096, out_features=4096)
            self.relu7 = nn.ReLU(inplace=True)
            self.dropout2 = nn.Dropout(p=0.0)
            self.fc3 = nn.Linear(in_features=4096, out_features=num_classes)

        def forward(self, x):
            x = self.maxpool1(self.relu1(self.conv1(x)))
            x = self.maxpool2(self.relu2(self.conv2(x)))
            x = self.relu3(self.conv3(x))
            x = self.relu4(self.conv4(x))
            x = self.maxpool3(self.relu5(self.conv5(x)))
            x = torch.flatten(x, 1)
            x = self.dropout1(self.relu6(self.fc1(x)))
            x = self.dropout2(self.relu7(self.fc2(x)))
            x = self.fc3(x)
            return x


    batch_size = 1024
    num_classes = 1000


    def get_inputs():
        return [torch.rand(batch_size, 3, 224, 224)]


    def get_init_inputs():
        return [num_classes]
    ''')

_LAYERNORM = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Layer normalisation over the last three dimensions (eps 1e-5, elementwise affine)."""

        def __init__(self, normalized_shape: tuple):
            super(Model, self).__init__()
            self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ln(x)


    batch_size = 16
    features = 64
    dim1 = 256
    dim2 = 256


    def get_inputs():
        x = torch.rand(batch_size, features, dim1, dim2)
        return [x]


    def get_init_inputs():
        return [(features, dim1, dim2)]
    ''')


# ---------------------------------------------------------------------------------------------------
# The registry. Tolerances are the fp32 defaults unless a comment says why a task needs others.

def _builtin() -> dict[str, Task]:
    tasks = [
        Task("conv_groupnorm", _conv_groupnorm_src(128, 8, 64, 128, 16),
             "Conv2d(8->64, 3x3, stride 1, no padding, with bias) on x of shape (128, 8, 128, 128) fp32, "
             "then GroupNorm(16 groups, eps 1e-5, affine), Tanh, HardSwish, add the conv output back "
             "(residual of the pre-norm conv output), and LogSumExp over the 64 channels (keepdim). "
             "Output (128, 1, 126, 126) fp32. The conv output is 520 MB, so the tail is memory-bound.",
             flops=_conv_flops(128, 8, 64, (126, 126), (3, 3)),
             source="KernelBench level2 #92"),
        # Batch 16 instead of 128: the reference then takes a few ms on a 2-core CPU, so an evaluation
        # (several input sets plus dozens of timed calls of reference and candidate) stays under a
        # second, while each GroupNorm group still averages 2 x 30 x 30 = 1800 values.
        Task("conv_groupnorm_small", _conv_groupnorm_src(16, 3, 16, 32, 8),
             "Conv2d(3->16, 3x3, stride 1, no padding, with bias) on x of shape (16, 3, 32, 32) fp32, "
             "then GroupNorm(8 groups, eps 1e-5, affine), Tanh, HardSwish, add the conv output back "
             "(residual of the pre-norm conv output), and LogSumExp over the 16 channels (keepdim). "
             "Output (16, 1, 30, 30) fp32. Small enough to run on a CPU.",
             device="cpu", flops=_conv_flops(16, 3, 16, (30, 30), (3, 3)),
             source="KernelBench level2 #92 (original sizes, batch 16)"),
        Task("batchnorm", _BATCHNORM,
             "BatchNorm2d(64) in training mode on x of shape (64, 64, 512, 512) fp32: each channel is "
             "normalised with its batch mean and biased variance over (N, H, W) = 16.8M values, eps "
             "1e-5, affine weight/bias; running statistics are updated but not compared. Output same "
             "shape. Memory-bound (4.3 GB input).",
             source="KernelBench level1 #33"),
        Task("conv_div", _CONV_DIV,
             "Conv3d(8->16, 3x3x3, with bias) on x of shape (128, 8, 16, 64, 64) fp32, divide by 2.0, "
             "MaxPool3d(2), global average pool to (1,1,1), add a (16,1,1,1) bias parameter, sum over "
             "channels. Output (128, 1, 1, 1) fp32.",
             flops=_conv_flops(128, 8, 16, (14, 62, 62), (3, 3, 3)),
             source="KernelBench level2 #8"),
        Task("conv_max", _CONV_MAX,
             "Conv3d(32->64, 3x3x3, stride 1, padding 1, with bias) on x of shape (4, 32, 32, 128, 128) "
             "fp32, MaxPool3d(2, stride 2), LogSumExp over the 64 channels (keepdim), ReLU. Output "
             "(4, 1, 16, 64, 64) fp32.",
             flops=_conv_flops(4, 32, 64, (32, 128, 128), (3, 3, 3)),
             source="KernelBench level2 #43"),
        Task("conv_t2d", _CONV_T2D,
             "ConvTranspose2d(64->64, 3x3, stride 2, padding 1, output_padding 1, with bias) on x of "
             "shape (128, 64, 128, 128) fp32, add a (64,1,1) bias parameter, clamp to [0,1], multiply "
             "by 2, clamp to [0,1], divide by 2. Output (128, 64, 256, 256) fp32.",
             flops=_conv_flops(128, 64, 64, (128, 128), (3, 3)),  # per input pixel: C_out*k*k MACs
             source="KernelBench level2 #2"),
        Task("gelu", _GELU,
             "Exact GELU, 0.5*x*(1+erf(x/sqrt(2))), elementwise on x of shape (4096, 393216) fp32 "
             "(6.4 GB). The tanh approximation is not exact enough. Memory-bound.",
             source="KernelBench level1 #26"),
        # K = 524288: an honest fp32 kernel that accumulates each output sequentially is ~2e-5 from
        # cuBLAS in relative L2 on zero-mean inputs; TF32/bf16 input rounding is >= 3e-4 there.
        Task("matmul", _MATMUL,
             "C = A @ B with A of shape (256, 524288) and B of shape (524288, 256), fp32, output "
             "(256, 256) fp32. The inner dimension is huge and M, N small, so the work must be split "
             "along K (split-K) to fill the GPU. No TF32 or lower precision.",
             atol=2e-4, l2_tol=5e-5, flops=_linear_flops(256, 524288, 256),
             source="KernelBench level1 #6"),
        Task("maxpool", _MAXPOOL,
             "MaxPool2d(kernel 4, stride 1, padding 1, dilation 1) on x of shape (32, 64, 512, 512) "
             "fp32. Output (32, 64, 511, 511) fp32. Memory-bound (2.1 GB in and out).",
             source="KernelBench level1 #42"),
        # Three chained K = 16384 reductions: summation order alone moves the result by a few 1e-6.
        Task("mlp", _MLP,
             "MLP on x of shape (128, 16384) fp32: Linear(16384->16384)+ReLU, Linear(16384->16384)+"
             "ReLU, Linear(16384->8192). Output (128, 8192) fp32. Dominated by three GEMMs. No TF32.",
             l2_tol=2e-5,
             flops=_linear_flops(128, 16384, 16384) * 2 + _linear_flops(128, 16384, 8192),
             source="KernelBench level3 #1"),
        Task("rmsnorm", _RMSNORM,
             "RMS norm over the 64 channels (dim 1) of x of shape (112, 64, 512, 512) fp32: "
             "x / sqrt(mean(x^2 over dim 1) + 1e-5). Output same shape (7.5 GB). Memory-bound.",
             source="KernelBench level1 #36"),
        Task("softmax", _SOFTMAX,
             "Softmax over dim 1 of x of shape (4096, 393216) fp32 (rows of 393216 values; outputs "
             "are ~2.5e-6, so the check is relative). Output same shape. Memory-bound.",
             source="KernelBench level1 #23"),
        # Sixteen layers (K up to 25088) compound summation-order differences.
        Task("vgg16", _VGG16,
             "VGG16 on x of shape (10, 3, 224, 224) fp32: 13 conv3x3(padding 1)+ReLU layers in five "
             "blocks each ending in MaxPool2d(2,2), flatten (channel-major), then Linear(25088->4096)+"
             "ReLU, Linear(4096->4096)+ReLU, Linear(4096->1000); dropout p=0. Output (10, 1000) fp32.",
             l2_tol=2e-5, flops=_vgg16_flops(10),
             source="KernelBench level3 #11"),
        Task("mean", _MEAN,
             "Mean over dim 1 of x of shape (128, 4096, 4095) fp32 (8.6 GB). Output (128, 4095) fp32. "
             "Memory-bound.",
             source="KernelBench level1 #48"),
        # K = 32768 then 16384 reductions: a few 1e-6 from summation order alone.
        Task("rnn", _RNN,
             "One vanilla-RNN step: inputs x (256, 16384) and h0 (256, 16384) fp32; the hidden state "
             "is set to h0, hidden = tanh(Linear(32768->16384)(cat(x, hidden))), output = "
             "Linear(16384->8192)(hidden). Output (256, 8192) fp32. Dominated by two GEMMs. No TF32.",
             l2_tol=2e-5,
             flops=_linear_flops(256, 32768, 16384) + _linear_flops(256, 16384, 8192),
             source="KernelBench level3 #33"),
        Task("bmm_instancenorm", _BMM_INSTANCENORM,
             "Inputs x (1024, 8192) and y (1024, 8192) fp32: Linear(8192->8192), then normalise each "
             "row by its own mean and biased variance (InstanceNorm2d on a (1024,1,1,8192) view, eps "
             "1e-5, no affine), then (row + y) * y. Output (1024, 8192) fp32.",
             flops=_linear_flops(1024, 8192, 8192),
             source="KernelBench level2 #28"),
        # Eight layers (K up to 9216) compound summation-order differences.
        Task("alexnet", _ALEXNET,
             "AlexNet on x of shape (1024, 3, 224, 224) fp32: conv 11x11/4 (96) + ReLU + maxpool 3/2, "
             "conv 5x5 (256) + ReLU + maxpool, conv 3x3 (384, 384, 256) + ReLU, maxpool, flatten, "
             "Linear(9216->4096)+ReLU, Linear(4096->4096)+ReLU, Linear(4096->1000); dropout p=0. "
             "Output (1024, 1000) fp32.",
             l2_tol=2e-5, flops=_alexnet_flops(1024),
             source="KernelBench level3 #5"),
        Task("layernorm", _LAYERNORM,
             "LayerNorm over the last three dims (64, 256, 256) of x of shape (16, 64, 256, 256) fp32: "
             "each of the 16 samples (4.2M values) is normalised with its mean and biased variance, "
             "eps 1e-5, then multiplied by a (64,256,256) weight and a bias added. Output same shape. "
             "Only 16 rows, so a row-per-block reduction leaves the GPU idle: split each row.",
             source="KernelBench level1 #40"),
    ]
    return {t.name: t for t in tasks}


_TASKS = _builtin()


def names() -> list[str]:
    """Names of the built-in tasks, in registry order."""
    return list(_TASKS)


def get(name: str) -> Task:
    """The built-in task called `name`; KeyError listing the known names otherwise."""
    if name not in _TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(_TASKS)} "
                       f"(or tasks.load(path) for a KernelBench problem file)")
    return _TASKS[name]


def check_reference_source(src: str, origin: str = "<source>") -> None:
    """Raise ValueError unless `src` parses and defines Model, get_inputs and get_init_inputs at
    module level. Checked with ast: nothing is executed."""
    try:
        tree = ast.parse(src, filename=origin)
    except SyntaxError as e:
        raise ValueError(f"{origin}: not valid Python (line {e.lineno}: {e.msg})") from e
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise ValueError(f"{origin}: not a KernelBench problem file: it does not define "
                         f"{', '.join(missing)} at module level")


def _describe_loaded(tree_src: str, stem: str) -> str:
    """The Model class docstring (or the module's), else a generic line: the prompt description."""
    tree = ast.parse(tree_src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model" and ast.get_docstring(node):
            return " ".join(ast.get_docstring(node).split())
    doc = ast.get_docstring(tree)
    if doc:
        return " ".join(doc.split())
    return f"The KernelBench problem {stem}: reproduce Model.forward exactly (fp32) and faster."


def load(path: str) -> Task:
    """A Task from any KernelBench problem file (validated by ast, not executed); name = file stem."""
    with open(path, encoding="utf-8") as f:
        src = f.read()
    check_reference_source(src, origin=path)
    stem = os.path.splitext(os.path.basename(path))[0]
    return Task(name=stem, reference_src=src, description=_describe_loaded(src, stem), source=path)
