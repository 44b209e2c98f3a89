"""Lowering rules: one small function per canonical op name (``op_names.py``), in one table.

A rule gets a ``Call`` (the node, its arguments with data values as ``Ref``s, its concrete result)
and emits kernels through the ``Builder``. ``RULES`` maps each op name to its rule; a name that is
missing is a ``LoweringError`` naming the op and the node, never a silently dropped op::

    >>> RULES["relu"] is RULES["add"], RULES["masked_linear"].__name__
    (True, '_masked')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from sparsefx.errors import LoweringError
from sparsefx.op_table import MASKED

from .arguments import bind, method_target
from .builder import Builder, Ref, SparseWeight, dtype_name

__all__ = ["Call", "RULES", "ELEMENTWISE", "IDENTITY", "CHECKS"]

_NO = object()


@dataclass
class Call:
    """One node to lower: canonical ``name``, lowered ``args``/``kwargs``, concrete ``out``."""

    name: str
    node: fx.Node
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    module: nn.Module | None = None
    _bound: dict[str, Any] | None = field(default=None, repr=False)

    def get(self, *names: str, default: Any = _NO) -> Any:
        """The argument the op's own signature calls ``names[0]`` (or another of ``names``: aliases across
        spellings, like ``dim0`` and ``axis0``), whatever its position; else ``default``."""
        bound = self.bound()
        for name in names:
            if name in bound:
                return bound[name]
        if default is _NO:
            raise self.error(f"has no argument {names[0]!r}")
        return default

    def bound(self) -> dict[str, Any]:
        """Every argument by name (``arguments.bind``), defaults included; a ``LoweringError`` when no
        signature of the op accepts the call's arguments."""
        if self._bound is None:
            node = self.node
            target = method_target(str(node.target)) if node.op == "call_method" else node.target
            method = node.op == "call_method"
            bound = bind(target, self.args, self.kwargs, is_data=lambda v: isinstance(v, Ref), method=method)
            if bound is None:
                raise self.error("its arguments match no signature of the op, so they cannot be read by name")
            self._bound = bound
        return self._bound

    def error(self, why: str) -> LoweringError:
        """A ``LoweringError`` naming this node and its op."""
        return LoweringError(f"cannot lower node {self.node.format_node()} (op {self.name!r}): {why}")


Rule = Callable[[Builder, Call], Any]
RULES: dict[str, Rule] = {}

ELEMENTWISE = (
    "relu", "gelu", "tanh", "sigmoid", "silu", "neg", "exp", "log", "sqrt", "rsqrt", "abs", "erf",
    "reciprocal", "sin", "cos", "add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum",
    "where", "masked_fill", "to", "type_as", "float", "half", "bfloat16", "eq", "ne", "lt", "le", "gt",
    "ge", "logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and", "bitwise_or",
    "bitwise_xor", "clamp", "square",
)  # fmt: skip
"""Ops lowered to one ``elementwise`` kernel: tensors become inputs, scalars stay in ``attrs``."""

IDENTITY = ("identity", "dropout")
"""Ops that are the identity on a model in eval mode: the value passes through, no kernel."""

CHECKS = ("assert_metadata",)
"""Ops that only check a value's metadata (export's ``_assert_tensor_metadata``): held at lowering, where the
example inputs pass them; a program's inputs are checked against its streams when it runs. No kernel."""


def _rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


def _ref(b: Builder, value: Any, name: str) -> Ref:
    """A data operand: a ``Ref`` as is; a constant tensor becomes a ``constant`` kernel."""
    if isinstance(value, Ref):
        return value
    if isinstance(value, torch.Tensor):
        return b.const(value, f"{name}_const")
    raise LoweringError(f"{b.source}: operand {value!r} is not a tensor")


