"""Where a sparse matmul's nonzeros sit, as the clocks read it: per PE, its input and output ranges and
the nonzeros of each of its input columns.

``layout(program, kernel)`` reads the kernel's CSC slices (decoded once where the program stores them
packed, ``encoding.py``). A kernel marked ``all_ones`` (the dense
baseline, ``runtime/baseline.py``) holds every weight: its layout is a placement's geometry, with no
arrays at all, so a dense GPT-2 costs nothing to describe. ``all_ones: true`` is the block placement;
``all_ones: "balanced"`` the balanced placement of an all-ones weight (``attrs["drift"]`` its row-cut
limit), computed here from counts alone, equal to what ``place_balanced`` gives for ones::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import ProgramData, Kernel, Region
    >>> p = ProgramData(MeshSpec(4, 4), HardwareSpec(), "pipelined", "block")
    >>> k = Kernel("fc", "sparse_matmul", Region(0, 0, 2, 2), ("x",), (1, 6), "float32",
    ...            attrs={"kind": "linear", "in_features": 4, "out_features": 6, "all_ones": True})
    >>> s = layout(p, k)
    >>> s.in_lo.tolist(), s.out_lo.tolist(), s.span.tolist(), s.counts.tolist()
    ([0, 0, 2, 2], [0, 3, 0, 3], [3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3])
    >>> weight_bytes(p, k)  # a dense layout: 24 fp32 values and 4 one-byte ranges on each of 4 PEs
    112

A kernel that keeps every entry of its weight (``dense_layout``: the baseline's, or a real one lowered
at sparsity 0 or kept dense) stores and loads it in a dense layout: each PE's values in order, found
from its input and output ranges, without the row indices and column offsets a sparse slice needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .compiled import available, lazy
from .encoding import range_bytes, sparse_arrays
from .memo import kept
from .memory import itemsize
from .program import Kernel, ProgramData, lane_bounds
from .sparse_eval import read_slices

__all__ = [
    "Layout",
    "layout",
    "placed",
    "weight_bytes",
    "sparse_bytes",
    "dense_layout",
    "balanced_ones",
    "row_cuts",
    "cut_rows",
    "ones_runs",
]


@dataclass(frozen=True)
class Layout:
    """Per PE (row-major in the region): input range, cyclic output range, nonzeros per input column."""

    in_features: int
    out_features: int
    in_lo: torch.Tensor
    in_hi: torch.Tensor
    out_lo: torch.Tensor
    span: torch.Tensor
    counts: torch.Tensor  # flat: PE 0's columns in order, then PE 1's ...


def layout(program: ProgramData, k: Kernel) -> Layout:
    """The layout of sparse matmul ``k``: from its arrays, or the dense geometry when ``all_ones``."""
    r = k.region
    in_f, out_f = int(k.attrs["in_features"]), int(k.attrs["out_features"])
    if k.attrs.get("all_ones") == "balanced":
        return balanced_ones(in_f, out_f, r.width, r.height, k.attrs.get("drift"))
    if k.attrs.get("all_ones"):
        ins, outs = lane_bounds(in_f, r.height), lane_bounds(out_f, r.width)
        in_lo, in_hi = ins[:-1].repeat_interleave(r.width), ins[1:].repeat_interleave(r.width)
        out_lo, span = outs[:-1].repeat(r.height), outs.diff().repeat(r.height)
        counts = torch.repeat_interleave(span, in_hi - in_lo)
        return Layout(in_f, out_f, in_lo, in_hi, out_lo, span, counts)
    arrays = sparse_arrays(program, k)
    s = read_slices(arrays, in_f, out_f, r.width, r.height, f"kernel {k.name!r} ({k.op})")
    return _counted(in_f, out_f, s.in_lo, s.in_hi, s.out_lo, s.span, s.col_ptr, s.col_ptr_off)


def placed(arrays: dict[str, torch.Tensor], in_f: int, out_f: int) -> Layout | None:
    """The layout of a placement's own arrays (``place_sparse``'s: unpacked, each PE's input range
    given, well formed), without the checks ``layout`` makes of a program's; None without input ranges."""
    if "in_lo" not in arrays:
        return None
    lo, hi, out_lo, out_hi, col_ptr, col_off = (
        arrays[r].to(torch.int64) for r in ("in_lo", "in_hi", "out_lo", "out_hi", "col_ptr", "col_ptr_off")
    )
    return _counted(in_f, out_f, lo, hi, out_lo, out_hi - out_lo, col_ptr, col_off)


