"""A streamed matmul's parts that make a program output go to the host as they are made.

``split_streamed.split`` cuts a matmul too big for the mesh into parts, and a ``cat`` kernel puts them
back together for its readers. When no kernel reads the whole value and the model returns it (GPT-2's
LM head, cut into 14 parts on 64x64), a cat on the mesh would keep every part's result there, on its
producer's east column (``runtime/held.py``), until the last part is made, and then send all of it
again. So no cat kernel is made: each part is a program output of its own, leaving for the host as it
is made (``runtime/host.py``), and the host puts the parts together in its memory, a ``cat`` node of
the output tree (``runtime/outputs.py``)::

    >>> from sparsefx.passes.lower.builder import Pending
    >>> parts = [Pending(f"fc.part{k}", "sparse_matmul", ("x",), (2, 3), "float32", {}) for k in range(2)]
    >>> cat = Pending("fc", "layout", ("fc.part0", "fc.part1"), (2, 6), "float32", {"fn": "cat", "dim": 1})
    >>> pending, outputs, tree = join_on_host([*parts, cat], ["fc"], {"type": "tensor", "index": 0})
    >>> [p.name for p in pending], outputs
    (['fc.part0', 'fc.part1'], ['fc.part0', 'fc.part1'])
    >>> tree
    {'type': 'cat', 'dim': 1, 'items': [{'type': 'tensor', 'index': 0}, {'type': 'tensor', 'index': 1}]}
"""

from __future__ import annotations

from typing import Any

from sparsefx.runtime.outputs import split_outputs

from .builder import Pending

__all__ = ["join_on_host"]


def _joined(pending: list[Pending], outputs: list[str]) -> dict[str, Pending]:
    """The cats of streamed parts (``split_streamed.split``) that the program returns and no kernel reads."""
    read = {v for p in pending for v in p.inputs}
    return {
        p.name: p
        for p in pending
        if p.op == "layout"
        and p.attrs.get("fn") == "cat"
        and p.name in outputs
        and p.name not in read
        and p.inputs == tuple(f"{p.name}.part{k}" for k in range(len(p.inputs)))
    }


def join_on_host(
    pending: list[Pending], outputs: list[str], tree: Any
) -> tuple[list[Pending], list[str], Any]:
    """``pending`` without the cats the host does (module docstring), the program's outputs with their
    parts in their place, and the output tree with a ``cat`` node for each."""
    joins = _joined(pending, outputs)
    if not joins:
        return pending, outputs, tree
    new, tree = split_outputs(outputs, tree, {n: (cat.inputs, cat.attrs["dim"]) for n, cat in joins.items()})
    return [p for p in pending if p.name not in joins], new, tree