def _plain(value: Any) -> Any:
    """A JSON-able form of a scalar argument (dtypes by name)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    raise LoweringError(f"{value!r} ({type(value).__name__}) cannot be a kernel attribute")


_CASTS = ("to", "type_as", "float", "half", "bfloat16")


@_rule(*ELEMENTWISE)
def _elementwise(b: Builder, c: Call) -> Any:
    if c.name in _CASTS:  # device and copy arguments mean nothing on the mesh; only the dtype does
        x = _ref(b, c.args[0], c.node.name)
        return _cast(b, x, c.out.dtype, c.node.name, c.out)
    args = c.args
    if c.node.op == "call_method" and c.name == "where":  # x.where(cond, y) is torch.where(cond, x, y)
        args = (args[1], args[0], *args[2:])
    operands, inputs = [], []
    for i, a in enumerate(args):
        if isinstance(a, (Ref, torch.Tensor)) and (isinstance(a, Ref) or a.dim() > 0):
            inputs.append(_ref(b, a, f"{c.node.name}_arg{i}"))
            operands.append({"in": len(inputs) - 1})
        elif isinstance(a, torch.Tensor):
            operands.append({"scalar": a.item()})
        else:
            operands.append({"scalar": _plain(a)})
    kwargs = {k: _plain(v) for k, v in c.kwargs.items() if not isinstance(v, (Ref, torch.Tensor))}
    for k, v in c.kwargs.items():
        if isinstance(v, (Ref, torch.Tensor)):
            inputs.append(_ref(b, v, f"{c.node.name}_{k}"))
            kwargs[k] = {"in": len(inputs) - 1}
    if c.module is not None and c.name == "gelu":
        kwargs["approximate"] = c.module.approximate
    attrs = {"fn": c.name, "args": operands, "kwargs": kwargs}
    return b.emit(c.node.name, "elementwise", inputs, c.out, attrs)


def _cast(b: Builder, x: Ref, dtype: torch.dtype, name: str, out: Any = None) -> Ref:
    """``x`` as ``dtype``: ``x`` itself when it has that dtype, else a ``cast`` kernel called ``name``."""
    if b.values[x.name][1] == dtype_name(dtype):
        return x
    like = torch.empty(b.shape(x), dtype=dtype) if out is None else out
    attrs = {"fn": "cast", "args": [{"in": 0}], "kwargs": {"dtype": _plain(dtype)}}
    return b.emit(name, "elementwise", [x], like, attrs)


@_rule(*IDENTITY)
def _identity(b: Builder, c: Call) -> Any:
    if c.name == "dropout" and c.module is None and _dropout_active(c):
        raise c.error(
            "this dropout is active (training=True and p > 0: F.dropout's default) and draws random "
            "numbers, which a program cannot; pass training=self.training, or p=0"
        )
    if isinstance(c.out, tuple):  # aten.native_dropout: (output, mask); eval keeps every element
        return (c.args[0], *([None] * (len(c.out) - 1)))
    return c.args[0]


@_rule(*CHECKS)
def _check(b: Builder, c: Call) -> None:
    return None


def _dropout_active(c: Call) -> bool:
    """Whether a dropout call drops: ``F.dropout(x, p, training)`` (training defaults to True) or
    ``aten.dropout(x, p, train)``. A dropout module lowers in eval mode, where it is the identity."""
    p = c.get("p", default=0.5)
    training = c.get("train", "training", default=True)
    return bool(training) and float(p) > 0


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


@_rule("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as")
def _reshape(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    return b.emit(c.node.name, "layout", [x], c.out, {"fn": "reshape", "shape": list(c.out.shape)})


@_rule("expand", "expand_as", "broadcast_to")
def _expand(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    return b.emit(c.node.name, "layout", [x], c.out, {"fn": "expand", "shape": list(c.out.shape)})


@_rule("permute", "transpose", "t", "swapaxes", "attr_T", "attr_mT")
def _permute(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    ndim = len(b.shape(x))
    if c.name in ("attr_T", "attr_mT"):  # x.T reverses every dim; x.mT swaps the last two
        dims = list(range(ndim))[::-1] if c.name == "attr_T" else [*range(ndim - 2), ndim - 1, ndim - 2]
        return b.emit(c.node.name, "layout", [x], c.out, {"fn": "permute", "dims": dims})
    if c.name == "permute":  # x.permute(0, 2, 1), x.permute((0, 2, 1)), torch.permute(x, dims=...)
        dims = c.args[1:] if len(c.args) > 2 or (len(c.args) == 2 and isinstance(c.args[1], int)) else None
        dims = [_dim(int(d), ndim) for d in (dims if dims is not None else c.get("dims"))]
    else:
        dims = list(range(ndim))
        if c.name == "t":
            a, z = (0, 1) if ndim == 2 else (0, 0)
        else:
            a, z = _dim(c.get("dim0", "axis0"), ndim), _dim(c.get("dim1", "axis1"), ndim)
        dims[a], dims[z] = dims[z], dims[a]
    return b.emit(c.node.name, "layout", [x], c.out, {"fn": "permute", "dims": dims})


def _slice(b: Builder, x: Ref, name: str, dim: int, start: int, end: int, out: torch.Tensor) -> Ref:
    return b.emit(
        name, "layout", [x], out, {"fn": "slice", "dim": dim, "start": start, "end": end, "step": 1}
    )


@_rule("slice", "narrow")
def _slice_rule(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    shape = b.shape(x)
    dim = _dim(c.get("dim", default=0), len(shape))
    if c.name == "narrow":
        start = _dim(c.get("start"), shape[dim])
        start, end, step = start, start + c.get("length"), 1
    else:
        start, end, step = c.get("start", default=None), c.get("end", default=None), c.get("step", default=1)
        start, end, _ = slice(start, end, step).indices(shape[dim])
    attrs = {"fn": "slice", "dim": dim, "start": start, "end": max(end, start), "step": step}
    return b.emit(c.node.name, "layout", [x], c.out, attrs)


@_rule("select")
def _select(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    shape = b.shape(x)
    dim = _dim(c.get("dim"), len(shape))
    index = _dim(c.get("index"), shape[dim])
    return b.emit(c.node.name, "layout", [x], c.out, {"fn": "select", "dim": dim, "index": index})


@_rule("split", "chunk", "unbind", "tensor_split")
def _split(b: Builder, c: Call) -> list[Ref]:
    x = _ref(b, c.args[0], c.node.name)
    dim = _dim(c.get("dim", default=0), len(b.shape(x)))
    outs, start = [], 0
    for i, piece in enumerate(c.out):
        size = piece.shape[dim] if c.name != "unbind" else 1
        name = f"{c.node.name}_{i}"
        if c.name == "unbind":
            outs.append(b.emit(name, "layout", [x], piece, {"fn": "select", "dim": dim, "index": i}))
        else:
            outs.append(_slice(b, x, name, dim, start, start + size, piece))
        start += size
    return outs


@_rule("getitem")
def _getitem(b: Builder, c: Call) -> Any:
    base, index = c.args[0], c.args[1]
    if isinstance(base, (list, tuple)):
        return base[index]
    if isinstance(base, dict):
        return base[index]
    if not isinstance(base, Ref):
        raise c.error(f"indexes a {type(base).__name__}")
    items = index if isinstance(index, tuple) else (index,)
    spec = []
    for item in items:
        if item is None:
            spec.append({"none": True})
        elif item is Ellipsis:
            spec.append({"ellipsis": True})
        elif isinstance(item, (bool, Ref, torch.Tensor, list)):
            raise c.error("advanced (tensor or list) indexing cannot be lowered; only ints and slices")
        elif isinstance(item, int):
            spec.append({"int": item})
        elif isinstance(item, slice):
            spec.append({"slice": [item.start, item.stop, item.step]})
        else:
            raise c.error(f"index {item!r} cannot be lowered")
    return b.emit(c.node.name, "layout", [base], c.out, {"fn": "index", "index": spec})


@_rule("index")
def _index(b: Builder, c: Call) -> Ref:
    """``x[i0, i1, ...]`` with index tensors the program knows (aten.index): a gather, costed as routing."""
    x = _ref(b, c.args[0], c.node.name)
    positions, payload = [], {}
    for k, idx in enumerate(c.get("indices")):
        if idx is None:
            positions.append(None)
        elif isinstance(idx, Ref):
            raise c.error("indexing with indices the model computes from its inputs cannot be lowered")
        else:
            payload[f"index{k}"] = idx.detach().clone()
            positions.append(f"index{k}")
    return b.emit(c.node.name, "layout", [x], c.out, {"fn": "gather", "indices": positions}, payload=payload)


@_rule("cat", "concat", "concatenate", "stack")
def _cat(b: Builder, c: Call) -> Ref:
    tensors = list(c.get("tensors", "input"))
    refs = [_ref(b, t, f"{c.node.name}_in{i}") for i, t in enumerate(tensors)]
    dim = _dim(c.get("dim", "axis", default=0), c.out.dim())
    return b.emit(
        c.node.name, "layout", refs, c.out, {"fn": c.name if c.name == "stack" else "cat", "dim": dim}
    )


@_rule("sum", "mean", "amax")
def _reduce(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    ndim = len(b.shape(x))
    dims = c.get("dim", default=None)
    dims = [dims] if isinstance(dims, int) else dims
    if dims is None or (c.name == "amax" and list(dims) == []):  # amax(dim=[]) reduces every dim
        dims = list(range(ndim))
    dtype = c.get("dtype", default=None)
    if dtype is not None:  # torch.sum(x, dtype=...) converts first, then reduces in that dtype
        x = _cast(b, x, dtype, f"{c.node.name}_cast")
    attrs = {
        "fn": c.name,
        "dims": [_dim(d, ndim) for d in dims],
        "keepdim": bool(c.get("keepdim", default=False)),
    }
    return b.emit(c.node.name, "reduce", [x], c.out, attrs)


@_rule("softmax", "log_softmax")
def _softmax(b: Builder, c: Call) -> Ref:
    x = _ref(b, c.args[0], c.node.name)
    dim = c.module.dim if c.module is not None else c.get("dim", default=None)
    if dim is None:
        raise c.error("a softmax without dim (the legacy implicit choice) cannot be lowered; give dim")
    if c.module is None:
        dtype = c.get("dtype", default=None)
        if c.get("half_to_float", default=False):  # aten._softmax(x, dim, True): a half input, float out
            dtype = torch.float32
        if dtype is not None:  # softmax(x, dim, dtype=...) converts first, then computes in that dtype
            x = _cast(b, x, dtype, f"{c.node.name}_cast")
    attrs = {"dim": _dim(dim, len(b.shape(x))), "log": c.name == "log_softmax"}
    return b.emit(c.node.name, "softmax", [x], c.out, attrs)


@_rule("layer_norm")
def _layer_norm(b: Builder, c: Call) -> Any:
    x = _ref(b, c.args[0], c.node.name)
    if c.module is not None:
        shape, weight, bias, eps = c.module.normalized_shape, c.module.weight, c.module.bias, c.module.eps
    else:
        shape, eps = c.get("normalized_shape"), c.get("eps", default=1e-5)
        weight, bias = c.get("weight", default=None), c.get("bias", default=None)
    if isinstance(weight, Ref) or isinstance(bias, Ref):
        raise c.error("a layer norm whose weight is computed by the model cannot be lowered")
    payload = {k: v.detach() for k, v in (("weight", weight), ("bias", bias)) if v is not None}
    out = c.out[0] if isinstance(c.out, tuple) else c.out
    attrs = {"normalized_shape": list(shape), "eps": float(eps)}
    ref = b.emit(c.node.name, "layer_norm", [x], out, attrs, payload=payload)
    return (ref, None, None) if isinstance(c.out, tuple) else ref


@_rule("embedding")
def _embedding(b: Builder, c: Call) -> Ref:
    if c.module is not None:
        table, ids, max_norm = c.module.weight, c.args[0], c.module.max_norm
    else:  # F.embedding(input, weight, ...); aten.embedding(weight, indices, ...)
        table, ids, max_norm = c.get("weight"), c.get("indices", "input"), c.get("max_norm", default=None)
    if max_norm is not None:
        raise c.error(
            f"an embedding with max_norm={max_norm} rescales its table in place; give max_norm=None"
        )
    if isinstance(table, Ref):
        raise c.error("an embedding whose table is computed by the model cannot be lowered")
    ids = _ref(b, ids, f"{c.node.name}_ids")
    return b.emit(c.node.name, "embedding", [ids], c.out, {}, payload={"table": table.detach()})


@_rule("batch_norm", "_native_batch_norm_legit_no_training")
def _batch_norm(b: Builder, c: Call) -> Any:
    """Eval-mode batch norm with the running statistics, read by name: ``F.batch_norm`` takes
    ``(input, running_mean, running_var, weight, bias, ...)``, ``aten.batch_norm`` and
    ``torch.batch_norm`` take ``(input, weight, bias, running_mean, running_var, ...)``."""
    x = _ref(b, c.args[0], c.node.name)
    if c.module is not None:
        m = c.module
        mean, var, weight, bias, eps = m.running_mean, m.running_var, m.weight, m.bias, m.eps
        batch_stats = mean is None  # a module lowers as in eval mode, whatever its flag says now
    else:
        mean, var = c.get("running_mean"), c.get("running_var")
        weight, bias, eps = c.get("weight", default=None), c.get("bias", default=None), c.get("eps")
        batch_stats = bool(c.get("training", default=False)) or mean is None
    if batch_stats:
        raise c.error(
            "this batch norm normalizes with the batch's own statistics (training=True, or "
            "track_running_stats=False); only running statistics (eval mode) can be lowered"
        )
    parts = {"mean": mean, "var": var, "weight": weight, "bias": bias}
    if any(isinstance(v, Ref) for v in parts.values()):
        raise c.error("batch norm needs running statistics and weights held by the model, not computed ones")
    payload = {k: v.detach() for k, v in parts.items() if v is not None}
    out = c.out[0] if isinstance(c.out, tuple) else c.out
    ref = b.emit(
        c.node.name, "elementwise", [x], out, {"fn": "batch_norm", "eps": float(eps)}, payload=payload
    )
    return (ref, None, None) if isinstance(c.out, tuple) else ref


def _pair(v: Any) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(a) for a in v] * (2 if len(v) == 1 else 1)


@_rule("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_avg_pool1d", "max_pool2d_with_indices")
def _pool(b: Builder, c: Call) -> Any:
    x = _ref(b, c.args[0], c.node.name)
    m = c.module
    if c.name.startswith("adaptive_avg_pool"):  # the result's sizes: None sizes resolved
        attrs = {
            "fn": "adaptive_avg",
            "output_size": list(c.out.shape[-1 if c.name.endswith("1d") else -2 :]),
        }
    else:
        get = (lambda k, d: getattr(m, k)) if m is not None else (lambda k, d: c.get(k, default=d))
        kernel = _pair(get("kernel_size", None))
        stride = get("stride", None) or kernel  # aten's stride=[] means the kernel size, as None does
        attrs = {
            "fn": "max" if c.name.startswith("max") else "avg",
            "kernel_size": kernel,
            "stride": _pair(stride),
            "padding": _pair(get("padding", 0)),
            "ceil_mode": bool(get("ceil_mode", False)),
        }
        if attrs["fn"] == "max":
            attrs["dilation"] = _pair(get("dilation", 1))
        else:
            attrs["count_include_pad"] = bool(get("count_include_pad", True))
            if get("divisor_override", None) is not None:
                raise c.error("avg_pool2d with divisor_override cannot be lowered")
    out = c.out[0] if isinstance(c.out, tuple) else c.out
    ref = b.emit(c.node.name, "pool", [x], out, attrs)
    return (ref, None) if isinstance(c.out, tuple) else ref


def _matmul_kernel(b: Builder, c: Call, x: Ref, sw: SparseWeight, attrs: dict[str, Any]) -> Ref:
    if attrs["kind"] == "conv2d":  # every output position sees the whole weight once
        rows = c.out.shape[0] * math.prod(c.out.shape[2:])
    else:
        rows = math.prod(c.out.shape) // sw.weight.shape[0]
    nnz = sw.nnz
    attrs = {
        **attrs,
        "in_features": int(sw.weight.shape[1]),
        "out_features": int(sw.weight.shape[0]),
        "rows": int(rows),
        "param": sw.param,
    }
    return b.emit(c.node.name, "sparse_matmul", [x], c.out, attrs, sparse=sw, flops=2 * nnz * int(rows))


def _param_name(c: Call, index: int) -> str:
    arg = c.node.args[index] if index < len(c.node.args) else None
    return str(arg.target) if isinstance(arg, fx.Node) and arg.op == "get_attr" else ""


@_rule("masked_linear", "masked_addmm", "masked_matmul", "masked_conv1d", "masked_conv2d")
def _masked(b: Builder, c: Call) -> Ref:
    row = MASKED[c.node.target]
    ops = row.operands(c.args)
    if not isinstance(ops.input, Ref) or isinstance(ops.weight, Ref) or isinstance(ops.mask, Ref):
        raise c.error("a masked op must read a model weight and a data input")
    w, m = ops.weight.detach(), ops.mask
    param = _param_name(c, row.weight_arg)
    kind = row.kind
    if kind in ("conv1d", "conv2d"):
        return _conv(b, c, ops.input, w, m, ops.bias, ops.flags, kind, param)
    weight_first = bool(ops.flags.get("weight_first", False))
    if row.layout == "in_out" and not weight_first:
        w, m = w.t(), m.t()
    if w.dim() != 2:
        raise c.error(f"a masked matmul weight of shape {list(w.shape)} is not a matrix")
    attrs: dict[str, Any] = {"kind": kind}
    if kind == "addmm":
        attrs |= {"beta": _plain(ops.flags.get("beta", 1)), "alpha": _plain(ops.flags.get("alpha", 1))}
    if weight_first:
        raise c.error("weight @ input (weight_first) cannot be lowered yet; only input @ weight")
    bias = None if isinstance(ops.bias, Ref) else ops.bias
    if isinstance(ops.bias, Ref):
        raise c.error("a bias computed by the model cannot be lowered")
    if kind == "addmm":
        return _addmm_kernel(b, c, ops.input, w.contiguous(), m.contiguous(), bias, param, attrs)
    return _matmul_kernel(b, c, ops.input, SparseWeight(w.contiguous(), m.contiguous(), bias, param), attrs)


def _conv(
    b: Builder,
    c: Call,
    x: Any,
    w: torch.Tensor,
    m: torch.Tensor,
    bias: Any,
    flags: dict,
    kind: str,
    param: str,
) -> Ref:
    groups = int(flags.get("groups", 1))
    if groups != 1:  # a grouped convolution is the block-diagonal dense one; the mask keeps the blocks
        w, m = _ungroup(w, groups), _ungroup(m, groups)
    if isinstance(bias, Ref) or not isinstance(x, Ref):
        raise c.error("a convolution must read a data input and model weights")
    padding = _conv_padding(c, flags.get("padding", 0), w.shape[2:], flags.get("dilation", 1))
    attrs = {
        "kind": kind,
        "groups": groups,
        "kernel_size": list(w.shape[2:]),
        "stride": _plain(flags.get("stride", 1)),
        "padding": _plain(padding),
        "dilation": _plain(flags.get("dilation", 1)),
    }
    out_ch = w.shape[0]
    sw = SparseWeight(w.reshape(out_ch, -1).contiguous(), m.reshape(out_ch, -1).contiguous(), bias, param)
    if kind == "conv1d":
        rows = c.out.shape[0] * c.out.shape[-1]
        nnz = sw.nnz
        attrs |= {
            "in_features": int(sw.weight.shape[1]),
            "out_features": out_ch,
            "rows": int(rows),
            "param": param,
        }
        return b.emit(c.node.name, "sparse_matmul", [x], c.out, attrs, sparse=sw, flops=2 * nnz * int(rows))
    return _matmul_kernel(b, c, x, sw, attrs)


def _conv_padding(c: Call, padding: Any, kernel: Any, dilation: Any) -> Any:
    """Numeric padding: ``"valid"`` is 0; ``"same"`` is half of ``dilation * (kernel - 1)`` per dim
    when that is even (torch pads the odd one out on one side only, which a program cannot)."""
    if not isinstance(padding, str):
        return padding
    if padding == "valid":
        return 0
    dilation = [dilation] * len(kernel) if isinstance(dilation, int) else list(dilation)
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    if padding != "same" or any(t % 2 for t in totals):
        raise c.error(
            f"padding={padding!r} cannot be lowered (with kernel {list(kernel)} and dilation {dilation}); "
            "give the padding as numbers, or 'same' with an odd kernel"
        )
    return [t // 2 for t in totals]


def _ungroup(w: torch.Tensor, groups: int) -> torch.Tensor:
    """``[out, in/groups, *k]`` -> ``[out, in, *k]``, zero (False) outside each group's channels."""
    out, per = w.shape[0], w.shape[1]
    full = torch.zeros((out, per * groups, *w.shape[2:]), dtype=w.dtype)
    step = out // groups
    for g in range(groups):
        full[g * step : (g + 1) * step, g * per : (g + 1) * per] = w[g * step : (g + 1) * step]
    return full


