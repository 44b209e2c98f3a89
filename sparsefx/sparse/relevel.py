"""Masks loaded at another level than the config's are brought to the config's level, with a message.

A static algorithm holds one level per parameter. When a state dict or checkpoint brings masks
at another level (the checkpoint was saved at 50% and the config now says 90%), the masks are
re-levelled as Cerebras does: to raise the level, the pruned positions stay pruned and the
smallest kept ``|w|`` are pruned too; to lower it, pruned positions regrow at random, at 0.
Dynamic algorithms are left alone: their level moves with their schedule, and their own state
(``sparsity.load_state_dict``) says where they are::

    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(10, 10)), 0.5)
    >>> sparse = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(10, 10)), 0.9)
    >>> _ = sparse.load_state_dict(sm.state_dict())
    >>> int(sparse.masks["0.weight"].sum())
    10
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..config.counts import keep_count
from .retarget import retarget_

__all__ = ["relevel", "static_targets"]

logger = logging.getLogger("sparsefx")


def static_targets(algorithm: Any) -> dict[str, tuple[float, int]]:
    """``{param: (level, seed)}`` for parameters of static algorithms whose mask is not at their level.

    Masks a config does not pin to a count are skipped: ``from_zeros`` and user-callable init,
    global pools (their count is shared) and balanced groups (their count is per group).
    """
    targets = {}
    for alg in getattr(algorithm, "algorithms", None) or [algorithm]:
        if alg.dynamic:
            continue
        for name, sp in alg.params.items():
            d = sp.decision
            if d.init_method == "from_zeros" or callable(d.init_method) or d.distribution == "global":
                continue
            if d.balance_out_groups or d.balance_in_groups or sp.param.device.type == "meta":
                continue
            if int(sp.mask.count_nonzero()) != keep_count(sp.mask.numel(), d.sparsity):
                targets[name] = (d.sparsity, d.seed)
    return targets


def relevel(
    algorithm: Any, model: nn.Module, *, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, tuple[int, int]]:
    """Re-level what ``static_targets`` lists, with one warning; returns ``{param: (nnz before, after)}``."""
    targets = static_targets(algorithm)
    changes: dict[str, tuple[int, int]] = {}
    for name, (level, seed) in targets.items():
        changes.update(retarget_(model, {name: level}, seed=seed, optimizer=optimizer))
    if not changes:
        return changes
    first, (before, after) = next(iter(changes.items()))
    numel = model.get_parameter(first).numel()
    more = f" and {len(changes) - 1} more parameter(s)" if len(changes) > 1 else ""
    logger.warning(
        "loaded masks are at another level than the config: %s was %.1f%% sparse (nnz %d), re-levelled to "
        "%.1f%% (nnz %d)%s; a raised level prunes the smallest |w|, a lowered one regrows at random, at 0",
        first,
        100 * (1 - before / numel),
        before,
        100 * targets[first][0],
        after,
        more,
    )
    return changes
