"""When a value's messages reach a kernel's PEs, from when they leave their lanes.

A message for block ``q[i]`` and feature ``feats[n]`` leaves at ``depart[q[i], feats[n]]``, takes
``hops[n]`` cycles to its PE's column and ``climb[n]`` more to its row, and is whole there once its
``sends`` wavelets have come in behind its head. A filtered (all-zero) message is never sent: its
reader knows it is zero when the end-of-block mark of its lane, carried by the lane's last message,
arrives. (Messages that fork onto a column's links queue there first: ``FastClock.arrivals``.)

    >>> import torch
    >>> depart, sends = torch.tensor([[0, 4]]), torch.tensor([[2, 2]])
    >>> live = torch.tensor([[False, True]])  # feature 0 is all zero; feature 1 ends the lane
    >>> one = torch.tensor([0])
    >>> arrivals_at(depart, sends, live, one, torch.tensor([0, 1]), torch.tensor([3, 3]),
    ...             torch.tensor([1, 0]), torch.tensor([1, 1])).tolist()
    [[10, 9]]
"""

from __future__ import annotations

import torch

from . import compiled

__all__ = ["arrivals_at"]


def arrivals_at(
    depart: torch.Tensor,
    sends: torch.Tensor,
    live: torch.Tensor | None,
    q: torch.Tensor,
    feats: torch.Tensor,
    hops: torch.Tensor,
    climb: torch.Tensor,
    last: torch.Tensor,
    forked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``[len(q), len(feats)]``: when message ``(q[i], feats[n])``'s last wavelet reaches its PE (a
    filtered one's: its lane's mark, ``last[f]`` the lane's last feature). ``live`` None: every
    message holds data. ``forked = (start, q_at, k_of)``: the messages that forked onto a column's
    links left them when queued there, message ``(q[i], feats[n])`` with ``k_of[n] >= 0`` at
    ``start[q_at[i], k_of[n]]`` (a filtered one still arrives with its lane's mark)."""
    if compiled.available(depart, sends, q, feats, hops):
        return compiled.arrivals_at(depart, sends, live, q, feats, hops, climb, last, forked)
    arrived = depart[q][:, feats].add_(hops).add_(climb).add_(sends[q][:, feats])
    if live is not None:
        end = last[feats]
        mark = depart[q][:, end].add_(hops).add_(climb).add_(sends[q][:, end])
        arrived = torch.where(live[q][:, feats], arrived, mark)
    if forked is not None:
        start, q_at, k_of = forked
        at = (k_of >= 0).nonzero().squeeze(1)
        fed = feats[at]
        moved = start[q_at[:, None], k_of[at][None, :]].add_(climb[None, at]).add_(sends[q][:, fed])
        if live is not None:
            moved = torch.where(live[q][:, fed], moved, arrived[:, at])
        arrived[:, at] = moved
    return arrived
