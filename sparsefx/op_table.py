"""The one table of matmul-like ops: their dense sources, their masked form, where operands sit, their FLOPs.

Every masked op (``sparsefx.ops``) and every dense op that accounting counts is described once here.
The rewrite pass reads a row to turn a dense call into its masked op, shape propagation to find
conv1d inputs, FLOP counting to cost a node, and lowering to get the canonical operands of a
masked op: its input, its weight as ``[out, in]``, its mask and bias, and its flags::

    >>> row = MASKED[ops.masked_addmm]
    >>> row.kind, row.layout, row.weight_arg
    ('addmm', 'in_out', 2)
    >>> operands = row.operands(("b", "x", "w", "m", 1, 1))
    >>> operands.input, operands.weight, operands.mask, operands.bias, operands.flags
    ('x', 'w', 'm', 'b', {'beta': 1, 'alpha': 1})

A row's ``params`` list the masked op's positional parameters by canonical name; ``source`` lists the
dense function's, as ``(canonical name, keyword in the source, default)``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import ops

__all__ = [
    "MatmulOp",
    "Operands",
    "TABLE",
    "MASKED",
    "WEIGHT_ARG",
    "MASKED_OPS",
    "by_function",
    "by_method",
    "by_module",
    "conv1d_sources",
    "dense_flops",
]

aten = torch.ops.aten
_NO = object()  # "no default": the source must give this operand
CANONICAL = ("input", "weight", "mask", "bias")


@dataclass(frozen=True)
class Operands:
    """A masked op's operands by role; ``flags`` holds the rest by name (``weight_first``, ``stride`` ...)."""

    input: Any
    weight: Any
    mask: Any
    bias: Any = None
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MatmulOp:
    """One family of matmul-like ops (see the module docstring)."""

    kind: str
    functions: frozenset[Any] = frozenset()
    methods: frozenset[str] = frozenset()
    modules: tuple[type, ...] = ()
    masked: Callable[..., Any] | None = None
    params: tuple[str, ...] = ()
    source: tuple[tuple[str, str, Any], ...] = ()
    layout: str = "out_in"  # how the masked op's weight is stored: [out, in], or [in, out] (addmm)

    @property
    def weight_arg(self) -> int:
        """Index of the weight among the masked op's positional arguments (the mask follows it)."""
        return self.params.index("weight")

    def operands(self, args: Sequence[Any]) -> Operands:
        """The canonical operands of a call of the masked op with positional ``args``."""
        named = dict(zip(self.params, args))
        flags = {k: v for k, v in named.items() if k not in CANONICAL}
        return Operands(named["input"], named["weight"], named["mask"], named.get("bias"), flags)

    def masked_args(self, operands: Mapping[str, Any]) -> tuple[Any, ...]:
        """Positional arguments of the masked op from ``{canonical name: value}``."""
        return tuple(operands[name] for name in self.params)

    def read_source(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        """``{canonical name: value}`` of a dense call, defaults filled in; None if one is missing."""
        out = {}
        for i, (name, keyword, default) in enumerate(self.source):
            value = args[i] if i < len(args) else kwargs.get(keyword, default)
            if value is _NO:
                return None
            out[name] = value
        return out

    def out_in(self, operands: Operands) -> tuple[int, int]:
        """``(out, in)`` of the weight: the first two dims (the last two for a matmul), swapped when the
        weight is stored ``[in, out]`` (addmm, and a matmul with the weight on the right)."""
        shape = tuple(operands.weight.shape)
        if self.kind == "matmul":
            out_features, in_features = shape[-2], shape[-1]
            return (
                (out_features, in_features)
                if operands.flags.get("weight_first")
                else (in_features, out_features)
            )
        return (shape[1], shape[0]) if self.layout == "in_out" else (shape[0], shape[1])

    def rows(self, operands: Operands, input_numel: Any, output_numel: Any) -> Any:
        """How many input vectors the weight multiplies: the input's rows, or for a convolution every
        output position (each sees the whole weight once). Input and output counts give the same
        number; each op uses the one its shape makes simplest."""
        out_features, in_features = self.out_in(operands)
        if self.kind in ("conv1d", "conv2d", "linear"):
            return output_numel / out_features
        return input_numel / in_features

    def flops(self, operands: Operands, nnz: int, input_numel: Any, output_numel: Any) -> tuple[Any, Any]:
        """Dense and sparse forward FLOPs (2 x MACs): ``2 * numel(weight) * rows`` and ``2 * nnz * rows``."""
        rows = self.rows(operands, input_numel, output_numel)
        return 2 * operands.weight.numel() * rows, 2 * nnz * rows


def _conv_source(kind: str) -> tuple[tuple[str, str, Any], ...]:
    names = ("stride", "padding", "dilation", "groups")
    return (("input", "input", _NO), ("weight", "weight", _NO), ("bias", "bias", None)) + tuple(
        (n, n, d) for n, d in zip(names, (1, 0, 1, 1))
    )


_CONV_PARAMS = ("input", "weight", "mask", "bias", "stride", "padding", "dilation", "groups")

TABLE: tuple[MatmulOp, ...] = (
    MatmulOp(
        "linear",
        frozenset({F.linear, aten.linear.default}),
        modules=(nn.Linear,),
        masked=ops.masked_linear,
        params=("input", "weight", "mask", "bias"),
        source=(("input", "input", _NO), ("weight", "weight", _NO), ("bias", "bias", None)),
    ),
    MatmulOp(
        "matmul",
        frozenset({torch.matmul, operator.matmul, torch.mm, aten.mm.default, aten.matmul.default}),
        frozenset({"matmul", "mm", "__matmul__"}),
        masked=ops.masked_matmul,
        params=("input", "weight", "mask", "weight_first"),
        source=(("a", "input", _NO), ("b", "other", _NO)),
        layout="in_out",  # x @ w; with weight_first (w @ x) the weight is [out, in]
    ),
    MatmulOp(
        "addmm",
        frozenset({torch.addmm, aten.addmm.default}),
        masked=ops.masked_addmm,
        params=("bias", "input", "weight", "mask", "beta", "alpha"),
        source=(
            ("bias", "input", _NO),
            ("input", "mat1", _NO),
            ("weight", "mat2", _NO),
            ("beta", "beta", 1),
            ("alpha", "alpha", 1),
        ),
        layout="in_out",
    ),
    MatmulOp(
        "conv1d",
        frozenset({F.conv1d, aten.conv1d.default}),
        modules=(nn.Conv1d,),
        masked=ops.masked_conv1d,
        params=_CONV_PARAMS,
        source=_conv_source("conv1d"),
    ),
    MatmulOp(
        "conv2d",
        frozenset({F.conv2d, aten.conv2d.default}),
        modules=(nn.Conv2d,),
        masked=ops.masked_conv2d,
        params=_CONV_PARAMS,
        source=_conv_source("conv2d"),
    ),
    # Counted, never rewritten: no masked form (yet).
    MatmulOp("bmm", frozenset({torch.bmm, aten.bmm.default}), frozenset({"bmm"})),
    MatmulOp("baddbmm", frozenset({torch.baddbmm, aten.baddbmm.default})),
    MatmulOp(
        "conv", frozenset({F.conv3d, aten.conv3d.default, aten.convolution.default}), modules=(nn.Conv3d,)
    ),
    MatmulOp("sdpa", frozenset({F.scaled_dot_product_attention, aten.scaled_dot_product_attention.default})),
)

MASKED: dict[Callable[..., Any], MatmulOp] = {row.masked: row for row in TABLE if row.masked is not None}
WEIGHT_ARG: dict[Callable[..., Any], int] = {op: row.weight_arg for op, row in MASKED.items()}
"""Masked op -> index of its weight argument; lowering and accounting find sparse ops through it."""
MASKED_OPS: frozenset[Callable[..., Any]] = frozenset(MASKED) | {ops.apply_mask, ops.masked_module_call}

_BY_FUNCTION = {fn: row for row in TABLE for fn in row.functions}
_BY_METHOD = {name: row for row in TABLE for name in row.methods}


def by_function(target: Any) -> MatmulOp | None:
    """The row whose dense functions include ``target`` (a ``call_function`` target)."""
    try:
        return _BY_FUNCTION.get(target)
    except TypeError:  # an unhashable target
        return None


def by_method(name: str) -> MatmulOp | None:
    """The row whose tensor methods include ``name`` (a ``call_method`` target)."""
    return _BY_METHOD.get(name)


def by_module(module: nn.Module) -> MatmulOp | None:
    """The row for a leaf module whose class is listed and whose forward is the stock one."""
    for row in TABLE:
        for cls in row.modules:
            if isinstance(module, cls) and type(module).forward is cls.forward:
                return row
    return None


def conv1d_sources() -> tuple[frozenset[Any], tuple[type, ...]]:
    """Functions and module classes that compute a conv1d (the masked op and aten's generic one too)."""
    row = next(r for r in TABLE if r.kind == "conv1d")
    return row.functions | {row.masked, aten.convolution.default}, row.modules


def dense_flops(row: MatmulOp, vals: Sequence[Any], out_numel: Any, dim: Callable[[Any, int], Any]) -> Any:
    """Forward FLOPs (2 x MACs) of a dense call of ``row``, or None when ``row`` is not counted that way.

    ``vals`` are the call's positional arguments as tensors (or fake/meta tensors), ``out_numel`` the
    output's element count and ``dim(t, i)`` size ``i`` of ``t``, as a number or a symbol.

        >>> x, w = torch.ones(8, 4), torch.ones(3, 4)
        >>> dense_flops(MASKED[ops.masked_linear], [x, w], 24, lambda t, i: t.shape[i])
        192
    """
    if row.kind in ("matmul", "bmm"):
        return 2 * out_numel * dim(vals[0], -1)
    if row.kind in ("addmm", "baddbmm", "linear"):
        return 2 * out_numel * dim(vals[1], -1)
    if row.kind in ("conv1d", "conv2d", "conv"):
        return 2 * out_numel * math.prod(dim(vals[1], d) for d in range(1, vals[1].dim()))
    if row.kind == "sdpa":
        q, k, v = vals[:3]
        rows = math.prod(dim(q, d) for d in range(q.dim() - 1))
        return 2 * rows * dim(k, -2) * (dim(q, -1) + dim(v, -1))
    return None
