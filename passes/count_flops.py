"""Pass: count forward FLOPs (2 x MACs) per node, dense and sparse, as sympy expressions.

Sparse ops cost ``2 * nnz * rows``; matmuls between activations (attention scores and values)
stay dense, and so do layers that are not sparsified. Embedding lookups and elementwise ops are
not counted: the figures follow the matmul-only convention of published FLOP counts.
``gm.meta["sparsefx.flops"]`` holds a ``NodeFlops`` per counted node, and ``gm.meta["sparsefx.uncounted"]``
the names of matmul-like nodes it could not cost because shape propagation gave them no shapes
(the count is then partial)::

    >>> from sparsefx.passes.shape_prop import PropagateShapes
    >>> gm = fx.symbolic_trace(torch.nn.Linear(4, 3))
    >>> shaped = PropagateShapes(((torch.randn(8, 4),), {}), symbolic=True)(gm).graph_module
    >>> gm = CountFlops()(shaped).graph_module
    >>> gm.meta["sparsefx.flops"][0].dense, gm.meta["sparsefx.uncounted"]
    (24*batch, ())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import sympy
import torch
from torch import fx, nn

from sparsefx import op_table, ops
from sparsefx.config.counts import keep_count
from sparsefx.masks import param_of

from .manager import PassResult, attr_at
from .meta import FLOPS, SELECTED, SHAPES, UNCOUNTED
from .shape_prop import sym_expr

__all__ = ["CountFlops", "NodeFlops", "FLOPS", "mask_nnz", "weight_read", "op_name"]

_VIEWS = {"t", "transpose", "permute", "view", "reshape", "contiguous"}


@dataclass(frozen=True)
class NodeFlops:
    """Forward FLOPs of one node; ``param`` is the path (in its graph) of the weight it reads, if any."""

    node: str
    op: str
    param: str | None
    dense: sympy.Expr
    sparse: sympy.Expr


@dataclass(frozen=True)
class CountFlops:
    """Write ``gm.meta["sparsefx.flops"]``; needs ``propagate-shapes`` to have run with inputs."""

    name: str = "count-flops"
    requires: ClassVar[tuple[str, ...]] = (SHAPES,)
    ensures: ClassVar[tuple[str, ...]] = (FLOPS, UNCOUNTED)

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        rows: list[NodeFlops] = []
        uncounted: list[str] = []
        density: dict[fx.Node, sympy.Expr] = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is ops.apply_mask:
                density[node] = _density(gm, node.args[1])
                continue
            if _is_view(node) and node.args and node.args[0] in density:
                density[node] = density[node.args[0]]
                continue
            if "val" not in node.meta and _costable(gm, node):
                uncounted.append(node.name)
                continue
            row = _count(gm, node, density)
            if row is not None:
                rows.append(row)
        gm.meta[FLOPS] = tuple(rows)
        gm.meta[UNCOUNTED] = tuple(uncounted)
        return PassResult(gm, modified=False, info={"counted": len(rows), "uncounted": len(uncounted)})


def _costable(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` is an op this pass would cost, given shapes."""
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), (nn.Linear, nn.modules.conv._ConvNd))
    if node.op == "call_function":
        return node.target in op_table.MASKED or op_table.by_function(node.target) is not None
    if node.op == "call_method":
        return op_table.by_method(str(node.target)) is not None
    return False


def _count(gm: fx.GraphModule, node: fx.Node, density: dict) -> NodeFlops | None:
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor):
        return None
    if node.op == "call_function" and node.target in op_table.MASKED:
        return _masked(gm, node, out)
    dense = _dense(gm, node, out)
    if dense is None:
        return None
    scale = next((density[a] for a in node.args if isinstance(a, fx.Node) and a in density), sympy.Integer(1))
    return NodeFlops(node.name, op_name(node), weight_read(gm, node), dense, sympy.expand(dense * scale))


