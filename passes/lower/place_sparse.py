"""Place a masked weight on a region of PEs: the per-PE CSC slices of a ``sparse_matmul`` kernel.

PE ``(c, r)`` (local index ``p = r * width + c``) holds the nonzeros whose input feature lies in
``[in_lo[p], in_hi[p])`` and whose output lies in ``[out_lo[p], out_hi[p])``, as CSC
(``sparsefx.runtime.csc`` reads them back). The mask says what is a nonzero: a kept weight equal to
0.0 is stored. Placements:

* ``"block"``: region row ``r`` takes the input band ``[b[r], b[r + 1])`` (``lane_bounds(in,
  height)``, the features its lane carries) and ``width`` equal contiguous output ranges, the same on
  every row: a 2-D block partition;
* ``"balanced"``: every PE holds the same nnz to within one (``place_balanced.py``).

Block placement comes down to where each chunk starts. Prefix counts of the transposed mask turn the
starts into the nonzeros of each (PE, input) pair, hence every offset, and one gather moves the
nonzeros from input-major order into PE order. Nothing loops over PEs or nonzeros: region rows go in
groups of about ``GROUP_ENTRIES`` mask entries, through scratch buffers reused from group to group::

    >>> w = torch.tensor([[1.0, 2.0, 3.0], [0.0, 4.0, 0.0]])
    >>> a = place_sparse(w, w != 0, width=2, height=1, placement="block")
    >>> a["out_lo"].tolist(), a["out_hi"].tolist(), a["nz_ptr"].tolist()
    ([0, 1], [1, 2], [0, 3, 4])
    >>> a["col_ptr"].tolist(), a["row_idx"].tolist(), a["values"].tolist()
    ([0, 1, 2, 3, 0, 0, 1, 1], [0, 0, 0, 0], [1.0, 2.0, 3.0, 4.0])
"""

from __future__ import annotations

import torch

from sparsefx.errors import LoweringError
from sparsefx.runtime.encoding import I16_SPAN
from sparsefx.runtime.program import PLACEMENTS, lane_bounds

from .place_balanced import place_balanced

__all__ = ["place_sparse", "GROUP_ENTRIES"]

GROUP_ENTRIES = 1 << 21
"""Mask entries (inputs x outputs) per group of region rows placed together."""

_ORDER = ("out_lo", "out_hi", "in_lo", "in_hi", "nz_ptr", "col_ptr_off", "col_ptr", "row_idx", "values")


def place_sparse(
    weight: torch.Tensor,
    mask: torch.Tensor,
    width: int,
    height: int,
    placement: str,
    drift: int | None = None,
) -> dict[str, torch.Tensor]:
    """The arrays ``out_lo``, ``out_hi``, ``nz_ptr``, ``col_ptr_off``, ``col_ptr``, ``row_idx``, ``values``.

    ``weight`` is ``[out, in]``, ``mask`` a bool tensor of the same shape; the region is ``width``
    columns by ``height`` rows. ``row_idx`` is int16 when every PE's output span fits, else int32;
    ``values`` keep the weight's dtype. No bias: the caller adds it. ``drift`` is the balanced
    placement's limit on how far a row's inputs may move off its lane (``place_balanced``). The module
    docstring has an example.
    """
    out_features, in_features = _check(weight, mask, width, height, placement)
    if placement == "balanced":
        return place_balanced(weight.detach().cpu(), mask.detach().cpu(), width, height, drift)
    bounds = lane_bounds(in_features, height)
    mask_t = mask.detach().cpu().t().contiguous()  # [in, out]: a band is a run of rows
    weight_t = weight.detach().cpu().t().contiguous()
    nnz = int(mask_t.count_nonzero())
    values = torch.empty(nnz, dtype=weight.dtype)
    row_idx = torch.empty(nnz, dtype=torch.int16)
    parts: dict[str, list[torch.Tensor]] = {"out_lo": [], "out_hi": [], "nz_ptr": [], "col_ptr": []}
    scratch = _Scratch()
    done = 0
    for r0, r1 in _groups(bounds, out_features):
        lo, hi = int(bounds[r0]), int(bounds[r1])
        group = _place_group(mask_t[lo:hi], bounds[r0 : r1 + 1] - lo, width, scratch)
        n = int(group["nz_ptr"][-1])
        span = group["out_hi"] - group["out_lo"]
        if row_idx.dtype == torch.int16 and int(span.max()) >= I16_SPAN:
            row_idx = row_idx.to(torch.int32)
        _gather(
            mask_t[lo:hi], weight_t[lo:hi], group, values[done : done + n], row_idx[done : done + n], scratch
        )
        parts["nz_ptr"].append(group["nz_ptr"][:-1] + done)
        for key in ("out_lo", "out_hi", "col_ptr"):
            parts[key].append(group[key])
        done += n
    parts["nz_ptr"].append(torch.tensor([done]))
    arrays = {key: torch.cat(pieces) for key, pieces in parts.items()}
    for key in ("out_lo", "out_hi", "col_ptr"):
        arrays[key] = arrays[key].to(torch.int32)
    band_width = bounds[1:] - bounds[:-1]
    arrays["col_ptr_off"] = torch.zeros(width * height + 1, dtype=torch.int64)
    torch.cumsum((band_width + 1).repeat_interleave(width), 0, out=arrays["col_ptr_off"][1:])
    arrays.update(row_idx=row_idx, values=values)
    arrays["in_lo"] = bounds[:-1].to(torch.int32).repeat_interleave(width)
    arrays["in_hi"] = bounds[1:].to(torch.int32).repeat_interleave(width)
    return {key: arrays[key] for key in _ORDER}


