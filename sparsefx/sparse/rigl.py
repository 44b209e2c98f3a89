"""RigL: drop the smallest kept weights, regrow where the dense gradient is largest.

Regrowth ranks every position not kept after the drop, the just-dropped ones included (RigL's
Algorithm 1): a dropped weight whose gradient is large comes straight back, with its value and
optimizer state, since it was never pruned.

The dense gradient is the full gradient before masking, summed over the micro-batches since the
last optimizer step, and averaged over ranks under DDP before masks change.

    >>> RigL(sparsity=0.9).update_schedule.freq
    100
"""

from __future__ import annotations

from torch import Tensor

from ..config.schedules import UpdateSchedule
from ..errors import ConfigError
from .base import DynamicSparsityAlgorithm

__all__ = ["RigL"]


class RigL(DynamicSparsityAlgorithm):
    """Rigging the Lottery (Evci et al., 2020)."""

    name = "rigl"
    # config rules (read by ``sparsefx.config.parse`` through ``registry.config_rule``)
    default_update = UpdateSchedule(freq=100)
    default_drop_fraction = 0.3
    needs_dense_grad = True

    def update_mask(self, p: Tensor, mask: Tensor, sparsity: float) -> Tensor:
        assert self.current is not None
        name = self.current.name
        grad = self.dense_grad(name)
        if grad is None:
            raise ConfigError(
                f"RigL update for {name!r} found no dense gradient; call loss.backward() before "
                "optimizer.step() "
                "on update steps"
            )
        return self.drop_and_grow(p, mask, sparsity, grad)
