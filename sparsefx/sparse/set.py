"""SET: drop the smallest kept weights, regrow at random among every position not kept after the drop.

The just-dropped positions are candidates too, so a dropped weight may come straight back; it then
keeps its value and optimizer state (see ``DynamicSparsityAlgorithm``).

>>> SET(sparsity=0.9).drop_fraction(0)
0.3
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config.schedules import UpdateSchedule
from .base import DynamicSparsityAlgorithm

__all__ = ["SET"]


class SET(DynamicSparsityAlgorithm):
    """Sparse Evolutionary Training; random regrowth comes from the algorithm's seeded generator."""

    name = "set"
    # config rules (read by ``sparsefx.config.parse`` through ``registry.config_rule``)
    default_update = UpdateSchedule(freq=100)
    default_drop_fraction = 0.3

    def update_mask(self, p: Tensor, mask: Tensor, sparsity: float) -> Tensor:
        score = torch.rand(p.shape, generator=self.generator).to(p.device)
        return self.drop_and_grow(p, mask, sparsity, score)
