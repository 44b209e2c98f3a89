"""Static sparsity: masks fixed at initialisation.

>>> Static(sparsity=0.9).group.sparsity(0)
0.9
"""

from __future__ import annotations

from ..config.schedules import Constant, Cycling, Schedule
from ..errors import ConfigError
from .base import SparsityAlgorithm

__all__ = ["Static"]


class Static(SparsityAlgorithm):
    """A fixed mask at a constant level ``0 <= s < 1``; ``update()`` only counts the step."""

    name = "static"

    # config rules (read by ``sparsefx.config.parse`` through ``registry.config_rule``)
    updates_mask = False  # an ``update`` key is an error
    default_drop_fraction = None  # no ``drop_fraction`` key

    @classmethod
    def check_config_sparsity(cls, schedule: Schedule, path: str) -> Schedule:
        """A constant level only; a cycling schedule counts as its first value.

        >>> Static.check_config_sparsity(Cycling((0.5,)), "sparsity")
        Constant(value=0.5)
        """
        if not schedule.is_constant:
            raise ConfigError(
                f"{path}: static sparsity needs a constant level, got a {schedule.kind} schedule; "
                "use algorithm: gmp for a level that changes over training"
            )
        if isinstance(schedule, Cycling):
            return Constant(schedule.values[0])
        return schedule

    def update(self) -> None:
        self._bind_pending()
        self.step += 1
