"""Readers of a ``sparse_matmul`` kernel's weight: CSC slices per PE, back to a dense weight and its mask.

PE ``p = r * width + c`` of a ``width`` x ``height`` region holds the nonzeros whose input lies in
``[in_lo[p], in_hi[p])`` (without those arrays: band ``r``, ``lane_bounds(in_features, height)``) and
whose output row lies in ``[out_lo[p], out_hi[p])`` (cyclically: ``out_hi`` may pass ``out_features``,
and output ``o`` has local index ``(o - out_lo) % out_features``), as CSC: its ``nz_ptr[p + 1] -
nz_ptr[p]`` nonzeros in ``row_idx``/``values``, and its input range + 1 column offsets (local, from 0 to
its nnz) at ``col_ptr[col_ptr_off[p]:col_ptr_off[p + 1]]``; row indices are local to ``out_lo[p]``.
``docs/architecture.md`` describes the mapping. One PE, one band of three inputs, two nonzeros (``W[0,
1] = 5``, ``W[1, 2] = 7``)::

    >>> arrays = {"out_lo": torch.tensor([0], dtype=torch.int32),
    ...           "out_hi": torch.tensor([2], dtype=torch.int32),
    ...           "nz_ptr": torch.tensor([0, 2]), "col_ptr_off": torch.tensor([0, 4]),
    ...           "col_ptr": torch.tensor([0, 0, 1, 2], dtype=torch.int32),
    ...           "row_idx": torch.tensor([0, 1], dtype=torch.int16),
    ...           "values": torch.tensor([5.0, 7.0])}
    >>> weight, mask = assemble(arrays, in_features=3, out_features=2, width=1, height=1)
    >>> weight.tolist(), mask.tolist()
    ([[0.0, 5.0, 0.0], [0.0, 0.0, 7.0]], [[False, True, False], [False, False, True]])
    >>> pe_nnz(arrays["nz_ptr"]).tolist(), imbalance(arrays["nz_ptr"])
    ([2], 1.0)
"""

from __future__ import annotations

import torch

from sparsefx.errors import ProgramFormatError

from .encoding import decode
from .program import lane_bounds

__all__ = ["assemble", "pe_nnz", "imbalance"]


def pe_nnz(nz_ptr: torch.Tensor) -> torch.Tensor:
    """Nonzeros each PE holds (int64, ``[pes]``), from the ``[pes + 1]`` offsets.

    >>> pe_nnz(torch.tensor([0, 3, 3, 7])).tolist()
    [3, 0, 4]
    """
    ptr = nz_ptr.to(torch.int64)
    return ptr[1:] - ptr[:-1]


def imbalance(nz_ptr: torch.Tensor) -> float:
    """Most nonzeros on one PE over the mean per PE of the region (1.0 when there are none).

    The slowest PE sets a sparse matmul's pace, so this is its slowdown against a perfect split.

    >>> imbalance(torch.tensor([0, 3, 3, 7]))  # max 4, mean 7 / 3
    1.7142857142857142
    """
    nnz = pe_nnz(nz_ptr)
    total = int(nnz.sum())
    if total == 0:
        return 1.0
    return int(nnz.max()) * len(nnz) / total


def assemble(
    arrays: dict[str, torch.Tensor], in_features: int, out_features: int, width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense weight ``[out, in]`` (zeros off the mask) and its bool mask, rebuilt from per-PE slices.

    ``arrays`` needs ``out_lo``, ``nz_ptr``, ``col_ptr_off``, ``col_ptr``, ``row_idx`` and ``values``
    (the module docstring has an example), or the packed form (``encoding.py``). Raises
    ``ProgramFormatError`` when their sizes disagree.
    """
    arrays = decode(arrays)
    pes = width * height
    nz_ptr = arrays["nz_ptr"].to(torch.int64)
    col_off = arrays["col_ptr_off"].to(torch.int64)
    col_ptr = arrays["col_ptr"].to(torch.int64)
    values = arrays["values"]
    if len(nz_ptr) != pes + 1 or len(col_off) != pes + 1 or len(arrays["out_lo"]) != pes:
        raise ProgramFormatError(
            f"per-PE arrays have {len(nz_ptr)} nz_ptr, {len(col_off)} col_ptr_off and "
            f"{len(arrays['out_lo'])} out_lo entries; a {width}x{height} region needs "
            f"{pes + 1}, {pes + 1} and {pes}"
        )
    nnz = nz_ptr[1:] - nz_ptr[:-1]
    in_lo, in_hi = _input_ranges(arrays, in_features, width, height)
    entries = col_off[1:] - col_off[:-1]  # input range + 1 per PE
    if len(col_ptr) != int(col_off[-1]) or not torch.equal(entries, in_hi - in_lo + 1):
        raise ProgramFormatError(
            f"col_ptr_off does not give each PE its input range + 1 of the {len(col_ptr)} col_ptr entries"
        )
    if len(values) != int(nz_ptr[-1]) or len(arrays["row_idx"]) != len(values):
        raise ProgramFormatError(
            f"nz_ptr ends at {int(nz_ptr[-1])}; row_idx has {len(arrays['row_idx'])} and values {len(values)}"
        )
    if not torch.equal(col_ptr[col_off[:-1]], torch.zeros_like(nnz)) or not torch.equal(
        col_ptr[col_off[1:] - 1], nnz
    ):
        raise ProgramFormatError("col_ptr does not run from 0 to each PE's nnz")
    pe_of_entry = torch.repeat_interleave(torch.arange(pes), entries)
    local = torch.arange(len(col_ptr)) - col_off[:-1][pe_of_entry]
    is_column = local < entries[pe_of_entry] - 1  # every entry but each PE's last opens a column
    counts = (col_ptr[1:] - col_ptr[:-1])[is_column[:-1]]
    column = (in_lo[pe_of_entry] + local)[is_column]
    if bool((counts < 0).any()):
        raise ProgramFormatError("col_ptr decreases inside a PE")
    cols = torch.repeat_interleave(column, counts, output_size=len(values))
    pe = torch.repeat_interleave(torch.arange(pes), nnz, output_size=len(values))
    rows = (arrays["row_idx"].to(torch.int64) + arrays["out_lo"].to(torch.int64)[pe]) % out_features
    flat = rows * in_features + cols
    weight = torch.zeros(out_features * in_features, dtype=values.dtype)
    mask = torch.zeros(out_features * in_features, dtype=torch.bool)
    weight[flat] = values
    mask[flat] = True
    return weight.view(out_features, in_features), mask.view(out_features, in_features)


def _input_ranges(
    arrays: dict[str, torch.Tensor], in_features: int, width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each PE's input features ``[in_lo, in_hi)``: its arrays', else its row's lane band."""
    if "in_lo" in arrays and "in_hi" in arrays:
        lo, hi = arrays["in_lo"].to(torch.int64), arrays["in_hi"].to(torch.int64)
        if (
            len(lo) != width * height
            or len(hi) != len(lo)
            or bool(((lo < 0) | (hi < lo) | (hi > in_features)).any())
        ):
            raise ProgramFormatError(f"in_lo/in_hi are not {width * height} ranges inside [0, {in_features}]")
        return lo, hi
    bounds = lane_bounds(in_features, height)
    return bounds[:-1].repeat_interleave(width), bounds[1:].repeat_interleave(width)
