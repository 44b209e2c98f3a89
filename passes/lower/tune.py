"""Tune the balanced placement per kernel: how far a row's input cut may move off its lane.

Cutting every column's nonzeros into equal runs evens out the PEs, but a row's inputs then drift off
its lane, and each feature that drifted forks up or down the column to reach it. On a layer whose
inputs are most of its traffic (GPT-2 small's 3072-input projection on a 64x64 mesh) the forks cost
more than the imbalance they remove; on one whose outputs are (its 768-to-3072 expansion) the
balance wins. ``tune_balanced`` places each sparse matmul at every limit in ``DRIFTS`` (``None``: no
limit, every PE within one nonzero; ``0``: each row holds exactly its lane's features), times each
with the emulator's own clock at its best block size (``blocks.best_sparse``), and keeps the fastest:
ties go to the earlier limit, so the even placement stays unless another is faster. The kernel
records its limit in ``attrs["drift"]`` (absent: none). A later kernel of the same shape, region and
density (the next layer of a stack) takes the first one's limit and block size untimed. For example,
on a 768-to-768 layer at 90% on a 64x64 mesh the unlimited cut takes about 5,200 cycles alone and the
cut held within 16 features about 3,200.
"""

from __future__ import annotations

from sparsefx.runtime.csc import imbalance
from sparsefx.runtime.memory import pe_bytes
from sparsefx.runtime.program import DataflowProgram, Kernel

from .blocks import best_sparse
from .builder import Pending
from .place_sparse import place_sparse

__all__ = ["tune_balanced", "DRIFTS"]

DRIFTS: tuple[int | None, ...] = (None, 16, 0)
"""The limits tried, in order of preference."""

_ROWWISE = ("linear", "addmm", "matmul")


def tune_balanced(program: DataflowProgram, pending: list[Pending]) -> dict[str, int]:
    """Re-place each balanced sparse matmul at its fastest limit; returns the block sizes found on the
    way (``plan_blocks`` takes them and searches for the rest)."""
    found: dict[str, int] = {}
    chosen: dict[tuple, tuple[int | None, int]] = {}  # by shape, region and density: a stack's layers repeat
    for k, p in zip(program.kernels, pending):
        if k.op != "sparse_matmul" or k.attrs.get("kind") not in _ROWWISE or p.sparse is None:
            continue
        key = _signature(k, p)
        if key in chosen:
            drift, found[k.name] = chosen[key]
            if drift is not None:
                _place(program, k, p, drift)
                k.attrs["drift"] = drift
            continue
        best: tuple[int, int, int | None, dict] | None = None
        for drift in DRIFTS:
            arrays = _arrays(program, k) if drift is None else _place(program, k, p, drift)
            timed = best_sparse(program, k)
            if timed is not None and (best is None or timed[0] < best[0]):
                best = (timed[0], timed[1], drift, arrays)
        if best is None:
            _install(program, k, _place(program, k, p, None))
            continue
        _, rows, drift, arrays = best
        _install(program, k, arrays)
        if drift is not None:
            k.attrs["drift"] = drift
        chosen[key] = drift, rows
        found[k.name] = rows
    return found


def _signature(k: Kernel, p: Pending) -> tuple:
    """What the choice depends on: the weight's shape, the region, and the density to 1%."""
    assert p.sparse is not None
    density = round(float(p.sparse.mask.float().mean()), 2)
    return (k.attrs["in_features"], k.attrs["out_features"], k.region.width, k.region.height, density)


def _arrays(program: DataflowProgram, k: Kernel) -> dict:
    return {role: program.arrays[name] for role, name in k.arrays.items() if role != "bias"}


def _place(program: DataflowProgram, k: Kernel, p: Pending, drift: int | None) -> dict:
    assert p.sparse is not None
    arrays = place_sparse(p.sparse.weight, p.sparse.mask, k.region.width, k.region.height, "balanced", drift)
    _install(program, k, arrays)
    return arrays


def _install(program: DataflowProgram, k: Kernel, arrays: dict) -> None:
    for role, tensor in arrays.items():
        k.arrays[role] = program.add_array(f"{k.name}.{role}", tensor)
    k.stats["imbalance"] = round(imbalance(arrays["nz_ptr"]), 4)
    k.stats["sram_max"] = int(pe_bytes(program, k).max()) if k.region.pes else 0
