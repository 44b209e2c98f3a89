"""Messages that wait for one link together, served as the reference's fabric serves them.

A link carries one message at a time. When it frees, it serves the messages whose heads have reached
it, round-robin by color (the color after the one it served last, else the lowest), first come first
served within a color (``runtime/events.py``: ``Fabric``). So a value whose messages all wait from the
start of a step does not hold the link while another value's messages arrive one by one: each of those
is served as soon as the message in progress is done. A message of no wavelets uses no link and goes at
once::

    >>> import torch
    >>> link, color = torch.tensor([0, 0, 0, 0]), torch.tensor([0, 0, 0, 1])
    >>> ready, cost = torch.tensor([0, 0, 0, 3]), torch.tensor([4, 4, 4, 2])
    >>> round_robin(link, ready, cost, color).tolist()  # color 1 goes as soon as color 0's first is done
    [0, 6, 10, 4]

``round_robin`` runs one compiled loop where numba is installed, else the same loop in Python.
"""

from __future__ import annotations

import numpy as np
import torch

from .compiled import available, lazy

__all__ = ["round_robin"]


def round_robin(
    link: torch.Tensor, ready: torch.Tensor, cost: torch.Tensor, color: torch.Tensor
) -> torch.Tensor:
    """When each message starts on its link (module docstring): ``link``, ``ready`` (when its head reaches
    the link), ``cost`` (its wavelets: cycles it holds the link) and ``color``, one entry a message; ties
    within a color go in the given order. Returns int64 starts in the given order, on ``link``'s device
    (the queue is one sequential walk: it runs on the host, like the rest of the clock's scheduling)."""
    n = link.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=link.device)
    args = [t.to(torch.int64).cpu().numpy() for t in (link, color, ready, cost)]
    order = np.lexsort([np.arange(n), args[2], args[1], args[0]])  # link, color, ready, given order
    link_s, color_s, ready_s, cost_s = (np.ascontiguousarray(a[order]) for a in args)
    out = np.empty(n, dtype=np.int64)
    loop = _serve_loop if available() else _serve  # host arrays: numba, when installed and allowed
    loop(link_s, color_s, ready_s, cost_s, out)
    start = np.empty(n, dtype=np.int64)
    start[order] = out
    return torch.from_numpy(start).to(link.device)


def _serve(link, color, ready, cost, start):  # pragma: no cover - also runs compiled
    """``round_robin``'s loop over entries sorted by link, color, then ready: each link's queues, one a
    color, served one message at a time."""
    n = link.shape[0]
    head = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    col = np.empty(n, np.int64)
    i = 0
    while i < n:
        j = i
        while j < n and link[j] == link[i]:
            j += 1
        groups = 0
        a = i
        while a < j:  # the link's colors, lowest first
            b = a
            while b < j and color[b] == color[a]:
                b += 1
            head[groups], end[groups], col[groups] = a, b, color[a]
            groups += 1
            a = b
        free, last, left = -(1 << 62), -(1 << 62), j - i
        while left > 0:
            first = 1 << 62
            for g in range(groups):
                e = head[g]
                while e < end[g] and cost[e] <= 0:  # no wavelets: it goes at once, on no link
                    start[e] = ready[e]
                    e += 1
                    left -= 1
                head[g] = e
                if e < end[g] and ready[e] < first:
                    first = ready[e]
            if first == 1 << 62:
                continue
            now = max(free, first)
            pick, lowest = -1, -1
            for g in range(groups):
                e = head[g]
                if e < end[g] and ready[e] <= now:
                    if lowest < 0:
                        lowest = g
                    if pick < 0 and col[g] > last:
                        pick = g
            if pick < 0:  # no color after the last served waits: the lowest that does (one always
                pick = lowest  # does: the head that came first is there by ``now``)
            e = head[pick]
            start[e] = now
            free = now + cost[e]
            last = col[pick]
            head[pick] += 1
            left -= 1
        i = j


_serve_loop = lazy(_serve)
