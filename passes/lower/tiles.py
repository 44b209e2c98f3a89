"""The row tiles of kernels without stored weights (``runtime/tiles.py``): as many as their region holds.

A kernel whose lanes hold fewer features than its region has columns would leave columns idle; cut
into row tiles, each tile runs every ``tiles``-th block of rows, so an attention matmul on a 64-column
region runs its 128 key positions' dot products on 64 tiles' worth of PEs, not two columns::

    >>> from sparsefx.runtime.program import Kernel, Region
    >>> k = Kernel("scores", "matmul", Region(0, 0, 64, 64), ("q", "k"), (12, 128, 128), "float32")
    >>> with_tiles(k).attrs["row_tiles"]  # 2 features a lane: 32 tiles of 2 columns
    32
    >>> e = Kernel("gelu", "elementwise", Region(0, 0, 1, 64), ("x",), (128, 3072), "float32")
    >>> "row_tiles" in with_tiles(e).attrs  # one column: one tile, the attribute stays out
    False
"""

from __future__ import annotations

from sparsefx.runtime.cost import features_of
from sparsefx.runtime.program import Kernel
from sparsefx.runtime.tiles import tiles_for

__all__ = ["with_tiles", "UNTILED"]

UNTILED = ("sparse_matmul", "constant")
"""Kernels that do not run in row tiles: a sparse matmul's PEs hold its weights (its own mapping,
``place_sparse.py``), and a constant runs no task."""


def with_tiles(k: Kernel) -> Kernel:
    """``k`` with ``attrs["row_tiles"]`` set to ``tiles_for`` its region (removed where that is 1)."""
    k.attrs.pop("row_tiles", None)
    if k.op not in UNTILED and k.region.pes:
        tiles = tiles_for(k, features_of(k.shape))
        if tiles > 1:
            k.attrs["row_tiles"] = tiles
    return k
