"""Values kept between the steps of a streaming program, and the SRAM they take.

A streaming program runs one kernel at a time. A value a later step reads is kept where its producer
left it, every row of it: on the PEs that made it (``runtime/homes.py``: a row tile's share, or a
sparse matmul's output on the column where its sum ends), or on the producer's east column, one lane
a row (the rows ``region.y + lane``), for a constant, a layout change on one column and a
convolution. From there each reader's step sends it again (``runtime/journeys.py``). So a PE holds its
part of the value from the step after its producer's (during its own step, its rows in flight are the
producer's buffers, ``memory.pe_bytes``) to its last reader's, beside whatever the running kernel
keeps on that PE.

The lowering gives a step more columns where that spreads its own data enough (``crowded``), and fewer
rows in flight, so that its own data fits beside what is kept on its PEs (``kept_beside``,
``passes/lower/blocks.py``). Where neither is enough, the program still lowers and runs, but sparsefx
neither spills nor charges a spill: lowering warns, naming the step, the PE, the values and about how
many rows would fit, since the program's figures then assume SRAM the mesh does not have. (An error
would refuse, by a few bytes, programs whose placement, not their size, puts a kept value beside a
kernel's buffers; a mapping that keeps values away from busy PEs, or spread over the PEs that read them,
is the fix.)
Program inputs wait in the host and outputs leave to it as they are made (``runtime/host.py``; a
streamed matmul's parts too, ``passes/lower/host_join.py``), so neither is kept on the mesh, and a
pipelined program streams its values between kernels that run at once, so it keeps none::

    >>> import torch, sparsefx
    >>> x = torch.randn(64, 32)
    >>> model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    >>> p = sparsefx.lower(sparsefx.compile(model, 0.9, (x,)), (x,), mesh=(8, 8), mode="streaming")
    >>> peak = held_peak(p)
    >>> [(k.name, k.attrs.get("epilogue", {}).get("fn")) for k in p.kernels]  # the ReLU: an epilogue
    [('masked_linear', 'relu'), ('masked_linear_1', None)]
    >>> from sparsefx.runtime.homes import kept_where
    >>> x_, y_, nbytes = kept_where(p, p.kernels[0])  # the first linear's result: 8 features a lane,
    >>> sorted(set(nbytes.tolist())), len(set(zip(x_.tolist(), y_.tolist())))  # one a PE, 64 rows each
    ([256], 64)
    >>> peak.step, peak.values, peak.held  # so the busiest PE is the first linear's own, nothing kept
    ('masked_linear', (), 0)
    >>> peak.total <= p.hardware.sram_bytes
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from .blocking import kernel_lanes
from .cost import features_of, rows_of
from .homes import kept_where, stays
from .memory import itemsize, pe_bytes
from .program import Kernel, ProgramData, lane_bounds

__all__ = ["HeldPeak", "crowded", "held_peak", "held_overflow", "kept_beside", "lane_bytes"]


@dataclass(frozen=True)
class HeldPeak:
    """The busiest PE of a streaming program counting kept values: during step ``step`` (a kernel),
    PE ``(x, y)`` keeps ``held`` bytes of ``values`` beside the step's own ``own`` bytes."""

    step: str
    x: int
    y: int
    held: int
    own: int
    values: tuple[str, ...]

    @property
    def total(self) -> int:
        return self.held + self.own


def lane_bytes(k: Kernel) -> torch.Tensor:
    """``[lanes]``: bytes of ``k``'s whole result each lane's PE keeps (every row of its features)."""
    f = features_of(k.shape)
    bounds = lane_bounds(f, kernel_lanes(k, f))
    return (bounds[1:] - bounds[:-1]).to(torch.int64) * rows_of(k.shape) * itemsize(k.dtype)


def _last_reads(p: ProgramData) -> dict[str, int]:
    """Each kernel value read by a later step: the index of its last reader's step."""
    made = {k.name: i for i, k in enumerate(p.kernels)}
    last: dict[str, int] = {}
    for i, k in enumerate(p.kernels):
        for v in k.inputs:
            if v in made and made[v] < i:
                last[v] = max(last.get(v, i), i)
    return last


