"""An activation after a sparse matmul becomes the matmul's epilogue, on the PE where each sum ends up.

A GELU or ReLU that reads only a sparse matmul's result, and is its only reader, is a kernel of its
own otherwise: in a streaming program a step that sends the whole result again through column 0 for
one function of each element (GPT-2 small's MLP: 6,144 wavelets a lane at 128 tokens, 98,304 at
2,048). Joined to the matmul (``attrs["epilogue"] = {"fn", "kwargs"}``), the function runs on the PE
where each output's sum ends up, once the sum is whole (its own column in a streaming program, the
region's east edge in a pipelined one), as a task of ``cost.epilogue_cycles`` on that PE; the
matmul's readers read the activation. Functions that keep zero at zero qualify, so a message whose
sum is all zero stays filtered::

    >>> from sparsefx.passes.lower.builder import Pending
    >>> fc = Pending("fc", "sparse_matmul", ("x",), (4, 8), "float32", {"kind": "linear"})
    >>> act = Pending("act", "elementwise", ("fc",), (4, 8), "float32",
    ...               {"fn": "gelu", "args": [{"in": 0}], "kwargs": {"approximate": "none"}})
    >>> out = Pending("out", "elementwise", ("act", "x"), (4, 8), "float32", {"fn": "add"})
    >>> [(p.name, p.inputs, p.attrs.get("epilogue")) for p in fuse_epilogues([fc, act, out], ["out"])]
    [('fc', ('x',), {'fn': 'gelu', 'kwargs': {'approximate': 'none'}}), ('out', ('fc', 'x'), None)]
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

from sparsefx.runtime.cost import EPILOGUES

from .builder import Pending

__all__ = ["fuse_epilogues"]

JOINED_KINDS = ("linear", "addmm", "matmul")
"""Sparse matmuls whose outputs are features of rows (a convolution's are channels, sent together)."""


def _activation(p: Pending) -> bool:
    return (
        p.op == "elementwise"
        and len(p.inputs) == 1
        and not p.payload
        and p.attrs.get("fn") in EPILOGUES
        and p.attrs.get("args") == [{"in": 0}]
        and all(not isinstance(v, dict) for v in p.attrs.get("kwargs", {}).values())
    )


def fuse_epilogues(pending: list[Pending], outputs: Iterable[str]) -> list[Pending]:
    """``pending`` with each activation that alone reads a sparse matmul joined to it (module
    docstring); the activation's readers read the matmul."""
    kept_out = set(outputs)
    readers = Counter(v for p in pending for v in p.inputs)
    by_name = {p.name: p for p in pending}
    renamed: dict[str, str] = {}
    out: list[Pending] = []
    at: dict[str, int] = {}  # each kept kernel's place in ``out``
    for p in pending:
        src = by_name.get(p.inputs[0]) if p.inputs else None
        if (
            _activation(p)
            and src is not None
            and src.op == "sparse_matmul"
            and src.attrs.get("kind") in JOINED_KINDS
            and "epilogue" not in src.attrs
            and readers[src.name] == 1
            and src.name not in kept_out
            and p.name not in kept_out
            and (src.shape, src.dtype) == (p.shape, p.dtype)
        ):
            epilogue = {"fn": p.attrs["fn"], "kwargs": dict(p.attrs.get("kwargs", {}))}
            joined = dataclasses.replace(
                src, attrs={**src.attrs, "epilogue": epilogue}, source=f"{src.source}; {p.source}"
            )
            out[at[src.name]] = by_name[src.name] = joined
            renamed[p.name] = src.name
            continue
        if any(v in renamed for v in p.inputs):
            p = dataclasses.replace(p, inputs=tuple(renamed.get(v, v) for v in p.inputs))
        at[p.name], by_name[p.name] = len(out), p
        out.append(p)
    return out
