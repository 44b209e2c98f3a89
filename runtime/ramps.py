"""Stored values sent again in one streaming step take turns where they leave.

In weight-streaming mode a kernel's result stays on its producer's east column until a later step
reads it; that step sends the whole value again (``Flow.depart(t0)``). Values that live on the same
east column leave through the same PEs' ramps onto the same rows: each ramp passes one message at a
time, and messages that are waiting together go round-robin by value (the reference's colors, one
per value, in program order), first come first served within a value. A kernel that reads two
stored values, a residual add say, gets them interleaved, not each as fast as if it were alone::

    >>> import torch
    >>> from sparsefx.runtime.timeline import Flow
    >>> a = Flow("a", "fp32", 1, 1, 2, 1, torch.tensor([4, 4]), 3, torch.zeros(2, 1, dtype=torch.int64))
    >>> b = Flow("b", "fp32", 1, 1, 2, 1, torch.tensor([4, 4]), 3, torch.zeros(2, 1, dtype=torch.int64))
    >>> [d.flatten().tolist() for d in shared_departs([a, b], [0, 0], 10)]  # alone: [10, 14] each
    [[10, 18], [14, 22]]
"""

from __future__ import annotations

import torch

from .queues import fifo
from .timeline import Flow

__all__ = ["shared_departs"]

_ROWS = 1 << 20  # more rows than any mesh has: ``east * _ROWS + row`` names one ramp


def shared_departs(flows: list[Flow], rows0: list[int], t0: int) -> list[torch.Tensor]:
    """``[blocks, features]`` for each of ``flows`` (stored values sent again from ``t0``, in program
    order; ``rows0[i]``: the mesh row of flow ``i``'s lane 0): when each message's head leaves its
    ramp, the ramps of values on the same east column and row shared (module docstring). A flow
    alone on its ramps leaves as ``flow.depart(t0)``."""
    ready, ramp, sends, key = [], [], [], []
    for i, (flow, row0) in enumerate(zip(flows, rows0)):
        r = flow.ready.clamp(min=t0).reshape(-1)
        lane = (flow.east * _ROWS + row0 + flow.lane)[None, :].expand(flow.blocks, -1)
        lane = lane.reshape(-1).contiguous()
        order = torch.argsort(r, stable=True)  # the flow's own queue: ready, then block, then feature
        order = order[torch.argsort(lane[order], stable=True)]
        place = torch.empty_like(order)
        place[order] = torch.arange(len(order))
        start = torch.searchsorted(lane[order], lane, side="left")  # the ramp's first entry of the flow
        ready.append(r)
        ramp.append(lane)
        sends.append(flow.sends.reshape(-1))
        key.append((place - start) * len(flows) + i)  # waiting together: round-robin by value
    key_all = torch.cat(key)
    given = torch.argsort(key_all, stable=True)
    r_all, ramp_all, s_all = (torch.cat(t)[given] for t in (ready, ramp, sends))
    depart = torch.empty_like(r_all)
    depart[given] = fifo(ramp_all, r_all, s_all) - s_all
    parts = depart.split([f.ready.numel() for f in flows])
    return [d.view(f.blocks, f.features) for d, f in zip(parts, flows)]
