"""A kernel timed alone: the fast clock's entry points for the lowering's tuner.

``passes/lower/blocks.py`` and ``passes/lower/tune.py`` compare mappings of one kernel (block sizes,
row cuts) by timing it with nothing before it: its inputs stream in back to back, in its own blocks,
from west of its region, under the same rules as ``simulate`` (``FastClock``), pipelined, with no
timing kept for reuse.
"""

from __future__ import annotations

import dataclasses

import torch

from .blocking import block_sizes, kernel_lanes
from .cost import block_rows, features_of, row_streaming_op, rows_of
from .fast import FastClock
from .layout import Layout
from .program import Kernel, ProgramData
from .timeline import Flow, KernelTime

__all__ = ["time_alone", "kernel_alone"]


def time_alone(program: ProgramData, kernel: Kernel, known: Layout | None = None) -> int:
    """Cycles ``kernel`` takes alone: its inputs stream in back to back, in its own blocks, from west
    of its region. The lowering compares mappings (block sizes) with it; ``known`` is the kernel's
    layout when the caller has read it already."""
    return kernel_alone(program, kernel, known).end


def kernel_alone(
    program: ProgramData, kernel: Kernel, known: Layout | None = None, rows: int | None = None
) -> KernelTime:
    """``time_alone``'s whole timing: when the kernel ends, and each PE's busy cycles. ``rows`` times
    only the first rows of a row-wise kernel (its inputs' as many): the lowering's block search
    times a few blocks of a long kernel and extrapolates (``passes/lower/blocks.py``)."""
    clock = FastClock(program, None, {kernel.name: known} if known is not None else None)
    clock.streaming = False
    clock.reuse = False  # the lowering times each mapping once: keeping its timings only holds memory
    full = rows_of(kernel.shape)
    if rows is not None and rows < full and row_streaming_op(kernel):
        kernel = dataclasses.replace(kernel, shape=(rows, features_of(kernel.shape)))
    b = block_rows(kernel)
    for value in dict.fromkeys(kernel.inputs):
        shape, dtype = program.value(value).shape, program.value(value).dtype
        f, n = features_of(shape), rows_of(shape)
        if n == full:  # row-streamed: as many rows as the kernel
            n = rows_of(kernel.shape)
        lanes = kernel_lanes(kernel, f)
        block = b if n == rows_of(kernel.shape) else max(n, 1)
        wave = clock.waves(block_sizes(n, block), dtype)
        ready = torch.zeros((len(wave), f), dtype=torch.int64)
        clock.flows[value] = Flow(value, dtype, f, lanes, n, block, wave, kernel.region.x - 1, ready)
    return clock.time(kernel)
