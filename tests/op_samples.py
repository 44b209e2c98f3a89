"""The op-sample table of the lowering conformance test (``test_conformance.py``), in the spirit of
PyTorch's OpInfo: small modules that use every op the lowering rules claim, with non-default arguments.

Each ``Sample`` names the canonical ops (``passes.lower.rules.RULES`` keys) it lowers, builds its module
(eval mode, weights and BatchNorm statistics away from their defaults), and draws fresh inputs from a
generator. ``not_captured`` records, with the reason, a capture method that cannot take the sample;
``ONE_PATH`` records the ops that only one capture method can ever produce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

aten = torch.ops.aten

Inputs = Callable[[torch.Generator, torch.dtype], tuple]


@dataclass(frozen=True)
class Sample:
    """One tiny model: the ops it lowers, how to build it and how to draw its inputs."""

    name: str
    ops: tuple[str, ...]
    build: Callable[[], nn.Module]
    inputs: Inputs
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
    not_captured: dict[str, str] = field(default_factory=dict)


ONE_PATH = {
    "assert_metadata": "export: its check of x.to(other)'s dtype; fx records no check",
    "float": "fx: export records x.float() as aten._to_copy (to)",
    "half": "fx: export records x.half() as aten._to_copy (to)",
    "bfloat16": "fx: export records x.bfloat16() as aten._to_copy (to)",
}
"""Ops only one capture method produces, and why (the other records the same computation as another op)."""


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _x(*shape: int) -> Inputs:
    return lambda g, dtype: (_randn(g, *shape, dtype=dtype),)


def _xy(a: tuple[int, ...], b: tuple[int, ...]) -> Inputs:
    return lambda g, dtype: (_randn(g, *a, dtype=dtype), _randn(g, *b, dtype=dtype))


def _stats(bn: nn.modules.batchnorm._BatchNorm, g: torch.Generator) -> None:
    """BatchNorm running statistics and affine parameters away from 0 and 1."""
    with torch.no_grad():
        bn.running_mean.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) * 1.5 + 0.5)
        if bn.weight is not None:
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.rand(bn.num_features, generator=g) - 0.5)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------ elementwise


class Unary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.acts = nn.ModuleList(
            [nn.ReLU(), nn.GELU(approximate="tanh"), nn.Tanh(), nn.Sigmoid(), nn.SiLU()]
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pos = x.abs() + 0.5
        outs = tuple(a(x) for a in self.acts)
        return (
            *outs,
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
            torch.relu(x),
            F.silu(x),
            -x,
            torch.exp(x),
            torch.log(pos),
            pos.sqrt(),
            torch.rsqrt(pos),
            torch.erf(x),
            torch.reciprocal(pos),
            x.sin(),
            torch.cos(x),
            x.square(),
            aten.gelu.default(x, approximate="tanh"),
        )


class Binary(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pos = y.abs() + 0.5
        return (
            x + y,
            torch.add(x, y, alpha=2.5),
            torch.sub(x, y, alpha=-1.5),
            x - 3,
            2 - x,
            torch.rsub(x, 2.0),
            torch.rsub(x, y, alpha=2),
            x * y,
            x * 4,
            x / pos,
            torch.div(x, pos, rounding_mode="floor"),
            torch.div(x * 3, pos, rounding_mode="trunc"),
            x.abs() ** 1.5,
            torch.pow(2.0, x),
            torch.pow(pos, y),
            torch.maximum(x, y),
            torch.minimum(y, x),
        )


class Compare(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        big = x > 0.2
        return (
            x == y,
            torch.ne(x, 0.0),
            x < y,
            x <= 0.1,
            torch.gt(x, y),
            x >= y,
            torch.where(big, x, y),
            torch.where(big, x, 0.5),
            x.where(big, y),
            x.masked_fill(big, -2.0),
            torch.masked_fill(y, x < 0, 3.0),
            torch.clamp(x, min=-0.3),
            x.clamp(max=0.4),
            torch.clamp(x, -0.2, 0.7),
            torch.clamp(x, min=y),
            ~big,
            torch.logical_not(big),
            torch.logical_and(big, y > 0),
            torch.logical_or(big, y > 0),
        )


def _ints(g: torch.Generator, dtype: torch.dtype) -> tuple:
    return (
        torch.randint(-20, 20, (3, 5), generator=g),
        torch.randint(-20, 20, (5,), generator=g).to(torch.int32),
    )


class Bitwise(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a & b,
            torch.bitwise_or(a, 6),
            a ^ b,
            ~a,
            torch.bitwise_not(b),
            torch.bitwise_and(a > 0, b > 0),
            a + b,
            a * 3,
            torch.where(a > b, a, b),
            torch.clamp(a, -5, 5),
            a.sum(-1),
            torch.sum(b, dtype=torch.int16),
        )


class Casts(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.to(torch.float64) * 3,
            x.float(),
            x.half(),
            x.bfloat16(),
            y.type_as(x),
            x.to(torch.int32),
            (x > 0).to(x.dtype),
            x.to(y),
            x.to("cpu"),
            aten._to_copy.default(x, dtype=torch.float64),
        )


class Identities(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop, self.drop1d, self.same = nn.Dropout(0.3), nn.Dropout1d(0.5), nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            self.drop(x) * 2,
            self.drop1d(x) + 1,
            self.same(x) - 1,
            F.dropout(x, 0.2, training=self.training) * 3,
            F.dropout(x, p=0.0) + 2,
            x.contiguous() * 4,
            x.detach() + 5,
            x.clone() - 5,
            aten.native_dropout.default(x, 0.3, False)[0] * 6,
        )


# ----------------------------------------------------------------------------------------- layout


class Shapes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flat = nn.Flatten(1, 2)
        self.register_buffer("wide", torch.zeros(4, 6))
        self.register_buffer("tall", torch.zeros(3, 8))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 3, 4], [3, 4]
        return (
            x.view(6, 4),
            x.reshape(2, -1),
            torch.flatten(x, 1),
            self.flat(x),
            x.unflatten(-1, (2, 2)),
            x.unsqueeze(-2).squeeze(-2),
            torch.unsqueeze(x, 0),
            x[:1].squeeze(0),
            x.view_as(self.wide),
            x.reshape_as(self.tall),
            y.expand(2, 3, 4),
            y.unsqueeze(0).expand(2, -1, -1),
            y.expand_as(x),
            torch.broadcast_to(y[:, :1], (3, 4)),
        )


class Permutes(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 3, 4], [3, 4]
        return (
            x.permute(2, 0, 1),
            x.permute((0, -1, 1)),
            torch.permute(x, dims=(1, 2, 0)),
            x.transpose(-1, -2),
            torch.transpose(x, 0, 2),
            y.t(),
            torch.swapaxes(x, 0, -1),
            x.swapaxes(1, 2),
            y.T,
            x.mT,
        )


class Slices(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("idx", torch.tensor([2, 0, 2]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [4, 5, 6]
        a, b = torch.split(x, [2, 4], dim=-1)
        c = x.split(2, 1)
        d = torch.chunk(x, 3, -1)
        e = x.unbind(1)
        f = torch.tensor_split(x, (1, 4), dim=2)
        g = torch.tensor_split(x, 2)
        return (
            x[1:, None, ::2],
            x[..., -1],
            x[-1],
            x[:, 1:4, 2:],
            x[:, -3:],
            x.narrow(-1, 1, 3),
            torch.narrow(x, 0, -2, 2),
            x.select(1, -1),
            torch.select(x, 2, 0),
            a * 2,
            b + 1,
            c[2] - 1,
            d[1] * 3,
            e[4] + 2,
            f[1] - 3,
            g[1] * 4,
            aten.index.Tensor(x, [None, self.idx]),
            aten.slice.Tensor(x, -1, 1, 5, 2),
            aten.slice.Tensor(x, 1, -4),
            aten.split_with_sizes.default(x, [1, 3], 0)[1],
        )


class Cats(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 3], [2, 3]
        return (
            torch.cat([x, y], dim=-1),
            torch.cat((x, y, x)),
            torch.concat([y, x], 1),
            torch.concatenate([x, y], axis=0),
            torch.stack([x, y], dim=-1),
            torch.stack((x, y)),
        )


# ---------------------------------------------------------------------------------- reductions


class Reductions(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 3, 4]
        return (
            x.sum(),
            x.sum(-1),
            torch.sum(x, (0, 2), keepdim=True),
            x.sum(dim=1, dtype=torch.float64),
            torch.sum(x, dtype=torch.float64),
            x.mean(),
            x.mean(dim=(-1, -2)),
            torch.mean(x, 1, True),
            torch.mean(x, -1, dtype=torch.float64),
            x.amax(-1),
            torch.amax(x, dim=(0, 1), keepdim=True),
            torch.amax(x),
            aten.sum.default(x),
            aten.sum.default(x, dtype=torch.float64),
            aten.sum.dim_IntList(x, [], True),
            aten.mean.default(x),
            aten.amax.default(x),
        )


class Softmaxes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sm = nn.Softmax(dim=-2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 3, 4]
        return (
            F.softmax(x, -1),
            x.softmax(dim=1),
            self.sm(x),
            torch.softmax(x, 0),
            F.log_softmax(x, dim=0),
            x.log_softmax(-1),
            F.softmax(x, dim=-1, dtype=torch.float64),
            torch.log_softmax(x, 1, dtype=torch.float64),
            aten._softmax.default(x, -1, False),
            aten._log_softmax.default(x, 0, False),
        )


# ------------------------------------------------------------------------------------ norms


class LayerNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = _gen(1)
        self.ln = nn.LayerNorm(5, eps=1e-3)
        self.ln2 = nn.LayerNorm([4, 5], elementwise_affine=False, eps=0.1)
        self.ln3 = nn.LayerNorm(5, bias=False)
        self.norm_weight = nn.Parameter(torch.rand(4, 5, generator=g) + 0.5)
        with torch.no_grad():
            for p in (self.ln.weight, self.ln.bias, self.ln3.weight):
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [3, 4, 5]
        return (
            self.ln(x),
            self.ln2(x),
            self.ln3(x),
            F.layer_norm(x, (4, 5), self.norm_weight, None, 1e-2),
            F.layer_norm(x, [5], eps=0.5),
            aten.native_layer_norm.default(x, [5], self.ln.weight, None, 1e-3)[0],
        )


class BatchNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = _gen(2)
        self.bn1 = nn.BatchNorm1d(4, eps=1e-3, momentum=0.3)
        self.bn1b = nn.BatchNorm1d(4, affine=False)
        self.bn2 = nn.BatchNorm2d(4, eps=0.01, momentum=None)
        self.bn2b = nn.BatchNorm2d(4, affine=False, eps=0.2)
        self.bn3 = nn.BatchNorm3d(4, eps=1e-4)
        for bn in (self.bn1, self.bn1b, self.bn2, self.bn2b, self.bn3):
            _stats(bn, g)
        self.register_buffer("rm", torch.rand(4, generator=g) - 0.5)
        self.register_buffer("rv", torch.rand(4, generator=g) + 0.5)
        self.norm_w = nn.Parameter(torch.rand(4, generator=g) + 0.5)
        self.norm_b = nn.Parameter(torch.rand(4, generator=g) - 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 4, 3, 5]
        flat = x.flatten(2)
        return (
            self.bn1(x.mean((2, 3))),
            self.bn1b(flat),
            self.bn2(x),
            self.bn2b(x),
            self.bn3(x.unsqueeze(2)),
            F.batch_norm(x, self.rm, self.rv, self.norm_w, self.norm_b, False, 0.2, 1e-3),
            F.batch_norm(flat, self.rm, self.rv, eps=0.3),
            torch.batch_norm(x, self.norm_w, None, self.rm, self.rv, False, 0.1, 2e-3, False),
            aten._native_batch_norm_legit_no_training.default(
                x, self.norm_w, self.norm_b, self.rm, self.rv, 0.1, 1e-2
            )[0],
        )


# ---------------------------------------------------------------------------------- pools


class Pools(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mp = nn.MaxPool2d(3, stride=2, padding=1, dilation=1)
        self.mp2 = nn.MaxPool2d((2, 3), stride=(1, 2), ceil_mode=True)
        self.ap = nn.AvgPool2d(3, 2, 1, count_include_pad=False)
        self.aap = nn.AdaptiveAvgPool2d((2, None))
        self.aap1 = nn.AdaptiveAvgPool1d(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [2, 3, 7, 8]
        return (
            self.mp(x),
            self.mp2(x),
            F.max_pool2d(x, 2, dilation=2),
            F.max_pool2d(x, 3, 2, 1, return_indices=True)[0],
            self.ap(x),
            F.avg_pool2d(x, (2, 3), ceil_mode=True, padding=1),
            self.aap(x),
            F.adaptive_avg_pool2d(x, 3),
            self.aap1(x.flatten(2)),
            F.adaptive_avg_pool1d(x[:, :, 0], 3),
        )


# ---------------------------------------------------------------------------------- embeddings


class Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4, padding_idx=0)
        self.embedding_table = nn.Parameter(torch.randn(10, 3, generator=_gen(3)))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            self.embedding(ids),
            F.embedding(ids, self.embedding_table, padding_idx=2) * 2,
            aten.embedding.default(self.embedding_table, ids),
        )


def _ids(g: torch.Generator, dtype: torch.dtype) -> tuple:
    return (torch.randint(0, 10, (2, 5), generator=g),)


# --------------------------------------------------------------------------------- matmuls


class SparseLayers(nn.Module):
    """Every masked op: linear, matmul (x @ W), addmm, conv1d and conv2d, with strides and groups."""

    def __init__(self) -> None:
        super().__init__()
        g = _gen(4)
        self.fc = nn.Linear(6, 5)
        self.w = nn.Parameter(torch.randn(6, 4, generator=g))
        self.w2 = nn.Parameter(torch.randn(6, 3, generator=g))
        self.b2 = nn.Parameter(torch.randn(3, generator=g))
        self.conv1 = nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
        self.conv2b = nn.Conv2d(4, 4, 3, padding="same", bias=False)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [3, 6], [2, 4, 6, 7]
        return (
            self.fc(x),
            x @ self.w,
            torch.addmm(self.b2, x, self.w2, beta=0.5, alpha=2.0),
            self.conv1(img.flatten(2)),
            self.conv2(img),
            self.conv2b(img),
        )


def _sparse_inputs(g: torch.Generator, dtype: torch.dtype) -> tuple:
    return _randn(g, 3, 6, dtype=dtype), _randn(g, 2, 4, 6, 7, dtype=dtype)


class DenseLayers(nn.Module):
    """Dense (excluded) weights and activation-by-activation matmuls: linear, conv1d/2d, addmm, mm, bmm."""

    def __init__(self) -> None:
        super().__init__()
        g = _gen(5)
        self.fc = nn.Linear(6, 5)
        self.conv1_weight = nn.Parameter(torch.randn(6, 2, 3, generator=g))
        self.conv2 = nn.Conv2d(4, 2, (3, 2), stride=2, padding=1, dilation=(2, 1))
        self.w = nn.Parameter(torch.randn(6, 4, generator=g))
        self.b = nn.Parameter(torch.randn(4, generator=g))
        for m in (self.fc, self.conv2):
            m.requires_dense = True
        self.w.requires_dense = self.conv1_weight.requires_dense = True

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [3, 6], [2, 4, 6, 7]
        h = x.view(3, 2, 3)
        return (
            self.fc(x),
            F.linear(x, x * 0.5),
            F.conv1d(img.flatten(2), self.conv1_weight, None, 2, 2, 2, 2),
            self.conv2(img),
            torch.addmm(self.b, x, self.w, beta=-1.0, alpha=0.5),
            torch.mm(x, x.t()),
            x @ x.T,
            torch.matmul(h, h.transpose(1, 2)),
            torch.bmm(h, h.transpose(1, 2)),
            torch.matmul(x, self.w),
        )


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = _gen(6)
        self.register_buffer("bias", torch.randn(5, 5, generator=g))
        self.register_buffer("keep", (torch.rand(5, 5, generator=g) > 0.3) | torch.eye(5, dtype=torch.bool))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = self.keep
        return (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.to(q.dtype), scale=0.3),
            F.scaled_dot_product_attention(q, k, v, attn_mask=keep),
            F.scaled_dot_product_attention(q, k, v, attn_mask=q[..., :1] > 0),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True, scale=0.5)[0],
            aten._scaled_dot_product_flash_attention_for_cpu.default(
                q, k, v, attn_mask=self.bias.to(q.dtype)
            )[0],
        )


def _qkv(g: torch.Generator, dtype: torch.dtype) -> tuple:
    return tuple(_randn(g, 2, 3, 5, 4, dtype=dtype) for _ in range(3))


SAMPLES: tuple[Sample, ...] = (
    Sample(
        "unary",
        ("relu", "gelu", "tanh", "sigmoid", "silu", "neg", "exp", "log", "sqrt", "rsqrt", "abs", "erf",
         "reciprocal", "sin", "cos", "square", "add"),
        Unary, _x(3, 5), (torch.float32, torch.bfloat16),
    ),
    Sample(
        "binary", ("add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum", "abs"),
        Binary, _xy((3, 1, 5), (4, 5)), (torch.float32, torch.float64),
    ),
    Sample(
        "compare",
        ("eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "clamp", "bitwise_not", "logical_not",
         "logical_and", "logical_or"),
        Compare, _xy((3, 5), (5,)), (torch.float32, torch.float16),
    ),
    Sample(
        "bitwise", ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "add", "mul", "where", "clamp",
                    "gt", "sum"),
        Bitwise, _ints, (torch.int64,),
    ),
    Sample(
        "casts", ("to", "float", "half", "bfloat16", "type_as", "mul", "gt", "assert_metadata"),
        Casts, _xy((3, 4), (3, 4)),
    ),
    Sample("identities", ("identity", "dropout", "mul", "add", "sub"), Identities, _x(2, 3, 4)),
    Sample(
        "shapes",
        ("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as", "expand",
         "expand_as", "broadcast_to"),
        Shapes, _xy((2, 3, 4), (3, 4)),
    ),
    Sample(
        "permutes", ("permute", "transpose", "t", "swapaxes", "attr_T", "attr_mT"),
        Permutes, _xy((2, 3, 4), (3, 4)),
    ),
    Sample(
        "slices",
        ("getitem", "slice", "narrow", "select", "split", "chunk", "unbind", "tensor_split", "index", "mul",
         "add", "sub"),
        Slices, _x(4, 5, 6),
    ),
    Sample("cats", ("cat", "concat", "concatenate", "stack"), Cats, _xy((2, 3), (2, 3))),
    Sample("reductions", ("sum", "mean", "amax"), Reductions, _x(2, 3, 4), (torch.float32, torch.bfloat16)),
    Sample("softmaxes", ("softmax", "log_softmax"), Softmaxes, _x(2, 3, 4)),
    Sample("layer_norms", ("layer_norm",), LayerNorms, _x(3, 4, 5), (torch.float32, torch.bfloat16)),
    Sample(
        "batch_norms",
        ("batch_norm", "_native_batch_norm_legit_no_training", "mean", "flatten", "unsqueeze"),
        BatchNorms, _x(2, 4, 3, 5),
    ),
    Sample(
        "pools",
        ("max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_avg_pool1d"),
        Pools, _x(2, 3, 7, 8),
    ),
    Sample("embeddings", ("embedding", "mul"), Embeddings, _ids),
    Sample(
        "sparse_layers",
        ("masked_linear", "masked_matmul", "masked_addmm", "masked_conv1d", "masked_conv2d", "flatten"),
        SparseLayers, _sparse_inputs,
    ),
    Sample(
        "dense_layers",
        ("linear", "conv1d", "conv2d", "addmm", "mm", "matmul", "bmm", "view", "transpose", "t"),
        DenseLayers, _sparse_inputs,
    ),
    Sample("attention", ("sdpa", "sdpa_flash", "gt", "getitem"), Attention, _qkv),
)  # fmt: skip
