"""What a sparse matmul alone should take, from the cost rules in closed form: the tuner's ranking.

The lowering compares mappings of a sparse matmul (widths, row cuts, block sizes) by timing each on the
fast clock (``alone.kernel_alone``). That clock is exact but costs a whole kernel's simulation, and
``wse2`` has thousands of such mappings. ``sparse_alone`` gives each one's cycles from four limits of
the same rules, each a sum the kernel cannot beat, plus the fill and drain that it cannot skip:

* **the busiest PE**: its tasks over every block (``cost.sparse_task_cycles``: a start per column with
  nonzeros, an AXPY per nonzero), after its lane's first block has come and before the last block's
  results leave;
* **the busiest input lane**: every block's messages of its features, one wavelet a cycle on the link
  that brings them in, then one block's work and results;
* **the busiest output lane**: every block's results of its outputs, one wavelet a cycle on the link
  that takes them east, after one block has come in and been computed;
* **the busiest column link**: every block's partial sums that cross it on their way to their lanes
  (``intervals.column_load``: each output once, merged on the way), after one block's work;

and the hops across the region. The tuner ranks its candidates by it and times only the best few on
the clock (``passes/lower/blocks.py``); it never decides alone (``tests/test_estimate.py`` holds a
program lowered so to 3% of one lowered with every mapping timed).

    >>> import torch
    >>> from sparsefx.runtime.layout import Layout
    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import Kernel, ProgramData, Region
    >>> p = ProgramData(MeshSpec(2, 1), HardwareSpec(), "pipelined", "block")
    >>> k = Kernel("fc", "sparse_matmul", Region(0, 0, 2, 1), ("x",), (8, 4), "float32",
    ...            attrs={"kind": "linear", "in_features": 2, "out_features": 4})
    >>> two = torch.tensor([0, 2])
    >>> s = Layout(2, 4, torch.tensor([0, 0]), torch.tensor([2, 2]), two, two, torch.tensor([1, 2, 0, 1]))
    >>> busiest_pe(p, k, s, 4)  # PE 0: 2 columns, 3 nonzeros, each of 2 blocks: 2 x (2 x 8 + 3 x 4)
    56
    >>> sparse_alone(p, k, s, 4) > busiest_pe(p, k, s, 4)
    True
"""

from __future__ import annotations

import torch

from .blocking import block_sizes, kernel_lanes
from .cost import axpy_cycles, epilogue_cycles, partial_add_cycles, rows_of, wavelets
from .homes import final_pes
from .intervals import Holders, column_load, lane_merges
from .layout import Layout
from .memo import kept
from .program import Kernel, ProgramData, lane_bounds

__all__ = ["busiest_pe", "sparse_alone"]


