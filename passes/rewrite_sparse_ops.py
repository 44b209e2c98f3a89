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

The rewritten ops keep their targets, so lowering finds them in the graph. The pass is
idempotent: weights already consumed by masked ops are left alone.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from sparsefx import ops

from .effects import eliminate_dead_code
from .insert_masks import mask_name
from .manager import PassResult
from .select_params import SELECTED

__all__ = ["RewriteSparseOps"]

aten = torch.ops.aten

LINEAR_FNS: frozenset[Any] = frozenset({F.linear, aten.linear.default})
MATMUL_FNS: frozenset[Any] = frozenset(
    {torch.matmul, operator.matmul, torch.mm, aten.mm.default, aten.matmul.default}
)
MATMUL_METHODS: frozenset[str] = frozenset({"matmul", "mm", "__matmul__"})
ADDMM_FNS: frozenset[Any] = frozenset({torch.addmm, aten.addmm.default})
CONV_FNS: dict[Any, Callable[..., Any]] = {
    F.conv1d: ops.masked_conv1d,
    aten.conv1d.default: ops.masked_conv1d,
    F.conv2d: ops.masked_conv2d,
    aten.conv2d.default: ops.masked_conv2d,
}
CONV_MODULES: dict[type, Callable[..., Any]] = {nn.Conv1d: ops.masked_conv1d, nn.Conv2d: ops.masked_conv2d}


@dataclass(frozen=True)
class RewriteSparseOps:
    """Route every read of a selected weight through its mask (see the table above)."""

    name: str = "rewrite-sparse-ops"

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
            if _is_plain(mod, nn.Linear) and names == ["weight"]:
                new = graph.call_function(
                    ops.masked_linear, (x, attr["weight"], masks["weight"], attr["bias"])
                )
            elif type(mod) in CONV_MODULES and _is_plain(mod, type(mod)) and names == ["weight"]:
                new = self._conv_module(graph, mod, x, attr, masks["weight"])
            else:
                module = graph.get_attr(path)
                new = graph.call_function(ops.masked_module_call, (module, masks, node.args, node.kwargs))
        _replace(node, new)
        return 1

    @staticmethod
    def _conv_module(graph: fx.Graph, mod: nn.Module, x: fx.Node, attr: dict, mask: fx.Node) -> fx.Node:
        op = CONV_MODULES[type(mod)]
        padding: Any = mod.padding
        if mod.padding_mode != "zeros":
            x = graph.call_function(
                F.pad, (x, mod._reversed_padding_repeated_twice), {"mode": mod.padding_mode}
            )
            padding = 0
        args = (x, attr["weight"], mask, attr.get("bias"), mod.stride, padding, mod.dilation, mod.groups)
        return graph.call_function(op, args)

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
        args, kw = list(user.args), dict(user.kwargs)
        if user.op == "call_function" and user.target in LINEAR_FNS and _arg(args, kw, 1, "weight") is w:
            bias = _arg(args, kw, 2, "bias")
            return graph.call_function(ops.masked_linear, (_arg(args, kw, 0, "input"), w, m, bias))
        is_matmul = (user.op == "call_function" and user.target in MATMUL_FNS) or (
            user.op == "call_method" and user.target in MATMUL_METHODS
        )
        if is_matmul and len(args) == 2 and not kw and (args[0] is w) != (args[1] is w):
            first = args[0] is w
            other = args[1] if first else args[0]
            return graph.call_function(ops.masked_matmul, (other, w, m, first))
        if user.op == "call_function" and user.target in ADDMM_FNS and _arg(args, kw, 2, "mat2") is w:
            bias, x = _arg(args, kw, 0, "input"), _arg(args, kw, 1, "mat1")
            if x is w or bias is w:
                return None
            beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
            return graph.call_function(ops.masked_addmm, (bias, x, w, m, beta, alpha))
        if user.op == "call_function" and user.target in CONV_FNS and _arg(args, kw, 1, "weight") is w:
            if _arg(args, kw, 0, "input") is w:
                return None
            rest = [
                _arg(args, kw, i, k)
                for i, k in enumerate(("bias", "stride", "padding", "dilation", "groups"), 2)
            ]
            defaults = (None, 1, 0, 1, 1)
            rest = [d if v is None else v for v, d in zip(rest, defaults)]
            return graph.call_function(CONV_FNS[user.target], (_arg(args, kw, 0, "input"), w, m, *rest))
        return None


def _already_masked(user: fx.Node, weight: fx.Node) -> bool:
    if user.op != "call_function" or user.target not in ops.MASKED_OPS:
        return False
    if user.target is ops.apply_mask:
        return user.args[0] is weight
    return ops.WEIGHT_ARG.get(user.target) is not None and user.args[ops.WEIGHT_ARG[user.target]] is weight


def _is_plain(mod: nn.Module, cls: type) -> bool:
    """``mod`` is a ``cls`` whose forward is the stock one (a subclass may compute something else)."""
    return isinstance(mod, cls) and type(mod).forward is cls.forward


def _arg(args: list, kwargs: dict, index: int, name: str) -> Any:
    if index < len(args):
        return args[index]
    return kwargs.get(name)


def _replace(old: fx.Node, new: fx.Node) -> None:
    new.meta.update({k: v for k, v in old.meta.items() if k not in new.meta})
    old.replace_all_uses_with(new)
    old.graph.erase_node(old)