def _check(
    weight: torch.Tensor, mask: torch.Tensor, width: int, height: int, placement: str
) -> tuple[int, int]:
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LoweringError(f"region {name} {value!r} is not valid; it must be an integer >= 1")
    if placement not in PLACEMENTS:
        raise LoweringError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
    if weight.dim() != 2 or weight.numel() == 0:
        raise LoweringError(f"weight of shape {tuple(weight.shape)} is not a non-empty 2-D [out, in] matrix")
    if mask.shape != weight.shape:
        raise LoweringError(
            f"mask of shape {tuple(mask.shape)} does not match weight of shape {tuple(weight.shape)}"
        )
    if mask.dtype != torch.bool:
        raise LoweringError(f"mask has dtype {mask.dtype}; it must be torch.bool")
    return weight.shape[0], weight.shape[1]


class _Scratch:
    """Buffers that grow to the largest group and are reused (fresh pages cost more than the work)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized ``shape`` tensor, in the memory of the last ``take`` of ``name`` when it fits."""
        size = 1
        for d in shape:
            size *= d
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < size:
            buffer = self._buffers[name] = torch.empty(size, dtype=dtype)
        return buffer[:size].view(shape)


def _groups(bounds: torch.Tensor, out_features: int) -> list[tuple[int, int]]:
    """Runs ``[r0, r1)`` of region rows whose bands hold about ``GROUP_ENTRIES`` mask entries each."""
    key = bounds[:-1] * out_features // GROUP_ENTRIES
    sizes = torch.unique_consecutive(key, return_counts=True)[1]
    ends = torch.cumsum(sizes, 0).tolist()
    return list(zip([0] + ends[:-1], ends))


def _count_dtype(n: int) -> torch.dtype:
    """int32 when counts up to ``n`` fit, else int64."""
    return torch.int32 if n < 2**31 else torch.int64


def _place_group(
    mask_t: torch.Tensor, bounds: torch.Tensor, width: int, scratch: _Scratch
) -> dict[str, torch.Tensor]:
    """Offsets and per-segment tables of the region rows whose bands are ``bounds`` (local to ``mask_t``).

    A segment is the nonzeros of one input on one PE; segments run in (region row, PE column, input)
    order, the order of the nonzeros in the arrays.
    """
    inputs, out_features = mask_t.shape
    rows = len(bounds) - 1
    band_width = bounds[1:] - bounds[:-1]
    # [j, i]: nonzeros of input j in output rows <= i
    upto = scratch.take("prefix", (inputs, out_features), _count_dtype(out_features + 1))
    torch.cumsum(mask_t, 1, dtype=upto.dtype, out=upto)
    first = torch.arange(width + 1) * out_features // width
    first_row = first.expand(rows, width + 1)
    out_lo, out_hi = first[:-1].repeat(rows), first[1:].repeat(rows)
    counts, before, column = _segment_counts(upto, bounds, first_row)
    group = _offsets(counts, band_width, width)
    per_input = upto[:, -1].to(torch.int64)
    # where each segment's nonzeros start among the group's nonzeros in input-major order
    source = (torch.cumsum(per_input, 0) - per_input)[column] + before
    pe = torch.repeat_interleave(torch.arange(rows * width), band_width.repeat_interleave(width))
    group.update(counts=counts, shift=source - group["seg_start"], out_lo=out_lo, out_hi=out_hi)
    group["row_base"] = column * out_features + out_lo[pe]  # input-major flat position of local row 0
    return group


