"""Which graph nodes have side effects, and dead-code elimination that keeps them.

fx's own ``eliminate_dead_code`` keeps only the calls it knows to be impure, so an in-place update
whose result nothing reads (``self.running.mul_(0.9).add_(x)``, ``buf.copy_(y)``) would vanish from
the graph. Here a node is kept when it may write to memory::

    >>> g = fx.Graph()
    >>> x = g.placeholder("x")
    >>> updated, unused = g.call_method("add_", (x, 1)), g.call_method("add", (x, 1))
    >>> _ = g.output(x)
    >>> eliminate_dead_code(g), [n.target for n in g.nodes if n.op == "call_method"]
    (True, ['add_'])
"""

from __future__ import annotations

import operator

import torch
from torch import fx

__all__ = ["has_side_effects", "eliminate_dead_code", "INPLACE_OPERATORS"]

_WRITES = frozenset({operator.setitem, operator.delitem, setattr, delattr})

INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
    operator.imatmul, operator.iconcat,
})  # fmt: skip
"""``h += 1`` as fx records it: on a tensor, it writes ``h`` in place."""


def has_side_effects(node: fx.Node) -> bool:
    """True when running ``node`` may change state beyond its own output (in-place ops, asserts, ...)."""
    if node.op in ("placeholder", "output"):
        return True
    if node.op == "call_module":
        return True  # a module may update its own buffers (BatchNorm's running statistics)
    if node.op == "call_method":
        return _inplace_name(str(node.target)) or node.kwargs.get("inplace") is True
    if node.op != "call_function":
        return False
    target = node.target
    if target in _WRITES or target in INPLACE_OPERATORS or node.kwargs.get("inplace") is True:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    return _inplace_name(getattr(target, "__name__", "")) or node.is_impure()


def eliminate_dead_code(graph: fx.Graph) -> bool:
    """Remove nodes whose results are unused and that have no side effects; True if any were removed."""
    return graph.eliminate_dead_code(is_impure_node=has_side_effects)


def _inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__") and not name.startswith("_")