def _dense(w: torch.Tensor) -> torch.Tensor:
    return torch.ones(w.shape, dtype=torch.bool)


@_rule("linear")
def _linear(b: Builder, c: Call) -> Ref:
    if c.module is not None:
        x, w, bias = c.args[0], c.module.weight, c.module.bias
    else:
        x, w, bias = c.args[0], c.get("weight"), c.get("bias", default=None)
    if isinstance(w, Ref):
        return _act_matmul(b, c, x, w, transpose_b=True, bias=bias)
    if isinstance(bias, Ref):
        raise c.error("a bias computed by the model cannot be lowered")
    x = _ref(b, x, c.node.name)
    param = c.node.target + ".weight" if c.module is not None else _param_name(c, 1)
    sw = SparseWeight(w.detach(), _dense(w), None if bias is None else bias.detach(), param)
    return _matmul_kernel(b, c, x, sw, {"kind": "linear"})


@_rule("conv1d", "conv2d")
def _dense_conv(b: Builder, c: Call) -> Ref:
    m = c.module
    if m is not None:
        if m.padding_mode != "zeros":
            raise c.error(f"padding_mode={m.padding_mode!r} cannot be lowered; only zero padding")
        x, w, bias = c.args[0], m.weight, m.bias
        flags = {"stride": m.stride, "padding": m.padding, "dilation": m.dilation, "groups": m.groups}
        param = c.node.target + ".weight"
    else:
        x, w, bias = c.args[0], c.get("weight"), c.get("bias", default=None)
        flags = {
            k: c.get(k, default=d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))
        }
        param = _param_name(c, 1)
    if isinstance(w, Ref):
        raise c.error("a convolution whose weight is computed by the model cannot be lowered")
    return _conv(b, c, x, w.detach(), _dense(w), bias, flags, c.name, param)


