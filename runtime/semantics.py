"""What each kernel of a ``DataflowProgram`` computes: one rule per op kind, in one table.

``RULES[kernel.op](program, kernel, inputs)`` takes the kernel's input values (in ``kernel.inputs``
order) and returns its result, reading its parameters from ``kernel.attrs`` and its payloads from
``program.arrays`` (``kernel.attrs["shapes"]`` gives a flat payload's shape). ``apply`` runs one
kernel through its rule and checks the result against the kernel's shape, casting it to the kernel's
dtype. Attributes and arrays are checked as they are read: an unknown ``fn`` or ``kind``, a missing
or wrongly sized array, or an op torch rejects is an ``EmulationError`` naming the kernel::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import ProgramData, Kernel, Region
    >>> p = ProgramData(MeshSpec(4, 4), HardwareSpec(), "pipelined", "block")
    >>> k = Kernel("y", "elementwise", Region(0, 0, 1, 4), ("x",), (2,), "float32",
    ...            attrs={"fn": "mul", "args": [{"in": 0}, {"scalar": 3.0}], "kwargs": {}})
    >>> apply(p, k, [torch.tensor([1.0, -2.0])]).tolist()
    [3.0, -6.0]
    >>> k.attrs["fn"] = "frobnicate"
    >>> apply(p, k, [torch.tensor([1.0, -2.0])])
    Traceback (most recent call last):
    ...
    sparsefx.errors.EmulationError: kernel 'y' (elementwise): elementwise fn 'frobnicate' is unknown; ...
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from sparsefx.errors import EmulationError, ProgramFormatError

from .elementwise import CASTS, call, keywords, operands
from .encoding import sparse_arrays
from .op_kinds import CHAINED_LAYOUTS
from .program import DTYPES, Kernel, ProgramData
from .sparse_eval import sparse_matmul

__all__ = ["RULES", "Rule", "apply", "array"]

Rule = Callable[[ProgramData, Kernel, list[torch.Tensor]], torch.Tensor]
RULES: dict[str, Rule] = {}
"""Op kind (``runtime.program.OPS``) -> its rule."""


def _rule(op: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[op] = fn
        return fn

    return register


def _where(k: Kernel) -> str:
    return f"kernel {k.name!r} ({k.op})"


def _attr(k: Kernel, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """``k.attrs[key]``, which must be a ``kind``; ``default`` when it is absent (if one is given)."""
    if key not in k.attrs:
        if default is not ...:
            return default
        raise EmulationError(f"{_where(k)}: has no attribute {key!r}")
    value = k.attrs[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
        raise EmulationError(f"{_where(k)}: attribute {key}={value!r} is not a {_names(kind)}")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _tuple(kind))


def _ints(k: Kernel, key: str, default: Any = ...) -> list[int]:
    value = _attr(k, key, (list, int), default)
    values = [value] if isinstance(value, int) else value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise EmulationError(f"{_where(k)}: attribute {key}={value!r} is not integers")
    return list(values)


def array(program: ProgramData, k: Kernel, role: str, numel: int | None = None) -> torch.Tensor:
    """Payload ``role`` of kernel ``k``, in its recorded shape, checked to hold ``numel`` elements."""
    name = k.arrays.get(role)
    if name is None:
        raise EmulationError(f"{_where(k)}: has no {role!r} array")
    if name not in program.arrays:
        raise EmulationError(f"{_where(k)}: array {name!r} has no payload (a program parsed from text?)")
    flat = program.arrays[name]
    shape = k.attrs.get("shapes", {}).get(role)
    if shape is not None and math.prod(shape) != flat.numel():
        raise EmulationError(
            f"{_where(k)}: array {name!r} has {flat.numel()} elements; shape {shape} needs more"
        )
    if numel is not None and flat.numel() != numel:
        raise EmulationError(f"{_where(k)}: array {name!r} has {flat.numel()} elements; {numel} needed")
    return flat.reshape(shape) if shape is not None else flat


def _count(k: Kernel, inputs: list[torch.Tensor], n: int) -> None:
    if len(inputs) != n:
        raise EmulationError(f"{_where(k)}: takes {n} input(s), got {len(inputs)} ({list(k.inputs)})")


# -- elementwise ---------------------------------------------------------------------------------------


@_rule("elementwise")
def _elementwise(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    fn = _attr(k, "fn", str)
    where = _where(k)
    if fn == "batch_norm":
        _count(k, inputs, 1)
        return _batch_norm(program, k, inputs[0])
    args = operands(_attr(k, "args", list), inputs, where)
    kwargs = keywords(_attr(k, "kwargs", dict, {}), inputs, where)
    if fn == "cast" or fn in CASTS:
        if not args or not isinstance(args[0], torch.Tensor):
            raise EmulationError(f"{where}: a cast needs a tensor operand")
        name = kwargs.get("dtype", k.dtype) if fn == "cast" else k.dtype
        if name not in DTYPES:
            raise EmulationError(f"{where}: cast to dtype {name!r}; programs hold {', '.join(DTYPES)}")
        return args[0].to(DTYPES[name])
    return call(fn, args, kwargs, where)


def _batch_norm(program: ProgramData, k: Kernel, x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2:
        raise EmulationError(f"{_where(k)}: batch norm of input {k.inputs[0]!r} of shape {list(x.shape)}")
    c = x.shape[1]
    parts = {r: array(program, k, r, c) if r in k.arrays else None for r in ("mean", "var", "weight", "bias")}
    eps = _attr(k, "eps", (float, int))
    return F.batch_norm(
        x, parts["mean"], parts["var"], parts["weight"], parts["bias"], training=False, eps=float(eps)
    )


# -- layout ----------------------------------------------------------------------------------------------


def _index_item(k: Kernel, item: Any) -> Any:
    if isinstance(item, dict) and len(item) == 1:
        ((key, value),) = item.items()
        if key == "none":
            return None
        if key == "ellipsis":
            return Ellipsis
        if key == "int" and isinstance(value, int):
            return value
        if key == "slice" and isinstance(value, list) and len(value) == 3:
            return slice(*value)
    raise EmulationError(f"{_where(k)}: index item {item!r} is not none, ellipsis, int or slice")


@_rule("layout")
def _layout(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    fn = _attr(k, "fn", str)
    if fn in ("cat", "stack"):
        if not inputs:
            raise EmulationError(f"{_where(k)}: {fn} of no inputs")
        return (torch.cat if fn == "cat" else torch.stack)(inputs, _attr(k, "dim", int))
    _count(k, inputs, 1)
    x = inputs[0]
    if fn == "chain":  # layout changes joined into one kernel (``passes/lower/fuse_layouts.py``)
        for step in _attr(k, "steps", list):
            if not isinstance(step, dict) or step.get("fn") not in CHAINED_LAYOUTS:
                valid = ", ".join(CHAINED_LAYOUTS)
                raise EmulationError(f"{_where(k)}: chain step {step!r} is not a layout of one of {valid}")
            x = _layout(program, dataclasses.replace(k, attrs=step), [x])
        return x
    if fn == "reshape":
        return x.reshape(_ints(k, "shape"))
    if fn == "expand":
        return x.expand(_ints(k, "shape"))
    if fn == "permute":
        dims = _ints(k, "dims")
        if sorted(dims) != list(range(x.dim())):
            raise EmulationError(
                f"{_where(k)}: dims {dims} do not permute the {x.dim()} dims of {k.inputs[0]!r}"
            )
        return x.permute(dims)
    if fn == "slice":
        dim, step = _attr(k, "dim", int), _attr(k, "step", int, 1)
        if not 0 <= dim < x.dim() or step < 1:
            raise EmulationError(f"{_where(k)}: slice dim {dim}, step {step} of a {x.dim()}-d input")
        index = (slice(None),) * dim + (slice(_attr(k, "start", int), _attr(k, "end", int), step),)
        return x[index]
    if fn == "select":
        return x.select(_attr(k, "dim", int), _attr(k, "index", int))
    if fn == "index":
        return x[tuple(_index_item(k, item) for item in _attr(k, "index", list))]
    if fn == "gather":
        positions = _attr(k, "indices", list)
        if not all(p is None or isinstance(p, str) for p in positions):
            raise EmulationError(f"{_where(k)}: indices {positions!r} are not array roles or None")
        index = [slice(None) if p is None else _index_array(program, k, p, x.device) for p in positions]
        return x[tuple(index)]
    raise EmulationError(f"{_where(k)}: layout fn {fn!r} is unknown")


def _index_array(program: ProgramData, k: Kernel, role: str, device: torch.device) -> torch.Tensor:
    idx = array(program, k, role)
    if idx.dtype != torch.bool and idx.is_floating_point():
        raise EmulationError(f"{_where(k)}: index array {k.arrays[role]!r} has dtype {idx.dtype}")
    return idx.to(device)


# -- reductions, pools, normalizations ----------------------------------------------------------------------


@_rule("reduce")
def _reduce(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 1)
    fn = _attr(k, "fn", str)
    functions = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "max_reduce": torch.amax}
    if fn not in functions:
        raise EmulationError(f"{_where(k)}: reduce fn {fn!r} is not sum, mean or amax")
    return functions[fn](inputs[0], dim=_ints(k, "dims"), keepdim=bool(_attr(k, "keepdim", bool, False)))


@_rule("pool")
def _pool(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 1)
    fn, x = _attr(k, "fn", str), inputs[0]
    if fn == "adaptive_avg":  # one output size pools the last dim ([N, C, L]), two the last two
        size = _ints(k, "output_size")
        return (F.adaptive_avg_pool1d if len(size) == 1 else F.adaptive_avg_pool2d)(x, size)
    if fn not in ("max", "avg"):
        raise EmulationError(f"{_where(k)}: pool fn {fn!r} is not max, avg or adaptive_avg")
    kernel, ceil = _ints(k, "kernel_size"), bool(_attr(k, "ceil_mode", bool, False))
    stride, padding = _ints(k, "stride", kernel), _ints(k, "padding", 0)
    if fn == "max":
        return F.max_pool2d(x, kernel, stride, padding, _ints(k, "dilation", 1), ceil_mode=ceil)
    include = bool(_attr(k, "count_include_pad", bool, True))
    return F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil, count_include_pad=include)


@_rule("softmax")
def _softmax(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 1)
    log, dim = bool(_attr(k, "log", bool, False)), _attr(k, "dim", int)
    x = inputs[0]
    if _attr(k, "causal", bool, False):  # attention's causal softmax: query i reads keys j <= i
        if x.dim() < 2 or dim % x.dim() != x.dim() - 1:
            raise EmulationError(f"kernel {k.name!r}: a causal softmax runs over the last of 2 or more dims")
        keep = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril()
        x = x.masked_fill(~keep, float("-inf"))
    out = (torch.log_softmax if log else torch.softmax)(x, dim)
    if _attr(k, "safe", bool, False):  # attention's softmax: a row that attends to nothing is 0, not NaN
        out = out.masked_fill((x == float("-inf")).all(dim, keepdim=True), 0.0)
    return out


@_rule("layer_norm")
def _layer_norm(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 1)
    shape = _ints(k, "normalized_shape")
    n = math.prod(shape)
    weight = array(program, k, "weight", n).reshape(shape) if "weight" in k.arrays else None
    bias = array(program, k, "bias", n).reshape(shape) if "bias" in k.arrays else None
    return F.layer_norm(inputs[0], shape, weight, bias, float(_attr(k, "eps", (float, int), 1e-5)))


# -- data the program holds ----------------------------------------------------------------------------


@_rule("embedding")
def _embedding(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 1)
    table, ids = array(program, k, "table"), inputs[0]
    if table.dim() != 2:
        raise EmulationError(
            f"{_where(k)}: table {k.arrays['table']!r} of shape {list(table.shape)} is not 2-d"
        )
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise EmulationError(f"{_where(k)}: ids {k.inputs[0]!r} have dtype {ids.dtype}, not an integer one")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise EmulationError(
            f"{_where(k)}: ids {k.inputs[0]!r} run from {int(ids.min())} to {int(ids.max())}; "
            f"the table has {table.shape[0]} rows"
        )
    return F.embedding(ids, table)


@_rule("constant")
def _constant(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 0)
    return array(program, k, "value", math.prod(k.shape)).reshape(k.shape)


# -- matmuls ------------------------------------------------------------------------------------------------


@_rule("matmul")
def _matmul(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    has_bias = bool(_attr(k, "bias", bool, False))
    _count(k, inputs, 3 if has_bias else 2)
    a, b = inputs[0], inputs[1]
    if _attr(k, "transpose_b", bool, False):
        b = b.transpose(-1, -2) if b.dim() >= 2 else b
    out = torch.matmul(a, b)
    if "scale" in k.attrs:
        out = out * float(_attr(k, "scale", (float, int)))
    return out + inputs[2] if has_bias else out


@_rule("sparse_matmul")
def _sparse_matmul(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    _count(k, inputs, 1)
    missing = [name for name in k.arrays.values() if name not in program.arrays]
    if missing:
        raise EmulationError(f"{_where(k)}: arrays {missing} have no payload (a program parsed from text?)")
    try:
        arrays = sparse_arrays(program, k, _where(k))
    except ProgramFormatError as e:
        raise EmulationError(str(e)) from None
    region = (k.region.width, k.region.height)
    return sparse_matmul(arrays, k.attrs, region, inputs[0], k.shape, _where(k))


def apply(program: ProgramData, k: Kernel, inputs: list[torch.Tensor]) -> torch.Tensor:
    """Kernel ``k``'s result from its ``inputs``: its rule's, checked for shape, cast to ``k.dtype``."""
    rule = RULES.get(k.op)
    if rule is None:
        raise EmulationError(f"{_where(k)}: op kind {k.op!r} has no rule; known: {', '.join(sorted(RULES))}")
    try:
        out = rule(program, k, inputs)
    except EmulationError:
        raise
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        shapes = ", ".join(f"{n}: {list(t.shape)}" for n, t in zip(k.inputs, inputs))
        raise EmulationError(f"{_where(k)}: fails on inputs ({shapes}): {exc}") from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(k.shape):
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise EmulationError(f"{_where(k)}: computes {got}; the program says {list(k.shape)}")
    dtype = DTYPES.get(k.dtype)
    if dtype is None:
        raise EmulationError(f"{_where(k)}: dtype {k.dtype!r} is not one of {', '.join(DTYPES)}")
    return out if out.dtype == dtype else out.to(dtype)