def _counted(
    in_f: int,
    out_f: int,
    in_lo: torch.Tensor,
    in_hi: torch.Tensor,
    out_lo: torch.Tensor,
    span: torch.Tensor,
    col_ptr: torch.Tensor,
    col_ptr_off: torch.Tensor,
) -> Layout:
    """A ``Layout`` whose counts are the steps of each PE's column offsets."""
    steps = col_ptr.diff()
    inside = torch.ones_like(steps, dtype=torch.bool)
    if len(col_ptr_off) > 2:
        inside[col_ptr_off[1:-1] - 1] = False  # the step from one PE's last offset to the next's first
    return Layout(in_f, out_f, in_lo, in_hi, out_lo, span, steps[inside])


def balanced_ones(in_f: int, out_f: int, width: int, height: int, drift: int | None) -> Layout:
    """The balanced placement of an all-ones ``[out_f, in_f]`` weight on ``width`` x ``height`` PEs
    (``passes/lower/place_balanced.py``), from how many outputs of each input every column holds; a
    geometry, so it is kept (``memo.kept``) and the same ``Layout`` comes back for the same arguments.

    Column ``c`` takes flat entries ``[c * n // width, (c + 1) * n // width)`` of the weight in output
    order; in its input order, input ``j`` holds outputs ``first[c, j]`` on, ``count[c, j]`` of them.
    The row cuts then follow ``place_balanced``'s rule on the running counts ``ptr``."""
    key = ("balanced ones", in_f, out_f, width, height, drift)
    return kept(None, key, lambda: _balanced_ones(in_f, out_f, width, height, drift))


