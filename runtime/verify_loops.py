"""The verifier's per-route checks of router entries as one compiled pass, where numba is installed.

``verify._check_batch`` asks two things of a batch's router entries: does a route set one PE's router
twice, and is every hop a run's end sends received by the neighbour's entry of the same route? The
tensor form sorts the entries by (route, PE) and searches the sorted keys. Grouped by route as they
come, the entries need no sort: one pass per route stamps each PE it sets (a PE stamped twice is a
duplicate) and then looks up each hop's neighbour by its stamp. The answers are the tensor form's,
the first duplicate (by route, then PE) and the bad hops included (``tests/test_routes_expand.py``)::

    >>> import torch
    >>> within, pe = torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0])
    >>> rx, tx = torch.tensor([16, 8, 16]), torch.tensor([2, 16, 2])  # RAMP=16, E=2, W=8
    >>> got = route_checks(within, pe, rx, tx, torch.tensor([1, 2]), torch.tensor([False, False]), 2, 1)
    >>> got is None or (got[0], got[1].tolist())  # route 1's hop east from PE 0 has no receiver
    (-1, [[False, False], [False, True], [False, False], [False, False]])
"""

from __future__ import annotations

import numpy as np
import torch

from .compiled import available, lazy

__all__ = ["route_checks", "first_clash"]


def route_checks(
    within: torch.Tensor,
    pe: torch.Tensor,
    rx: torch.Tensor,
    tx: torch.Tensor,
    ends: torch.Tensor,
    to_host: torch.Tensor,
    width: int,
    height: int,
) -> tuple[int, torch.Tensor] | None:
    """``(first duplicate key, bad)`` for entries grouped by ``within`` (each entry's route, ascending):
    the least ``route * pes + pe`` a route sets twice (-1: none), and ``bad[d, i]`` whether the entry
    ``ends[i]`` sends in direction ``d`` (N, E, S, W) where no entry of its route receives it (off the
    mesh: unless its route ends at the host, ``to_host[i]``). None where the loop does not run."""
    if not available(within, pe, rx, tx):
        return None
    bad = np.zeros((4, len(ends)), np.bool_)
    arrays = [t.to(torch.int64).contiguous().numpy() for t in (within, pe, rx, tx, ends)]
    first = _checks(*arrays, to_host.to(torch.bool).contiguous().numpy(), width, height, bad)
    return int(first), torch.from_numpy(bad)


def _checks_loop(within, pe, rx, tx, ends, to_host, width, height, bad):  # pragma: no cover - compiled
    pes = width * height
    stamp = np.full(pes, -1, np.int64)
    entry = np.zeros(pes, np.int64)
    first = -1
    steps = ((1, 0, -1, 4), (2, 1, 0, 8), (4, 0, 1, 1), (8, -1, 0, 2))  # (bit, dx, dy, opposite)
    n, e, start = len(pe), 0, 0
    while start < n:
        route = within[start]
        stop = start
        while stop < n and within[stop] == route:
            at = pe[stop]
            if stamp[at] == route:
                key = route * pes + at
                if first < 0 or key < first:
                    first = key
            else:
                stamp[at] = route
                entry[at] = stop
            stop += 1
        while e < len(ends) and ends[e] < stop:
            here = pe[ends[e]]
            x, y = here % width, here // width
            for d in range(4):
                bit, dx, dy, back = steps[d]
                if tx[ends[e]] & bit:
                    nx, ny = x + dx, y + dy
                    if nx < 0 or nx >= width or ny < 0 or ny >= height:
                        bad[d, e] = not to_host[e]
                    else:
                        there = ny * width + nx
                        bad[d, e] = not (stamp[there] == route and rx[entry[there]] & back)
            e += 1
        start = stop
    return first


def first_clash(key: torch.Tensor, who: torch.Tensor, pes: int) -> tuple[int, int, int] | None:
    """``(key, first, second)``: the least ``key`` (``group * pes + pe``) that entries of two routes
    (``who``) share, and the first two such routes next to each other in the entries' order, as a
    stable sort by key would meet them; ``(-1, 0, 0)`` if none. None where the loop does not run. One
    pass per group (a counting sort by it), stamping each PE with the route that last set it."""
    if not available(key, who):
        return None
    if not len(key):
        return -1, 0, 0
    if int(key.min()) < 0:
        return None  # groups below 0: the tensor form's
    got = _clash(key.to(torch.int64).contiguous().numpy(), who.to(torch.int64).contiguous().numpy(), pes)
    return int(got[0]), int(got[1]), int(got[2])


def _clash_loop(key, who, pes):  # pragma: no cover - runs compiled
    n = len(key)
    groups = key.max() // pes + 1
    start = np.zeros(groups + 1, np.int64)
    for i in range(n):
        start[key[i] // pes + 1] += 1
    for g in range(groups):
        start[g + 1] += start[g]
    order = np.empty(n, np.int64)
    fill = start[:-1].copy()
    for i in range(n):
        g = key[i] // pes
        order[fill[g]] = i
        fill[g] += 1
    tag = np.full(pes, -1, np.int64)
    route = np.zeros(pes, np.int64)
    best, first, second = -1, 0, 0
    for g in range(groups):
        if best >= 0:
            break  # a clash in an earlier group has the least key
        for t in range(start[g], start[g + 1]):
            i = order[t]
            at = key[i] % pes
            if tag[at] == g and route[at] != who[i] and (best < 0 or key[i] < best):
                best, first, second = key[i], route[at], who[i]
            tag[at] = g
            route[at] = who[i]
    return best, first, second


_checks = lazy(_checks_loop)
_clash = lazy(_clash_loop)
