"""Routes as straight runs of router entries, and their expansion to one ``(pe, rx, tx)`` entry per PE.

A route carries one value on one color. It is stored as runs: a run is a straight line of PEs from
``(x0, y0)`` in direction ``dir`` for ``length`` PEs. On a run, every PE receives from the PE before
it and transmits to the PE after it, except that the first PE receives on ``rx_first`` and the last
transmits on ``tx_last``; PEs at positions ``[tap_lo, tap_hi)`` also deliver to their core
(``RAMP`` in tx), and PEs at ``[inj_lo, inj_hi)`` also take data from their core (``RAMP`` in rx).
Runs keep a 757x996 mesh's routes small: one run per lane, not one entry per PE. ``expand`` gives
the per-PE router entries the verifier and the executors read::

    >>> runs = torch.tensor([[0, 0, int(Dir.E), 3, int(Dir.RAMP), int(Dir.RAMP), 2, 3, 0, 0]])
    >>> pe, rx, tx = expand(runs, MeshSpec(4, 1))
    >>> pe.tolist(), [Dir.format(b) for b in rx], [Dir.format(b) for b in tx]
    ([0, 1, 2], ['RAMP', 'W', 'W'], ['E', 'E', 'RAMP'])

Off-mesh ends: a run that starts on the mesh edge with ``rx_first`` pointing off the mesh receives
from the host; one whose ``tx_last`` points off the mesh sends to the host.
"""

from __future__ import annotations

import numpy as np
import torch

from .compiled import available, lazy
from .mesh import Dir, MeshSpec

__all__ = ["RUN_FIELDS", "run", "expand", "run_pes"]

RUN_FIELDS = ("x0", "y0", "dir", "length", "rx_first", "tx_last", "tap_lo", "tap_hi", "inj_lo", "inj_hi")
"""Columns of a runs table (``int32``, one row per run)."""

_DX = {0: 0, int(Dir.N): 0, int(Dir.S): 0, int(Dir.E): 1, int(Dir.W): -1}
_DY = {0: 0, int(Dir.N): -1, int(Dir.S): 1, int(Dir.E): 0, int(Dir.W): 0}
_OPP = {0: 0, int(Dir.N): int(Dir.S), int(Dir.S): int(Dir.N), int(Dir.E): int(Dir.W), int(Dir.W): int(Dir.E)}


def run(
    x0: int,
    y0: int,
    direction: Dir | int,
    length: int,
    *,
    rx_first: Dir | int,
    tx_last: Dir | int,
    taps: tuple[int, int] = (0, 0),
    injects: tuple[int, int] = (0, 0),
) -> list[int]:
    """One row of a runs table; ``taps`` and ``injects`` are ``[lo, hi)`` positions along the run."""
    return [x0, y0, int(direction), length, int(rx_first), int(tx_last), *taps, *injects]


def _lookup(table: dict[int, int], keys: torch.Tensor) -> torch.Tensor:
    """``table[key]`` for each of ``keys`` (0 for a key it lacks), through one small lookup tensor."""
    size = max(table) + 1
    lut = torch.zeros(size, dtype=keys.dtype, device=keys.device)
    values = torch.tensor(list(table.values()), dtype=keys.dtype, device=keys.device)
    lut[torch.tensor(list(table), device=keys.device)] = values
    inside = (keys >= 0) & (keys < size)
    return torch.where(inside, lut[keys.clamp(0, size - 1)], 0)


def run_pes(runs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, run index, position)`` of every PE on every run, in run order (no mesh check)."""
    runs = runs.to(torch.int64).reshape(-1, len(RUN_FIELDS))
    lengths = runs[:, 3].clamp(min=0)
    which = torch.repeat_interleave(torch.arange(len(runs)), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(int(lengths.sum())) - starts[which]
    d = runs[which, 2]
    x = runs[which, 0] + _lookup(_DX, d) * pos
    y = runs[which, 1] + _lookup(_DY, d) * pos
    return x, y, which, pos


def expand(runs: torch.Tensor, mesh: MeshSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pe index, rx bits, tx bits)`` per PE on the runs; PEs off the mesh get index -1. Where numba is
    installed, one compiled pass over the runs writes them (a verifier expands millions of entries)."""
    runs64 = runs.to(torch.int64).reshape(-1, len(RUN_FIELDS)).contiguous()
    if available(runs64):
        return _expand_compiled(runs64, mesh)
    x, y, which, pos = run_pes(runs64)
    r = runs64[which]
    d, length = r[:, 2], r[:, 3]
    ramp = int(Dir.RAMP)
    rx = torch.where(pos == 0, r[:, 4], _lookup(_OPP, d))
    rx = rx | torch.where((pos >= r[:, 8]) & (pos < r[:, 9]), ramp, 0)
    tx = torch.where(pos == length - 1, r[:, 5], d)
    tx = tx | torch.where((pos >= r[:, 6]) & (pos < r[:, 7]), ramp, 0)
    on = (x >= 0) & (x < mesh.width) & (y >= 0) & (y < mesh.height)
    pe = torch.where(on, y * mesh.width + x, torch.full_like(x, -1))
    return pe, rx, tx


def _luts() -> np.ndarray:
    """``[3, 32]``: one hop's ``dx``, ``dy`` and the opposite port of each port bit pattern (0 elsewhere)."""
    out = np.zeros((3, 32), np.int64)
    for row, table in enumerate((_DX, _DY, _OPP)):
        for key, value in table.items():
            out[row, key] = value
    return out


_LUTS = _luts()


def _expand_compiled(runs: torch.Tensor, mesh: MeshSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = runs[:, 3].clamp(min=0)
    starts = torch.zeros(len(runs) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=starts[1:])
    out = torch.empty((3, int(starts[-1])), dtype=torch.int64)
    _expand_loop(runs.numpy(), starts.numpy(), _LUTS, mesh.width, mesh.height, out.numpy())
    return out[0], out[1], out[2]


def _expand_runs(runs, starts, luts, width, height, out):  # pragma: no cover - runs compiled
    """``expand``'s rule, run by run: ``out[0]`` the PE (-1 off the mesh), ``out[1]`` rx, ``out[2]`` tx."""
    ramp = 16
    for r in range(runs.shape[0]):
        x0, y0, d, length = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3]
        known = 0 <= d < luts.shape[1]
        dx = luts[0, d] if known else 0
        dy = luts[1, d] if known else 0
        back = luts[2, d] if known else 0
        at = starts[r]
        for pos in range(max(length, 0)):
            x, y = x0 + dx * pos, y0 + dy * pos
            rx = runs[r, 4] if pos == 0 else back
            if runs[r, 8] <= pos < runs[r, 9]:
                rx |= ramp
            tx = runs[r, 5] if pos == length - 1 else d
            if runs[r, 6] <= pos < runs[r, 7]:
                tx |= ramp
            out[0, at + pos] = y * width + x if 0 <= x < width and 0 <= y < height else -1
            out[1, at + pos] = rx
            out[2, at + pos] = tx


_expand_loop = lazy(_expand_runs)
