"""A sparse matmul's values as the reference machine's PEs compute them.

Each PE does one AXPY per stored nonzero, ``partial[:, row] += x[:, column] * value``, into the
partial sums of the outputs it holds (its cyclic span). The partial sums of an output then add up
**along its reduction route**: down the column from the top, up from the bottom, added on the lane's
PE (its own, then what came from above, then what came from below), then east along the lane, each
column's lane sum added to what arrived from the west. The order of these adds is the route's, so a
float result is the one the machine would hold, not one summed in PE-index order.
"""

from __future__ import annotations

import torch

from .program import lane_bounds
from .sparse_eval import Slices

__all__ = ["route_product", "partials"]


def partials(s: Slices, x: torch.Tensor, pe: int, dtype: torch.dtype) -> torch.Tensor | None:
    """``[rows, span]``: PE ``pe``'s partial sums, one AXPY per stored nonzero (None: it holds none)."""
    n0, n1 = int(s.nz_ptr[pe]), int(s.nz_ptr[pe + 1])
    span = int(s.span[pe])
    if n1 == n0 or span == 0:
        return None
    c0, c1 = int(s.col_ptr_off[pe]), int(s.col_ptr_off[pe + 1])
    per_column = s.col_ptr[c0:c1].diff()
    feature = torch.repeat_interleave(torch.arange(int(s.in_lo[pe]), int(s.in_hi[pe])), per_column)
    local = s.row_idx[n0:n1].to(torch.int64)
    out = torch.zeros(x.shape[0], span, dtype=dtype, device=x.device)
    out.index_add_(1, local, x[:, feature] * s.values[n0:n1].to(dtype))
    return out


def route_product(s: Slices, x: torch.Tensor, width: int, height: int, lanes: int) -> torch.Tensor:
    """``[rows, in] -> [rows, out]`` on a ``width x height`` region whose outputs travel on ``lanes``
    lanes: each PE's AXPYs, then the partial sums added along their reduction routes (module docstring).
    """
    dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    dtype = torch.promote_types(dtype, s.values.dtype)
    x = x.to(dtype)
    rows, out_f = x.shape[0], s.out_features
    out = torch.zeros(rows, out_f, dtype=dtype, device=x.device)
    if out_f == 0 or rows == 0:
        return out.to(torch.promote_types(x.dtype, s.values.dtype))
    lane = torch.searchsorted(lane_bounds(out_f, lanes), torch.arange(out_f), right=True) - 1
    cols = torch.arange(out_f)
    for cx in range(width):
        held = torch.zeros(height, rows, out_f, dtype=dtype, device=x.device)
        any_held = False
        for cy in range(height):
            pe = cy * width + cx
            if pe >= s.pes:
                continue
            part = partials(s, x, pe, dtype)
            if part is None:
                continue
            outputs = (int(s.out_lo[pe]) + torch.arange(part.shape[1])) % out_f
            held[cy].index_add_(1, outputs, part)
            any_held = True
        if not any_held:
            continue
        from_above = torch.cumsum(held, 0)  # the chain down the column, top first
        from_below = torch.cumsum(held.flip(0), 0).flip(0)  # the chain up the column, bottom first
        column = held[lane, :, cols].T.clone()  # [rows, out]: the lane PE's own sums
        above = lane - 1
        below = lane + 1
        has_above, has_below = above >= 0, below < height
        column[:, has_above] += from_above[above[has_above], :, cols[has_above]].T
        column[:, has_below] += from_below[below[has_below], :, cols[has_below]].T
        out += column  # east along the lane: what came from the west, plus this column's
    return out.to(torch.promote_types(x.dtype, s.values.dtype))