def _kept(p: ProgramData) -> Iterator[tuple[int, Kernel, torch.Tensor, dict]]:
    """Each step of streaming ``p`` that keeps a value: its index and kernel, the bytes kept on each
    PE (``[height, width]``, changed after the step) and the kept values by (column, rows)."""
    last = _last_reads(p)
    if p.mode != "streaming" or not last or not p.has_payloads:
        return
    mesh = p.mesh
    held = torch.zeros(mesh.height, mesh.width, dtype=torch.int64)
    kept: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # value -> (x, y, bytes)
    made: Kernel | None = None
    for i, k in enumerate(p.kernels):
        if made is not None and made.name in last and made.region.pes:  # kept from the next step on
            kept[made.name] = where = _where(p, made)
            held.index_put_(where[1::-1], where[2], accumulate=True)
        made = k
        yield i, k, held, kept
        for v in [v for v, j in last.items() if j == i and v in kept]:
            x, y, nbytes = kept.pop(v)
            held.index_put_((y, x), -nbytes, accumulate=True)


def _where(p: ProgramData, k: Kernel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, bytes)``: the PEs that keep ``k``'s result and the bytes each keeps, where it was made
    (``homes.kept_where``) or, where it does not stay there, on the region's east column."""
    if stays(p, k):
        return kept_where(p, k)
    per = lane_bytes(k)
    y = k.region.y + torch.arange(len(per))
    return torch.full_like(y, k.region.x + k.region.width - 1), y, per


def _steps(
    p: ProgramData, own: Mapping[str, torch.Tensor] | None = None
) -> Iterator[tuple[int, Kernel, torch.Tensor, torch.Tensor, dict]]:
    """``_kept``'s steps, each also with the kernel's own bytes on its region's PEs (``[height, width]``
    of the region, zeros where it keeps none), not added to the mesh-wide ``held``: a copy of the whole
    mesh per step would cost more than the step on a wafer-sized one. ``own``: ``memory.pe_bytes`` of
    kernels by name, where the caller has them already."""
    for i, k, held, kept in _kept(p):
        r = k.region
        mine = torch.zeros(r.height, r.width, dtype=torch.int64)
        if r.pes and not k.attrs.get("all_ones"):
            given = own.get(k.name) if own is not None else None
            mine = (pe_bytes(p, k) if given is None else given).view(r.height, r.width)
        yield i, k, held, mine, kept


def _in_region(held: torch.Tensor, k: Kernel) -> torch.Tensor:
    """``[height, width]`` of ``k``'s region: the bytes kept on each of its PEs."""
    r = k.region
    return held[r.y : r.y + r.height, r.x : r.x + r.width]


def kept_beside(p: ProgramData) -> dict[str, torch.Tensor]:
    """Each streaming step (kernel name) whose PEs keep values for later steps: ``[region pes]`` bytes
    kept on each of its PEs (row-major in its region, as ``memory.pe_bytes``), which its own data must
    leave room for (``passes/lower/blocks.py`` sizes its rows in flight by it)."""
    out = {}
    for _, k, held, _ in _kept(p):
        here = _in_region(held, k)
        if k.region.pes and bool(here.any()):
            out[k.name] = here.reshape(-1).clone()
    return out


def held_peak(p: ProgramData) -> HeldPeak | None:
    """The PE and step where kept values and the running kernel take the most SRAM (None: a pipelined
    program, or one that keeps no value between steps)."""
    best: HeldPeak | None = None
    for _, k, held, own, kept in _steps(p):
        x, y, total = _busiest(held, own, k)
        if best is None or total > best.total:
            names = tuple(v for v, where in kept.items() if _keeps(where, x, y))
            mine = int(own[y - k.region.y, x - k.region.x]) if k.region.contains(x, y) else 0
            best = HeldPeak(k.name, x, y, total - mine, mine, names)
    return best


