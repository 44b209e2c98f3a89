"""The ``balanced`` placement: every PE of a region holds the same number of nonzeros, to within one.

Two cuts, both by count. The nonzeros, ordered by input feature (then output), are cut into ``height``
equal runs, one per region row: row ``r`` takes the features ``[in_lo, in_hi)`` its run touches, and a
feature on a boundary is shared with the neighbouring row (each holds part of its column). Each row's
nonzeros, ordered by output (then input), are cut into ``width`` equal runs, one per PE: PE ``(c, r)``
takes the outputs ``[out_lo, out_hi)`` its run touches, again sharing a boundary output with its
neighbour. Outputs are counted cyclically from the row's first nonzero, so a row that holds the tail of
one input's outputs and the head of the next one's has no gap inside a PE's range; such a range may pass
``out`` and wrap to output 0 (output ``o`` is local index ``(o - out_lo) % out``). So neither the mask's
pattern nor a lane count that does not divide the features leaves a PE with more work than the rest. The
input features reach the rows that hold them over the kernel's vertical buses; the arrays follow
``runtime/csc.py``::

    >>> w = torch.tensor([[1.0, 2.0], [3.0, 0.0], [4.0, 5.0]])
    >>> a = place_balanced(w, w != 0, width=1, height=2)
    >>> a["in_lo"].tolist(), a["in_hi"].tolist(), a["nz_ptr"].tolist()  # feature 0 shared by both rows
    ([0, 0], [1, 2], [0, 2, 5])
    >>> a["col_ptr"].tolist(), a["row_idx"].tolist(), a["values"].tolist()
    ([0, 2, 0, 1, 3], [0, 1, 0, 0, 1], [1.0, 3.0, 4.0, 5.0, 2.0])
"""

from __future__ import annotations

import torch

__all__ = ["place_balanced"]

_I16_SPAN = 2**15


def _cuts(total: torch.Tensor | int, parts: int) -> torch.Tensor:
    """Start offsets of ``parts`` runs of ``total`` items, sizes differing by at most one."""
    return torch.arange(parts + 1, dtype=torch.int64) * int(total) // parts


