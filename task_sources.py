"""Reference sources of the built-in tasks, in KernelBench's problem format (paper Appendix C.3, Table 5).

Each builder takes the problem's sizes and the input draw ("rand" for current KernelBench, "randn" for
KernelBench v0) and returns a module source: `class Model(nn.Module)`, the size constants,
`get_inputs()` (CPU tensors) and `get_init_inputs()`. `task_catalog.py` calls them with the current
and the v0 sizes.

The sources are re-statements written for this project. They keep KernelBench's constructor signatures,
the modules each constructor creates and their order, and the order of every random draw: the evaluator
seeds the reference and the candidate identically, so a candidate must draw exactly as the reference
does, and the weights must be those KernelBench's problem would make.
"""
from __future__ import annotations

import textwrap


def conv_groupnorm(batch: int, c_in: int, c_out: int, side: int, groups: int, draw: str = "rand") -> str:
    return _module(_CONV_GROUPNORM_MODEL, dict(
        batch_size=batch, in_channels=c_in, out_channels=c_out, height=side, width=side, kernel_size=3,
        groups=groups), ["batch_size, in_channels, height, width"],
        "in_channels, out_channels, kernel_size, groups", draw)


def batchnorm(batch: int, features: int, dim1: int, dim2: int, draw: str) -> str:
    return _module(_BATCHNORM_MODEL, dict(batch_size=batch, features=features, dim1=dim1, dim2=dim2),
                   ["batch_size, features, dim1, dim2"], "features", draw)


def conv_div(batch: int, c_in: int, c_out: int, depth: int, height: int, width: int, draw: str) -> str:
    return _module(_CONV_DIV_MODEL, dict(
        batch_size=batch, in_channels=c_in, out_channels=c_out, depth=depth, height=height, width=width,
        kernel_size=(3, 3, 3), divisor=2.0, pool_size=(2, 2, 2), bias_shape="(out_channels, 1, 1, 1)",
        sum_dim=1), ["batch_size, in_channels, depth, height, width"],
        "in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim", draw)


def conv_max(batch: int, c_in: int, c_out: int, depth: int, height: int, width: int, draw: str) -> str:
    return _module(_CONV_MAX_MODEL, dict(
        batch_size=batch, in_channels=c_in, out_channels=c_out, depth=depth, height=height, width=width,
        kernel_size=3, stride=1, padding=1), ["batch_size, in_channels, depth, height, width"],
        "in_channels, out_channels, kernel_size, stride, padding", draw)


def conv_t2d(batch: int, c_in: int, c_out: int, side: int, draw: str) -> str:
    return _module(_CONV_T2D_MODEL, dict(
        batch_size=batch, in_channels=c_in, out_channels=c_out, height=side, width=side, kernel_size=3,
        stride=2, padding=1, output_padding=1, bias_shape="(out_channels, 1, 1)", scaling_factor=2.0),
        ["batch_size, in_channels, height, width"],
        "in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape, "
        "scaling_factor", draw)


def gelu(batch: int, dim: int, draw: str) -> str:
    return _module(_GELU_MODEL, dict(batch_size=batch, dim=dim), ["batch_size, dim"], "", draw)


def matmul(m: int, n: int, k: int, draw: str) -> str:
    return _module(_MATMUL_MODEL, dict(M=m, N=n, K=k), ["M, K", "K, N"], "", draw)


def maxpool(batch: int, channels: int, side: int, kernel: int, stride: int, padding: int, dilation: int,
            draw: str) -> str:
    return _module(_MAXPOOL_MODEL, dict(
        batch_size=batch, channels=channels, height=side, width=side, kernel_size=kernel, stride=stride,
        padding=padding, dilation=dilation), ["batch_size, channels, height, width"],
        "kernel_size, stride, padding, dilation", draw)


def mlp(batch: int, input_size: int, layer_sizes: list[int], output_size: int, draw: str) -> str:
    return _module(_MLP_MODEL, dict(batch_size=batch, input_size=input_size, layer_sizes=list(layer_sizes),
                                    output_size=output_size),
                   ["batch_size, input_size"], "input_size, layer_sizes, output_size", draw)


def rmsnorm(batch: int, features: int, dim1: int, dim2: int, draw: str) -> str:
    return _module(_RMSNORM_MODEL, dict(batch_size=batch, features=features, dim1=dim1, dim2=dim2),
                   ["batch_size, features, dim1, dim2"], "features", draw)


def softmax(batch: int, dim: int, draw: str) -> str:
    return _module(_SOFTMAX_MODEL, dict(batch_size=batch, dim=dim), ["batch_size, dim"], "", draw)


def vgg16(batch: int, draw: str) -> str:
    return _module(_VGG16_MODEL, dict(batch_size=batch, num_classes=1000), ["batch_size, 3, 224, 224"],
                   "num_classes", draw)


def mean(batch: int, dim1: int, dim2: int, draw: str) -> str:
    return _module(_MEAN_MODEL, dict(batch_size=batch, dim1=dim1, dim2=dim2), ["batch_size, dim1, dim2"],
                   "1", draw)


def rnn(batch: int, input_size: int, hidden_size: int, output_size: int, draw: str,
        hidden_as_input: bool) -> str:
    """`hidden_as_input`: current KernelBench passes the initial hidden state as a second input; v0
    takes x only and starts from the state drawn in the constructor."""
    constants = dict(batch_size=batch, input_size=input_size, hidden_size=hidden_size,
                     output_size=output_size, sequence_length=256)
    if hidden_as_input:
        return _module(_RNN_MODEL, constants, ["batch_size, input_size", "batch_size, hidden_size"],
                       "input_size, hidden_size, output_size", draw)
    return _module(_RNN_V0_MODEL, constants, ["batch_size, input_size"],
                   "input_size, hidden_size, output_size", draw)


