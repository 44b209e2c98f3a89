"""The row tiles of activation matmuls (``runtime/tiles.py``): as many as their region holds.

An attention matmul's lanes hold fewer features (key positions, head dims) than its region has
columns; cut into row tiles, each tile computes its share of every block's rows, so a 64-column
region runs the 128 key positions' dot products on 32 tiles of 2 columns, not on 2 columns. Every
tile reads every message of its inputs, so tiles pay where a task is long against its messages (a
matmul's contraction of 64 or 128), not for a norm or a GELU::

    >>> from sparsefx.runtime.program import Kernel, Region
    >>> k = Kernel("scores", "matmul", Region(0, 0, 64, 64), ("q", "k"), (12, 128, 128), "float32")
    >>> with_tiles(k).attrs["row_tiles"]  # 2 features a lane: 32 tiles of 2 columns
    32
    >>> e = Kernel("gelu", "elementwise", Region(0, 0, 4, 64), ("x",), (128, 3072), "float32")
    >>> "row_tiles" in with_tiles(e).attrs  # not a matmul: no tiles
    False
"""

from __future__ import annotations

from sparsefx.runtime.cost import features_of
from sparsefx.runtime.program import Kernel
from sparsefx.runtime.tiles import tiles_for

__all__ = ["with_tiles", "TILED"]

TILED = ("matmul", "layout", "elementwise", "softmax", "layer_norm")
"""Kernels the lowering runs in row tiles (a sparse matmul's PEs hold its weights: its own mapping,
``place_sparse.py``). A layout change gets more than one column only where its data needs them (a
head split of many tokens keeps every row of its input until it has all of them): its tiles then
split the rows it copies out, and with them its SRAM."""


def with_tiles(k: Kernel) -> Kernel:
    """``k`` with ``attrs["row_tiles"]`` set to ``tiles_for`` its region (removed where that is 1)."""
    k.attrs.pop("row_tiles", None)
    if k.op in TILED and k.region.pes:
        tiles = tiles_for(k, features_of(k.shape))
        if tiles > 1:
            k.attrs["row_tiles"] = tiles
    return k
