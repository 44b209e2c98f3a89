"""Gradual magnitude pruning: on each update step, keep the top-k of |w| at the scheduled level.

>>> gmp = GMP(sparsity={"type": "polynomial", "init": 0.0, "final": 0.9, "begin": 0, "end": 100})
>>> round(gmp.group.sparsity(50), 4)
0.7875
"""

from __future__ import annotations

from torch import Tensor

from ..config.schedules import Schedule, UpdateSchedule
from ..errors import ConfigError
from .base import DynamicSparsityAlgorithm
from .init import make_mask

__all__ = ["GMP"]


class GMP(DynamicSparsityAlgorithm):
    """Prune by magnitude on a schedule (Zhu and Gupta's cubic is ``type: polynomial``)."""

    name = "gmp"

    # config rules (read by ``sparsefx.config.parse`` through ``registry.config_rule``)
    default_update = UpdateSchedule(freq=1)
    default_drop_fraction = None  # no ``drop_fraction`` key

    @classmethod
    def check_config_sparsity(cls, schedule: Schedule, path: str) -> Schedule:
        """A level that changes over training: a constant one is ``static``'s."""
        if schedule.is_constant:
            raise ConfigError(
                f"{path}: gmp needs a schedule that changes over training, got constant {schedule(0)!r}; "
                "use static for a fixed level"
            )
        return schedule

    def update_mask(self, p: Tensor, mask: Tensor, sparsity: float) -> Tensor:
        return make_mask(
            p.masked_fill(~mask, 0.0),
            sparsity,
            "topk",
            balance_out_groups=self.group.balance_out_groups,
            balance_in_groups=self.group.balance_in_groups,
        )
