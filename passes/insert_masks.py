"""Pass: give every selected parameter a persistent bool ``<param>_mask`` buffer on its owning module.

The mask comes from the parameter's decision (level at step 0, ``init_method``, derived seed,
balance groups); parameters whose decision has ``distribution == "global"`` get theirs from one
magnitude top-k over all of their pool in this graph (``sparse.make_masks`` builds both). Owning
modules shared with the user's model are replaced by shallow copies that hold the same ``Parameter``
objects, so the user's model gains no buffers. A mask that already exists is kept: running the pass
twice changes nothing::

    >>> from sparsefx.config import load_config
    >>> from sparsefx.passes.select_params import SelectSparseParams
    >>> gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    >>> plan = load_config(0.5).resolve(gm.named_parameters())
    >>> gm = SelectSparseParams(plan)(gm).graph_module
    >>> int(InsertMasks()(gm).graph_module.weight_mask.sum())
    8
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import fx, nn

from sparsefx.masks import has_mask, mask_name, owner_and_attr
from sparsefx.shell import PRIVATE, private_copy
from sparsefx.sparse.make_masks import make_masks

from .manager import PassResult
from .meta import SELECTED

__all__ = ["InsertMasks", "own_module"]


@dataclass(frozen=True)
class InsertMasks:
    """Register ``<param>_mask`` buffers for the parameters ``select-sparse-params`` marked."""

    name: str = "insert-masks"
    requires: ClassVar[tuple[str, ...]] = (SELECTED,)
    ensures: ClassVar[tuple[str, ...]] = ()

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        todo = {local: d for local, d in gm.meta.get(SELECTED, {}).items() if not has_mask(gm, local)}
        masks = make_masks(gm, todo)
        for local, mask in masks.items():
            owner_path, attr = owner_and_attr(local)
            own_module(gm, owner_path).register_buffer(mask_name(attr), mask, persistent=True)
        return PassResult(gm, modified=bool(masks), info={"inserted": [mask_name(n) for n in masks]})


def own_module(root: nn.Module, path: str) -> nn.Module:
    """The module at ``path``, after replacing it and its ancestors by copies private to ``root``.

    A copy has its own parameter, buffer and child dicts but the same ``Parameter`` objects, so
    training still updates the user's parameters while new buffers land only in ``root``.
    """
    module = root
    for part in path.split(".") if path else []:
        child = module._modules[part]
        if not getattr(child, PRIVATE, False):
            child = private_copy(child)
            module._modules[part] = child
        module = child
    return module
