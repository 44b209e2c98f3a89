"""Chains of layout changes become one kernel: a reshape, permute, slice or select whose result only
the next layout change reads moves no data of its own.

Each layout change is a copy of its input in a new order, so a chain of them (a GPT's ``chunk``, then
``unflatten`` to heads, then ``transpose``) is one copy in the composed order. Lowered one by one,
every link of the chain is a step of its own in a streaming program, sending its whole value again.
``fuse_layouts`` joins a layout kernel to the one reading it when that is its only reader and it is
not a program output: the joined kernel reads the first one's input and keeps the steps in order
(``attrs = {"fn": "chain", "steps": [...]}``, which ``runtime/semantics.py`` applies one by one).
Layout changes that read arrays or several inputs (``gather``, ``cat``, ``stack``) stay as they are::

    >>> from sparsefx.passes.lower.builder import Pending
    >>> def kernel(name, src, out, attrs):
    ...     return Pending(name, "layout", (src,), out, "float32", attrs)
    >>> chain = [
    ...     kernel("chunk_0", "qkv", (1, 8, 4), {"fn": "slice", "dim": 2, "start": 0, "end": 4, "step": 1}),
    ...     kernel("unflatten", "chunk_0", (1, 8, 2, 2), {"fn": "reshape", "shape": [1, 8, 2, 2]}),
    ...     kernel("transpose", "unflatten", (1, 2, 8, 2), {"fn": "permute", "dims": [0, 2, 1, 3]}),
    ... ]
    >>> [(p.name, p.inputs, [s["fn"] for s in p.attrs["steps"]]) for p in fuse_layouts(chain, [])]
    [('transpose', ('qkv',), ['slice', 'reshape', 'permute'])]
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

from sparsefx.runtime.op_kinds import CHAINED_LAYOUTS

from .builder import Pending

__all__ = ["fuse_layouts"]


def _joins(p: Pending) -> bool:
    return (
        p.op == "layout"
        and len(p.inputs) == 1
        and not p.payload
        and p.attrs.get("fn") in (*CHAINED_LAYOUTS, "chain")
    )


def _steps(p: Pending) -> list[dict]:
    return list(p.attrs["steps"]) if p.attrs["fn"] == "chain" else [dict(p.attrs)]


def fuse_layouts(pending: list[Pending], outputs: Iterable[str]) -> list[Pending]:
    """``pending`` with each layout change that only the next one reads joined to it (module docstring)."""
    kept_out = set(outputs)
    readers = Counter(v for p in pending for v in p.inputs)
    out: dict[str, Pending] = {}
    for p in pending:
        src = out.get(p.inputs[0]) if p.inputs else None
        if (
            _joins(p)
            and src is not None
            and _joins(src)
            and readers[src.name] == 1
            and src.name not in kept_out
        ):
            del out[src.name]
            attrs = {"fn": "chain", "steps": _steps(src) + _steps(p)}
            p = dataclasses.replace(p, inputs=src.inputs, attrs=attrs, source=f"{src.source}; {p.source}")
        out[p.name] = p
    return list(out.values())