@_rule("addmm")
def _addmm(b: Builder, c: Call) -> Ref:
    bias, x, w = c.get("input"), c.get("mat1"), c.get("mat2")
    if isinstance(w, Ref) or isinstance(bias, Ref):
        raise c.error("addmm with a computed weight or bias cannot be lowered")
    x = _ref(b, x, c.node.name)
    wt = w.detach().t().contiguous()
    attrs = {
        "kind": "addmm",
        "beta": _plain(c.get("beta", default=1)),
        "alpha": _plain(c.get("alpha", default=1)),
    }
    return _addmm_kernel(b, c, x, wt, _dense(wt), bias.detach(), _param_name(c, 2), attrs)


def _addmm_kernel(
    b: Builder,
    c: Call,
    x: Ref,
    w: torch.Tensor,
    m: torch.Tensor,
    bias: torch.Tensor | None,
    param: str,
    attrs: dict[str, Any],
) -> Ref:
    """``beta * bias + alpha * (x @ w.T)``: the east column adds one bias per output, so a bias that
    broadcasts along the rows ([out], [1, out], a scalar) is stored as ``[out]``; one that varies by row
    becomes an ``add`` of the constant ``beta * bias`` after a bias-free kernel."""
    rows, out = c.out.shape
    if bias is None or bias.dim() < 2 or bias.shape[0] == 1:
        vector = None if bias is None else torch.broadcast_to(bias.detach(), (rows, out))[0].contiguous()
        return _matmul_kernel(b, c, x, SparseWeight(w, m, vector, param), attrs)
    product = _matmul_kernel(b, c, x, SparseWeight(w, m, None, param), attrs)
    if attrs["beta"] == 0:  # as torch.addmm: the bias is ignored
        return product
    full = (torch.broadcast_to(bias.detach(), (rows, out)) * attrs["beta"]).contiguous()
    const = b.const(full, f"{c.node.name}_bias")
    add = {"fn": "add", "args": [{"in": 0}, {"in": 1}], "kwargs": {}}
    return b.emit(f"{c.node.name}_add_bias", "elementwise", [product, const], c.out, add)


