"""Results derived from a program's arrays, computed once and kept while the arrays live.

A program runs many times on new inputs, but much of what the executors derive from it does not
depend on the inputs: a sparse matmul's merged matrix, its layout, which partial sums share which
links. ``kept(owner, key, build)`` returns ``build()``'s result, computed on the first call for that
``owner`` (a payload tensor, compared by identity) and ``key``, and dropped when the owner is freed.
An owner changed in place (its version counter moves) is derived again. ``owner=None`` keeps results
that depend on ``key`` alone (a geometry), the most recently used ones, at most ``GEOMETRY_BYTES`` of
tensors in all::

    >>> w = torch.ones(3)
    >>> calls = []
    >>> kept(w, "sum", lambda: calls.append(1) or float(w.sum()))
    3.0
    >>> kept(w, "sum", lambda: calls.append(1) or float(w.sum())), len(calls)
    (3.0, 1)
    >>> w.add_(1) is w and kept(w, "sum", lambda: calls.append(1) or float(w.sum())), len(calls)
    (6.0, 2)
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from .program import Kernel, ProgramData

__all__ = ["kept", "kept_for", "GEOMETRY_BYTES"]

T = TypeVar("T")

GEOMETRY_BYTES = 1 << 30
"""How many bytes of tensors the owner-less results may hold (least recently used dropped first)."""

_BY_OWNER: dict[int, tuple[weakref.ref, int, dict[Hashable, Any]]] = {}
_BY_KEY: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
_held = [0]  # bytes in _BY_KEY


def kept(owner: torch.Tensor | None, key: Hashable, build: Callable[[], T]) -> T:
    """``build()``, computed once per ``owner`` (by identity and version) and ``key`` (module docstring)."""
    if owner is None:
        if key in _BY_KEY:
            _BY_KEY.move_to_end(key)
            return _BY_KEY[key][0]
        value = build()
        size = _nbytes(value)
        if size <= GEOMETRY_BYTES:
            _BY_KEY[key] = (value, size)
            _held[0] += size
            while _held[0] > GEOMETRY_BYTES:
                _held[0] -= _BY_KEY.popitem(last=False)[1][1]
        return value
    entry = _BY_OWNER.get(id(owner))
    if entry is None or entry[0]() is not owner or entry[1] != owner._version:
        if entry is None or entry[0]() is not owner:
            weakref.finalize(owner, _BY_OWNER.pop, id(owner), None)
        entry = _BY_OWNER[id(owner)] = (weakref.ref(owner), owner._version, {})
    results = entry[2]
    if key not in results:
        results[key] = build()
    return results[key]


def kept_for(program: ProgramData, k: Kernel, key: tuple, build: Callable[[], T]) -> T:
    """``kept`` for what a kernel's structure determines: a sparse matmul's results are owned by its
    ``values`` array and keyed by the identity and version of every array but its bias (another array
    swapped in is derived again); any other kernel's by its geometry (op, shape, region, mesh and the
    attributes that shape its data). ``key`` names the result and anything else it depends on."""
    owner, arrays = None, ()
    if k.op == "sparse_matmul" and not k.attrs.get("all_ones") and "values" in k.arrays:
        owner = program.arrays[k.arrays["values"]]
        tensors = (program.arrays[name] for role, name in sorted(k.arrays.items()) if role != "bias")
        arrays = tuple((id(t), t._version) for t in tensors)
    r, a, mesh = k.region, k.attrs, program.mesh
    shape = (k.op, k.shape, r.x, r.y, r.width, r.height, mesh.width, mesh.height)
    named = ("lanes", "in_features", "out_features", "kind", "all_ones", "drift", "row_tiles")
    attrs = tuple(a.get(n) for n in named)
    return kept(owner, shape + attrs + arrays + key, build)


def _nbytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or tuples, lists and dataclasses of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0
