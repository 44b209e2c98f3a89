"""The drop-and-grow step shared by SET and RigL, with exact counts.

Keep ``k = keep_count(numel, s)`` entries. Drop: the ``keep_count(nnz, drop_fraction)`` kept
entries with the largest ``|w|`` survive (``int((1 - drop_fraction) * nnz)``, evaluated exactly).
Grow: the other ``k - survivors`` are the best ``grow_score`` (larger first) among every position
not kept after the drop, the just-dropped ones included (RigL's Algorithm 1 grows outside
``theta`` minus ``I_drop``; Cerebras applies ``make_mask_grow_maximum`` to the dropped mask), so a
dropped weight with a large score comes straight back. When the level rises above the current
density (a dense start), the step only prunes to ``k``. With ``balance_out_groups`` or
``balance_in_groups`` the same step runs inside every group (rows of ``weight.reshape(groups, -1)``,
or of its transpose for input groups), so a balanced mask stays balanced. With a constant level the
number of nonzeros never changes. Here ``1.0`` and ``2.0`` are dropped and ``1.0`` grows back::

    >>> w = torch.tensor([0.0, 4.0, 0.0, 1.0, 0.0, 3.0, 2.0, 0.0])
    >>> score = torch.tensor([0.0, 0.0, 1.0, 9.0, 0.0, 0.0, 0.0, 5.0])
    >>> drop_and_grow(w, w != 0, 0.5, 0.5, score).int().tolist()
    [0, 1, 0, 1, 0, 1, 0, 1]
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config.counts import keep_count
from .init import from_groups, select_largest, to_groups

__all__ = ["drop_and_grow", "magnitude_key"]


def drop_and_grow(
    weight: Tensor,
    mask: Tensor,
    sparsity: float,
    drop_fraction: float,
    grow_score: Tensor,
    *,
    balance_out_groups: int | None = None,
    balance_in_groups: int | None = None,
) -> Tensor:
    """New mask: drop the smallest kept weights, grow the best-scored positions not kept after the drop."""
    if balance_out_groups or balance_in_groups:
        groups = (balance_out_groups, balance_in_groups)
        grouped = _grouped_drop_and_grow(
            to_groups(weight, *groups),
            to_groups(mask, *groups),
            sparsity,
            drop_fraction,
            to_groups(grow_score, *groups),
        )
        return from_groups(grouped, mask.shape, balance_in_groups)
    flat_mask = mask.reshape(-1)
    k = keep_count(mask.numel(), sparsity)
    nnz = int(flat_mask.count_nonzero())
    if nnz > k:  # the level went up (or a dense start): prune to it by magnitude, grow nothing this step
        return select_largest(torch.where(flat_mask, magnitude_key(weight).reshape(-1) + 1, 0), k).reshape(
            mask.shape
        )
    survivors = keep_count(nnz, drop_fraction)
    keep = select_largest(_keys(weight, flat_mask), survivors)
    grown = select_largest(_keys(grow_score, ~keep), k - survivors)  # k <= numel: enough room
    return (keep | grown).reshape(mask.shape)


def _grouped_drop_and_grow(
    weight: Tensor, mask: Tensor, sparsity: float, drop_fraction: float, grow_score: Tensor
) -> Tensor:
    """``drop_and_grow`` on every row of ``[groups, n]`` tensors at once, with per-row counts."""
    n = mask.shape[1]
    k = keep_count(n, sparsity)
    nnz = mask.sum(dim=1)
    kept = torch.minimum(nnz, torch.full_like(nnz, k))
    survivors = _keep_counts(kept, drop_fraction)
    weight_keys = _keys(weight, mask.reshape(-1)).view(mask.shape)
    keep = _largest_per_row(weight_keys, survivors)
    grown = _largest_per_row(_keys(grow_score, ~keep.reshape(-1)).view(mask.shape), k - survivors)
    new = keep | grown
    above = nnz > k  # rows above the level (a dense start): prune to k by magnitude, grow nothing
    if bool(above.any()):
        pruned_only = _largest_per_row(weight_keys, torch.full_like(nnz, k))
        new = torch.where(above.unsqueeze(1), pruned_only, new)
    return new


def _keep_counts(counts: Tensor, drop_fraction: float) -> Tensor:
    """``keep_count(c, drop_fraction)`` of every entry of the integer tensor ``counts``.

    >>> _keep_counts(torch.tensor([10, 3, 10]), 0.3).tolist()
    [7, 2, 7]
    """
    values, where = counts.unique(return_inverse=True)  # balanced rows share one count
    kept = [keep_count(int(c), drop_fraction) for c in values.tolist()]
    return torch.tensor(kept, dtype=counts.dtype, device=counts.device)[where]


def _largest_per_row(keys: Tensor, counts: Tensor) -> Tensor:
    """Each row's ``counts[row]`` largest keys (ties: the earlier position first)."""
    order = keys.argsort(dim=1, descending=True, stable=True)
    positions = torch.arange(keys.shape[1], device=keys.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)
    return rank < counts.unsqueeze(1)


def magnitude_key(t: Tensor) -> Tensor:
    """``|t|`` as non-negative int32 keys (float32 bits) ordered like the values; NaN, Inf count as 0."""
    magnitude = t.detach().float().abs().nan_to_num(nan=0.0, posinf=0.0)
    return magnitude.view(torch.int32)


def _keys(t: Tensor, where: Tensor) -> Tensor:
    """Flat keys: ``magnitude_key + 1`` (at most 0x7F800000, so int32 holds it) where ``where``, else 0."""
    return (magnitude_key(t).reshape(-1) + 1).masked_fill_(~where, 0)