def _act_matmul(
    b: Builder,
    c: Call,
    x: Any,
    y: Any,
    *,
    transpose_b: bool = False,
    bias: Any = None,
    scale: float | None = None,
    name: str | None = None,
    out: Any = None,
) -> Ref:
    xr, yr = _ref(b, x, f"{c.node.name}_a"), _ref(b, y, f"{c.node.name}_b")
    attrs: dict[str, Any] = {"transpose_b": transpose_b}
    if scale is not None:
        attrs["scale"] = float(scale)
    inputs = [xr, yr]
    if bias is not None:
        inputs.append(_ref(b, bias, f"{c.node.name}_bias"))
        attrs["bias"] = True
    out = c.out if out is None else out
    k = b.shape(xr)[-1]
    return b.emit(name or c.node.name, "matmul", inputs, out, attrs, flops=2 * out.numel() * k)


@_rule("matmul", "mm", "bmm")
def _matmul(b: Builder, c: Call) -> Ref:
    x, y = c.args[0], c.args[1] if len(c.args) > 1 else c.get("other", "mat2")
    if isinstance(x, Ref) and isinstance(y, torch.Tensor) and y.dim() == 2:
        x = _ref(b, x, c.node.name)
        wt = y.detach().t().contiguous()
        return _matmul_kernel(
            b, c, x, SparseWeight(wt, _dense(wt), None, _param_name(c, 1)), {"kind": "matmul"}
        )
    return _act_matmul(b, c, x, y)


