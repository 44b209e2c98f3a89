"""Static sparsity: masks fixed at initialisation.

>>> Static(sparsity=0.9).group.sparsity(0)
0.9
"""

from __future__ import annotations

from .base import SparsityAlgorithm

__all__ = ["Static"]


class Static(SparsityAlgorithm):
    """A fixed mask at a constant level ``0 <= s < 1``; ``update()`` only counts the step."""

    name = "static"

    def update(self) -> None:
        self._bind_pending()
        self.step += 1
