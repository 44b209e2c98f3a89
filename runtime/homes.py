"""Where a streaming program keeps a result until later steps read it: on the PEs that made it.

In a streaming program each kernel runs alone and a later step sends its inputs again from where
they wait (``runtime/journeys.py``). A kernel without stored weights (an attention matmul, a norm, a
softmax, an elementwise op) makes each feature of each block on one PE of each row
tile (``runtime/tiles.py``), and its result stays there: no share travels to the region's east edge,
so the lane's eastward links carry only the messages the tiles read. Its step ends when the last
share is made. A later step's route takes each share from its tile's column, west to column 0
(``passes/lower/connect.py``'s streaming routes take data from every column of the producer's
region), on a schedule: each lane's messages pass column 0 one after another, in the order and at
the times they would have from the region's east column (``Flow.depart``), each share leaving its
PE in time to follow the share before it. Sent all at once instead, the shares of near columns
overtake those of far ones on the lane's links, and a reader that needs whole messages gets most of
them late (GPT-2 small's MLP expansion, reading a layer norm's five row tiles, took 11,759 cycles
on the reference's links instead of 7,951). A sparse matmul's output sums down its columns and east
across the columns that hold a part of it, then moves along its lane to its own column, a lane's
features spread over the region's columns (``runtime/sums.py``): one tile, each feature on its own
column. A convolution's sparse matmul (its channels are not its
features), a constant and a layout change on one column keep their result at the region's east edge
(``EAST``); a program output leaves for the host in either mode.

Both executors follow this rule; the SRAM model counts each share on its PE (``runtime/held.py``)::

    >>> import torch
    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import Kernel, ProgramData, Region
    >>> k = Kernel("g", "elementwise", Region(0, 0, 4, 2), ("x",), (8, 4), "float32", attrs={"row_tiles": 2})
    >>> p = ProgramData(MeshSpec(8, 8), HardwareSpec(), "streaming", "balanced")
    >>> x, y, nbytes = kept_where(p, k)  # 2 features a lane, one a column, in 2 tiles of 2 columns
    >>> x.tolist(), y.tolist()
    ([0, 1, 0, 1, 2, 3, 2, 3], [0, 0, 1, 1, 0, 0, 1, 1])
    >>> nbytes.tolist()  # 4 of the 8 rows in each tile, 4 bytes each
    [16, 16, 16, 16, 16, 16, 16, 16]
    >>> back(p, k).tolist()  # columns from the east edge to the last tile's PE of each feature
    [1, 0, 1, 0]
"""

from __future__ import annotations

import torch

from .blocking import block_sizes, feature_lanes, kernel_lanes
from .cost import block_rows, features_of, rows_of
from .layout import layout
from .memo import kept_for
from .memory import itemsize
from .program import Kernel, ProgramData
from .sums import CONV, EAST, last_columns, spread_columns, stays, whole_at
from .tiles import tile_place, tile_rows

__all__ = ["EAST", "CONV", "stays", "sums", "final_pes", "shares", "back", "kept_where"]


def sums(program: ProgramData, k: Kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """``(last, home)``, ``[outputs]`` each: the column of sparse matmul ``k``'s region where each
    output's sum is whole (``sums.last_columns`` of its layout) and the one where it stays
    (``sums.spread_columns``). Kept per kernel structure (``memo.kept_for``)."""

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        outputs = int(k.attrs["out_features"])
        if k.attrs.get("all_ones"):  # the dense baseline's geometry: no stored ranges
            s = layout(program, k)
            last = last_columns(s.out_lo, s.span, k.region.width, outputs)
        else:
            last = whole_at(program, k)
        return last, spread_columns(outputs, kernel_lanes(k, outputs), k.region.width)

    return kept_for(program, k, ("sums",), build)


def final_pes(program: ProgramData, k: Kernel) -> torch.Tensor:
    """``[outputs]``: the region PE (row-major) where each output of sparse matmul ``k`` ends up once
    its sum is whole: its lane's row, on its own column (``sums``) when the result stays, else on the
    region's east edge. A sparse matmul's epilogue runs there (``cost.epilogue_cycles``)."""
    r, outputs = k.region, int(k.attrs["out_features"])
    column = sums(program, k)[1] if stays(program, k) else torch.full((outputs,), r.width - 1)
    return feature_lanes(k, outputs) * r.width + column


def shares(program: ProgramData, k: Kernel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, rows)``: each row tile's column of each feature (``[tiles, features]``), each feature's
    mesh row (``[features]``) and each tile's rows of each block (``[tiles, blocks]``). A sparse matmul
    is one tile: each output on its own column (``sums``), every row of it."""
    sizes = block_sizes(rows_of(k.shape), block_rows(k))
    if k.op == "sparse_matmul":
        lane = feature_lanes(k, features_of(k.shape))
        return k.region.x + sums(program, k)[1][None, :], k.region.y + lane, sizes[None, :]
    px, py, _ = tile_place(k, features_of(k.shape))
    return px, py, tile_rows(sizes, px.shape[0])


def back(program: ProgramData, k: Kernel) -> torch.Tensor:
    """``[features]``: columns from ``k``'s east edge back to the PE of its last row tile that keeps
    each feature (a later step's messages leave from there)."""
    px, _, _ = shares(program, k)
    return k.region.x + k.region.width - 1 - px[-1]


def kept_where(program: ProgramData, k: Kernel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, bytes)``, flat over ``[tiles, features]``: each share's PE and the bytes of every row of
    it that the PE keeps."""
    px, py, rows = shares(program, k)
    nbytes = (rows.sum(dim=1)[:, None] * itemsize(k.dtype)).expand_as(px)  # every row a tile keeps
    return px.reshape(-1), py[None, :].expand_as(px).reshape(-1), nbytes.reshape(-1)