def _busiest(held: torch.Tensor, own: torch.Tensor, k: Kernel) -> tuple[int, int, int]:
    """``(x, y, bytes)`` of the PE holding the most, kept and own, during ``k``'s step (on ties, the
    region's first in row-major order). Inside the region a PE holds its kept bytes and more, so the
    busiest PE is outside it only where a kept value alone outweighs the region's busiest."""
    r, width = k.region, held.shape[1]
    x = y = total = -1
    if r.pes:
        here = _in_region(held, k) + own
        ry, rx = divmod(int(torch.argmax(here)), r.width)
        x, y, total = r.x + rx, r.y + ry, int(here[ry, rx])
    top = int(held.max())
    if top > total:
        y, x = divmod(int(torch.argmax(held)), width)
        total = top
    return x, y, total


def crowded(p: ProgramData, own: Mapping[str, torch.Tensor] | None = None) -> list[int]:
    """Kernels (indices) to give more columns where a step's own data and the values kept on its PEs
    overflow a PE's SRAM: the step, which spreads its own data, and the producers of the values kept on
    its busiest PE, which spreads a result that stays where it is made (``homes.py``) over more row
    tiles. ``own`` as ``_steps``'."""
    index = {k.name: i for i, k in enumerate(p.kernels)}
    out: dict[int, None] = {}
    for i, k, held, mine, kept in _steps(p, own):
        if not k.region.pes:
            continue
        here = _in_region(held, k) + mine
        if int(here.max()) <= p.hardware.sram_bytes:
            continue
        out[i] = None
        y, x = divmod(int(torch.argmax(here)), k.region.width)
        x, y = x + k.region.x, y + k.region.y
        for v, where in kept.items():  # a result kept on its region's east edge does not spread
            if _spreads(p, p.kernels[index[v]]) and _keeps(where, x, y):
                out[index[v]] = None
    return sorted(out)


def _spreads(p: ProgramData, k: Kernel) -> bool:
    """Whether more columns spread ``k``'s kept result: one that stays where it is made, or a layout
    change on one column, which more columns give row tiles (``homes.stays``)."""
    return stays(p, k) or (k.op == "layout" and k.name not in p.outputs)


def _keeps(where: tuple[torch.Tensor, torch.Tensor, torch.Tensor], x: int, y: int) -> bool:
    """Whether a kept value's PEs (``_where``) include PE ``(x, y)``."""
    cx, cy, _ = where
    return bool(((cx == x) & (cy == y)).any())


def held_overflow(p: ProgramData) -> str | None:
    """Why ``p``'s kept values do not fit its PEs' SRAM (None: they fit), for the lowering's warning;
    the message names the step, the PE, the values and about how many rows would fit."""
    peak = held_peak(p)
    sram = p.hardware.sram_bytes
    if peak is None or peak.total <= sram or not peak.values:
        return None
    rows = max(rows_of(p.kernel(v).shape) for v in peak.values)
    fits = math.floor(rows * max(sram - peak.own, 0) / peak.held) if peak.held else rows
    return (
        f"streaming step {peak.step!r}: PE ({peak.x}, {peak.y}) keeps {peak.held:,} bytes of "
        f"{_names(peak.values)} for later steps beside the step's own {peak.own:,}: "
        f"{peak.total:,} bytes, and a PE has {sram:,} bytes of SRAM. A value kept between streaming "
        f"steps stays where it was made (or on its producer's east column), every row of it; sparsefx "
        f"does not spill it, so this program's figures assume SRAM the mesh does not have. About "
        f"{fits:,} of its {rows:,} rows would fit: lower fewer tokens, onto a mesh with more rows, or in "
        "pipelined mode"
    )


def _names(values: tuple[str, ...], shown: int = 3) -> str:
    """``'a', 'b', 'c' and 11 more``."""
    names = ", ".join(repr(v) for v in values[:shown])
    return names if len(values) <= shown else f"{names} and {len(values) - shown} more"
