"""Sparsity hooks for loggers: ``sparsity/<name>/target`` and ``sparsity/<name>/actual`` scalars.

Works with ``torch.utils.tensorboard.SummaryWriter`` or anything with ``add_scalar(tag, value, step)``::

    >>> class Rows:
    ...     def __init__(self): self.rows = []
    ...     def add_scalar(self, tag, value, step): self.rows.append((tag, round(value, 2), step))
    >>> writer = Rows()
    >>> tensorboard_hook(writer)("fc.weight", 0.9, 0.9, 100)
    >>> writer.rows
    [('sparsity/fc.weight/target', 0.9, 100), ('sparsity/fc.weight/actual', 0.9, 100)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["tensorboard_hook"]


def tensorboard_hook(writer: Any, prefix: str = "sparsity") -> Callable[[str, float, float, int], None]:
    """A target-sparsity hook (see ``SparsityAlgorithm.register_target_sparsity_hook``) that logs scalars."""

    def hook(name: str, target: float, actual: float, step: int) -> None:
        writer.add_scalar(f"{prefix}/{name}/target", target, step)
        writer.add_scalar(f"{prefix}/{name}/actual", actual, step)

    return hook
