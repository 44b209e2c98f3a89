"""Rows in flight: how many rows of a value each kernel takes per block (the AXPY length of a matmul).

A sparse matmul's task is one input column's AXPYs (one per nonzero) over the rows of a block, so long
blocks spread the task's start and the AXPYs' vector starts over more rows; short blocks keep the
accumulators small and let the partial sums of one
block travel while the next is computed. ``plan_blocks`` gives each sparse matmul the fastest block
size that fits its PEs' SRAM: every size is ranked by what the cost rules say it should take alone
(``runtime.estimate.sparse_alone``, in closed form), and only the ``TIMED_CANDIDATES`` best are timed
on the clock (``runtime.alone.time_alone``: the emulator's own rules), so a search costs a fixed
number of timings whatever the mesh, and gives the same answer every time.
Row-wise kernels after it take its block size, so blocks flow down a chain of kernels without waiting
for whole values (any other kernel takes all its rows at once, or as many as fit; one with several
row-streamed inputs the smallest of their sizes). So a matmul's block size caps those of the kernels
after it (``followers``: a GELU after the layer, the residual add and layer norm after it, and the
adds of the residual stream further on), and they are timed with it, each alone at the same size: a
block size is chosen for the chain it sets, not for the matmul alone. (A 64-to-256 layer at 90% on a
64x64 mesh ran 2% faster alone in 2-row blocks than in 16-row ones, and the GELU after it, one column
wide, 2.3x slower: a sparser model ended up slower than a denser one.) A size with more than
``TIMED_BLOCKS`` blocks is timed on its first 8 and 16 and extrapolated (a long kernel reaches a
steady state in which every block adds the same cycles). In pipelined mode
every kernel is resident and inputs follow each other through them, so the busiest PE of any kernel
sets the throughput: there a size is ranked only if its busiest PE (expected) stays within
``BUSY_SLACK`` of the longest size's (short blocks repeat every task start), and the fastest of
those timed wins. The sizes
tried are the powers of two below the rows, and the rows themselves::

    >>> candidates(12)
    [12, 8, 4, 2, 1]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from sparsefx.runtime.alone import kernel_alone
from sparsefx.runtime.cost import block_rows, row_streaming, row_streaming_op, rows_of
from sparsefx.runtime.estimate import busiest_pe, sparse_alone
from sparsefx.runtime.held import kept_beside
from sparsefx.runtime.layout import Layout, layout
from sparsefx.runtime.memo import kept
from sparsefx.runtime.memory import pe_bytes
from sparsefx.runtime.op_kinds import ROW_MATMULS
from sparsefx.runtime.program import Kernel, ProgramData

__all__ = [
    "ROWWISE",
    "Candidate",
    "candidates",
    "best_sparse",
    "ranked",
    "timed",
    "followers",
    "fits",
    "plan_blocks",
    "WORSE_IN_A_ROW",
    "BUSY_SLACK",
    "TIMED_BLOCKS",
    "TIMED_CANDIDATES",
]

ROWWISE = ROW_MATMULS
"""Matmul kinds whose blocks are rows (a convolution's are whole images): their block size is searched
(``op_kinds.ROW_MATMULS``)."""

WORSE_IN_A_ROW = 2
"""The tuner stops trying wider mappings after this many in a row were expected slower than the best."""

TIMED_CANDIDATES = 3
"""Mappings of one kernel timed on the clock: the best ranked by ``estimate.sparse_alone``. A program
lowered so runs within 3% of one lowered with every mapping timed (``tests/test_estimate.py``)."""

TIMED_BLOCKS = 16
"""A block size with more blocks is timed on its first 8 and 16 and extrapolated from their difference."""

BUSY_SLACK = 0.1
"""Pipelined mode: how much busier than the least busy block size a kept size's busiest PE may be."""


def candidates(rows: int) -> list[int]:
    """Block sizes to try for ``rows`` rows, largest first."""
    sizes, b = [rows], 1
    while b < rows:
        sizes.append(b)
        b *= 2
    return sorted(set(sizes), reverse=True)


def fits(program: ProgramData, k: Kernel, beside: Mapping[str, torch.Tensor] | None = None) -> bool:
    """Whether the kernel's busiest PE holds its data at its rows in flight, beside what a streaming
    program keeps on its PEs for later steps (``beside``: ``held.kept_beside``)."""
    if k.region.pes == 0:
        return True
    need = pe_bytes(program, k)
    if beside and k.name in beside:
        need = need + beside[k.name]
    return int(need.max()) <= program.hardware.sram_bytes


def followers(program: ProgramData, k: Kernel) -> list[Kernel]:
    """The kernels whose block sizes ``k``'s caps (``plan_blocks``: the smallest of their row-streamed
    inputs'), in program order: each later kernel but a row-wise matmul that streams rows of ``k`` or of
    such a kernel. ``k`` may be a copy of the program's kernel of its name (a mapping being tried)."""
    at = next((i for i, c in enumerate(program.kernels) if c.name == k.name), len(program.kernels))
    chain, out = {k.name}, []
    for c in program.kernels[at + 1 :]:
        if _tuned(c) or not any(v in chain and row_streaming(program, c, v) for v in c.inputs):
            continue
        out.append(c)
        chain.add(c.name)
    return out


@dataclass(frozen=True)
class Candidate:
    """A block size of a sparse matmul ranked for timing: its expected cycles (the kernel's
    ``estimate.sparse_alone`` and its followers' cycles on the clock) and its busiest PE's."""

    estimate: int
    rows: int
    busy: int


def ranked(
    program: ProgramData, k: Kernel, known: Layout, beside: Mapping[str, torch.Tensor] | None = None
) -> list[Candidate]:
    """Every block size of ``k`` that fits (``fits``), best estimate first (ties: the longer block). In
    pipelined mode only the sizes before the first whose busiest PE passes the longest size's by more
    than ``BUSY_SLACK``: shorter blocks only start more tasks. Leaves ``k``'s block size unset."""
    after = [(c, _follower_key(program, c)) for c in followers(program, k)]
    out: list[Candidate] = []
    for b in candidates(rows_of(k.shape)):
        k.attrs["rows_in_flight"] = b
        if not k.attrs.get("all_ones") and not fits(program, k, beside):
            continue
        busy = busiest_pe(program, k, known, b)
        cycles = sparse_alone(program, k, known, b, busy)
        for c, key in after:
            end, most = _follower(program, c, b, key)
            cycles, busy = cycles + end, max(busy, most)
        if program.mode == "pipelined" and out and busy > out[0].busy * (1 + BUSY_SLACK):
            break
        out.append(Candidate(cycles, b, busy))
    k.attrs.pop("rows_in_flight", None)
    return sorted(out, key=lambda c: c.estimate)


def timed(program: ProgramData, k: Kernel, known: Layout, b: int) -> tuple[int, int]:
    """``(cycles, cycles of k alone)`` of ``k`` at ``b`` rows per block on the clock, ``cycles`` with its
    ``followers``' at the same size. Leaves ``k``'s block size unset."""
    k.attrs["rows_in_flight"] = b
    try:
        alone = _timed(program, k, known, b)[0]
    finally:
        k.attrs.pop("rows_in_flight", None)
    return alone + sum(_follower(program, c, b)[0] for c in followers(program, k)), alone


def best_sparse(
    program: ProgramData, k: Kernel, beside: Mapping[str, torch.Tensor] | None = None
) -> tuple[int, int, int] | None:
    """``(cycles, rows in flight, cycles of k alone)`` of a sparse matmul's fastest block size, or None if
    none fits (beside the values kept on its PEs, ``fits``): the ``TIMED_CANDIDATES`` best ranked
    (``ranked``) timed on the clock, ``cycles`` with the time of each of its ``followers`` alone at the
    same block size. Ties go to the better estimate."""
    known = layout(program, k)  # the same at every block size: read and check the slices once
    best: tuple[int, int, int] | None = None
    for c in ranked(program, k, known, beside)[:TIMED_CANDIDATES]:
        cycles, alone = timed(program, k, known, c.rows)
        if best is None or cycles < best[0]:
            best = (cycles, c.rows, alone)
    return best


def _follower(program: ProgramData, c: Kernel, b: int, key: tuple | None = None) -> tuple[int, int]:
    """``(cycles, busiest PE's cycles)`` of follower ``c`` alone at ``b`` rows per block, kept by geometry
    (``key``: ``_follower_key(program, c)``, when the caller has it)."""

    def timed() -> tuple[int, int]:
        had = c.attrs.get("rows_in_flight")
        c.attrs["rows_in_flight"] = b
        try:
            t = kernel_alone(program, c)
            return t.end, t.busy_sums()[0]
        finally:
            if had is None:
                c.attrs.pop("rows_in_flight")
            else:
                c.attrs["rows_in_flight"] = had

    return kept(None, (*(key or _follower_key(program, c)), b), timed)


def _follower_key(program: ProgramData, c: Kernel) -> tuple:
    """What a follower's time alone depends on, but its block size."""
    return ("follower", _geometry(program, c), repr(program.hardware))


def _rows(program: ProgramData, k: Kernel, b: int, beside: Mapping[str, torch.Tensor]) -> int | None:
    """The most rows in flight, ``b`` halved until it fits beside ``beside`` (else without it), for a
    kernel whose block size is not searched."""
    for room in (beside, None):
        n: int | None = b
        while n is not None:
            k.attrs["rows_in_flight"] = n
            if k.attrs.get("all_ones") or fits(program, k, room):
                return n
            n = n // 2 or None
    return None


def _tuned(k: Kernel) -> bool:
    return k.op == "sparse_matmul" and k.attrs.get("kind") in ROW_MATMULS


def _timed(program: ProgramData, k: Kernel, known: Layout, b: int) -> tuple[int, int]:
    """``(cycles, busiest PE's cycles)`` of ``k`` alone at ``b`` rows per block. Past ``TIMED_BLOCKS``
    blocks, both come from the first ``TIMED_BLOCKS // 2`` and ``TIMED_BLOCKS`` blocks: a long kernel
    settles into a steady state where each block adds the same cycles."""
    blocks = -(-max(rows_of(k.shape), 1) // b)
    if blocks <= TIMED_BLOCKS:
        kt = kernel_alone(program, k, known)
        return kt.end, kt.busy_sums()[0]
    half, whole = (kernel_alone(program, k, known, rows=n * b) for n in (TIMED_BLOCKS // 2, TIMED_BLOCKS))
    busy = [t.busy_sums()[0] for t in (half, whole)]
    more = (blocks - TIMED_BLOCKS) / (TIMED_BLOCKS // 2)  # steady-state steps of TIMED_BLOCKS // 2 blocks
    return round(whole.end + (whole.end - half.end) * more), round(busy[1] + (busy[1] - busy[0]) * more)


def _fits_at(program: ProgramData, k: Kernel, b: int, beside: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``k`` fits its PEs' SRAM at ``b`` rows in flight beside ``beside`` (an all-ones matmul
    keeps no data); leaves its ``rows_in_flight`` at ``b``."""
    k.attrs["rows_in_flight"] = b
    return bool(k.attrs.get("all_ones")) or fits(program, k, beside)


def _geometry(program: ProgramData, k: Kernel) -> tuple:
    """All an all-ones kernel's time alone depends on: its shape, region and attrs, and its inputs'."""
    attrs = tuple(sorted((n, repr(v)) for n, v in k.attrs.items() if n not in ("rows_in_flight", "dense")))
    inputs = tuple((s.shape, s.dtype) for s in map(program.value, k.inputs))
    return (k.op, k.shape, k.dtype, k.region, attrs, inputs)


def plan_blocks(program: ProgramData, known: Mapping[str, int] | None = None) -> None:
    """Set ``attrs["rows_in_flight"]`` on every kernel that streams rows (module docstring); ``known``
    gives sparse matmuls whose block size was found already (``tune.py``). A known size that overflows
    the kernel's own PEs (a later layer given the first one's size untimed) is searched again.

    In a streaming program each step's data leaves room for the values kept on its PEs for later
    steps (``held.kept_beside``); a step that cannot, at any block size, is sized as if they were not
    there, and the lowering warns (``held.held_overflow``)."""
    beside = kept_beside(program)
    chosen: dict[str, int] = {}
    geometric: dict[tuple, tuple[int, int, int] | None] = {}  # all-ones kernels: timed by geometry alone
    for k in program.kernels:
        if _tuned(k):
            if known and k.name in known and _fits_at(program, k, known[k.name], beside):
                found: tuple[int | None, int, int | None] | None = (None, known[k.name], None)
            elif k.attrs.get("all_ones"):
                key = (_geometry(program, k), *(_geometry(program, c) for c in followers(program, k)))
                if key not in geometric:
                    geometric[key] = best_sparse(program, k)
                found = geometric[key]
            else:
                found = best_sparse(program, k, beside) or best_sparse(program, k)
            b = None if found is None else found[1]
        else:
            aligned = [chosen[v] for v in k.inputs if v in chosen and row_streaming(program, k, v)]
            b = _rows(program, k, min(aligned) if aligned else max(rows_of(k.shape), 1), beside)
        if b is None:
            k.attrs.pop("rows_in_flight", None)
            continue
        k.attrs["rows_in_flight"] = b
        chosen[k.name] = b
    result_blocks(program)


def result_blocks(program: ProgramData) -> None:
    """In a streaming program, a layout change that waits for the whole of its input (a head merge: each
    row of its result gathers every head) sends its result in the blocks its readers stream
    (``attrs["result_rows"]``, ``cost.block_rows``): its input is whole when it starts, so nothing
    makes it wait to send the first rows, and a matmul reading it in blocks starts on the first
    block's messages instead of waiting for every row of every feature of its lane."""
    if program.mode != "streaming":
        return
    for k in program.kernels:
        k.attrs.pop("result_rows", None)
        if k.op != "layout" or row_streaming_op(k) or k.name in program.outputs:
            continue
        them = [program.kernel(name) for name in program.consumers(k.name)]
        if not them or not all(row_streaming(program, r, k.name) for r in them):
            continue
        b = min(block_rows(r) for r in them)
        if b < rows_of(k.shape):
            k.attrs["result_rows"] = b
