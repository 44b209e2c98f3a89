"""Stored values sent again in one streaming step take turns on the links they share.

In weight-streaming mode a kernel's result waits where its producer left it until a later step reads
it; that step sends the whole value again (``Flow.depart(t0)``), west along each lane to column 0,
then east across the reader's region. A message leaves through the ramp of the PE that keeps it: its
producer's east column, or, for a result that stays where it was made (``Flow.back``,
``runtime/homes.py``), the column of its share, which it leaves at its lane's slot moved by the hops
it saves, so that it passes column 0 when it would have from the east column. Messages of the values
a step reads that are on one row meet: all of them on the link out of column 0 when the reader is
wider than one column, else (a reader on column 0 alone, or a wider reader's PEs on column 0, which
take them off column 0's router) those that come from east of column 0 on the westward link into it
and those kept on column 0 on its ramp; a row tile's share of a message kept on column 0
(``Flow.home0``) takes the ramp, and the shares east of it the westward link, and the message is there
when its last share is. Each link passes one message at a time: when it frees, the messages waiting
for it go round-robin by value (the reference's colors, one per value, in program order), first come
first served within a value (``arbiter.round_robin``, the reference fabric's rule). A kernel that
reads two stored values, a residual add say, gets them interleaved, not each as fast as if it were
alone, and a value whose messages come late is not held back by one that waits whole::

    >>> import torch
    >>> from sparsefx.runtime.timeline import Flow
    >>> a = Flow("a", "fp32", 1, 1, 2, 1, torch.tensor([4, 4]), 3, torch.zeros(2, 1, dtype=torch.int64))
    >>> b = Flow("b", "fp32", 1, 1, 2, 1, torch.tensor([4, 4]), 3, torch.zeros(2, 1, dtype=torch.int64))
    >>> [d.flatten().tolist() for d in shared_departs([a, b], [0, 0], 10)]  # alone: [10, 14] each
    [[10, 18], [14, 22]]
"""

from __future__ import annotations

import torch

from .arbiter import round_robin
from .queues import fifo
from .timeline import Flow

__all__ = ["shared_departs", "links_of", "output_departs"]


def shared_departs(
    flows: list[Flow], rows0: list[int], t0: int, hop: int = 1, through: bool = False
) -> list[torch.Tensor]:
    """``[blocks, features]`` for each of ``flows`` (stored values sent again from ``t0``, in program
    order; ``rows0[i]``: the mesh row of flow ``i``'s lane 0): when each message's head would leave
    its producer's east column, the links of each row shared (module docstring; ``hop``: cycles a
    hop; ``through``: the reader is wider than one column). A flow alone leaves as ``flow.depart(t0)``."""
    ready, link, sends, color, message = [], [], [], [], []
    for i, (flow, row0) in enumerate(zip(flows, rows0)):
        # on its east column each lane's ramp is its queue; kept where made, its lane's schedule, in
        # the order of that queue (ready, then block, then feature)
        queue = flow.ready.clamp(min=t0).reshape(-1)
        at = flow.east * hop  # from the east column to column 0: the order the links see
        r = queue if flow.back is None else flow.depart(t0).reshape(-1)
        r = r + at
        ways = _links(flow, row0, through)[None, :].expand(flow.blocks, -1).reshape(-1).contiguous()
        cost = flow.sends.reshape(-1)
        n = torch.arange(len(r))
        first = _column0_share(flow, through)
        if first is not None:  # its share on column 0 takes column 0's ramp, the rest follow it west
            on0 = (first > 0).nonzero().squeeze(1)
            rest = (cost > first) | (first == 0)
            queue = torch.cat([queue[on0], queue[rest]])
            r = torch.cat([r[on0], (r + first)[rest]])
            ways = torch.cat([ways[on0] + 1, ways[rest]])
            cost = torch.cat([first[on0], (cost - first)[rest]])
            n = torch.cat([n[on0], n[rest]])
        order = torch.argsort(queue, stable=True)  # the flow's own queue: ties in it go in its order
        ready.append(r[order])
        link.append(ways[order])
        sends.append(cost[order])
        color.append(torch.full_like(order, i))
        message.append(n[order])
    done = round_robin(*(torch.cat(t) for t in (link, ready, sends, color))) + torch.cat(sends)
    out = []
    for flow, d, n in zip(flows, done.split([len(m) for m in message]), message):
        whole = torch.full((flow.ready.numel(),), torch.iinfo(torch.int64).min, dtype=torch.int64)
        whole.scatter_reduce_(0, n, d, "amax")  # a message is there when its last share is
        left = (whole - flow.sends.reshape(-1)).view(flow.blocks, flow.features) - flow.east * hop
        # a filtered message takes no link: it keeps its lane's slot (its readers go by the end mark)
        out.append(torch.where(flow.sends > 0, left, flow.depart(t0)))
    return out


