"""The non-tensor arguments a program was lowered with, and the check that a run passes the same ones.

A program computes for the call it was lowered for: flags, sizes and strings (``use_cache=False``,
``return_dict=True``) are baked in, only tensors stream in. ``constant_inputs`` records, at lowering,
every forward parameter whose value (given or its default) is ``None``, a bool, an int, a finite float
or a string, as ``program.meta["constant_inputs"]`` (plain JSON, so it survives program files and text)::

    >>> def forward(x, flag=False, *, mode="a"): ...
    >>> constant_inputs(forward, (torch.ones(2), True), {})
    {'flag': {'value': True, 'position': 1}, 'mode': {'value': 'a', 'position': None}}

A run may pass such an argument (by name, or at its position) only with the value it was lowered with;
``check_constant`` names the argument, the value given and the lowered one otherwise. Leaving one out
runs the program as lowered.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from sparsefx.errors import EmulationError

__all__ = ["constant_inputs", "check_constant", "is_constant", "constant_at", "KEY"]

KEY = "constant_inputs"
"""The ``program.meta`` key of the record."""


def is_constant(value: Any) -> bool:
    """Whether ``value`` is a non-tensor argument a program records: None, bool, int, finite float, str."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def constant_inputs(forward: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, dict[str, Any]]:
    """``{name: {"value": v, "position": i or None}}`` for the constants of a call (module docstring)."""
    try:
        signature = inspect.signature(forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):  # no signature, or a call it does not take: record what was given
        given = {f"args[{i}]": (a, i) for i, a in enumerate(args)} | {k: (v, None) for k, v in kwargs.items()}
        return {k: {"value": v, "position": i} for k, (v, i) in given.items() if is_constant(v)}
    out: dict[str, dict[str, Any]] = {}
    positional = True
    for i, p in enumerate(signature.parameters.values()):
        if p.kind == p.VAR_POSITIONAL:
            positional = False
            continue
        if p.kind == p.VAR_KEYWORD:
            extra = bound.arguments.get(p.name, {})
            out |= {k: {"value": v, "position": None} for k, v in extra.items() if is_constant(v)}
            continue
        positional = positional and p.kind != p.KEYWORD_ONLY
        value = bound.arguments.get(p.name, p.default)
        if value is not p.empty and is_constant(value):
            out[p.name] = {"value": value, "position": i if positional else None}
    return out


def constant_at(constants: dict[str, Any], position: int) -> str | None:
    """The name of the constant lowered at ``position`` among the positional arguments, if any."""
    return next((k for k, c in constants.items() if c.get("position") == position), None)


def check_constant(constants: dict[str, Any], name: str, value: Any) -> None:
    """Accept ``value`` for argument ``name`` only if the program was lowered with the same one."""
    if name not in constants:
        lowered = ", ".join(f"{k}={c['value']!r}" for k, c in constants.items()) or "none"
        raise EmulationError(
            f"argument {name!r} is {value!r}, and the program was lowered without it (its non-tensor "
            f"arguments: {lowered}); lower the model again for this call"
        )
    lowered = constants[name]["value"]
    if type(value) is not type(lowered) or value != lowered:
        raise EmulationError(
            f"argument {name!r} is {value!r}; the program was lowered with {name}={lowered!r}, which it "
            f"computes with: pass {lowered!r} (or leave it out), or lower the model again for {value!r}"
        )
