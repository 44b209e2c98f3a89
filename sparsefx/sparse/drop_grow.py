"""The drop-and-grow step shared by SET and RigL, with exact counts.

Keep ``k = int((1 - s) * numel)`` entries: the ``min(nnz, k) - n_drop`` kept entries with the
largest ``|w|`` survive (``n_drop = int(drop_fraction * min(nnz, k))``), and the rest of ``k`` is
grown among the positions that were inactive before the drop, by ``grow_score`` (larger first).
When the level rises above the current density (a dense start), the step only prunes to ``k``.
With a constant level the number of nonzeros never changes::

    >>> w = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.0, 2.0])
    >>> mask = w != 0
    >>> drop_and_grow(w, mask, 0.5, 1 / 3, torch.tensor([9.0, 0, 1, 0, 5, 0])).int().tolist()
    [1, 1, 0, 0, 0, 1]
"""

from __future__ import annotations

import torch
from torch import Tensor

from .init import keep_count, select_largest

__all__ = ["drop_and_grow", "magnitude_key"]


def drop_and_grow(
    weight: Tensor, mask: Tensor, sparsity: float, drop_fraction: float, grow_score: Tensor
) -> Tensor:
    """New mask: drop the smallest kept weights, grow the best-scored inactive positions."""
    flat_mask = mask.reshape(-1)
    k = keep_count(mask.numel(), sparsity)
    nnz = int(flat_mask.count_nonzero())
    if nnz > k:  # the level went up (or a dense start): prune to it by magnitude, grow nothing this step
        return select_largest(torch.where(flat_mask, magnitude_key(weight).reshape(-1) + 1, 0), k).reshape(
            mask.shape
        )
    n_drop = int(drop_fraction * min(nnz, k))
    survivors = min(nnz, k) - n_drop
    keep = select_largest(_keys(weight, flat_mask), survivors)
    inactive = int((~flat_mask).count_nonzero())
    grow = min(k - survivors, inactive)
    grown = select_largest(_keys(grow_score, ~flat_mask), grow)
    return (keep | grown).reshape(mask.shape)


def magnitude_key(t: Tensor) -> Tensor:
    """``|t|`` as non-negative int32 keys (float32 bits) ordered like the values; NaN, Inf count as 0."""
    magnitude = t.detach().float().abs().nan_to_num(nan=0.0, posinf=0.0)
    return magnitude.view(torch.int32)


def _keys(t: Tensor, where: Tensor) -> Tensor:
    """Flat keys: ``magnitude_key + 1`` (at most 0x7F800000, so int32 holds it) where ``where``, else 0."""
    return (magnitude_key(t).reshape(-1) + 1).masked_fill_(~where, 0)
