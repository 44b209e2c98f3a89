"""Regions: where each kernel runs, sized by its work and by what its data needs.

Every region spans the program's lanes: rows ``[0, lanes)`` of the mesh, one lane per row, so values
travel from kernel to kernel along mesh rows. Kernels differ in width:

- ``pipelined``: all kernels are resident at once, side by side in program order from column 0
  eastward. Each gets the columns its SRAM needs, and the columns left over are shared in
  proportion to work (``work``: a sparse matmul's multiply-accumulates and its input and output rows;
  one per element for ops without a weight).
- ``streaming``: one kernel at a time, each from column 0 over as much of the mesh as it can use:
  a matmul takes every column, capped by its outputs, and the lowering then searches narrower widths
  on the clock (``tune.py``). A matmul whose data does not fit the mesh runs in passes
  (``split_streamed.py``).

    >>> mesh = MeshSpec(8, 4)
    >>> [str(r) for r in regions([1, 1], [100.0, 300.0], mesh, 4, "pipelined")]
    ['[0,0 2x4]', '[2,0 6x4]']
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from sparsefx.errors import LoweringError
from sparsefx.runtime.cost import features_of
from sparsefx.runtime.memory import ACC_BYTES, ROWS_IN_FLIGHT, itemsize
from sparsefx.runtime.mesh import MeshSpec
from sparsefx.runtime.op_kinds import op_kind
from sparsefx.runtime.program import Region

from .builder import Pending

__all__ = ["lanes_for", "work", "min_width", "max_width", "regions", "SRAM_MARGIN"]

SRAM_MARGIN = 0.9  # size for 90% of SRAM: balanced slices and lane rounding add a little per PE


def lanes_for(pending: list[Pending], inputs: list[tuple[int, ...]], mesh: MeshSpec) -> int:
    """Rows the program uses: one per feature of its widest value, at most the mesh height."""
    widest = max([features_of(p.shape) for p in pending] + [features_of(s) for s in inputs] + [1])
    return max(1, min(mesh.height, widest))


def work(p: Pending) -> float:
    """What a pipelined kernel's share of spare columns is weighed by: a sparse matmul's
    multiply-accumulates (nonzeros times rows) plus the rows of every input feature it receives and
    every output it sends, which do not shrink with its nonzeros; an activation matmul's
    multiply-accumulates; elements otherwise."""
    if p.op == "sparse_matmul" and p.sparse is not None:
        out, inp = p.sparse.weight.shape
        rows = math.prod(p.shape) // max(out, 1)
        return p.flops / 2 + rows * (out + inp)
    if op_kind(p.op).matmul:
        return p.flops / 2
    if p.op == "constant":
        return 0.0
    return float(math.prod(p.shape))


def _resident_bytes(p: Pending) -> int:
    """Bytes a kernel keeps whole: its payloads, but a table whose rows the host sends (``gather``)."""
    kept = {n: t for n, t in p.payload.items() if not (n == "table" and p.attrs.get("gather"))}
    return sum(t.numel() * t.element_size() for t in kept.values())


def min_width(p: Pending, lanes: int, sram: int, rows: int = ROWS_IN_FLIGHT) -> int:
    """Fewest columns whose PEs hold the kernel's data with ``rows`` rows in flight (an estimate the
    final check confirms)."""
    budget = sram * SRAM_MARGIN
    rows_bytes = rows * itemsize(p.dtype)
    if p.sparse is not None:
        out, inp = p.sparse.weight.shape
        nnz = p.sparse.nnz
        value = p.sparse.weight.element_size()
        band = math.ceil(inp / lanes)
        per_lane_fixed = (band + 1) * 4 + band * rows_bytes
        for w in _widths(max(1, out)):
            per_pe = math.ceil(nnz / (w * lanes)) * (value + 4) + per_lane_fixed
            per_pe += math.ceil(out / w) * rows * ACC_BYTES + math.ceil(out / lanes) * value
            if per_pe <= budget:
                return w
        raise LoweringError(
            f"kernel {p.name!r} ({p.source}) cannot fit: even one output per column needs more than "
            f"{sram} bytes of SRAM per PE"
        )
    streaming = 2 * ROWS_IN_FLIGHT * math.ceil(features_of(p.shape) / lanes) * itemsize(p.dtype)  # in and out
    room = budget - streaming
    if room <= 0:
        raise LoweringError(f"kernel {p.name!r}: its row buffers alone exceed {sram} bytes of SRAM per PE")
    return max(1, math.ceil(_resident_bytes(p) / (room * lanes)))


def _widths(limit: int) -> Iterator[int]:
    w = 1
    while w < limit:
        yield w
        w = max(w + 1, int(w * 1.25))
    yield limit


def max_width(p: Pending, lanes: int, mesh: MeshSpec) -> int:
    """Most columns a kernel can use: a matmul's outputs; one column for cheap elementwise kernels.

    Every AXPY starts a vector operation, so a PE with few nonzeros costs little more per nonzero than
    one with many: a sparse matmul takes as many columns as it has outputs, and its partial sums share
    more columns' buses."""
    if p.sparse is not None:
        return max(1, min(mesh.width, p.sparse.weight.shape[0]))
    if p.op == "matmul":
        return max(1, min(mesh.width, features_of(p.shape)))
    return 1


def regions(
    min_widths: list[int],
    works: list[float],
    mesh: MeshSpec,
    lanes: int,
    mode: str,
    max_widths: list[int] | None = None,
    names: list[str] | None = None,
) -> list[Region]:
    """One region per kernel (see the module docstring)."""
    caps = max_widths or [mesh.width] * len(min_widths)
    label = names or [f"number {i}" for i in range(len(min_widths))]
    if mode == "streaming":
        for i, w in enumerate(min_widths):
            if w > mesh.width:
                raise LoweringError(
                    f"kernel {label[i]!r} needs {w} columns of {lanes} PEs for its data; "
                    f"the mesh has {mesh.width}"
                )
        return [Region(0, 0, max(w, min(c, mesh.width)), lanes) for w, c in zip(min_widths, caps)]
    need = sum(min_widths)
    if need > mesh.width:
        raise LoweringError(
            f"a pipelined program of {len(min_widths)} kernels needs at least {need} columns of {lanes} PEs; "
            f"the {mesh} mesh has {mesh.width}. Use mode='streaming' or a wider mesh"
        )
    widths = _share(min_widths, works, caps, mesh.width - need)
    out, x = [], 0
    for w in widths:
        out.append(Region(x, 0, w, lanes))
        x += w
    return out


def _share(widths: list[int], works: list[float], caps: list[int], spare: int) -> list[int]:
    """Give ``spare`` columns in proportion to work, never past a kernel's cap."""
    widths = list(widths)
    while spare > 0:
        open_ = [i for i, w in enumerate(widths) if w < caps[i] and works[i] > 0]
        total = sum(works[i] for i in open_)
        if not open_ or total <= 0:
            break
        given = 0
        for i in open_:
            add = min(caps[i] - widths[i], int(spare * works[i] / total))
            widths[i] += add
            given += add
        if given == 0:  # the shares round to zero: hand out single columns by work
            for i in sorted(open_, key=lambda j: -works[j])[:spare]:
                widths[i] += 1
                given += 1
        spare -= given
    return widths
