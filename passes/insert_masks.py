"""Pass: give every selected parameter a persistent bool ``<param>_mask`` buffer on its owning module.

The mask comes from the parameter's decision (level at step 0, ``init_method``, derived seed,
balance groups); parameters whose decision has ``distribution == "global"`` get theirs from one
magnitude top-k over all of their pool in this graph. Owning modules shared with the user's model
are replaced by shallow copies that hold the same ``Parameter`` objects, so the user's model gains
no buffers. A mask that already exists is kept: running the pass twice changes nothing::

    >>> gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    >>> plan = load_config(0.5).resolve(gm.named_parameters())
    >>> gm = SelectSparseParams(plan)(gm).graph_module
    >>> int(InsertMasks()(gm).graph_module.weight_mask.sum())
    8
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from sparsefx.config import load_config  # noqa: F401  (doctest)
from sparsefx.shell import PRIVATE, private_copy
from sparsefx.sparse.distributions import global_magnitude_masks
from sparsefx.sparse.init import make_mask

from .manager import PassResult
from .select_params import SELECTED, SelectSparseParams  # noqa: F401  (doctest)

__all__ = ["InsertMasks", "mask_name", "own_module"]


def mask_name(param_path: str) -> str:
    """``"fc.weight"`` -> ``"fc.weight_mask"``."""
    return f"{param_path}_mask"


@dataclass(frozen=True)
class InsertMasks:
    """Register ``<param>_mask`` buffers for the parameters ``select-sparse-params`` marked."""

    name: str = "insert-masks"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        todo = {
            local: decision
            for local, decision in gm.meta.get(SELECTED, {}).items()
            if not hasattr(gm.get_submodule(local.rpartition(".")[0]), f"{local.rpartition('.')[2]}_mask")
        }
        pooled = {local: d for local, d in todo.items() if d.distribution == "global"}
        built = _make_masks(gm, {local: d for local, d in todo.items() if local not in pooled})
        built.update(_global_masks(gm, pooled))
        masks = {local: built[local] for local in todo}
        for local, mask in masks.items():
            owner_path, _, pname = local.rpartition(".")
            own_module(gm, owner_path).register_buffer(f"{pname}_mask", mask, persistent=True)
        return PassResult(gm, modified=bool(masks), info={"inserted": [mask_name(n) for n in masks]})


def _make_masks(gm: fx.GraphModule, todo: dict) -> dict[str, torch.Tensor]:
    """Masks for ``todo``, built on a thread pool: each is independent and torch releases the GIL."""

    def build(item: tuple[str, Any]) -> torch.Tensor:
        local, decision = item
        with torch.no_grad():
            return make_mask(
                gm.get_parameter(local),
                decision.sparsity,
                decision.init_method,
                seed=decision.seed,
                balance_out_groups=decision.balance_out_groups,
                balance_in_groups=decision.balance_in_groups,
            )

    workers = max(1, min(len(todo), torch.get_num_threads()))
    if workers == 1:
        return {local: build((local, d)) for local, d in todo.items()}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(todo, pool.map(build, todo.items())))


def _global_masks(gm: fx.GraphModule, todo: dict) -> dict[str, torch.Tensor]:
    """One magnitude top-k per pool; a parameter reached under two names counts once."""
    pools: dict[str, dict[str, Any]] = {}
    for local, decision in todo.items():
        pools.setdefault(decision.pool, {})[local] = decision
    masks: dict[str, torch.Tensor] = {}
    for members in pools.values():
        params = {local: gm.get_parameter(local) for local in members}
        first: dict[int, str] = {}
        for local, param in params.items():
            first.setdefault(id(param), local)
        level = next(iter(members.values())).sparsity
        with torch.no_grad():
            unique = global_magnitude_masks({local: params[local] for local in first.values()}, level)
        for local, param in params.items():
            mask = unique[first[id(param)]]
            masks[local] = mask if first[id(param)] == local else mask.clone()
    return masks


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
