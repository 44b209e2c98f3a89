"""Name every argument of a graph call by the called op's real signature, whatever the spelling.

``F.batch_norm(x, mean, var, weight, bias)``, ``torch.batch_norm(x, weight, bias, mean, var, ...)`` and
``aten.batch_norm.default(...)`` share one canonical name but not one argument order. A lowering rule
reads arguments by name from ``bind``, which matches them to the signature of the exact target: an
aten overload's schema, a Python function's ``inspect.signature``, or a torch builtin's schemas (the
first whose parameter types fit the values). A schema's ``self`` is named ``input``, as torch's Python
functions name it, and defaults are filled in::

    >>> x = torch.ones(2, 3)
    >>> bound = bind(torch.ops.aten.sum.dim_IntList, (x, [1]), {})
    >>> {k: v for k, v in bound.items() if k != "input"}
    {'dim': [1], 'keepdim': False, 'dtype': None}
    >>> sorted(bind(torch.sum, (x,), {"dtype": torch.float64}))
    ['dtype', 'input']
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.operator_schemas import (
    _torchscript_schema_to_signature,
    get_signature_for_torch_op,
    type_matches,
)

__all__ = ["bind", "method_target"]


def method_target(name: str) -> Any:
    """The function whose signature a ``call_method`` of ``name`` binds to (``x.sum(1)``: ``torch.sum``)."""
    tensor_fn = getattr(torch.Tensor, name, None)
    if tensor_fn is not None and _python_signature(tensor_fn) is not None:
        return tensor_fn  # Tensor.split and friends are Python methods with their own signatures
    return getattr(torch, name, None) or tensor_fn


def bind(
    target: Any,
    args: tuple,
    kwargs: dict,
    is_data: Callable[[Any], bool] | None = None,
    method: bool = False,
) -> dict | None:
    """``{name: value}`` for every argument of ``target(*args, **kwargs)``, defaults included; None when
    no signature of ``target`` accepts these arguments. ``is_data(v)`` says which values stand for
    tensors (lowered data values are not tensors themselves). ``method``: the call was
    ``args[0].name(*args[1:])``, so ``args[0]`` is ``self`` wherever the function puts it
    (``x.where(c, y)`` is ``torch.where(c, x, y)``)."""
    is_data = is_data or (lambda v: isinstance(v, torch.Tensor))
    if isinstance(target, torch._ops.OpOverload):
        return _bind_schema(target._schema, args, kwargs)
    sig = _python_signature(target)
    signatures = [sig] if sig is not None else _torch_signatures(target)
    for kw in (kwargs, {_NUMPY_NAMES.get(k, k): v for k, v in kwargs.items()}):
        for candidate in signatures:
            bound = _try_bind(candidate, args, kw, method)
            if bound is not None and (sig is not None or _types_fit(candidate, bound, is_data)):
                bound.apply_defaults()
                return {("input" if k == "self" else k): v for k, v in bound.arguments.items()}
    return None


_NUMPY_NAMES = {"axis": "dim", "keepdims": "keepdim"}
"""NumPy spellings torch's builtins accept for some arguments (``torch.concatenate(ts, axis=1)``)."""


def _python_signature(fn: Any) -> inspect.Signature | None:
    """A Python function's signature, or None for builtins and ``*args`` wrappers (``boolean_dispatch``)."""
    from torch._jit_internal import boolean_dispatched

    if fn in boolean_dispatched:
        fn = boolean_dispatched[fn]["if_true"]
    try:
        sig = inspect.signature(inspect.unwrap(fn))
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return None
    return sig


def _torch_signatures(target: Any) -> list[inspect.Signature]:
    """A torch builtin's signatures: from its TorchScript schemas, else from the aten op of its name."""
    try:
        found = list(get_signature_for_torch_op(target) or [])
    except (RuntimeError, TypeError, ValueError, AttributeError):
        found = []
    if found:
        return found
    packet = getattr(torch.ops.aten, getattr(target, "__name__", ""), None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return []
    return [_torchscript_schema_to_signature(getattr(packet, o)._schema) for o in packet.overloads()]


def _try_bind(
    sig: inspect.Signature, args: tuple, kwargs: dict, method: bool
) -> inspect.BoundArguments | None:
    """``sig.bind``; for a method call, ``args[0]`` binds to ``self`` (``input``) and the rest to the
    other parameters in order."""
    try:
        if not method or not args:
            return sig.bind(*args, **kwargs)
        params = list(sig.parameters.values())
        self_name = next(
            (p.name for p in params if p.name in ("self", "input")), params[0].name if params else ""
        )
        rest = sig.replace(parameters=[p for p in params if p.name != self_name])
        partial = rest.bind(*args[1:], **kwargs)
        return sig.bind_partial(**{self_name: args[0]}, **partial.arguments)
    except (TypeError, ValueError):
        return None


def _type_of(value: Any, is_data: Callable[[Any], bool]) -> Any:
    if is_data(value) or isinstance(value, torch.Tensor):
        return torch.Tensor
    if isinstance(value, (list, tuple)):
        if not value:
            return list[int]
        if all(is_data(v) or isinstance(v, torch.Tensor) for v in value):
            return list[torch.Tensor]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return list[int]
    return type(value)


def _types_fit(sig: inspect.Signature, bound: inspect.BoundArguments, is_data: Callable[[Any], bool]) -> bool:
    """Whether each value fits its parameter's annotation (``torch.sum``'s ``dim`` overload wants ints)."""
    for name, value in bound.arguments.items():
        annotation = sig.parameters[name].annotation
        if value is None or annotation is inspect.Parameter.empty:
            continue
        try:
            if not type_matches(annotation, _type_of(value, is_data)):
                return False
        except (TypeError, AttributeError):
            continue
    return True


def _bind_schema(schema: Any, args: tuple, kwargs: dict) -> dict | None:
    arguments = list(schema.arguments)
    positional = [a for a in arguments if not a.kwarg_only]
    if len(args) > len(positional) or any(k not in {a.name for a in arguments} for k in kwargs):
        return None
    out: dict[str, Any] = {}
    for i, a in enumerate(arguments):
        name = "input" if a.name == "self" else a.name
        if i < len(args) and not a.kwarg_only:
            out[name] = args[i]
        elif a.name in kwargs:
            out[name] = kwargs[a.name]
        elif a.has_default_value():
            out[name] = a.default_value
        else:
            return None
    return out