def ones_runs(in_f: int, out_f: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, count)``, ``[width, in_f]`` each: the outputs of each input that each column of a
    balanced placement holds of an all-ones ``[out_f, in_f]`` weight, ``first[c, j]`` on. Column ``c``
    takes flat entries ``[c * n // width, (c + 1) * n // width)`` of the weight in output order.

        >>> first, count = ones_runs(2, 3, 2)  # column 0: (0, 0), (0, 1), (1, 0); column 1 the rest
        >>> first.tolist(), count.tolist()
        ([[0, 0], [2, 1]], [[2, 1], [1, 2]])
    """
    n = in_f * out_f
    edges = torch.arange(width + 1, dtype=torch.int64) * n // width
    a, b, j = edges[:-1, None], edges[1:, None], torch.arange(in_f)[None, :]
    first = -torch.div(j - a, in_f, rounding_mode="floor")  # ceil((a - j) / in_f)
    count = (torch.div(b - 1 - j, in_f, rounding_mode="floor") - first + 1).clamp(min=0)
    return first, count


def _balanced_ones(in_f: int, out_f: int, width: int, height: int, drift: int | None) -> Layout:
    n = in_f * out_f
    first, count = ones_runs(in_f, out_f, width)
    ptr, bounds = cut_rows(count, height, drift)
    bounds = bounds - bounds[:, :1]  # from each column's start
    starts, ends = bounds[:, :-1].contiguous(), bounds[:, 1:].contiguous()  # [width, height]
    lo = torch.searchsorted(ptr, starts, right=True) - 1
    hi = torch.searchsorted(ptr, (ends - 1).clamp(min=0), right=True)
    s, e, lo, hi = (t.T.reshape(-1) for t in (starts, ends, lo, hi))  # PE order: row-major in the region
    full = e > s
    in_lo, in_hi = torch.where(full, lo, 0), torch.where(full, hi, 0)
    pairs = in_hi - in_lo
    if available(pairs):
        return _ones_compiled(in_f, out_f, width, ptr, first, s, e, in_lo, in_hi)
    col = torch.arange(width).repeat(height)
    pe = torch.repeat_interleave(torch.arange(width * height), pairs)
    base = torch.cumsum(pairs, 0) - pairs
    jj = in_lo[pe] + torch.arange(len(pe)) - base[pe]
    cc = col[pe]
    at, upto = ptr[cc, jj], ptr[cc, jj + 1]
    p0, p1 = torch.maximum(s[pe], at), torch.minimum(e[pe], upto)
    counts = (p1 - p0).clamp(min=0)
    held = counts > 0
    o_lo, o_hi = (first[cc, jj] + p0 - at)[held], (first[cc, jj] + p1 - at)[held]
    out_lo = torch.full((width * height,), n, dtype=torch.int64).scatter_reduce(0, pe[held], o_lo, "amin")
    out_hi = torch.zeros(width * height, dtype=torch.int64).scatter_reduce(0, pe[held], o_hi, "amax")
    out_lo = torch.where(full, out_lo, 0)
    return Layout(in_f, out_f, in_lo, in_hi, out_lo, torch.where(full, out_hi - out_lo, 0), counts)


def _ones_compiled(
    in_f: int,
    out_f: int,
    width: int,
    ptr: torch.Tensor,
    first: torch.Tensor,
    s: torch.Tensor,
    e: torch.Tensor,
    in_lo: torch.Tensor,
    in_hi: torch.Tensor,
) -> Layout:
    """``_balanced_ones``'s per-PE counts and output ranges in one compiled pass over its (PE, input)
    pairs (the same ``Layout``)."""
    pairs = in_hi - in_lo
    base = torch.zeros(len(pairs) + 1, dtype=torch.int64)
    torch.cumsum(pairs, 0, out=base[1:])
    counts = torch.empty(int(base[-1]), dtype=torch.int64)
    out = torch.zeros((2, len(pairs)), dtype=torch.int64)  # out_lo, span
    arrays = (ptr, first.contiguous(), s.contiguous(), e.contiguous(), in_lo.contiguous(), base)
    _ones_loop(*(t.numpy() for t in arrays), width, counts.numpy(), out.numpy())
    return Layout(in_f, out_f, in_lo, in_hi, out[0], out[1], counts)


def cut_rows(counts: torch.Tensor, height: int, drift: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ptr, bounds)`` of a balanced placement whose region column ``c`` holds ``counts[c, j]``
    nonzeros of input ``j``: ``ptr[c, j]``, those of column ``c`` before input ``j``; ``bounds[c, r]``,
    where PE (c, r)'s run starts among all the nonzeros in (column, input, output) order
    (``bounds[c, height]`` where the column's ends), its rows cut by ``row_cuts``.

        >>> ptr, bounds = cut_rows(torch.tensor([[2, 1], [0, 3]]), 2, None)
        >>> ptr.tolist(), bounds.tolist()
        ([[0, 2, 3], [0, 0, 3]], [[0, 1, 3], [3, 4, 6]])
    """
    width, in_features = counts.shape
    ptr = torch.zeros((width, in_features + 1), dtype=torch.int64)
    torch.cumsum(counts, 1, out=ptr[:, 1:])
    total = ptr[:, -1]
    cuts = row_cuts(ptr, total, in_features, height, drift)
    zero = torch.zeros((width, 1), dtype=torch.int64)
    return ptr, (torch.cumsum(total, 0) - total)[:, None] + torch.cat([zero, cuts, total[:, None]], 1)


def row_cuts(
    ptr: torch.Tensor, total: torch.Tensor, in_f: int, height: int, drift: int | None
) -> torch.Tensor:
    """``[width, height - 1]`` cuts of each column's run into rows, counted from the column's start:
    equal runs, or with ``drift`` row by row, each evening out the rest within ``drift`` inputs of its
    lane's boundary: the rule of every balanced placement."""
    r = torch.arange(1, height)
    if drift is None:
        return r[None, :] * total[:, None] // height
    lane = lane_bounds(in_f, height)[1:-1]
    lo = ptr[:, (lane - drift).clamp(min=0)]
    hi = ptr[:, (lane + drift).clamp(max=in_f)]
    cut = torch.empty((len(total), height - 1), dtype=torch.int64)
    if available(cut, total, lo, hi):  # the same cuts, column by column in one compiled pass
        _cuts_loop(total.contiguous().numpy(), lo.contiguous().numpy(), hi.contiguous().numpy(), cut.numpy())
        return cut
    prev = torch.zeros_like(total)
    for k in range(height - 1):
        want = prev + (total - prev) // (height - k)
        prev = cut[:, k] = torch.maximum(torch.minimum(torch.maximum(want, lo[:, k]), hi[:, k]), prev)
    return cut


def dense_layout(program: ProgramData, k: Kernel) -> bool:
    """Whether sparse matmul ``k`` keeps every entry of its weight: an all-ones kernel (the dense
    baseline), or one whose ``values`` number ``in_features * out_features``. One rule for both, so a
    program lowered at sparsity 0 and its dense baseline store and load the same bytes."""
    if k.op != "sparse_matmul":
        return False
    if k.attrs.get("all_ones"):
        return True
    values, shape = k.arrays.get("values"), (k.attrs.get("in_features"), k.attrs.get("out_features"))
    if values is None or None in shape:
        return False
    return math.prod(program.specs[values].shape) == int(shape[0]) * int(shape[1])


def weight_bytes(program: ProgramData, k: Kernel) -> int:
    """Bytes a kernel loads from off-mesh memory in weight-streaming mode: all its arrays, or for a dense
    layout (``dense_layout``) its values, its PEs' ranges (as packed: ``encoding.range_bytes``) and its
    bias, with no indices or offsets.

    An all-ones kernel holds no arrays: its values are its weight's, of the kernel's dtype. An embedding
    whose table the host gathers (``attrs["gather"] == "host"``, streaming mode) loads one table row
    per id, not the table: the host holds the ids, as it holds every program input."""
    if k.op == "embedding" and k.attrs.get("gather") == "host":
        row = (k.shape[-1] if k.shape else 1) * itemsize(program.specs[k.arrays["table"]].dtype)
        ids = math.prod(program.value(k.inputs[0]).shape) if k.inputs else 0
        return ids * row
    if not dense_layout(program, k):
        return sum(program.specs[a].nbytes for a in k.arrays.values())
    ranges = range_bytes(int(k.attrs["in_features"]), int(k.attrs["out_features"]))
    if k.attrs.get("all_ones"):
        value = itemsize(k.dtype)
        values = int(k.attrs["in_features"]) * int(k.attrs["out_features"])
        bias = int(k.attrs["out_features"]) * value if k.attrs.get("bias") else 0
        return values * value + ranges * k.region.pes + bias
    spec = program.specs[k.arrays["values"]]
    bias = program.specs[k.arrays["bias"]].nbytes if "bias" in k.arrays else 0
    return spec.nbytes + ranges * k.region.pes + bias


def sparse_bytes(program: ProgramData) -> tuple[int, int]:
    """(bytes, nonzeros) of every sparse matmul stored as a sparse layout (not ``dense_layout``): all
    its arrays (``weight_bytes``: values, indices, per-PE ranges and counts, bias), as weight streaming
    loads them, and its nonzeros. Their ratio is the program's bytes per nonzero."""
    stored = nonzeros = 0
    for k in program.kernels:
        if k.op == "sparse_matmul" and "values" in k.arrays and not dense_layout(program, k):
            stored += weight_bytes(program, k)
            nonzeros += math.prod(program.specs[k.arrays["values"]].shape)
    return stored, nonzeros


def _row_cuts_loop(total, lo, hi, cut):  # pragma: no cover - runs compiled
    """``row_cuts`` with a limit, one column at a time: each cut evens out the rest of its column, held
    to ``[lo, hi]`` and never before the cut above it."""
    width, cuts = cut.shape
    for c in range(width):
        prev = 0
        for k in range(cuts):
            want = prev + (total[c] - prev) // (cuts + 1 - k)
            prev = max(min(max(want, lo[c, k]), hi[c, k]), prev)
            cut[c, k] = prev


_cuts_loop = lazy(_row_cuts_loop)


def _ones_pairs_loop(ptr, first, s, e, in_lo, base, width, counts, out):  # pragma: no cover - compiled
    """Each PE's nonzeros of each of its inputs, and its output range (``out[0]``) and span (``out[1]``):
    the outputs of its inputs' runs that fall within its share ``[s, e)`` of its column's run."""
    for pe in range(len(s)):
        c = pe % width
        o_lo, o_hi = -1, 0
        for t in range(base[pe + 1] - base[pe]):
            j = in_lo[pe] + t
            at = ptr[c, j]
            p0, p1 = max(s[pe], at), min(e[pe], ptr[c, j + 1])
            n = max(p1 - p0, 0)
            counts[base[pe] + t] = n
            if n > 0:
                lo, hi = first[c, j] + p0 - at, first[c, j] + p1 - at
                o_lo = lo if o_lo < 0 else min(o_lo, lo)
                o_hi = max(o_hi, hi)
        if o_lo >= 0:
            out[0, pe] = o_lo
            out[1, pe] = o_hi - o_lo


_ones_loop = lazy(_ones_pairs_loop)
