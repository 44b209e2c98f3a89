"""The ``balanced`` placement: every PE of a region holds the same number of nonzeros, to within one.

Two cuts, both by count, and the columns first, so that each output's partial sums stay in one column
(or two, at a boundary) as they do with ``block``. The nonzeros, ordered by output (then input), are
cut into ``width`` equal runs, one per region column: column ``c`` takes the outputs its run touches,
and an output on a boundary is shared with the neighbouring column (each holds part of its row of
the weight). Each column's nonzeros, ordered by input (then output), are cut into ``height`` equal
runs, one per PE: PE ``(c, r)`` takes the inputs ``[in_lo, in_hi)`` its run touches, again sharing a
boundary input with the PE above or below, and ``[out_lo, out_hi)`` is the smallest range holding its
outputs. So neither the mask's pattern nor a lane count that does not divide the features leaves a PE
with more work than the rest. A row's input ranges differ a little from column to column; features
that land on a row other than their lane reach it over the kernel's vertical buses. An empty PE has
empty ranges at 0. The arrays follow ``runtime/csc.py``::

    >>> w = torch.tensor([[1.0, 2.0], [3.0, 0.0], [4.0, 5.0]])
    >>> a = place_balanced(w, w != 0, width=1, height=2)
    >>> a["in_lo"].tolist(), a["in_hi"].tolist(), a["nz_ptr"].tolist()  # input 0 shared by both rows
    ([0, 0], [1, 2], [0, 2, 5])
    >>> a["out_lo"].tolist(), a["out_hi"].tolist(), a["row_idx"].tolist(), a["values"].tolist()
    ([0, 0], [2, 3], [0, 1, 2, 0, 2], [1.0, 3.0, 4.0, 2.0, 5.0])
"""

from __future__ import annotations

import torch

from sparsefx.runtime.encoding import int32_if_fits
from sparsefx.runtime.layout import cut_rows

from . import place_loops

__all__ = ["place_balanced"]


def _cuts(total: torch.Tensor | int, parts: int) -> torch.Tensor:
    """Start offsets of ``parts`` runs of ``total`` items, sizes differing by at most one."""
    return torch.arange(parts + 1, dtype=torch.int64) * int(total) // parts


def place_balanced(
    weight: torch.Tensor, mask: torch.Tensor, width: int, height: int, drift: int | None = None
) -> dict[str, torch.Tensor]:
    """The per-PE CSC arrays of the balanced placement (see the module docstring); ``drift`` holds each
    row cut within that many input features of its lane's boundary. Where numba is installed the
    compiled passes of ``place_loops.py`` give the same arrays."""
    compiled = place_loops.place(weight, mask, width, height, drift)
    return compiled if compiled is not None else _tensor_form(weight, mask, width, height, drift)


def _tensor_form(
    weight: torch.Tensor, mask: torch.Tensor, width: int, height: int, drift: int | None
) -> dict[str, torch.Tensor]:
    """``place_balanced`` in tensor operations: the nonzeros sorted by column and input, cut into runs."""
    out_features, in_features = weight.shape
    pes = width * height
    flat, key = _by_column(mask, width)
    # PE (c, r) holds the run [bounds[c, r], bounds[c, r + 1]) of column c's nonzeros: taken in PE order
    # (row-major in the region), each PE's stay by input, then output.
    counts = torch.bincount(key, minlength=width * in_features).view(width, in_features)
    bounds = cut_rows(counts, height, drift)[1]
    first = bounds[:, :-1].t().reshape(-1)
    per_pe = (bounds[:, 1:] - bounds[:, :-1]).t().reshape(-1)
    nz_ptr = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(per_pe, 0, out=nz_ptr[1:])
    nnz = int(nz_ptr[-1])
    pe = torch.repeat_interleave(torch.arange(pes), per_pe, output_size=nnz)
    flat = flat[torch.repeat_interleave(first - nz_ptr[:-1], per_pe, output_size=nnz) + torch.arange(nnz)]
    i, j = flat // in_features, flat % in_features
    full = per_pe > 0  # a PE's inputs ascend: its first and last nonzero's are its range
    in_lo = torch.where(full, j[nz_ptr[:-1].clamp(max=max(nnz - 1, 0))] if nnz else 0, 0)
    in_hi = torch.where(full, j[(nz_ptr[1:] - 1).clamp(min=0)] + 1 if nnz else 0, 0)
    out_lo, out_hi = _ranges(i, pe, per_pe)
    spans = in_hi - in_lo
    col_ptr_off = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(spans + 1, 0, out=col_ptr_off[1:])
    slot = col_ptr_off[:-1][pe] + 1 + (j - in_lo[pe])
    col_ptr = torch.bincount(slot, minlength=int(col_ptr_off[-1])).cumsum(0)
    col_ptr -= torch.repeat_interleave(col_ptr[col_ptr_off[:-1]], spans + 1, output_size=len(col_ptr))
    row_idx, values = i - out_lo[pe], weight.reshape(-1)[flat]
    return place_loops.arrays(out_lo, out_hi, in_lo, in_hi, nz_ptr, col_ptr_off, col_ptr, row_idx, values)


def _by_column(mask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The nonzeros' flat positions ``output * in + input`` cut into ``width`` columns (the first cut),
    each column's by input then output, with their sort keys ``column * in + input`` (kept for the
    next placement at this width: ``place_loops.kept_for_mask``)."""

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        in_features = mask.shape[1]
        flat = mask.reshape(-1).nonzero().squeeze(1)  # by output, then input
        nnz = len(flat)
        column = torch.repeat_interleave(torch.arange(width), _cuts(nnz, width).diff(), output_size=nnz)
        # Within each column, by input then output: a stable sort keeps the output order of one input.
        keys = int32_if_fits(column * in_features + flat % in_features, width * in_features)
        key, order = torch.sort(keys, stable=True)
        return flat[order], key.to(torch.int64)

    return place_loops.kept_for_mask(mask, ("by column", width), build)


def _ranges(index: torch.Tensor, pe: torch.Tensor, per_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest + 1 of each PE's ``index`` values (0, 0 for an empty PE)."""
    pes = len(per_pe)
    lo = torch.zeros(pes, dtype=torch.int64)
    hi = torch.zeros(pes, dtype=torch.int64)
    if len(index):
        lo.scatter_reduce_(0, pe, index, reduce="amin", include_self=False)
        hi.scatter_reduce_(0, pe, index + 1, reduce="amax", include_self=False)
    full = per_pe > 0
    return torch.where(full, lo, 0), torch.where(full, hi, 0)
