"""Where a sparse matmul's nonzeros sit, as the clocks read it: per PE, its input and output ranges and
the nonzeros of each of its input columns.

``layout(program, kernel)`` reads the kernel's CSC slices. A kernel marked ``all_ones`` (the dense
baseline, ``runtime/baseline.py``) holds every weight: its layout is the block placement's geometry,
with no arrays at all, so a dense GPT-2 costs nothing to describe::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import DataflowProgram, Kernel, Region
    >>> p = DataflowProgram(MeshSpec(4, 4), HardwareSpec(), "pipelined", "block")
    >>> k = Kernel("fc", "sparse_matmul", Region(0, 0, 2, 2), ("x",), (1, 6), "float32",
    ...            attrs={"kind": "linear", "in_features": 4, "out_features": 6, "all_ones": True})
    >>> s = layout(p, k)
    >>> s.in_lo.tolist(), s.out_lo.tolist(), s.span.tolist(), s.counts.tolist()
    ([0, 0, 2, 2], [0, 3, 0, 3], [3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3])
    >>> weight_bytes(p, k)  # the arrays an all-ones lowering stores: values, row indices, ranges, offsets
    336
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .memo import kept_for
from .program import DTYPES, DataflowProgram, Kernel, lane_bounds
from .sparse_eval import read_slices

__all__ = ["Layout", "layout", "weight_bytes"]


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


def layout(program: DataflowProgram, k: Kernel) -> Layout:
    """The layout of sparse matmul ``k``: from its arrays, or the dense geometry when ``all_ones``."""
    r = k.region
    in_f, out_f = int(k.attrs["in_features"]), int(k.attrs["out_features"])
    if k.attrs.get("all_ones"):
        ins, outs = lane_bounds(in_f, r.height), lane_bounds(out_f, r.width)
        in_lo, in_hi = ins[:-1].repeat_interleave(r.width), ins[1:].repeat_interleave(r.width)
        out_lo, span = outs[:-1].repeat(r.height), outs.diff().repeat(r.height)
        counts = torch.repeat_interleave(span, in_hi - in_lo)
        return Layout(in_f, out_f, in_lo, in_hi, out_lo, span, counts)
    arrays = {role: program.arrays[name] for role, name in k.arrays.items()}
    s = read_slices(arrays, in_f, out_f, r.width, r.height, f"kernel {k.name!r} ({k.op})")
    steps = s.col_ptr.diff()
    inside = torch.ones_like(steps, dtype=torch.bool)
    if len(s.col_ptr_off) > 2:
        inside[s.col_ptr_off[1:-1] - 1] = False  # the step from one PE's last offset to the next's first
    return Layout(in_f, out_f, s.in_lo, s.in_hi, s.out_lo, s.span, steps[inside])


def weight_bytes(program: DataflowProgram, k: Kernel) -> int:
    """Bytes a kernel loads from off-mesh memory in weight-streaming mode: all its arrays."""
    if not k.attrs.get("all_ones"):
        return sum(program.specs[a].nbytes for a in k.arrays.values())
    key = ("weight_bytes", k.dtype, bool(k.attrs.get("bias")))
    return kept_for(program, k, key, lambda: _dense_bytes(program, k))


def _dense_bytes(program: DataflowProgram, k: Kernel) -> int:
    s = layout(program, k)
    pes = k.region.pes
    value = torch.empty((), dtype=DTYPES[k.dtype]).element_size()
    index = 2 if int(s.span.max()) < 2**15 else 4
    nnz = int(s.counts.sum())
    ranges = 4 * 4 * pes  # in_lo, in_hi, out_lo, out_hi: int32 per PE
    offsets = 2 * 8 * (pes + 1) + 4 * int((s.in_hi - s.in_lo + 1).sum())  # nz_ptr, col_ptr_off; col_ptr
    bias = s.out_features * value if k.attrs.get("bias") else 0
    return nnz * (value + index) + ranges + offsets + bias