def _per_pe(k: Kernel, s: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Each PE's columns holding nonzeros and its nonzeros, kept while the layout's counts live."""
    return kept(s.counts, ("per pe", k.region.pes), lambda: _count(k.region.pes, s))


def _count(pes: int, s: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    pe = torch.repeat_interleave(torch.arange(pes), s.in_hi - s.in_lo)
    columns = torch.zeros(pes, dtype=torch.int64).index_add_(0, pe, (s.counts > 0).to(torch.int64))
    nonzeros = torch.zeros(pes, dtype=torch.int64).index_add_(0, pe, s.counts.to(torch.int64))
    return columns, nonzeros


def _block_work(
    program: ProgramData, k: Kernel, columns: torch.Tensor, nonzeros: torch.Tensor, rows: int
) -> int:
    """The busiest PE's tasks for one block of ``rows``."""
    hw = program.hardware
    return int((columns * hw.task_start_cycles + nonzeros * axpy_cycles(rows, k.dtype, hw)).max())


def busiest_pe(program: ProgramData, k: Kernel, s: Layout, b: int) -> int:
    """The busiest PE's cycles over every block of ``b`` rows, as the clock counts them with every input
    sent: its tasks, the partial sums it adds (``intervals.merges``) and, with an epilogue, the activation
    of each whole sum that ends up on it."""
    if k.region.pes == 0:
        return 0
    columns, nonzeros = _per_pe(k, s)
    sizes, counts = torch.unique(block_sizes(max(rows_of(k.shape), 1), b), return_counts=True)
    hw = program.hardware
    blocks = list(zip(sizes.tolist(), counts.tolist()))  # every block: m of n rows
    starts = sum(m for _, m in blocks) * hw.task_start_cycles
    axpys = sum(m * axpy_cycles(n, k.dtype, hw) for n, m in blocks)
    merges = sum(m * partial_add_cycles(n, k.dtype, hw) for n, m in blocks)
    tasks = columns * starts + nonzeros * axpys + _adds(k, s) * merges
    if "epilogue" in k.attrs:  # each whole sum's activation, on the PE where the sum ends up
        each = sum(m * epilogue_cycles(k, n, hw) for n, m in blocks)
        tasks = tasks + _finals(program, k) * each
    return int(tasks.max())


def _finals(program: ProgramData, k: Kernel) -> torch.Tensor:
    """``[pes]``: the outputs whose whole sums end up on each PE (``homes.final_pes``)."""
    return torch.bincount(final_pes(program, k), minlength=k.region.pes)


def _adds(k: Kernel, s: Layout) -> torch.Tensor:
    """``[pes]``: the partial sums each PE adds per block, kept while the layout's counts live."""
    r = k.region
    lanes = kernel_lanes(k, s.out_features)

    def build() -> torch.Tensor:
        return lane_merges(s, r.width, r.height, lanes, _holders(k, s))

    return kept(s.counts, ("adds", r.width, r.height, lanes), build)


def sparse_alone(program: ProgramData, k: Kernel, s: Layout, b: int, busy: int | None = None) -> int:
    """Cycles sparse matmul ``k`` with layout ``s`` should take alone at ``b`` rows per block (module
    docstring); ``busy``: its ``busiest_pe``, when the caller has it."""
    hw, r = program.hardware, k.region
    if r.pes == 0:
        return 0
    sizes = block_sizes(max(rows_of(k.shape), 1), b)
    first, last = int(sizes[0]), int(sizes[-1])
    waves = sum(wavelets(int(n), k.dtype, hw) for n in sizes.tolist())
    columns, nonzeros = _per_pe(k, s)
    busy = busiest_pe(program, k, s, b) if busy is None else busy
    work = _block_work(program, k, columns, nonzeros, first)
    lane_in = int(lane_bounds(s.in_features, kernel_lanes(k, s.in_features)).diff().max())
    lane_out = int(lane_bounds(s.out_features, kernel_lanes(k, s.out_features)).diff().max())
    fill = lane_in * wavelets(first, k.dtype, hw)  # the first block's messages of the busiest lane
    drain = lane_out * wavelets(last, k.dtype, hw)  # the last block's results of the busiest lane
    bus = _busiest_link(k, s) * waves  # the column links' partial sums over every block
    hops = (r.width + r.height) * hw.hop_cycles
    limits = (busy + fill + drain, lane_in * waves + work + drain, lane_out * waves + fill + work)
    return max(*limits, bus + fill + work) + hops


def _busiest_link(k: Kernel, s: Layout) -> int:
    """Partial sums of one block on the region's busiest vertical link (``intervals.column_load``), kept
    while the layout's counts live."""
    r = k.region
    lanes = kernel_lanes(k, s.out_features)

    def build() -> int:
        south, north = column_load(s, r.width, r.height, lanes, _holders(k, s))[:2]
        return int(torch.maximum(south, north).max()) if south.numel() else 0

    return kept(s.counts, ("busiest link", r.width, r.height, lanes), build)


def _holders(k: Kernel, s: Layout) -> Holders:
    """The region's ``Holders``, built once for the adds and the column links, kept with the counts."""
    r = k.region
    return kept(s.counts, ("holders", r.width, r.height), lambda: Holders(s, r.width, r.height))
