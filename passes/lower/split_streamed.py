"""Weight streaming in passes: a matmul too big for the mesh's SRAM runs as slices of its outputs.

In ``streaming`` mode the weights stream in from off-mesh memory, so a layer need not fit the mesh
at once. A sparse matmul whose data needs more columns than the mesh has is cut into ``parts`` equal
ranges of its outputs; each part is its own kernel (``<name>.part<k>``, with ``attrs["out_offset"]``),
run one after another over the whole mesh, and a ``cat`` layout kernel under the original name puts
the outputs back together, so consumers read the same value.

``plan_passes`` sizes the parts for blocks of ``PASS_ROWS`` rows in flight (all the rows when fewer),
not the 2 rows that merely fit: every AXPY starts a vector operation and every input column a task,
so an AXPY over 128 fp32 rows spends 2 of its 66 cycles starting (the default vector start) and one
over 4 rows 2 of 4, each task's start (8) shared by fewer rows too. A part's accumulators hold
its outputs times its rows in flight, so more rows take more parts; when that would pass
``MAX_PASSES`` (the ``cat`` reads every part on its own color) it sizes for half the rows, and so on
down to 2. Convolutions, whose blocks are whole images, are sized for 2 rows::

    >>> from sparsefx.passes.lower.builder import Pending, SparseWeight
    >>> w = torch.ones(6, 4); m = torch.ones(6, 4, dtype=torch.bool)
    >>> p = Pending("fc", "sparse_matmul", ("x",), (2, 6), "float32", {"kind": "linear", "in_features": 4,
    ...             "out_features": 6, "rows": 2}, sparse=SparseWeight(w, m, None), flops=96)
    >>> [(q.name, q.shape, q.attrs.get("out_offset")) for q in split(p, 3)]
    [('fc.part0', (2, 2), 0), ('fc.part1', (2, 2), 2), ('fc.part2', (2, 2), 4), ('fc', (2, 6), None)]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from sparsefx.errors import LoweringError
from sparsefx.runtime.cost import rows_of
from sparsefx.runtime.memory import ROWS_IN_FLIGHT
from sparsefx.runtime.op_kinds import ROW_MATMULS

from .builder import Pending, SparseWeight

__all__ = ["split", "split_to_fit", "plan_passes", "out_dim", "PASS_ROWS", "MAX_PASSES"]

PASS_ROWS = 128
"""Rows in flight the parts of a streamed matmul make room for."""
MAX_PASSES = 16
"""The most parts sized for more than 2 rows in flight."""


def out_dim(p: Pending) -> int:
    """The dim of a matmul's result that indexes its outputs: channels for a convolution, else the last."""
    return 1 if p.attrs.get("kind") in ("conv1d", "conv2d") else len(p.shape) - 1


def split(p: Pending, parts: int) -> list[Pending]:
    """``p`` as ``parts`` kernels over equal output ranges, then a ``cat`` named like ``p``."""
    assert p.sparse is not None
    sw = p.sparse
    out = sw.weight.shape[0]
    parts = max(1, min(parts, out))
    dim = out_dim(p)
    pieces = []
    for k in range(parts):
        a, b = k * out // parts, (k + 1) * out // parts
        shape = list(p.shape)
        shape[dim] = b - a
        bias = None if sw.bias is None else sw.bias[a:b]
        nnz = int(torch.count_nonzero(sw.mask[a:b]))
        total = max(sw.nnz, 1)
        pieces.append(
            dataclasses.replace(
                p,
                name=f"{p.name}.part{k}",
                shape=tuple(shape),
                attrs={**p.attrs, "out_features": b - a, "out_offset": a},
                sparse=SparseWeight(sw.weight[a:b], sw.mask[a:b], bias, sw.param),
                flops=p.flops * nnz // total,
                payload={},
            )
        )
    cat = Pending(
        p.name,
        "layout",
        tuple(q.name for q in pieces),
        p.shape,
        p.dtype,
        {"fn": "cat", "dim": dim},
        source=p.source,
    )
    return [*pieces, cat]


def split_to_fit(p: Pending, width: int, need: Callable[[Pending], int]) -> tuple[list[Pending], list[int]]:
    """``split(p, parts)`` with the fewest parts, doubling from ``ceil(need(p) / width)``, whose kernels
    each ``need`` at most ``width`` columns (or one output per part); the kernels and what each needs."""
    assert p.sparse is not None
    parts = -(-need(p) // width)
    while True:
        pieces = split(p, parts)
        needs = [need(q) for q in pieces]
        if max(needs) <= width or parts >= p.sparse.weight.shape[0]:
            return pieces, needs
        parts *= 2


def plan_passes(
    p: Pending, width: int, need: Callable[[Pending, int], int]
) -> tuple[list[Pending], list[int]]:
    """``[p]`` and its width when it fits ``width`` columns with ``PASS_ROWS`` rows in flight, else its
    parts (module docstring); ``need(q, rows)`` is the columns ``q`` needs with ``rows`` in flight."""
    assert p.sparse is not None
    rows = ROWS_IN_FLIGHT
    if p.attrs.get("kind") in ROW_MATMULS:
        rows = max(ROWS_IN_FLIGHT, min(max(rows_of(p.shape), 1), PASS_ROWS))
    while True:
        at = functools.partial(_need, need=need, rows=rows, width=width)
        w = at(p)
        if w <= width:
            return [p], [w]
        pieces, needs = split_to_fit(p, width, at)
        if rows <= ROWS_IN_FLIGHT or (len(pieces) - 1 <= MAX_PASSES and max(needs) <= width):
            return pieces, needs
        rows = max(ROWS_IN_FLIGHT, rows // 2)


def _need(q: Pending, need: Callable[[Pending, int], int], rows: int, width: int) -> int:
    """``need(q, rows)``, or one column more than ``width`` when ``q`` cannot hold that many rows."""
    try:
        return need(q, rows)
    except LoweringError:
        return width + 1
