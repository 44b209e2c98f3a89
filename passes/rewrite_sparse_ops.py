"""Pass: rewrite every consumer of a selected weight into a masked-sparse op from ``sparsefx.ops``.

=====================================================  =================================
consumer of weight ``w``                               becomes
=====================================================  =================================
``nn.Linear`` call, ``F.linear``, ``aten.linear``      ``masked_linear(x, w, w_mask, b)``
``matmul``/``mm``/``@`` with ``w`` on either side      ``masked_matmul(x, w, w_mask, weight_first)``
``addmm(b, x, w)`` (GPT-2 Conv1D)                      ``masked_addmm(b, x, w, w_mask, beta, alpha)``
``nn.Conv1d/2d`` call, ``F.conv1d/2d``, ``aten.conv*``  ``masked_conv1d/2d(x, w, w_mask, ...)``
any other leaf module owning ``w``                     ``masked_module_call(mod, {name: mask}, args, kw)``
any other use of ``w``                                 that use reads ``apply_mask(w, w_mask)``
=====================================================  =================================

Which calls count as each dense op, and where their operands sit, comes from ``sparsefx.op_table``.
The rewritten ops keep their targets, so lowering finds them in the graph. The pass is
idempotent: weights already consumed by masked ops are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import fx, nn

from sparsefx import op_table, ops
from sparsefx.masks import mask_name

from .effects import eliminate_dead_code
from .manager import PassResult
from .meta import SELECTED

__all__ = ["RewriteSparseOps"]


@dataclass(frozen=True)
class RewriteSparseOps:
    """Route every read of a selected weight through its mask (see the table above)."""

    name: str = "rewrite-sparse-ops"
    requires: ClassVar[tuple[str, ...]] = (SELECTED,)
    ensures: ClassVar[tuple[str, ...]] = ()

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        selected = gm.meta.get(SELECTED, {})
        if not selected:
            return PassResult(gm, modified=False)
        graph = gm.graph
        rewritten = 0
        for node in list(graph.nodes):
            if node.op == "call_module":
                rewritten += self._rewrite_module_call(gm, node, selected)
        for node in list(graph.nodes):
            if node.op == "get_attr" and node.target in selected:
                rewritten += self._rewrite_weight_uses(gm, node)
        if rewritten:
            eliminate_dead_code(graph)
            gm.recompile()
        return PassResult(gm, modified=bool(rewritten), info={"rewritten": rewritten})

    # ------------------------------------------------------------------------------ module calls

    def _rewrite_module_call(self, gm: fx.GraphModule, node: fx.Node, selected: dict) -> int:
        mod = gm.get_submodule(node.target)
        names = [p for p in mod._parameters if f"{node.target}.{p}" in selected]
        if not names:
            return 0
        graph = gm.graph
        path = node.target
        with graph.inserting_before(node):
            attr = {
                p: graph.get_attr(f"{path}.{p}") if isinstance(getattr(mod, p, None), torch.Tensor) else None
                for p in ("weight", "bias")
            }
            masks = {p: graph.get_attr(mask_name(f"{path}.{p}")) for p in names}
            x = node.args[0] if node.args else next(iter(node.kwargs.values()), None)
            row = op_table.by_module(mod) if names == ["weight"] else None
            if row is not None and row.kind == "linear":
                new = graph.call_function(row.masked, (x, attr["weight"], masks["weight"], attr["bias"]))
            elif row is not None and row.masked is not None:
                new = self._conv_module(graph, mod, row, x, attr, masks["weight"])
            else:
                module = graph.get_attr(path)
                new = graph.call_function(ops.masked_module_call, (module, masks, node.args, node.kwargs))
        _replace(node, new)
        return 1

    @staticmethod
    def _conv_module(
        graph: fx.Graph, mod: nn.Module, row: op_table.MatmulOp, x: fx.Node, attr: dict, mask: fx.Node
    ) -> fx.Node:
        padding: Any = mod.padding
        if mod.padding_mode != "zeros":
            x = graph.call_function(
                F.pad, (x, mod._reversed_padding_repeated_twice), {"mode": mod.padding_mode}
            )
            padding = 0
        operands = {
            "input": x,
            "weight": attr["weight"],
            "mask": mask,
            "bias": attr.get("bias"),
            "stride": mod.stride,
            "padding": padding,
            "dilation": mod.dilation,
            "groups": mod.groups,
        }
        return graph.call_function(row.masked, row.masked_args(operands))

    # ------------------------------------------------------------------------------ weight reads

    def _rewrite_weight_uses(self, gm: fx.GraphModule, weight: fx.Node) -> int:
        graph = gm.graph
        mask: fx.Node | None = None
        masked_weight: fx.Node | None = None
        count = 0
        for user in list(weight.users):
            if _already_masked(user, weight):
                continue
            if mask is None:
                with graph.inserting_after(weight):
                    mask = graph.get_attr(mask_name(weight.target))
            with graph.inserting_before(user):
                new = self._named_op(graph, user, weight, mask)
            if new is not None:
                _replace(user, new)
            else:
                if masked_weight is None:
                    with graph.inserting_after(mask):
                        masked_weight = graph.call_function(ops.apply_mask, (weight, mask))
                user.replace_input_with(weight, masked_weight)
            count += 1
        return count

    @staticmethod
    def _named_op(graph: fx.Graph, user: fx.Node, w: fx.Node, m: fx.Node) -> fx.Node | None:
        """The masked op for ``user`` (a dense call reading ``w`` as its weight), from the op table."""
        if user.op == "call_function":
            row = op_table.by_function(user.target)
        elif user.op == "call_method":
            row = op_table.by_method(str(user.target))
        else:
            row = None
        if row is None or row.masked is None:
            return None
        operands = row.read_source(user.args, user.kwargs)
        if operands is None:
            return None
        if row.kind == "matmul":
            a, b = operands.pop("a"), operands.pop("b")
            if (a is w) == (b is w) or len(user.args) + len(user.kwargs) != 2:
                return None
            operands.update(input=b if a is w else a, weight=w, weight_first=a is w)
        elif operands["weight"] is not w or any(v is w for k, v in operands.items() if k != "weight"):
            return None
        operands["mask"] = m
        return graph.call_function(row.masked, row.masked_args(operands))


def _already_masked(user: fx.Node, weight: fx.Node) -> bool:
    if user.op != "call_function" or user.target not in op_table.MASKED_OPS:
        return False
    if user.target is ops.apply_mask:
        return user.args[0] is weight
    index = op_table.WEIGHT_ARG.get(user.target)
    return index is not None and user.args[index] is weight


def _replace(old: fx.Node, new: fx.Node) -> None:
    new.meta.update({k: v for k, v in old.meta.items() if k not in new.meta})
    old.replace_all_uses_with(new)
    old.graph.erase_node(old)
