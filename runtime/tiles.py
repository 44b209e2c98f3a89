"""Row tiles: where a kernel without stored weights (an activation matmul, a norm, a softmax, a layout
change, an elementwise op) runs each of its tasks.

Its features go on lanes (``lane_bounds``: lane ``r`` on the region's row ``r``), and the features of a
lane on its columns, one a column (``rank % columns``). A lane of fewer features than the region has
columns leaves columns idle, so the region's columns are cut into ``row_tiles`` groups of ``columns``
(the widest lane's features, at most the width), and each block's rows are split over the groups
(``tile_rows``): every group holds every feature and computes its share of the rows of each block.
A message a task reads travels its lane past every group's column (each keeps its rows of it); each
group's share of a result leaves east along the lane, and the result is at the region's edge when
every share is. A tile only changes which PEs do the work, and on how many rows each.

``attrs["row_tiles"]`` is the lowering's choice (``tiles_for``; absent: one group, each feature on one
PE). A program file that asks for more groups than fit is a ``ProgramFormatError``::

    >>> from sparsefx.runtime.program import Region
    >>> k = Kernel("s", "softmax", Region(0, 0, 8, 2), ("x",), (16, 4), "float32", attrs={"row_tiles": 4})
    >>> tile_columns(k, 4), row_tiles(k, 4)  # 2 features a lane, one a column: 4 groups of 2 columns
    (2, 4)
    >>> px, py, pe = tile_place(k, 4)
    >>> px.tolist()  # [tile, feature]: the column of each feature's PE in each group
    [[0, 1, 0, 1], [2, 3, 2, 3], [4, 5, 4, 5], [6, 7, 6, 7]]
    >>> py.tolist(), pe[1].tolist()
    ([0, 0, 1, 1], [2, 3, 10, 11])
"""

from __future__ import annotations

import torch

from sparsefx.errors import ProgramFormatError

from .blocking import kernel_lanes, lane_rank
from .program import Kernel, lane_bounds

__all__ = ["MAX_TILES", "edge_ready", "row_tiles", "tile_columns", "tile_place", "tile_rows", "tiles_for"]

MAX_TILES = 64
"""Most groups the lowering cuts a region into: past the tasks' own length in cycles (an activation
matmul's contraction, 64 to 128 in a GPT's attention) more groups no longer shorten a kernel, whose
lanes then deliver its messages more slowly than the groups use them."""


def tile_columns(k: Kernel, features: int) -> int:
    """Columns of one group: the widest lane's features, at most the region's width."""
    bounds = lane_bounds(features, kernel_lanes(k, features))
    widest = int((bounds[1:] - bounds[:-1]).max()) if features else 1
    return max(1, min(k.region.width, widest))


def row_tiles(k: Kernel, features: int) -> int:
    """The kernel's groups (``attrs["row_tiles"]``, 1 without); a ``ProgramFormatError`` past the fit."""
    tiles = int(k.attrs.get("row_tiles", 1))
    fit = k.region.width // tile_columns(k, features)
    if not 1 <= tiles <= max(fit, 1):
        raise ProgramFormatError(
            f"kernel {k.name!r}: row_tiles={tiles}, but its {k.region.width} columns hold 1 to {max(fit, 1)} "
            f"groups of {tile_columns(k, features)}"
        )
    return tiles


def tiles_for(k: Kernel, features: int) -> int:
    """The lowering's choice: as many groups as the region's columns hold, at most ``MAX_TILES``."""
    return max(1, min(MAX_TILES, k.region.width // tile_columns(k, features)))


def tile_place(k: Kernel, features: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, pe)``: each feature's mesh column in each group (``[tiles, features]``), its mesh row
    (``[features]``), and its PE in the region, row-major (``[tiles, features]``)."""
    r, cols = k.region, tile_columns(k, features)
    feats = torch.arange(features)
    lane, rank = lane_rank(lane_bounds(features, kernel_lanes(k, features)), feats)
    local = torch.arange(row_tiles(k, features))[:, None] * cols + (rank % cols)[None, :]
    return r.x + local, r.y + lane, lane[None, :] * r.width + local


def tile_rows(sizes: torch.Tensor, tiles: int) -> torch.Tensor:
    """``[tiles, blocks]``: the rows of each block (of ``sizes`` rows) each tile computes, consecutive
    rows a tile: ``n // tiles`` each and one more for the first ``n % tiles``.

        >>> tile_rows(torch.tensor([8, 3]), 4).tolist()
        [[2, 1], [2, 1], [2, 1], [2, 0]]
    """
    t = torch.arange(tiles)[:, None]
    return sizes[None, :] // tiles + (t < sizes[None, :] % tiles).to(sizes.dtype)


def edge_ready(
    heads: torch.Tensor, sends: torch.Tensor, whole: torch.Tensor, has: torch.Tensor
) -> torch.Tensor:
    """``[blocks, features]``: when a result made in row tiles is at its region's east edge, from each
    tile's share (``[tiles, blocks, features]``: its head's arrival, its wavelets, whether it has rows).
    The shares' wavelets pass the edge in turn, as the whole message's (``whole`` wavelets) would: the
    result is there when its last wavelet is less the whole message's, and no earlier than its first
    share's head. Both executors use this rule (the reference with its link queues in ``heads``).

        >>> heads, has = torch.tensor([[[10]], [[10]]]), torch.ones(2, 1, 1, dtype=torch.bool)
        >>> edge_ready(heads, torch.full((2, 1, 1), 4), torch.tensor([[8]]), has)  # at once: 4 wavelets each
        tensor([[10]])
    """
    big = torch.iinfo(torch.int64)
    first = torch.where(has, heads, big.max).amin(dim=0)
    last = torch.where(has, heads + sends, big.min).amax(dim=0)
    return torch.maximum(first, last - whole)