def _column0_share(flow: Flow, through: bool) -> torch.Tensor | None:
    """``[blocks * features]``: wavelets of each message's share kept on column 0 (``Flow.home0``) where
    they leave through column 0's ramp (the reader on column 0 alone, ``through`` False) and the message
    is sent whole (a filtered one's end mark rides on its last share); None where no share is there."""
    if through or flow.home0 is None:
        return None
    wave, here = flow.home0
    if not bool(here.any()):
        return None
    whole = flow.sends == flow.wave[:, None]
    first = torch.where(whole & here[None, :], wave[:, None].expand_as(whole), 0)
    return torch.minimum(first, flow.sends).reshape(-1)


def _links(flow: Flow, row0: int, through: bool) -> torch.Tensor:
    """``[features]``: the link where each feature's messages meet the other values' (module
    docstring), numbered ``row * 2`` (into or out of column 0) or ``row * 2 + 1`` (column 0's ramp)."""
    home = torch.full((flow.features,), flow.east, dtype=torch.int64)
    if flow.back is not None:
        home = home - flow.back.to(torch.int64)
    ramp = (home == 0) & (not through)
    return (row0 + flow.lane) * 2 + ramp.to(torch.int64)


def links_of(flow: Flow, row0: int, through: bool) -> set[int]:
    """The links where ``flow``'s messages meet other values' (``shared_departs``' numbering)."""
    ways = _links(flow, row0, through)
    first = _column0_share(flow, through)
    if first is not None:  # the shares on column 0 take its ramp
        on0 = (first.view(flow.blocks, flow.features) > 0).any(dim=0)
        ways = torch.cat([ways, ways[on0] + 1])
    return set(torch.unique(ways).tolist())


def output_departs(
    out: Flow, row0: int, column: int, sent: list[tuple[Flow, torch.Tensor, int]], hop: int
) -> torch.Tensor | None:
    """``[blocks, features]``: when each message of program output ``out`` (its lane 0 on mesh row
    ``row0``, leaving from ``column``) leaves for the host, where stored values its step reads
    (``sent``: each flow, its departures in the step and its lane 0's row) leave through the same
    PEs' ramps: each ramp passes one message at a time, first come first served. None where no stored
    message leaves from ``column``."""
    ready, ramp, sends = [], [], []
    for flow, departs, row in sent:
        back = torch.zeros(flow.features, dtype=torch.int64) if flow.back is None else flow.back
        here = (flow.east - back) == column
        if not bool(here.any()):
            continue
        ready.append((departs + back[None, :] * hop)[:, here].reshape(-1))
        ramp.append((row + flow.lane)[here][None, :].expand(flow.blocks, -1).reshape(-1))
        sends.append(flow.sends[:, here].reshape(-1))
    if not ready:
        return None
    ready.append(out.ready.reshape(-1))
    ramp.append((row0 + out.lane)[None, :].expand(out.blocks, -1).reshape(-1))
    sends.append(out.sends.reshape(-1))
    finish = fifo(torch.cat(ramp), torch.cat(ready), torch.cat(sends))
    n = out.ready.numel()
    return (finish[-n:] - sends[-1]).view(out.blocks, out.features)
