"""The cost rules both executors share: what a message, a task, an AXPY and a weight load cost.

The machine model (``docs/architecture.md``, "Executing a program"):

- A value is a stream of **messages**. Its rows go in **blocks** of ``block_rows(kernel)`` rows (the
  producer's ``rows_in_flight``); one message carries one feature of one block, ``wavelets(rows)``
  32-bit wavelets back to back. Feature ``f`` travels on lane ``lane_of(f)`` (a mesh row), and the
  messages of one lane leave in feature order, one wavelet per cycle.
- A message takes ``hop_cycles`` per hop; a task starts when its message's last wavelet arrives.
- A PE runs its tasks one at a time in arrival order: a task starts at ``max(arrival, PE free)`` and
  keeps the PE for its cost. Each PE's clock advances by the work it does.
- A task starts once (``task_start_cycles``); each vector operation inside it starts once too
  (``vector_start_cycles``) and then takes ``ceil(rows / simd)`` over the block's rows, or longer where
  its operands' SRAM traffic (``OPERANDS`` values an element: two read, one written) needs more
  cycles at ``sram_bytes_per_cycle``.
- A sparse matmul's task is the arrival of input feature ``j`` on a PE, for one block of rows: one AXPY
  per local nonzero of column ``j`` (``sparse_task_cycles``: the task start, then ``axpy_cycles`` per
  nonzero). A message whose vector is all zero is not sent (the sender filters it) and triggers nothing.
- Other kernels run one task per feature they handle per block, ``task_cycles`` each (``ELEMENT_OPS``
  vector operations per element); norms and softmax add an all-reduce of their statistics across lanes.
- Partial sums go down and up each column to their output lane, then east to the region's edge; a PE
  that receives a partial sum adds it to the one it holds (``partial_add_cycles``, one vector add).
- In weight-streaming mode each kernel's arrays come from off-mesh memory at ``weight_bytes_per_s``
  (``load_cycles``), loaded while the kernel before runs.

    >>> from sparsefx.runtime.mesh import HardwareSpec
    >>> hw = HardwareSpec()
    >>> wavelets(128, "float32", hw), wavelets(128, "float16", hw)
    (128, 64)
    >>> axpy_cycles(128, "float32", hw)  # 2 to start the vector op + 128 / 2 SIMD lanes
    66
    >>> sparse_task_cycles(3, 128, "float32", hw)  # the task starts once (8), then 3 AXPYs
    206
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch

from .memory import ROWS_IN_FLIGHT, itemsize
from .mesh import HardwareSpec
from .op_kinds import KINDS, ZERO_SKIPPING, op_kind, row_wise
from .program import Kernel, ProgramData

T = TypeVar("T", int, torch.Tensor)

__all__ = [
    "OPERANDS",
    "idle_tasks",
    "ZERO_SKIPPING",
    "ELEMENT_OPS",
    "TRANSCENDENTAL",
    "EPILOGUES",
    "epilogue_cycles",
    "wavelets",
    "simd",
    "vector_cycles",
    "axpy_cycles",
    "sparse_task_cycles",
    "task_cycles",
    "task_overhead",
    "partial_add_cycles",
    "allreduce_cycles",
    "load_cycles",
    "block_rows",
    "rows_of",
    "features_of",
    "element_ops",
    "ops_per_element",
    "row_streaming",
]

ELEMENT_OPS: dict[str, int] = {
    name: row.element_ops for name, row in KINDS.items() if name != "sparse_matmul"
}
"""SIMD operations per result element of each op kind but the sparse matmul's, which costs AXPYs
(``op_kinds.KINDS``' ``element_ops``; ``ops_per_element`` refines some)."""

TRANSCENDENTAL = frozenset(
    {"exp", "log", "tanh", "sigmoid", "gelu", "silu", "erf", "sqrt", "rsqrt", "pow", "div"}
)
"""Elementwise functions that cost 4 operations per element (a polynomial or an iteration)."""

EPILOGUES = frozenset({"gelu", "relu", "silu", "tanh"})
"""Activations a sparse matmul applies itself where each sum is whole (``attrs["epilogue"]``,
``passes/lower/fuse_epilogues.py``): each maps zero to zero, so an all-zero sum stays filtered."""


def wavelets(elements: int, dtype: str, hw: HardwareSpec) -> int:
    """Wavelets that carry ``elements`` values of ``dtype`` (16-bit values go two to a wavelet)."""
    return math.ceil(elements * itemsize(dtype) / hw.wavelet_bytes)


def simd(dtype: str, hw: HardwareSpec) -> int:
    """SIMD lanes for ``dtype``: the hardware's width, or 1 (one value per cycle) for a dtype it has no
    SIMD width for, such as the integers of position ids and masks."""
    return hw.simd_widths.get(dtype, 1)


OPERANDS = 3
"""Values of SRAM traffic a vector operation moves per element: an AXPY ``y += w * x`` reads ``y`` and
the arrived ``x`` (which each of the task's AXPYs reads again) and writes ``y``; an elementwise op or
a partial-sum add reads two and writes one (a unary op moves two: counting three is an upper bound)."""


def vector_cycles(rows: int, dtype: str, hw: HardwareSpec) -> int:
    """One vector operation over ``rows`` values inside a running task: its start plus ``ceil(rows /
    simd)``, or the cycles its SRAM traffic takes where that is more (``OPERANDS``)::

        >>> from sparsefx.runtime.mesh import HardwareSpec
        >>> vector_cycles(128, "float32", HardwareSpec())  # 2 + 128 / 2 lanes: 24 bytes a cycle fit
        66
        >>> vector_cycles(128, "float32", HardwareSpec(sram_bytes_per_cycle=12))  # 1,536 bytes / 12
        130
    """
    lanes = math.ceil(rows / simd(dtype, hw))
    traffic = math.ceil(rows * OPERANDS * itemsize(dtype) / hw.sram_bytes_per_cycle)
    return hw.vector_start_cycles + max(lanes, traffic)


def axpy_cycles(rows: int, dtype: str, hw: HardwareSpec) -> int:
    """One AXPY over ``rows`` values inside a task (``y += w * x``, REFERENCE §4): one vector operation."""
    return vector_cycles(rows, dtype, hw)


def sparse_task_cycles(nonzeros: T, rows: int, dtype: str, hw: HardwareSpec) -> T:
    """A sparse matmul's task, the arrival of one input column on a PE for one block of ``rows``: the
    task starts once, then one AXPY per local nonzero of the column. No nonzeros, no task (0). An int,
    or a tensor of counts (each its own task)."""
    return (hw.task_start_cycles + nonzeros * axpy_cycles(rows, dtype, hw)) * (nonzeros > 0)


def task_cycles(ops: int, rows: int, dtype: str, hw: HardwareSpec) -> int:
    """A task doing ``ops`` vector operations on each of ``rows`` values: the task starts once, then each
    operation (``vector_cycles``)."""
    return hw.task_start_cycles + ops * vector_cycles(rows, dtype, hw)


def task_overhead(tasks: T, ops: T, hw: HardwareSpec) -> T:
    """The part of ``tasks`` tasks doing ``ops`` vector operations in all (AXPYs, or another kernel's SIMD
    operations) that is not arithmetic: the tasks' starts and the operations' starts. Ints or tensors.

        >>> task_overhead(2, 5, HardwareSpec())  # 2 x 8 + 5 x 2
        26
    """
    return tasks * hw.task_start_cycles + ops * hw.vector_start_cycles


def partial_add_cycles(rows: int, dtype: str, hw: HardwareSpec) -> int:
    """A partial sum that reaches a PE holding (or collecting) another part of the same output, for a
    block of ``rows``: one vector add into the PE's own sum. It runs in the PE's reduction, which reads
    the arriving vector as its operand, so it pays a vector start but no task start (an assumption: the
    GEMV mapping of REFERENCE §4 reduces partial sums along the fabric, the cost of an add is not
    published)."""
    return vector_cycles(rows, dtype, hw)


def epilogue_cycles(kernel: Kernel, rows: int, hw: HardwareSpec) -> int:
    """A sparse matmul's epilogue on one whole sum of a block of ``rows`` (0 without one): a task on the
    PE that holds the sum, doing the activation's operations on each value (4 for a transcendental one,
    1 for a ReLU)."""
    epilogue = kernel.attrs.get("epilogue")
    if not isinstance(epilogue, dict):
        return 0
    ops = 4 if epilogue.get("fn") in TRANSCENDENTAL else 1
    return task_cycles(ops, rows, kernel.dtype, hw)


def allreduce_cycles(lanes: int, hw: HardwareSpec) -> int:
    """A norm's or softmax's statistics all-reduced across ``lanes`` lanes: down the lanes and back up,
    a hop and a task start at each step both ways (0 for one lane)."""
    return 2 * ((lanes - 1) * hw.hop_cycles + hw.task_start_cycles) if lanes > 1 else 0


def load_cycles(nbytes: int, hw: HardwareSpec) -> int:
    """Cycles to bring ``nbytes`` of weights onto the mesh in weight-streaming mode."""
    return math.ceil(nbytes * hw.clock_hz / hw.weight_bytes_per_s)


def features_of(shape: tuple[int, ...]) -> int:
    """Features of a value: its last dim (1 for a scalar)."""
    return shape[-1] if shape else 1


def rows_of(shape: tuple[int, ...]) -> int:
    """Rows of a value: all its elements over its features."""
    return math.prod(shape) // max(features_of(shape), 1) if shape else 1


def block_rows(kernel: Kernel) -> int:
    """Rows per block of a kernel's result: its ``rows_in_flight`` (``ROWS_IN_FLIGHT`` when unset, as
    the SRAM model assumes) for a row-wise kernel; for any other all rows at once, or its
    ``result_rows``: a kernel that waits for the whole of its inputs may still send its result in
    blocks (a head merge, in the blocks of the matmul that reads it, ``blocks.result_blocks``)."""
    rows = max(rows_of(kernel.shape), 1)
    if not row_streaming_op(kernel):
        given = kernel.attrs.get("result_rows", rows)
        ok = isinstance(given, int) and not isinstance(given, bool) and given > 0
        return min(given, rows) if ok else rows
    given = kernel.attrs.get("rows_in_flight", ROWS_IN_FLIGHT)
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return min(given, rows)
    return min(ROWS_IN_FLIGHT, rows)


def row_streaming_op(kernel: Kernel) -> bool:
    """Whether the kernel computes each row of its result from the same row of its inputs
    (``op_kinds.row_wise``)."""
    return row_wise(kernel.op, kernel.attrs, len(kernel.shape))


def row_streaming(program: ProgramData, kernel: Kernel, value: str) -> bool:
    """Whether ``kernel`` can take input ``value`` block by block (same rows, a row-wise op)."""
    if not row_streaming_op(kernel):
        return False
    shape = program.value(value).shape
    if kernel.op == "embedding":
        return math.prod(shape) == rows_of(kernel.shape)
    return rows_of(shape) == rows_of(kernel.shape)


def element_ops(kernel: Kernel) -> int:
    """SIMD operations per result element that the kernel alone determines: the kind's ``element_ops``,
    4 for a transcendental function, 2 for a batch norm, one more for a causal softmax's select
    (``ops_per_element`` adds what the inputs' shapes decide).

    >>> from sparsefx.runtime.program import Region
    >>> element_ops(Kernel("act", "elementwise", Region(0, 0, 1, 1), ("x",), (8, 4), "float32",
    ...                    attrs={"fn": "gelu"}))
    4
    """
    if kernel.op == "elementwise" and kernel.attrs.get("fn") in TRANSCENDENTAL:
        return 4
    if kernel.op == "elementwise" and kernel.attrs.get("fn") == "batch_norm":
        return 2
    if kernel.op == "softmax" and kernel.attrs.get("causal"):
        return op_kind(kernel.op).element_ops + 1  # the select that leaves out the later keys
    return op_kind(kernel.op).element_ops


def ops_per_element(program: ProgramData, kernel: Kernel) -> int:
    """SIMD operations per result element: ``element_ops``, a matmul's contraction, a pool's window."""
    ops = element_ops(kernel)
    if kernel.op == "matmul" and kernel.inputs:
        a = program.value(kernel.inputs[0]).shape
        return max(1, a[-1] if a else 1)
    if kernel.op in ("reduce", "pool") and kernel.inputs:
        n_in = math.prod(program.value(kernel.inputs[0]).shape)
        return max(1, n_in // max(math.prod(kernel.shape), 1))
    return ops


def idle_tasks(op: str, heard: torch.Tensor, out_live: torch.Tensor | None) -> torch.Tensor | None:
    """``[blocks, features]``: the tasks a kernel leaves out because nothing arrives and nothing leaves.

    A zero is not sent, so a task with no input data runs only to make a nonzero result (``exp(0)``,
    a bias). An elementwise task none of whose input messages hold data, and whose result message is
    all zero too, is not run; a layout task whose result is all zero is not run. ``heard[q, f]``:
    whether an input message of task ``(q, f)`` holds data; ``out_live``: whether its result does
    (None: unknown, every task runs).

        >>> heard = torch.tensor([[True, False, False]])
        >>> idle_tasks("elementwise", heard, torch.tensor([[False, False, True]])).tolist()
        [[False, True, False]]
    """
    if out_live is None:
        return None
    rule = op_kind(op).skips_tasks  # which kinds skip which tasks: ``op_kinds.KINDS``
    if rule == "never":
        return None
    return ~out_live if rule == "zero_result" else ~(heard | out_live)
