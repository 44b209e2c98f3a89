"""The FLOPs ``count-flops`` recorded for a graph, evaluated at the shapes of the call being lowered.

``count-flops`` writes each matmul-like node's forward FLOPs as sympy expressions in ``batch`` and
``seq`` (``passes/meta.py``: ``FLOPS``, ``SYMBOLS``). The sizes of this call bind those symbols through
the graph's placeholders, whose shapes ``propagate-shapes`` left in ``node.meta["val"]``::

    >>> import sparsefx
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5, torch.ones(2, 8))
    >>> counted_flops(sm.graph_module, (torch.ones(2, 8),), {})  # the shapes it was counted at
    {'masked_linear': 64}
    >>> counted_flops(sm.graph_module, (torch.ones(3, 8),), {})  # other fixed shapes: no figures
    {}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from sparsefx.symbolic import evaluate

from ..meta import FLOPS, SYMBOLS

__all__ = ["counted_flops"]


def _bindings(gm: fx.GraphModule, flat: list[Any]) -> dict[str, int] | None:
    """``{batch | seq: size}`` from the placeholders' symbolic shapes and this call's tensors.

    None when a recorded size that no symbol stands for differs from this call's: the counts were
    made for other shapes.
    """
    names = gm.meta.get(SYMBOLS, {})
    env: dict[str, int] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, flat):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        if val.dim() != value.dim():
            return None
        for size, actual in zip(val.shape, value.shape):
            name = names.get(size.node.expr) if isinstance(size, torch.SymInt) else None
            if name is not None:
                env[str(name)] = int(actual)
                continue
            recorded = getattr(size.node, "hint", None) if isinstance(size, torch.SymInt) else size
            if recorded is None or int(recorded) != int(actual):
                return None
    return env


def counted_flops(gm: fx.GraphModule, args: tuple, kwargs: dict) -> dict[str, int]:
    """``{node name: sparse forward FLOPs}`` for this call, from ``count-flops``.

    Empty when the graph has no FLOP counts (a graph the compiler's passes did not run on), or when
    they were made for shapes other than this call's; lowering then uses its own ``2 * nnz * rows``.
    """
    rows = gm.meta.get(FLOPS)
    if not rows:
        return {}
    from .interpret import flat_inputs

    env = _bindings(gm, flat_inputs(gm, args, kwargs))
    if env is None:
        return {}
    out = {}
    for row in rows:
        try:
            out[row.node] = evaluate(row.sparse, env)
        except (TypeError, ValueError):  # a symbol this call does not bind: no figure
            continue
    return out