def place_balanced(
    weight: torch.Tensor, mask: torch.Tensor, width: int, height: int
) -> dict[str, torch.Tensor]:
    """The per-PE CSC arrays of the balanced placement (see the module docstring)."""
    out_features, in_features = weight.shape
    pes = width * height
    flat = mask.t().reshape(-1).nonzero().squeeze(1)  # by input feature, then output
    nnz = len(flat)
    j = (flat // out_features).to(torch.int32)
    i = (flat % out_features).to(torch.int32)
    del flat
    row_start = _cuts(nnz, height)
    row = torch.repeat_interleave(
        torch.arange(height, dtype=torch.int32), row_start[1:] - row_start[:-1], output_size=nnz
    )
    # Within each row, order by output then input, the outputs counted cyclically from the row's first
    # nonzero's: a row holding the tail of one input (outputs a..out) and the head of the next
    # (outputs 0..b) is then one run a..out, 0..b, and no PE's range spans the gap between b and a.
    in_lo_row, in_hi_row = _row_inputs(j, row_start, height)  # before j leaves input order
    first_out = i[row_start[:-1].clamp(max=max(nnz - 1, 0))].to(torch.int64) if nnz else torch.zeros(height)
    rot = ((i.to(torch.int64) - first_out[row]) % out_features).to(torch.int32)
    key = _small(row.to(torch.int64) * out_features + rot, height * out_features)
    order = torch.sort(key, stable=True).indices  # sorting keeps each row's block where it is
    del key
    j, i, rot = j[order], i[order], rot[order]
    del order
    # PE of each position: in row r (count n), chunk c starts at floor(c * n / width).
    count = (row_start[1:] - row_start[:-1])[row.to(torch.int64)]
    pos = torch.arange(nnz) - row_start[:-1][row.to(torch.int64)]
    pe = row.to(torch.int64) * width + ((pos + 1) * width + count - 1) // count.clamp(min=1) - 1
    del count, pos, row
    # CSC order: by PE, then input; a stable sort keeps the (cyclic) output order within each input.
    csc = torch.sort(_small(pe * in_features + j, pes * in_features), stable=True).indices
    pe_s, j_s, i_s, rot_s = pe[csc], j[csc], i[csc], rot[csc].to(torch.int64)
    del pe, csc, rot
    per_pe = torch.bincount(pe_s, minlength=pes)
    nz_ptr = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(per_pe, 0, out=nz_ptr[1:])
    rot_lo, rot_hi = _ranges(rot_s, nz_ptr, per_pe)
    base = first_out[torch.arange(pes) // width] if nnz else torch.zeros(pes, dtype=torch.int64)
    out_lo = torch.where(per_pe > 0, (rot_lo + base) % out_features, 0)
    out_hi = out_lo + (rot_hi - rot_lo)  # may pass out_features: the range wraps to output 0
    row_first = torch.repeat_interleave(torch.arange(height), width)
    in_lo, in_hi = in_lo_row[row_first], in_hi_row[row_first]
    out_lo, out_hi = _fill_empty(out_lo, out_hi, per_pe, width)
    spans = in_hi - in_lo
    col_ptr_off = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(spans + 1, 0, out=col_ptr_off[1:])
    slot = col_ptr_off[:-1][pe_s] + 1 + (j_s.to(torch.int64) - in_lo[pe_s])
    col_ptr = torch.bincount(slot, minlength=int(col_ptr_off[-1])).cumsum(0)
    col_ptr -= torch.repeat_interleave(col_ptr[col_ptr_off[:-1]], spans + 1, output_size=len(col_ptr))
    local = (i_s.to(torch.int64) - out_lo[pe_s]) % out_features
    wide = bool(len(out_hi)) and int((out_hi - out_lo).max()) >= _I16_SPAN
    values = weight.reshape(-1)[i_s.to(torch.int64) * in_features + j_s]
    return {
        "out_lo": out_lo.to(torch.int32),
        "out_hi": out_hi.to(torch.int32),
        "in_lo": in_lo.to(torch.int32),
        "in_hi": in_hi.to(torch.int32),
        "nz_ptr": nz_ptr,
        "col_ptr_off": col_ptr_off,
        "col_ptr": col_ptr.to(torch.int32),
        "row_idx": local.to(torch.int32 if wide else torch.int16),
        "values": values,
    }


def _small(key: torch.Tensor, bound: int) -> torch.Tensor:
    """``key`` as int32 when every value is below ``bound`` < 2**31 (sorting int32 is faster)."""
    return key.to(torch.int32) if bound < 2**31 else key


def _ranges(
    i_s: torch.Tensor, nz_ptr: torch.Tensor, per_pe: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest + 1 output of each PE's nonzeros (0, 0 for an empty PE)."""
    pes = len(per_pe)
    lo = torch.zeros(pes, dtype=torch.int64)
    hi = torch.zeros(pes, dtype=torch.int64)
    full = per_pe > 0
    if len(i_s):
        seg = torch.repeat_interleave(torch.arange(pes), per_pe, output_size=len(i_s))
        i64 = i_s.to(torch.int64)
        lo.scatter_reduce_(0, seg, i64, reduce="amin", include_self=False)
        hi.scatter_reduce_(0, seg, i64 + 1, reduce="amax", include_self=False)
    return torch.where(full, lo, 0), torch.where(full, hi, 0)


def _row_inputs(j: torch.Tensor, row_start: torch.Tensor, height: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's input features ``[in_lo, in_hi)``: those its run of nonzeros touches."""
    lo = torch.zeros(height, dtype=torch.int64)
    hi = torch.zeros(height, dtype=torch.int64)
    full = row_start[1:] > row_start[:-1]
    if len(j):
        first = row_start[:-1].clamp(max=len(j) - 1)
        last = (row_start[1:] - 1).clamp(min=0)
        lo = torch.where(full, j[first].to(torch.int64), 0)
        hi = torch.where(full, j[last].to(torch.int64) + 1, 0)
    hi = torch.where(full, hi, lo)
    return lo, hi


def _fill_empty(
    lo: torch.Tensor, hi: torch.Tensor, per_pe: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty PE gets the empty range at its left neighbour's ``out_hi`` in the same row (0 first)."""
    empty = per_pe == 0
    if not bool(empty.any()):
        return lo, hi
    hi_rows = hi.view(-1, width).clone()
    mask = empty.view(-1, width)
    for c in range(width):  # a loop over columns, not PEs; only when some PE is empty
        prev = hi_rows[:, c - 1] if c else torch.zeros_like(hi_rows[:, 0])
        hi_rows[:, c] = torch.where(mask[:, c], prev, hi_rows[:, c])
    hi = hi_rows.reshape(-1)
    return torch.where(empty, hi, lo), hi