def bmm_instancenorm(batch: int, in_features: int, out_features: int, draw: str) -> str:
    return _module(_BMM_INSTANCENORM_MODEL, dict(batch_size=batch, in_features=in_features,
                                                 out_features=out_features),
                   ["batch_size, in_features", "batch_size, out_features"], "in_features, out_features", draw)


def alexnet(batch: int, draw: str) -> str:
    return _module(_ALEXNET_MODEL, dict(batch_size=batch, num_classes=1000), ["batch_size, 3, 224, 224"],
                   "num_classes", draw)


def layernorm(batch: int, features: int, dim1: int, dim2: int, draw: str) -> str:
    return _module(_LAYERNORM_MODEL, dict(batch_size=batch, features=features, dim1=dim1, dim2=dim2),
                   ["batch_size, features, dim1, dim2"], "(features, dim1, dim2)", draw)


# ---------------------------------------------------------------------------------------------------
# Assembly.

def _module(model: str, constants: dict, input_shapes: list[str], init_args: str, draw: str) -> str:
    """Imports, the Model class, one line per size constant (a str value is written as an expression
    over earlier constants), get_inputs() drawing each input in list order, get_init_inputs()."""
    if draw not in ("rand", "randn"):
        raise ValueError(f"input draw must be 'rand' or 'randn', not {draw!r}")
    lines = ["import torch", "import torch.nn as nn", "", "", textwrap.dedent(model).strip("\n"), "", ""]
    lines += [f"{k} = {v if isinstance(v, str) else repr(v)}" for k, v in constants.items()]
    draws = ", ".join(f"torch.{draw}({shape})" for shape in input_shapes)
    lines += ["", "", "def get_inputs():", f"    return [{draws}]", "", "",
              "def get_init_inputs():", f"    return [{init_args}]", ""]
    return "\n".join(lines)


_CONV_GROUPNORM_MODEL = '''
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
    '''

_BATCHNORM_MODEL = '''
    class Model(nn.Module):
        """Batch normalisation over (N, H, W) per channel. KernelBench never calls .eval(), so the
        forward uses batch statistics (biased variance) and updates the running statistics."""

        def __init__(self, num_features: int):
            super(Model, self).__init__()
            self.bn = nn.BatchNorm2d(num_features=num_features)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(x)
    '''

_CONV_DIV_MODEL = '''
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
    '''

_CONV_MAX_MODEL = '''
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
    '''

_CONV_T2D_MODEL = '''
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
    '''

_GELU_MODEL = '''
    class Model(nn.Module):
        """Exact (erf) GELU, elementwise."""

        def __init__(self):
            super(Model, self).__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(x)
    '''

_MATMUL_MODEL = '''
    class Model(nn.Module):
        """C = A @ B with a very large inner dimension K."""

        def __init__(self):
            super(Model, self).__init__()

        def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
            return torch.matmul(A, B)
    '''

_MAXPOOL_MODEL = '''
    class Model(nn.Module):
        """2-D max pooling."""

        def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
            super(Model, self).__init__()
            self.maxpool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding,
                                        dilation=dilation)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.maxpool(x)
    '''

_MLP_MODEL = '''
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
    '''

_RMSNORM_MODEL = '''
    class Model(nn.Module):
        """RMS normalisation over the feature dimension (dim 1), no affine parameters."""

        def __init__(self, num_features: int, eps: float = 1e-5):
            super(Model, self).__init__()
            self.num_features = num_features
            self.eps = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
            return x / rms
    '''

_SOFTMAX_MODEL = '''
    class Model(nn.Module):
        """Softmax over dim 1 of a (batch, dim) matrix."""

        def __init__(self):
            super(Model, self).__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x, dim=1)
    '''

_VGG16_MODEL = '''
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
    '''

_MEAN_MODEL = '''
    class Model(nn.Module):
        """Mean over one dimension."""

        def __init__(self, dim: int):
            super(Model, self).__init__()
            self.dim = dim

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.mean(x, dim=self.dim)
    '''

# KernelBench level3 #33 draws `self.hidden` (module-level batch_size) before the Linear layers; the
# draw order decides the Linear weights, so it is kept exactly.
_RNN_MODEL = '''
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
    '''

# KernelBench v0's forward stores the new hidden state on the module, so its second call starts from
# another state. The evaluator calls one model many times and compares call by call, so here every
# call starts from the state drawn in the constructor: each call returns what v0's first call returns.
_RNN_V0_MODEL = '''
    class Model(nn.Module):
        """One step of a vanilla RNN cell from the hidden state drawn at construction:
        output = h2o(tanh(i2h([x, hidden])))."""

        def __init__(self, input_size: int, hidden_size: int, output_size: int):
            super(Model, self).__init__()
            self.input_size = input_size
            self.hidden_size = hidden_size
            self.output_size = output_size
            self.hidden = torch.randn((batch_size, hidden_size))
            self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
            self.h2o = nn.Linear(hidden_size, output_size)
            self.tanh = nn.Tanh()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            combined = torch.cat((x, self.hidden.to(x.device).to(x.dtype)), dim=1)
            new_hidden = self.tanh(self.i2h(combined))
            return self.h2o(new_hidden)
    '''

_BMM_INSTANCENORM_MODEL = '''
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
    '''

_ALEXNET_MODEL = '''
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
    '''

_LAYERNORM_MODEL = '''
    class Model(nn.Module):
        """Layer normalisation over the last three dimensions (eps 1e-5, elementwise affine)."""

        def __init__(self, normalized_shape: tuple):
            super(Model, self).__init__()
            self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ln(x)
    '''
