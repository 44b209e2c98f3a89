"""Bytes of SRAM each PE of a kernel needs: its share of the kernel's arrays plus its working buffers.

Rows of a value stream through a kernel ``rows_in_flight`` at a time (double buffering: 2), so a PE
holds its lanes' features of that many rows per operand, not the whole activation. What stays
resident is a kernel's own data: a sparse matmul's nonzeros, a table, a norm's weights, a constant,
the second operand of an activation matmul. ``pe_bytes`` gives ``[region.pes]`` int64 bytes, region
PEs in row-major order. ``sram_needed`` is its busiest PE's figure: the one definition that
``sparsefx inspect`` (``summary.py``), ``sparsefx run`` (``stats.py``), lowering (``stats["sram_max"]``)
and ``verify`` (against ``HardwareSpec.sram_bytes``) all use, labelled ``SRAM_LABEL``::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import Region, Stream
    >>> k = Kernel("r", "elementwise", Region(0, 0, 1, 2), ("x",), (4, 6), "float32", attrs={"lanes": 2})
    >>> p = ProgramData(MeshSpec(2, 2), HardwareSpec(), "pipelined", "block", kernels=[k])
    >>> p.inputs.append(Stream("x", (4, 6), "float32"))
    >>> pe_bytes(p, k).tolist()  # 2 rows x 3 features x 4 bytes x (1 input + 1 output)
    [48, 48]
"""

from __future__ import annotations

import math

import torch

from .blocking import feature_lanes
from .encoding import row_index_dtype
from .memo import kept_for
from .program import DTYPES, Kernel, ProgramData, lane_bounds
from .sums import stays, whole_at
from .tiles import tile_columns

__all__ = ["pe_bytes", "sram_needed", "SRAM_LABEL", "ROWS_IN_FLIGHT", "ACC_BYTES", "itemsize", "features_of"]

