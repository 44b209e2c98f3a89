"""The balanced placement (``place_balanced.py``) as compiled passes, where numba is installed.

The tensor form sorts every nonzero by (region column, input, output), gathers the result into PE
order and reduces each PE's run: some fifteen passes over the nonzeros, about a second for GPT-2
small's LM head at 90% (3.9 million nonzeros), placed a dozen times while the lowering searches its
width. Counting gives the same order without a sort. One pass lists the mask's nonzeros in output
order (kept for the next width); one counts each region column's nonzeros of each input (a nonzero's
column follows from its place in output order, as the first cut has it), and the running counts give
each (column, input) run its start and the row cuts (``runtime.layout.cut_rows``, the rule
``place_balanced`` follows); one drops every nonzero, with its value, into its run in output order,
which is the stable sort's tie rule; two walk each PE's run, for its ranges and then for its column
offsets, row indices and values. The arrays are the tensor form's, bit for bit
(``tests/test_place_loops.py``). ``place`` returns None where the loops do not run
(``runtime.compiled.available``: numba missing, ``SPARSEFX_NUMBA=0``, or tensors off the CPU)::

    >>> w = torch.tensor([[1.0, 2.0], [3.0, 0.0], [4.0, 5.0]])
    >>> a = place(w, w != 0, width=1, height=2)
    >>> a is None or (a["in_lo"].tolist(), a["in_hi"].tolist()) == ([0, 0], [1, 2])  # numba or not
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from sparsefx.runtime.compiled import available, lazy
from sparsefx.runtime.encoding import row_index_dtype
from sparsefx.runtime.layout import cut_rows, ones_runs

__all__ = ["place", "arrays", "kept_for_mask"]

T = TypeVar("T")

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # values move as raw bits


def place(
    weight: torch.Tensor, mask: torch.Tensor, width: int, height: int, drift: int | None = None
) -> dict[str, torch.Tensor] | None:
    """``place_balanced``'s arrays from the compiled passes (module docstring); None where they do not run."""
    if not available(weight, mask) or weight.element_size() not in _BITS:
        return None
    out_features, in_features = mask.shape
    pes = width * height
    dense = bool(mask.all())  # kept dense: each (column, input) run is a range of outputs (no scan)
    if dense:
        nnz = out_features * in_features
        first, counts = ones_runs(in_features, out_features, width)
    else:
        i, j = _nonzeros(mask)
        nnz = len(i)
        counts = torch.zeros(width * in_features, dtype=torch.int64)
        column = np.empty(nnz, np.int64)
        _count(j, width, in_features, column, counts.numpy())
    ptr, bounds = cut_rows(counts.view(width, in_features), height, drift)
    nz_ptr = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(bounds.diff(dim=1).t().reshape(-1), 0, out=nz_ptr[1:])  # PE (c, r) is r * width + c
    bits = weight.detach().contiguous().view(_BITS[weight.element_size()]).reshape(-1).numpy()
    si, sj, sv = np.empty(nnz, np.int64), np.empty(nnz, np.int64), np.empty(nnz, bits.dtype)
    if dense:
        _runs(first.contiguous().numpy(), counts.contiguous().numpy(), bits, si, sj, sv)
    else:
        cursor = (bounds[:, :1] + ptr[:, :-1]).reshape(-1)  # where each (column, input) run starts
        _scatter(i, j, column, in_features, cursor.numpy(), bits, si, sj, sv)
    by_column = torch.zeros((4, width, height), dtype=torch.int64)  # in_lo, in_hi, out_lo, out_hi
    _ranges(si, sj, bounds.numpy(), by_column.numpy())
    in_lo, in_hi, out_lo, out_hi = by_column.transpose(1, 2).reshape(4, pes)  # PE order
    col_ptr_off = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(in_hi - in_lo + 1, 0, out=col_ptr_off[1:])  # each PE's offsets: span + 1
    values = np.empty(nnz, bits.dtype)
    row_idx = torch.empty(nnz, dtype=torch.int64)
    col_ptr = torch.zeros(int(col_ptr_off[-1]), dtype=torch.int64)
    starts = torch.stack([nz_ptr[:-1], col_ptr_off[:-1]]).view(2, height, width).transpose(1, 2)
    _fill(
        si, sj, sv, bounds.numpy(), by_column.numpy(), starts.contiguous().numpy(),
        values, row_idx.numpy(), col_ptr.numpy(),
    )  # fmt: skip
    values = torch.from_numpy(values).view(weight.dtype)
    return arrays(out_lo, out_hi, in_lo, in_hi, nz_ptr, col_ptr_off, col_ptr, row_idx, values)


