"""Where a streaming step leaves its result: the rule ``runtime/homes.py`` follows, and where a sparse
matmul's outputs end up.

A sparse matmul's output ``o`` is summed down each column holding a part of it, then east across
those columns along its lane: the sum is whole on the last of them (``last_columns``), where the bias
is added. Then it moves along its lane: to the region's east edge, or, in a streaming program where
the result stays on the mesh (``stays``), to its own column (``spread_columns``): a lane's features
spread over the region's columns from the east. With balanced placement each column holds a run of
consecutive outputs, which is one lane's features when the outputs are as many per lane as per
column (GPT-2 small's MLP expansion on 64x64: lane ``r``'s 48 sums end on column ``r``); kept
there, a lane's whole share of every row would wait on one PE. Spread, each PE keeps at most
``ceil(features / width)`` of its lane's features, and a lane of one feature keeps it on the east
column. This module reads only a kernel's attributes and its PEs' output ranges, so the SRAM model
(``memory.py``) and the clocks (through ``homes.py``) share it::

    >>> import torch
    >>> out_lo, span = torch.tensor([0, 2, 0, 3]), torch.tensor([3, 2, 1, 1])  # 2 columns, 2 rows
    >>> last_columns(out_lo, span, width=2, outputs=5).tolist()  # output 4: on no PE, the east column
    [0, 0, 1, 1, 1]
    >>> spread_columns(outputs=6, lanes=2, width=4).tolist()  # 3 features a lane over 4 columns
    [3, 2, 1, 3, 2, 1]
"""

from __future__ import annotations

import torch

from .blocking import lane_rank
from .memo import kept_for
from .program import Kernel, ProgramData, lane_bounds

__all__ = ["EAST", "CONV", "stays", "last_columns", "spread_columns"]

EAST = ("constant",)
"""Kernels whose result is at the region's east edge: a constant's value is loaded there. A layout
change on one column gathers its copy there too (its tasks are timed as reading one input feature
each, which understates a head split's or merge's traffic across lanes; its result's trip to the edge
is part of its cost until that is modelled), and so does a convolution's sparse matmul (``CONV``)."""

CONV = ("conv1d", "conv2d")
"""A sparse matmul of these kinds reduces image patches: its outputs are channels, sent once every
channel of a block is in, from the east edge."""


def stays(program: ProgramData, k: Kernel) -> bool:
    """Whether ``k``'s result stays on the PEs that made it (``homes.py``): streaming, a kernel
    without stored weights (a layout change only in row tiles, which the lowering gives it where its
    data needs more than one column) or a sparse matmul that is not a convolution, and not a program
    output."""
    if program.mode != "streaming" or k.name in program.outputs:
        return False
    if k.op == "layout":
        return int(k.attrs.get("row_tiles", 1)) > 1
    if k.op == "sparse_matmul":
        return k.attrs.get("kind") not in CONV
    return k.op not in EAST


def last_columns(out_lo: torch.Tensor, span: torch.Tensor, width: int, outputs: int) -> torch.Tensor:
    """``[outputs]``: the last (easternmost) column of a region whose PEs' cyclic output ranges
    (``out_lo``, ``span``, row-major over ``width`` columns) hold each output; the east column for an
    output none holds. One row of counts per column: the work is the columns times the outputs."""
    pe = (span > 0).nonzero().squeeze(1)
    lo = out_lo[pe].to(torch.int64) % max(outputs, 1)
    hi = lo + span[pe].to(torch.int64).clamp(max=outputs)
    col = pe % width
    wrap = hi > outputs  # the part past the last output starts again at output 0
    cols = torch.cat([col, col[wrap]])
    starts = torch.cat([lo, torch.zeros_like(lo[wrap])])
    ends = torch.cat([hi.clamp(max=outputs), hi[wrap] - outputs])
    diff = torch.zeros((width, outputs + 1), dtype=torch.int32)
    diff.index_put_((cols, starts), torch.ones_like(cols, dtype=torch.int32), accumulate=True)
    diff.index_put_((cols, ends), -torch.ones_like(cols, dtype=torch.int32), accumulate=True)
    held = torch.cumsum(diff, dim=1)[:, :outputs] > 0  # [width, outputs]
    last = width - 1 - torch.flip(held, (0,)).to(torch.int8).argmax(dim=0)
    return torch.where(held.any(dim=0), last, width - 1)


def whole_at(program: ProgramData, k: Kernel) -> torch.Tensor:
    """``last_columns`` of sparse matmul ``k``'s stored ranges, kept per kernel structure
    (``memo.kept_for``): its SRAM model and its executors ask for them alike."""

    def build() -> torch.Tensor:
        lo = program.array(k, "out_lo").to(torch.int64)
        span = program.array(k, "out_hi").to(torch.int64) - lo
        return last_columns(lo, span, k.region.width, int(k.attrs["out_features"]))

    return kept_for(program, k, ("last columns",), build)


def spread_columns(outputs: int, lanes: int, width: int) -> torch.Tensor:
    """``[outputs]``: the column of a region ``width`` columns wide where each output of a result in
    ``lanes`` lanes stays: feature ``j`` of a lane of ``n`` on column ``width - 1 - j * width // n``."""
    bounds = lane_bounds(outputs, lanes)
    lane, rank = lane_rank(bounds, torch.arange(outputs))
    n = (bounds[1:] - bounds[:-1])[lane].clamp(min=1)
    return width - 1 - rank * width // n