@_rule("sdpa", "sdpa_flash")
def _sdpa(b: Builder, c: Call) -> Any:
    """``F.scaled_dot_product_attention`` and aten's CPU flash kernel (whose ``attn_mask`` and ``scale``
    are keyword-only and which also returns the log-sum-exp), read by name."""
    q, k, v = (_ref(b, c.get(n, "input"), f"{c.node.name}_{n}") for n in ("query", "key", "value"))
    mask = c.get("attn_mask", default=None)
    if c.get("dropout_p", default=0.0):
        raise c.error("attention dropout must be 0 to lower (lower the model in eval mode)")
    causal = bool(c.get("is_causal", default=False))
    scale = c.get("scale", default=None)
    qs, ks = b.shape(q), b.shape(k)
    if c.get("enable_gqa", default=False) and qs[-3:-2] != ks[-3:-2]:
        raise c.error(
            f"grouped-query attention (enable_gqa with {qs[-3]} query and {ks[-3]} key heads) "
            "cannot be lowered; repeat the key and value heads first"
        )
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    out = c.out[0] if isinstance(c.out, tuple) else c.out
    base = c.node.name
    scores_shape = (*qs[:-1], ks[-2])
    scores = torch.empty(scores_shape, dtype=out.dtype)
    s = _act_matmul(b, c, q, k, transpose_b=True, scale=scale, name=f"{base}_scores", out=scores)
    if mask is not None:
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=out.dtype).masked_fill(~mask, float("-inf"))
        m = _ref(b, mask, f"{base}_mask")
        if b.values[m.name][1] == "bool":  # True attends: where(mask, scores, -inf)
            attrs = {"fn": "where", "args": [{"in": 1}, {"in": 0}, {"scalar": float("-inf")}], "kwargs": {}}
        else:
            attrs = {"fn": "add", "args": [{"in": 0}, {"in": 1}], "kwargs": {}}
        s = b.emit(f"{base}_masked", "elementwise", [s, m], scores, attrs)
    attrs = {"dim": len(scores_shape) - 1, "log": False, "safe": True}  # as torch: a fully masked row is 0
    if causal:  # the softmax leaves out the keys after each query itself: no mask is made or sent
        attrs["causal"] = True
    p = b.emit(f"{base}_probs", "softmax", [s], scores, attrs)
    ref = _act_matmul(b, c, p, v, name=base, out=out)
    return (ref, *([None] * (len(c.out) - 1))) if isinstance(c.out, tuple) else ref
