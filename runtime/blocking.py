"""Blocks and lanes: how a value's rows go in blocks and its features on lanes, and its messages' zero flags.

    >>> block_sizes(10, 4).tolist()
    [4, 4, 2]
    >>> blocked(torch.tensor([[True, False], [False, False], [False, True]]), 2).tolist()
    [[True, False], [False, True]]
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .program import Kernel, lane_bounds
from .timeline import Flow


def block_sizes(rows: int, b: int) -> torch.Tensor:
    """Rows of each block when ``rows`` go ``b`` at a time (the last block takes the rest)."""
    rows = max(rows, 1)
    sizes = torch.full((math.ceil(rows / b),), b, dtype=torch.int64)
    sizes[-1] = rows - b * (len(sizes) - 1)
    return sizes


def per_block(fn: Callable[[int], int], sizes: torch.Tensor) -> torch.Tensor:
    """``fn(rows)`` of each block, as an int64 tensor."""
    return torch.tensor([fn(int(n)) for n in sizes.tolist()], dtype=torch.int64)


def lane_rank(bounds: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each feature's lane and its place in the lane's message order."""
    lane = torch.searchsorted(bounds, feats, right=True) - 1
    return lane, feats - bounds[lane]


def kernel_lanes(kernel: Kernel, features: int) -> int:
    given = kernel.attrs.get("lanes", kernel.region.height)
    return max(1, min(int(given), features, kernel.region.height))


def feature_lanes(kernel: Kernel, features: int) -> torch.Tensor:
    """``[features]``: the lane of ``kernel`` each of its ``features`` travels on (``kernel_lanes``)."""
    bounds = lane_bounds(features, kernel_lanes(kernel, features))
    return lane_rank(bounds, torch.arange(features))[0]


def wave_runs(wave: torch.Tensor, step: int) -> list[tuple[int, int, int]]:
    """``(first, end, wavelets)`` of runs of at most ``step`` consecutive blocks whose messages have
    the same wavelets (all blocks but a shorter last one, usually)."""
    values, counts = torch.unique_consecutive(wave, return_counts=True)
    out, q0 = [], 0
    for n, w in zip(counts.tolist(), values.tolist()):
        out += [(q, min(q + step, q0 + n), w) for q in range(q0, q0 + n, step)]
        q0 += n
    return out


def blocked(rows: torch.Tensor, b: int) -> torch.Tensor:
    """``[rows, features]`` nonzero flags -> ``[blocks, features]``: whether any row of a block is nonzero."""
    blocks = -(-rows.shape[0] // b)
    rows = rows if rows.dtype == torch.bool else rows != 0
    if b == 1:
        return rows.clone()
    if blocks * b != rows.shape[0]:
        padded = torch.zeros((blocks * b, rows.shape[1]), dtype=torch.bool, device=rows.device)
        padded[: rows.shape[0]] = rows
        rows = padded
    # as bytes: torch's ``any`` over a middle dimension of a bool tensor is some 30x slower than ``amax``
    return rows.contiguous().view(torch.uint8).reshape(blocks, b, -1).amax(dim=1).bool()


def fits(live: torch.Tensor | None, flow: Flow) -> torch.Tensor | None:
    """``live`` if it has a flag per message of ``flow``; None for an empty value (nothing to filter)."""
    return sized(live, flow.blocks, flow.features)


def sized(live: torch.Tensor | None, blocks: int, features: int) -> torch.Tensor | None:
    return live if live is not None and tuple(live.shape) == (blocks, features) else None


def same_flags(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(torch.equal(a, b))