ROWS_IN_FLIGHT = 2
ACC_BYTES = 4  # partial sums accumulate in fp32
SRAM_LABEL = "SRAM needed by the busiest PE (its data + buffers for its rows in flight)"
"""How reports name ``sram_needed`` (a program's figure is the largest over its kernels)."""


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name."""
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


def features_of(shape: tuple[int, ...], split: int) -> int:
    """Features of a value viewed as ``[rows, features]`` from dim ``split`` on."""
    return math.prod(shape[split:]) if shape else 1


def _lane_widths(features: int, kernel: Kernel) -> torch.Tensor:
    """Features per PE row of the region (lane ``r`` is the region's row ``r``)."""
    lanes = kernel.region.height
    b = lane_bounds(features, lanes)
    return b[1:] - b[:-1]


def _per_pe_rows(widths: torch.Tensor, kernel: Kernel) -> torch.Tensor:
    return widths.repeat_interleave(kernel.region.width)


def _streaming_buffers(program: ProgramData, kernel: Kernel) -> torch.Tensor:
    """Rows of every operand and of the result each PE holds, of the features it works on: a lane's
    features go one a column (``runtime/tiles.py``), so a PE holds its own, not its lane's. The result
    and each operand the kernel streams row by row take ``rows_in_flight`` rows (a row tile's share);
    an operand it reads whole (a transpose's input, an attention matmul's keys) every row of it, but a
    layout change keeps of its input only the elements it copies out: its tile's rows of its own
    features, at most."""
    rif = int(kernel.attrs.get("rows_in_flight", ROWS_IN_FLIGHT))
    tiles = int(kernel.attrs.get("row_tiles", 1))
    share = -(-rif // tiles)
    total = torch.zeros(kernel.region.pes, dtype=torch.int64)
    split = int(kernel.attrs.get("split", max(len(kernel.shape) - 1, 0)))
    mine = _rows(kernel.shape, max(len(kernel.shape) - 1, 0))
    cols = tile_columns(kernel, features_of(kernel.shape, max(len(kernel.shape) - 1, 0)))
    for name in [*kernel.inputs, kernel.name]:
        value = program.value(name)
        s = min(split, max(len(value.shape) - 1, 0))
        rows = _rows(value.shape, s)
        held = share if name == kernel.name or rows == mine else rows
        per_pe = _pe_features(features_of(value.shape, s), kernel, cols, tiles)
        nbytes = per_pe * held * itemsize(value.dtype)
        if kernel.op == "layout" and held == rows and name != kernel.name:
            out_pe = _pe_features(features_of(kernel.shape, split), kernel, cols, tiles)
            nbytes = torch.minimum(nbytes, out_pe * -(-mine // tiles) * itemsize(value.dtype))
        total += nbytes
    return total


def _rows(shape: tuple[int, ...], split: int) -> int:
    return math.prod(shape) // max(features_of(shape, split), 1)


def _pe_features(features: int, kernel: Kernel, cols: int, tiles: int) -> torch.Tensor:
    """``[region.pes]``: how many of a value's features each PE holds, its lane's features dealt one a
    column over ``cols`` columns in each of ``tiles`` row tiles (none past the last tile)."""
    widths = _lane_widths(features, kernel)[:, None]  # [height, 1]
    c = torch.arange(kernel.region.width)[None, :]
    at = c % cols
    n = widths // cols + (at < widths % cols).to(torch.int64)
    return torch.where(c < cols * tiles, n, 0).reshape(-1)


def _resident(program: ProgramData, kernel: Kernel) -> torch.Tensor:
    """Arrays a kernel keeps whole, spread evenly over its PEs (tables, weights, constants); not an
    embedding's table whose rows the host sends (``gather``: they pass through its buffers)."""
    gathered = kernel.attrs.get("gather") and kernel.op == "embedding"
    kept = [name for role, name in kernel.arrays.items() if not (gathered and role == "table")]
    total = sum(program.specs[name].nbytes for name in kept)
    n = kernel.region.pes
    share = torch.full((n,), total // n, dtype=torch.int64)
    share[: total % n] += 1
    return share


def _sparse(program: ProgramData, kernel: Kernel) -> torch.Tensor:
    # kept_for keys the arrays but the bias; where the bias goes depends on the mode and the outputs
    key = ("sram parts", "bias" in kernel.arrays, program.mode, kernel.name in program.outputs)
    fixed, per_row = kept_for(program, kernel, key, lambda: _sparse_parts(program, kernel))
    return fixed + int(kernel.attrs.get("rows_in_flight", ROWS_IN_FLIGHT)) * per_row


def _sparse_parts(program: ProgramData, kernel: Kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse matmul's bytes a PE: what its nonzeros, pointers and bias take, and what each row in
    flight adds (its outputs' accumulators and its inputs' values); the tuner asks at every block size."""
    if "pe_nnz" in kernel.arrays:  # packed: decoded as it arrives, held as CSC (``encoding.py``)
        nnz = program.array(kernel, "pe_nnz").to(torch.int64)
    else:
        nz_ptr = program.array(kernel, "nz_ptr").to(torch.int64)
        nnz = nz_ptr[1:] - nz_ptr[:-1]
    if "in_lo" in kernel.arrays:
        in_widths = (program.array(kernel, "in_hi") - program.array(kernel, "in_lo")).to(torch.int64)
    else:
        in_widths = _per_pe_rows(_lane_widths(int(kernel.attrs["in_features"]), kernel), kernel)
    out_span = (program.array(kernel, "out_hi") - program.array(kernel, "out_lo")).to(torch.int64)
    value_bytes = itemsize(program.specs[kernel.arrays["values"]].dtype)
    if "row_idx" in kernel.arrays:
        index_bytes = itemsize(program.specs[kernel.arrays["row_idx"]].dtype)
    else:  # packed: the decoded row indices, by placement's rule
        index_bytes = row_index_dtype(out_span).itemsize
    ptr_bytes = torch.where(nnz < 2**15, 2, 4)  # local column offsets: 16-bit where they fit
    fixed = nnz * (value_bytes + index_bytes) + (in_widths + 1) * ptr_bytes
    if "bias" in kernel.arrays:  # each output's bias, on the PE where its sum ends
        at = bias_pes(program, kernel)
        fixed.index_add_(0, at, torch.full_like(at, value_bytes))
    return fixed, out_span * ACC_BYTES + in_widths * value_bytes


def bias_pes(program: ProgramData, kernel: Kernel) -> torch.Tensor:
    """``[outputs]``: the PE of sparse matmul ``kernel``'s region (row-major) that adds each output's
    bias, on the output's lane: where its sum ends (``sums.last_columns``) if its result stays there
    (``sums.stays``), else on the region's east column."""
    r, out_f = kernel.region, int(kernel.attrs["out_features"])
    lane = feature_lanes(kernel, out_f)
    if stays(program, kernel):
        col = whole_at(program, kernel)
    else:
        col = torch.full((out_f,), r.width - 1, dtype=torch.int64)
    return lane * r.width + col


def pe_bytes(program: ProgramData, kernel: Kernel) -> torch.Tensor:
    """``[region.pes]`` bytes of SRAM each of ``kernel``'s PEs needs (row-major in its region)."""
    if kernel.op == "sparse_matmul":
        return _sparse(program, kernel)
    return _resident(program, kernel) + _streaming_buffers(program, kernel)


def sram_needed(program: ProgramData, kernel: Kernel) -> int:
    """Bytes of SRAM the busiest of ``kernel``'s PEs needs at its rows in flight (``pe_bytes``'s max);
    0 for a kernel without PEs or without arrays (an all-ones matmul)."""
    if not kernel.region.pes or kernel.attrs.get("all_ones"):
        return 0
    return int(pe_bytes(program, kernel).max())
