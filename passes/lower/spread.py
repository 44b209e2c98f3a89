"""Streaming: norms, softmaxes and one-input elementwise ops spread over the mesh's columns in row tiles.

A kernel without weights on one column of a streaming program does all of its lanes' work on one PE
a lane while the rest of the mesh idles: GPT-2 small's GELU takes 13,824 cycles there and 6,239 over
48 columns. So in a streaming program a layer norm and an elementwise op of one input (a GELU, a
ReLU) may take as many columns as their features (``runtime/tiles.py`` cuts them into row tiles),
unless a neighbour (a kernel they read or one that reads them) runs in row tiles too: a tile's share
travels west to column 0 before any tile of the next kernel reads it (``runtime/homes.py``), so two
tiled kernels in a row would send every share on that round trip, which only one column avoids.

A spread kernel takes one column a feature of its lane, and more row tiles only while a PE's work
on an element outlasts the lane's delivery of it: its lane brings every feature of every row, one
after another, so a PE that holds one feature has that many elements' time for each of its own
(``_width``: GELU's 48 features a lane on 64 lanes need one tile of 48 columns, a norm's 12 one of
12). A norm in more tiles ends sooner (each block waits for its statistics' all-reduce, and every
tile shortens that wait), but each of its messages then leaves as one share a tile, which made the
reference executor 3.5x slower on gpt-tiny for a few percent of GPT-2 small's cycles. A kernel of
more than ``SPREAD_ROWS`` rows stays on one column: its result, spread, leaves values beside the
sparse matmuls that cut their blocks short (GPT-2 small at 90% on 64x64:
at 128 and 512 tokens a step spreading saved 7% and 4% of the sparse run, with the norm in five
tiles; at 2,048 it cost 7%). A softmax is the exception on both counts. Its reader is the attention's
context matmul, which holds no weights, so its result cuts no sparse matmul's blocks short, whatever its
rows; and each of its elements costs its PE an exponent, a subtraction and a division, more than the
round trip west costs the shares of a tiled reader's input. Between two attention matmuls its block
is all its rows, so a PE's task starts only once its whole message is in, and the PE of a lane's last
feature has no later message to work behind: it takes as many tiles as keep a PE's work on its message
within the message's delivery (GPT-2 small, fp32: 6 operations an element at 2 a cycle against one
wavelet, three tiles of two columns). On GPT-2 small at 90% (1 x 128 tokens, 64x64) spreading the
softmax in two tiles took the sparse run from 1,321,157 to 1,270,289 cycles (whole model 3.78x to
3.89x); with the causal mask applied inside it (``rules.py``: no mask kernel) 1,225,649 (4.00x), and
in three tiles 1,216,457 (4.02x). Other kernels keep ``place.max_width``::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from .builder import Pending
    >>> ln = Pending("ln", "layer_norm", ("x",), (128, 768), "float32", {})
    >>> gelu = Pending("gelu", "elementwise", ("fc",), (128, 3072), "float32", {})
    >>> add = Pending("add", "elementwise", ("x", "y"), (128, 768), "float32", {})
    >>> probs = Pending("probs", "softmax", ("scores",), (1, 12, 128, 128), "float32", {"dim": -1})
    >>> ctx = Pending("ctx", "matmul", ("probs", "v"), (1, 12, 128, 64), "float32", {})
    >>> caps([ln, gelu, add, probs, ctx], [1] * 5, 64, MeshSpec(64, 64), HardwareSpec(), "streaming")
    [12, 48, 1, 6, 64]
    >>> caps([ln, gelu, add, probs, ctx], [1] * 5, 64, MeshSpec(64, 64), HardwareSpec(), "pipelined")
    [1, 1, 1, 1, 64]
"""

from __future__ import annotations

import math

from sparsefx.runtime.cost import element_ops, features_of, rows_of, simd, wavelets
from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
from sparsefx.runtime.program import Kernel, Region
from sparsefx.runtime.tiles import tile_columns

from .builder import Pending
from .place import max_width

__all__ = ["caps", "spreads"]


SPREAD_ROWS = 512
"""Most rows a spread kernel has: past them the results it leaves on more PEs crowd the sparse
matmuls' blocks (module docstring)."""


def _candidate(p: Pending, weighted_reader: bool) -> bool:
    """A norm, a softmax or a one-input elementwise op, of at most ``SPREAD_ROWS`` rows when a sparse
    matmul reads it (``weighted_reader``; a softmax read by none may have any rows)."""
    one_input = p.op == "elementwise" and len(p.inputs) == 1
    if p.op not in ("layer_norm", "softmax") and not one_input:
        return False
    return rows_of(p.shape) <= SPREAD_ROWS or (p.op == "softmax" and not weighted_reader)


def spreads(pending: list[Pending]) -> list[bool]:
    """Which kernels a streaming program spreads (module docstring): candidates with no neighbour
    that is another candidate, nor, but for a softmax, an activation matmul."""
    readers: dict[str, set[str]] = {}
    for p in pending:
        for name in p.inputs:
            readers.setdefault(name, set()).add(p.name)
    weighted = {p.name for p in pending if p.op == "sparse_matmul"}
    candidates = {p.name for p in pending if _candidate(p, bool(readers.get(p.name, set()) & weighted))}
    matmuls = {p.name for p in pending if p.op == "matmul"}
    out = []
    for p in pending:
        neighbours = set(p.inputs) | readers.get(p.name, set())
        tiled = candidates if p.op == "softmax" else candidates | matmuls
        out.append(p.name in candidates and not neighbours & tiled)
    return out


def _width(p: Pending, lanes: int, mesh: MeshSpec, hw: HardwareSpec) -> int:
    """A spread kernel's columns: its lane's features, times the row tiles that keep its PEs up with
    the lane (module docstring)."""
    k = Kernel(p.name, p.op, Region(0, 0, mesh.width, lanes), p.inputs, p.shape, p.dtype, attrs=dict(p.attrs))
    per_lane = tile_columns(k, features_of(p.shape))  # its widest lane's features, one a column
    element = element_ops(k) / simd(p.dtype, hw)  # cycles an element takes its PE
    delivery = per_lane * wavelets(1, p.dtype, hw)  # cycles the lane takes to bring each of them
    if p.op == "softmax":  # its task waits for its whole message: keep up with one message, not a lane
        delivery = wavelets(1, p.dtype, hw)
    return max(1, min(mesh.width, per_lane * math.ceil(element / delivery)))


def caps(
    pending: list[Pending], widths: list[int], lanes: int, mesh: MeshSpec, hw: HardwareSpec, mode: str
) -> list[int]:
    """Most columns each kernel takes: ``place.max_width``, ``_width`` for a spread one, and never
    fewer than ``widths`` (what its SRAM needs)."""
    wide = spreads(pending) if mode == "streaming" else [False] * len(pending)
    return [
        max(w, _width(p, lanes, mesh, hw) if s else max_width(p, lanes, mesh))
        for p, w, s in zip(pending, widths, wide)
    ]
