"""Weight streaming in passes: a matmul too big for the mesh's SRAM runs as slices of its outputs.

In ``streaming`` mode the weights stream in from off-mesh memory, so a layer need not fit the mesh
at once. A sparse matmul whose data needs more columns than the mesh has is cut into ``parts`` equal
ranges of its outputs; each part is its own kernel (``<name>.part<k>``, with ``attrs["out_offset"]``),
run one after another over the whole mesh, and a ``cat`` layout kernel under the original name puts
the outputs back together, so consumers read the same value::

    >>> from sparsefx.passes.lower.builder import Pending, SparseWeight
    >>> w = torch.ones(6, 4); m = torch.ones(6, 4, dtype=torch.bool)
    >>> p = Pending("fc", "sparse_matmul", ("x",), (2, 6), "float32", {"kind": "linear", "in_features": 4,
    ...             "out_features": 6, "rows": 2}, sparse=SparseWeight(w, m, None), flops=96)
    >>> [(q.name, q.shape, q.attrs.get("out_offset")) for q in split(p, 3)]
    [('fc.part0', (2, 2), 0), ('fc.part1', (2, 2), 2), ('fc.part2', (2, 2), 4), ('fc', (2, 6), None)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .builder import Pending, SparseWeight

__all__ = ["split", "split_to_fit", "out_dim"]


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
        nnz = int(sw.mask[a:b].sum())
        total = max(int(sw.mask.sum()), 1)
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