def _boundary_entries(bounds: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every (region row ``r``, boundary ``c`` in ``0..width``, input ``j`` of band ``r``), in that order."""
    band_width = bounds[1:] - bounds[:-1]
    per_row = (width + 1) * band_width
    r = torch.repeat_interleave(torch.arange(len(band_width)), per_row)
    within = torch.arange(len(r)) - (torch.cumsum(per_row, 0) - per_row)[r]
    bw = band_width[r].clamp(min=1)
    return r, within // bw, bounds[:-1][r] + within % bw


def _segment_counts(
    upto: torch.Tensor, bounds: torch.Tensor, first_row: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nonzeros of each segment, nonzeros of its input before it, and its input (int64, segment order).

    At a chunk boundary ``first_row``, input ``j`` has passed every nonzero of the rows above.
    """
    out_features = upto.shape[1]
    width = first_row.shape[1] - 1
    r, c, j = _boundary_entries(bounds, width)
    row = first_row[r, c].to(torch.int64)
    above = upto.view(-1)[j * out_features + (row - 1).clamp(min=0)].to(torch.int64)
    before = torch.where(row > 0, above, 0)
    keep = c < width
    following = torch.arange(len(j)) + (bounds[1:] - bounds[:-1])[r]  # the same input, next boundary
    return before[following[keep]] - before[keep], before[keep], j[keep]


def _offsets(counts: torch.Tensor, band_width: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
    """``nz_ptr`` (from 0) and ``col_ptr`` from the per-segment counts, and each segment's first slot."""
    pes = width * len(band_width)
    ends = torch.zeros(len(counts) + 1, dtype=torch.int64)  # slot after segment s - 1
    torch.cumsum(counts, 0, out=ends[1:])
    cols = band_width.repeat_interleave(width)  # segments per PE
    first_seg = torch.zeros(pes + 1, dtype=torch.int64)
    torch.cumsum(cols, 0, out=first_seg[1:])
    pe = torch.repeat_interleave(torch.arange(pes), cols + 1)
    k = torch.arange(len(pe)) - (first_seg + torch.arange(pes + 1))[:-1][pe]  # entry k: end of column k - 1
    nz_ptr = ends[first_seg]
    col_ptr = ends[first_seg[:-1][pe] + k] - nz_ptr[:-1][pe]
    return {"nz_ptr": nz_ptr, "col_ptr": col_ptr, "seg_start": ends[:-1]}


def _per_slot(
    out: torch.Tensor, value: torch.Tensor, start: torch.Tensor, fill: int, scratch: _Scratch
) -> torch.Tensor:
    """``out[q] = value[s] + fill * q`` for slot ``q`` of segment ``s``: a cumsum of the steps at starts."""
    n = len(out)
    step = scratch.take("step", (n,), out.dtype).fill_(fill)
    delta = value - torch.cat([value.new_zeros(1), value[:-1]])
    delta[0] -= fill
    inside = start < n  # empty segments at the end start past the last slot
    step.index_add_(0, start[inside], delta[inside].to(out.dtype))
    return torch.cumsum(step, 0, out=out)


def _gather(
    mask_t: torch.Tensor,
    weight_t: torch.Tensor,
    group: dict[str, torch.Tensor],
    values: torch.Tensor,
    row_idx: torch.Tensor,
    scratch: _Scratch,
) -> None:
    """Fill ``values`` and ``row_idx`` with the group's nonzeros in segment order.

    Slot ``q`` of segment ``s`` holds nonzero number ``q + shift[s]`` of the group in input-major
    order; its flat position there, less ``row_base[s]``, is its local row.
    """
    n = len(values)
    if n == 0:
        return
    order = scratch.take("order", (n, 1), torch.int64)
    torch.nonzero(mask_t.reshape(-1), out=order)  # flat positions, input-major
    source = _per_slot(
        scratch.take("source", (n,), torch.int64), group["shift"], group["seg_start"], 1, scratch
    )
    position = torch.index_select(order.view(-1), 0, source, out=scratch.take("position", (n,), torch.int64))
    torch.index_select(weight_t.reshape(-1), 0, position, out=values)
    base = _per_slot(order.view(-1), group["row_base"], group["seg_start"], 0, scratch)
    row_idx.copy_(position.sub_(base))
