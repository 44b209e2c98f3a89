"""``lookup``: a one-token kernel that finds its inputs in registers, not memory (AVX-512).

``spmv`` gathers an input from memory for every nonzero, and a gather is slow on many cores (on
AMD's, 16 lanes take about 11 cycles). ``lookup`` takes the weight in blocks of 16 output rows by
32 inputs: a block's 32 inputs are two vector registers, and each of its steps holds a 16-lane vector
of weights (one per output row, zero where a row has no more nonzeros in the block) with each lane's
input position, 0 to 31. A step is then a register lookup (``simd.lookup32``) and a multiply-add.
The steps of a block are as many as its fullest row has nonzeros there, so at 90% about twice the
nonzeros are stored (about 10 bytes a nonzero against CSR's 6): it wins where the weights are read
from cache, and ``choose`` times it against ``spmv`` as the model will run. The layout is made from
the packed CSR when the kernel is bound and held beside it in memory (the saved state is the CSR)::

    >>> import torch
    >>> from sparsefx.frozen.packed import pack
    >>> w = torch.zeros(3, 40); w[0, 1], w[0, 2], w[2, 35] = 1.0, 2.0, 3.0
    >>> layout = build(pack(w, w != 0))
    >>> layout.steps.tolist(), layout.positions.reshape(-1, 16)[:, :3].tolist()
    ([0, 2, 3], [[1, 0, 0], [2, 0, 0], [0, 0, 3]])
"""

from __future__ import annotations

import functools
import importlib.util
from typing import NamedTuple

import numpy as np
import torch

from .packed import PackedWeight

__all__ = ["build", "padded_bias", "supported", "Layout", "ROWS", "INPUTS"]

ROWS = 16
"""Output rows a group: the lanes of a vector of sums."""

INPUTS = 32
"""Inputs a block: the 32 lanes of the two vectors ``lookup32`` looks up in."""


class Layout(NamedTuple):
    """The weight in ``lookup``'s layout. ``steps[g * (blocks + 1) + b]`` is the first step of group
    ``g``'s block ``b`` (the next entry ends it); step ``s`` is ``values[16 s : 16 s + 16]`` with the
    inputs' positions in the block in ``positions`` (uint8) likewise."""

    steps: np.ndarray  # uint32, [groups * (blocks + 1)]
    positions: np.ndarray  # uint8, [steps * 16]
    values: np.ndarray  # float32, [steps * 16]


@functools.cache
def supported() -> bool:
    """Whether ``lookup`` compiles here: numba is installed and targets this machine's CPU, which has
    AVX-512 (``kernels.runs_here`` also asks whether the numba kernels are on)."""
    if importlib.util.find_spec("numba") is None:
        return False
    import llvmlite.binding as llvm
    import numba

    if numba.config.CPU_NAME not in (None, "host") or numba.config.CPU_FEATURES is not None:
        return False  # compiled for another target: the host's features do not say what it has
    return bool(llvm.get_host_cpu_features().get("avx512f", False))


def padded_bias(bias: torch.Tensor | None, n_out: int) -> np.ndarray:
    """``bias`` as ``lookup`` reads it: a whole vector for every group (zeros past the layer's rows)."""
    padded = np.zeros(-(-n_out // ROWS) * ROWS, dtype=np.float32)
    if bias is not None:
        padded[:n_out] = bias.detach().numpy()
    return padded


def build(p: PackedWeight) -> Layout:
    """``p`` in ``lookup``'s layout (module docstring)."""
    n_out, n_in = p.out_features, p.in_features
    n_blocks, n_groups = -(-n_in // INPUTS), -(-n_out // ROWS)
    indptr = p.indptr.numpy().astype(np.int64)
    unsigned = np.uint16 if p.indices.dtype == torch.int16 else np.uint32
    cols = p.indices.numpy().view(unsigned).astype(np.int64)
    rows = np.repeat(np.arange(n_out), np.diff(indptr))
    cell = rows * n_blocks + cols // INPUTS  # (row, block); CSR order keeps a cell's nonzeros together
    counts = np.bincount(cell, minlength=n_groups * ROWS * n_blocks)
    rank = np.arange(cols.size) - (np.cumsum(counts) - counts)[cell]  # a nonzero's place in its cell
    per_block = counts.reshape(n_groups, ROWS, n_blocks).max(axis=1)  # steps: the fullest row's count
    starts = np.zeros((n_groups, n_blocks + 1), dtype=np.int64)
    starts[:, 1:] = np.cumsum(per_block, axis=1)
    starts[1:] += np.cumsum(starts[:-1, -1])[:, None]
    total = int(starts[-1, -1]) if n_groups else 0
    slot = (starts[rows // ROWS, cols // INPUTS] + rank) * ROWS + rows % ROWS
    values = np.zeros(total * ROWS, dtype=np.float32)
    positions = np.zeros(total * ROWS, dtype=np.uint8)
    values[slot] = p.values.numpy()
    positions[slot] = cols % INPUTS
    return Layout(starts.reshape(-1).astype(np.uint32), positions, values)