def weight_read(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """Path (inside ``gm``) of the largest parameter a node reads: a module's own, or a get_attr input."""
    found: list[tuple[str, torch.Tensor]] = []
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        found = [(f"{node.target}.{n}", p) for n, p in module.named_parameters()]
    for arg in node.all_input_nodes:
        source = arg.args[0] if arg.op == "call_function" and arg.target is ops.apply_mask else arg
        if isinstance(source, fx.Node) and source.op == "get_attr":
            value = attr_at(gm, str(source.target))
            if isinstance(value, nn.Parameter):
                found.append((str(source.target), value))
    return max(found, key=lambda item: item[1].dim())[0] if found else None


def _masked(gm: fx.GraphModule, node: fx.Node, out: torch.Tensor) -> NodeFlops:
    row = op_table.MASKED[node.target]
    nodes = row.operands(node.args)
    weight, mask = attr_at(gm, nodes.weight.target), attr_at(gm, nodes.mask.target)
    x = nodes.input.meta.get("val") if isinstance(nodes.input, fx.Node) else None
    values = op_table.Operands(x, weight, mask, None, nodes.flags)
    nnz = mask_nnz(mask, _decision(gm, str(nodes.weight.target)))
    x_numel = _numel(gm, x) if isinstance(x, torch.Tensor) else None
    dense, sparse = row.flops(values, nnz, x_numel, _numel(gm, out))
    return NodeFlops(node.name, node.target.__name__, str(nodes.weight.target), dense, sparse)


def mask_nnz(mask: torch.Tensor, decision: Any = None) -> int:
    """Kept entries of ``mask``; on the meta device, the count the decision's level implies.

    That count is ``keep_count`` (exact) of the whole tensor, or of each balance group times the
    number of groups::

        >>> from sparsefx.config import ParamDecision
        >>> meta = torch.empty(10, 10, dtype=torch.bool, device="meta")
        >>> mask_nnz(meta, ParamDecision("w", (10, 10), True, 0.9))
        10
        >>> mask_nnz(meta, ParamDecision("w", (10, 10), True, 0.75, balance_out_groups=10))
        20
    """
    if mask.device.type != "meta":
        return int(mask.count_nonzero())
    if decision is None:
        return mask.numel()
    groups = decision.balance_out_groups or decision.balance_in_groups or 1
    return groups * keep_count(mask.numel() // groups, decision.sparsity)


def _decision(gm: fx.GraphModule, weight_path: str) -> Any:
    return gm.meta.get(SELECTED, {}).get(weight_path)


def _dense(gm: fx.GraphModule, node: fx.Node, out: torch.Tensor) -> sympy.Expr | None:
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        if isinstance(mod, nn.Linear):
            return 2 * _numel(gm, out) * mod.in_features
        if isinstance(mod, nn.modules.conv._ConvNd):
            return 2 * _numel(gm, out) * (mod.weight.numel() // mod.out_channels)
        return None
    if node.op == "call_function":
        row = op_table.by_function(node.target)
    elif node.op == "call_method":
        row = op_table.by_method(str(node.target))
    else:
        row = None
    if row is None:
        return None
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in node.args]
    flops = op_table.dense_flops(row, vals, _numel(gm, out), lambda t, i: sym_expr(gm, t.shape[i]))
    return sympy.expand(flops) if row.kind == "sdpa" else flops


def _density(gm: fx.GraphModule, mask_node: fx.Node) -> sympy.Expr:
    mask = attr_at(gm, mask_node.target)
    nnz = mask_nnz(mask, _decision(gm, param_of(str(mask_node.target))))
    return sympy.Rational(nnz, max(1, mask.numel()))


def _is_view(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _VIEWS
    return node.op == "call_function" and getattr(node.target, "__name__", "") in _VIEWS


def _numel(gm: fx.GraphModule, t: torch.Tensor) -> sympy.Expr:
    return sympy.Mul(*[sym_expr(gm, d) for d in t.shape])


def op_name(node: fx.Node) -> str:
    """A short name for what ``node`` calls: the function name, or ``call_module:<path>``."""
    if node.op == "call_module":
        return f"call_module:{node.target}"
    return getattr(node.target, "__name__", str(node.target))
