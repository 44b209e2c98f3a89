"""The module tree a compiled model owns: a private copy of the user's tree, and graphs re-homed onto it.

``private_tree`` copies every module of a model but none of its tensors: each copy has its own
parameter, buffer, child and hook dicts, holding the same ``Parameter`` and buffer objects. A
module reached under two paths stays one module. Masks registered on the copy never reach the
user's model, while training still updates the user's parameters::

    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> tree = private_tree(model)
    >>> tree[0] is model[0], tree[0].weight is model[0].weight
    (False, True)

``rehome`` makes a captured ``GraphModule`` read and write that same tree: its parameter, buffer
and child dicts become the tree's, so a buffer the graph reassigns, a mask loaded from a
checkpoint or a parameter the forward never reads are the same objects for every graph and for
``state_dict``. Attributes only the graph has (fx's ``_tensor_constant*``, ``torch.export``'s lifted
constants and guard function) move to the graph module's own ``__dict__``, where they stay out of
``state_dict`` and ``move_extras`` moves their tensors with the model.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx, nn

__all__ = ["private_tree", "private_copy", "rehome", "graph_extras", "move_extras", "PRIVATE"]

PRIVATE = "_sparsefx_private"
EXTRAS = "sparsefx.graph_extras"


def private_tree(model: nn.Module) -> nn.Module:
    """A copy of every module of ``model`` sharing its tensors (see the module docstring)."""
    memo: dict[int, nn.Module] = {}

    def visit(module: nn.Module) -> nn.Module:
        if id(module) in memo:
            return memo[id(module)]
        clone = private_copy(module)
        memo[id(module)] = clone
        clone._modules = {k: None if c is None else visit(c) for k, c in module._modules.items()}
        return clone

    return visit(model)


def private_copy(module: nn.Module) -> nn.Module:
    """A shallow copy of ``module`` with its own parameter, buffer, child and hook dicts."""
    clone = copy.copy(module)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    clone._modules = dict(module._modules)
    for key, value in module.__dict__.items():
        if "hooks" in key and isinstance(value, dict):
            clone.__dict__[key] = copy.copy(value)
    clone.__dict__[PRIVATE] = True
    return clone


def rehome(gm: fx.GraphModule, tree: nn.Module) -> fx.GraphModule:
    """Point ``gm``'s parameter, buffer and child dicts at ``tree``'s; keep graph-only attributes apart."""
    targets = [str(n.target) for n in gm.graph.nodes if n.op in ("get_attr", "call_module")]
    extras = {target: _attr(gm, target) for target in targets if not _resolves(tree, target)}
    gm._parameters = tree._parameters
    gm._buffers = tree._buffers
    gm._non_persistent_buffers_set = tree._non_persistent_buffers_set
    gm._modules = tree._modules
    gm.training = tree.training
    for target, value in extras.items():
        _place(gm, target, value)
    for target in targets:
        if target not in extras and not _resolves(gm, target):
            # a plain attribute of the tree's root (``self.scale = torch.tensor(...)``): fx made it a
            # buffer of gm, which the shared buffer dict just dropped. Read the tree's, as eager does.
            _place(gm, target, _attr(tree, target))
    gm.meta[EXTRAS] = sorted(extras)
    return gm


def _place(gm: fx.GraphModule, target: str, value: Any) -> None:
    holder_path, _, name = target.rpartition(".")
    holder = gm.get_submodule(holder_path) if holder_path else gm
    object.__setattr__(holder, name, value)


def graph_extras(gm: fx.GraphModule) -> list[str]:
    """The attribute targets ``rehome`` kept on ``gm`` itself (lifted constants, guard functions)."""
    return list(gm.meta.get(EXTRAS, ()))


def move_extras(gm: fx.GraphModule, fn: Any) -> None:
    """Apply ``fn`` (``Module._apply``'s tensor map) to the graph-only tensors of ``gm``."""
    for target in graph_extras(gm):
        holder_path, _, name = target.rpartition(".")
        holder = gm.get_submodule(holder_path) if holder_path else gm
        value = holder.__dict__.get(name)
        if isinstance(value, torch.Tensor):
            object.__setattr__(holder, name, fn(value))


def _resolves(root: nn.Module, target: str) -> bool:
    try:
        _attr(root, target)
    except AttributeError:
        return False
    return True


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
