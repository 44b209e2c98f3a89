"""The functions an ``elementwise`` kernel's ``fn`` names, and how its operands are read.

An elementwise kernel's ``attrs`` hold ``fn``, ``args`` (``{"in": i}``: the kernel's input ``i``;
``{"scalar": v}``: a constant) and ``kwargs`` (plain values, or ``{"in": i}``). ``FUNCTIONS`` maps each
``fn`` the lowering emits to a callable taking the operands in that order; extra flags a graph may
carry (``inplace``) are dropped, so a kernel never writes to its inputs::

    >>> x = torch.tensor([-1.0, 2.0])
    >>> operands([{"in": 0}, {"scalar": 3.0}], [x], "kernel 'k'")
    [tensor([-1.,  2.]), 3.0]
    >>> call("rsub", [x, 1.0], {}, "kernel 'k'").tolist(), call("lt", [0, x], {}, "kernel 'k'").tolist()
    ([2.0, -1.0], [False, True])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from sparsefx.errors import EmulationError

__all__ = ["FUNCTIONS", "CASTS", "operands", "keywords", "call"]


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def apply(x: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:  # inplace flags and the like
        return fn(x)

    return apply


def _gelu(x: torch.Tensor, approximate: str = "none", *_: Any, **__: Any) -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


def _with_alpha(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def apply(x: Any, y: Any, alpha: Any = 1, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("inplace", None)
        return fn(x, y, alpha=alpha, **kwargs) if alpha != 1 else fn(x, y, **kwargs)

    return apply


def _masked_fill(x: torch.Tensor, mask: torch.Tensor, value: Any) -> torch.Tensor:
    return torch.masked_fill(x, mask, value)


_UNARY = {
    "relu": F.relu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "neg": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "abs": torch.abs,
    "erf": torch.erf,
    "reciprocal": torch.reciprocal,
    "sin": torch.sin,
    "cos": torch.cos,
    "square": torch.square,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
}
_PLAIN = (
    "mul", "div", "pow", "maximum", "minimum", "where", "clamp", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor",
)  # fmt: skip

FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    **{name: _unary(fn) for name, fn in _UNARY.items()},
    **{name: getattr(torch, name) for name in _PLAIN},
    "gelu": _gelu,
    "add": _with_alpha(torch.add),
    "sub": _with_alpha(torch.sub),
    "rsub": _with_alpha(torch.rsub),
    "masked_fill": _masked_fill,
}
"""``fn`` -> the function of its operands (``cast`` and ``batch_norm`` are the kernel rule's own)."""

CASTS = ("to", "type_as", "float", "half", "bfloat16")
"""Cast spellings: the kernel's dtype says the result (the lowering writes them as ``cast``)."""


def operands(args: Any, inputs: Sequence[torch.Tensor], where: str) -> list[Any]:
    """The positional operands: ``{"in": i}`` -> ``inputs[i]``, ``{"scalar": v}`` -> ``v``."""
    if not isinstance(args, list):
        raise EmulationError(f"{where}: attribute 'args' is {args!r}, not a list of operands")
    return [_operand(a, inputs, where) for a in args]


def _operand(spec: Any, inputs: Sequence[torch.Tensor], where: str) -> Any:
    if isinstance(spec, dict) and set(spec) == {"scalar"}:
        return spec["scalar"]
    if isinstance(spec, dict) and set(spec) == {"in"}:
        i = spec["in"]
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(inputs):
            return inputs[i]
        raise EmulationError(f"{where}: operand {spec!r} names no input of the {len(inputs)} it has")
    raise EmulationError(f"{where}: operand {spec!r} is neither {{'in': i}} nor {{'scalar': v}}")


def keywords(kwargs: Any, inputs: Sequence[torch.Tensor], where: str) -> dict[str, Any]:
    """The keyword operands, ``{"in": i}`` read as inputs; ``inplace`` dropped."""
    if not isinstance(kwargs, dict):
        raise EmulationError(f"{where}: attribute 'kwargs' is {kwargs!r}, not a dict")
    out = {}
    for k, v in kwargs.items():
        if k == "inplace":
            continue
        out[k] = _operand(v, inputs, where) if isinstance(v, dict) else v
    return out


def call(fn: str, args: list[Any], kwargs: Mapping[str, Any], where: str) -> torch.Tensor:
    """``FUNCTIONS[fn](*args, **kwargs)``; a scalar where torch wants a tensor becomes a 0-dim one."""
    function = FUNCTIONS.get(fn)
    if function is None:
        raise EmulationError(
            f"{where}: elementwise fn {fn!r} is unknown; known: {', '.join(sorted(FUNCTIONS))}"
        )
    try:
        return function(*args, **kwargs)
    except TypeError:  # torch.lt(0, x), torch.logical_and(x, True): wrap the scalars as 0-dim tensors
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        wrapped = [torch.tensor(a, device=device) if isinstance(a, (bool, int, float)) else a for a in args]
        return function(*wrapped, **kwargs)