def arrays(
    out_lo: torch.Tensor,
    out_hi: torch.Tensor,
    in_lo: torch.Tensor,
    in_hi: torch.Tensor,
    nz_ptr: torch.Tensor,
    col_ptr_off: torch.Tensor,
    col_ptr: torch.Tensor,
    row_idx: torch.Tensor,
    values: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """A balanced placement's arrays by role, in the dtypes ``runtime/csc.py`` stores: 32-bit ranges and
    offsets, 16-bit row indices where every PE's output span allows."""
    return {
        "out_lo": out_lo.to(torch.int32),
        "out_hi": out_hi.to(torch.int32),
        "in_lo": in_lo.to(torch.int32),
        "in_hi": in_hi.to(torch.int32),
        "nz_ptr": nz_ptr,
        "col_ptr_off": col_ptr_off,
        "col_ptr": col_ptr.to(torch.int32),
        "row_idx": row_idx.to(row_index_dtype(out_hi - out_lo)),
        "values": values,
    }


_LAST: list = []  # the last mask placed, its version, the key kept and what was kept for it


def kept_for_mask(mask: torch.Tensor, key: object, build: Callable[[], T]) -> T:
    """``build()``, kept for the last ``mask`` and ``key``: the tuner places one kernel at several
    widths and limits in a row, each time with a new view of the same mask (``detach``), so a view of
    the same memory, unchanged, finds it (the entry holds the mask alive)."""
    if _LAST and _same_memory(_LAST[0], mask) and _LAST[1] == mask._version and _LAST[2] == key:
        return _LAST[3]
    value = build()
    _LAST[:] = [mask, mask._version, key, value]
    return value


def _nonzeros(mask: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Output and input of each nonzero of ``mask``, in output order (kept for the next placement)."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        m = mask.contiguous().numpy()
        n = int(np.count_nonzero(m))
        i, j = np.empty(n, np.int64), np.empty(n, np.int64)
        _nonzeros_pass(m, i, j)
        return i, j

    return kept_for_mask(mask, "nonzeros", build)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


# -- the passes (plain Python until their first call compiles them) ------------------------------------


def _nonzeros_loop(mask, si, sj):  # pragma: no cover - runs compiled
    """Each nonzero's output and input, in output order."""
    rows, cols = mask.shape
    n = 0
    for i in range(rows):
        for j in range(cols):
            if mask[i, j]:
                si[n] = i
                sj[n] = j
                n += 1


def _count_loop(sj, width, cols, column, counts):  # pragma: no cover - runs compiled
    """Each nonzero's region column (the ``c``-th of ``width`` equal runs of the nonzeros in output
    order) into ``column``, and ``counts[c * cols + j]``: the nonzeros of input ``j`` in column ``c``."""
    nnz = len(sj)
    c, nxt = 0, nnz // width
    for p in range(nnz):
        while p >= nxt:
            c += 1
            nxt = (c + 1) * nnz // width
        column[p] = c
        counts[c * cols + sj[p]] += 1


def _scatter_loop(oi, oj, column, cols, cursor, bits, si, sj, sv):  # pragma: no cover - runs compiled
    """Each nonzero's output, input and value at its place in (column, input, output) order: ``cursor``
    holds where each (column, input) run starts and moves on as the run fills, output by output."""
    for p in range(len(oi)):
        i, j = oi[p], oj[p]
        at = cursor[column[p] * cols + j]
        cursor[column[p] * cols + j] = at + 1
        si[at] = i
        sj[at] = j
        sv[at] = bits[i * cols + j]


def _runs_loop(first, count, bits, si, sj, sv):  # pragma: no cover - runs compiled
    """An all-ones weight's entries in (column, input, output) order: each run a range of outputs."""
    width, cols = count.shape
    k = 0
    for c in range(width):
        for j in range(cols):
            for t in range(count[c, j]):
                i = first[c, j] + t
                si[k] = i
                sj[k] = j
                sv[k] = bits[i * cols + j]
                k += 1


def _ranges_loop(si, sj, bounds, out):  # pragma: no cover - runs compiled
    """``out[:, c, r]``: PE (c, r)'s input range (its run ascends by input) and output range; an empty
    PE keeps ranges of 0. Column by column, as the runs lie."""
    width, height = out.shape[1], out.shape[2]
    for c in range(width):
        for r in range(height):
            lo, hi = bounds[c, r], bounds[c, r + 1]
            if hi > lo:
                out[0, c, r] = sj[lo]
                out[1, c, r] = sj[hi - 1] + 1
                o_lo, o_hi = si[lo], si[lo]
                for k in range(lo + 1, hi):
                    o_lo = min(o_lo, si[k])
                    o_hi = max(o_hi, si[k])
                out[2, c, r] = o_lo
                out[3, c, r] = o_hi + 1


def _fill_loop(si, sj, sv, bounds, ranges, starts, values, row_idx, col_ptr):  # pragma: no cover - compiled
    """Each PE's nonzeros in its run's order, column by column: value, row index from its ``out_lo``,
    and its column offsets (``col_ptr[off + t]``: its nonzeros of inputs below ``in_lo + t``).
    ``starts[:, c, r]``: where PE (c, r)'s nonzeros and offsets start."""
    width, height = ranges.shape[1], ranges.shape[2]
    for c in range(width):
        for r in range(height):
            lo, hi = bounds[c, r], bounds[c, r + 1]
            at, off = starts[0, c, r] - lo, starts[1, c, r]
            in_lo, out_lo = ranges[0, c, r], ranges[2, c, r]
            for k in range(lo, hi):
                values[at + k] = sv[k]
                row_idx[at + k] = si[k] - out_lo
                col_ptr[off + 1 + sj[k] - in_lo] += 1
            for t in range(off + 1, off + 1 + ranges[1, c, r] - in_lo):
                col_ptr[t] += col_ptr[t - 1]


_nonzeros_pass, _count, _scatter = lazy(_nonzeros_loop), lazy(_count_loop), lazy(_scatter_loop)
_ranges, _fill, _runs = lazy(_ranges_loop), lazy(_fill_loop), lazy(_runs_loop)
