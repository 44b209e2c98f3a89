"""The masks a plan's decisions ask for: each its own pattern, ``global`` pools one top-k each.

A decision with ``distribution == "global"`` gets its mask from one magnitude top-k over every
parameter of its pool; any other gets ``init.make_mask`` at its level, with its ``init_method``,
seed and balance groups. The ``insert-masks`` pass and ``SparsityAlgorithm.bind`` both build their
masks here::

    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    >>> plan = sparsefx.config.load_config(0.75).resolve(model.named_parameters())
    >>> {name: int(mask.sum()) for name, mask in make_masks(model, plan.sparse).items()}
    {'0.weight': 4, '1.weight': 4}
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config.distributions import global_magnitude_masks
from .init import make_mask

if TYPE_CHECKING:
    from ..config import ParamDecision

__all__ = ["make_masks"]


def make_masks(root: nn.Module, decisions: Mapping[str, ParamDecision]) -> dict[str, Tensor]:
    """``{name: bool mask}`` for ``{name of a parameter of root: its ParamDecision}``, in that order.

    Independent masks are built on a thread pool (torch releases the GIL). A parameter reached
    under two names in one pool counts once; the second name gets a copy of its mask.
    """
    pooled = {name: d for name, d in decisions.items() if d.distribution == "global"}
    own = {name: d for name, d in decisions.items() if name not in pooled}
    built = _own_masks(root, own)
    built.update(_global_masks(root, pooled))
    return {name: built[name] for name in decisions}


def _own_masks(root: nn.Module, decisions: Mapping[str, ParamDecision]) -> dict[str, Tensor]:
    def build(item: tuple[str, ParamDecision]) -> Tensor:
        name, decision = item
        with torch.no_grad():
            return make_mask(
                root.get_parameter(name),
                decision.sparsity,
                decision.init_method or "random",
                seed=decision.seed,
                balance_out_groups=decision.balance_out_groups,
                balance_in_groups=decision.balance_in_groups,
            )

    workers = max(1, min(len(decisions), torch.get_num_threads()))
    if workers == 1:
        return {name: build((name, d)) for name, d in decisions.items()}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(decisions, pool.map(build, decisions.items())))


def _global_masks(root: nn.Module, decisions: Mapping[str, ParamDecision]) -> dict[str, Tensor]:
    """One magnitude top-k per pool, at the level of the pool's first member."""
    pools: dict[str | None, dict[str, ParamDecision]] = {}
    for name, decision in decisions.items():
        pools.setdefault(decision.pool, {})[name] = decision
    masks: dict[str, Tensor] = {}
    for members in pools.values():
        params = {name: root.get_parameter(name) for name in members}
        first: dict[int, str] = {}
        for name, param in params.items():
            first.setdefault(id(param), name)
        level = next(iter(members.values())).sparsity
        with torch.no_grad():
            unique = global_magnitude_masks({name: params[name] for name in first.values()}, level)
        for name, param in params.items():
            mask = unique[first[id(param)]]
            masks[name] = mask if first[id(param)] == name else mask.clone()
    return masks
