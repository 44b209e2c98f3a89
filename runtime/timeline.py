"""What a clock produces, whichever executor ran it: value flows, kernel timings and the timeline.

Both executors (``runtime/fast.py``, ``runtime/reference.py``) fill these in; ``runtime/stats.py``
reads them. A ``Flow`` says how a value's messages leave its producer, a ``KernelTime`` when a kernel
ran and how busy each of its PEs was, a ``Timeline`` all of them and the makespan.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from . import compiled
from .op_kinds import STATS_ALLREDUCE
from .program import lane_bounds
from .queues import fifo

__all__ = ["Flow", "KernelTime", "Timeline", "digest", "lane_sends", "REDUCING_STATS"]

REDUCING_STATS = STATS_ALLREDUCE
"""Kernels that all-reduce statistics across lanes before they finish a block (``op_kinds.KINDS``'
``allreduces_stats``; an alias of ``op_kinds.STATS_ALLREDUCE``)."""


def digest(t: torch.Tensor) -> tuple:
    """A tensor's shape, dtype and a 160-bit digest of its bytes: a key for ``kept``."""
    data = t.contiguous().view(torch.uint8) if t.dtype == torch.bool else t.contiguous()
    data = data.cpu()
    return tuple(t.shape), str(t.dtype), hashlib.blake2b(data.numpy().tobytes(), digest_size=20).digest()


def lane_sends(wave: torch.Tensor, live: torch.Tensor | None, bounds: torch.Tensor) -> torch.Tensor:
    """``[blocks, features]``: wavelets each message of a value puts on its lane, zeros filtered at the
    sender. ``wave[q]``: wavelets of a message of block ``q``; ``live[q, f]``: whether message ``(q, f)``
    holds a nonzero (None: every one does); ``bounds``: ``lane_bounds`` of the features. A filtered
    message sends nothing, except a lane's last one, which still sends the block's end mark (one
    wavelet). Both executors send by this rule.

        >>> live = torch.tensor([[True, False, False, False]])  # two lanes of two features
        >>> lane_sends(torch.tensor([4]), live, torch.tensor([0, 2, 4]))
        tensor([[4, 1, 0, 1]])
    """
    if live is not None and compiled.available(wave, live, bounds):
        return compiled.lane_sends(wave, live, bounds)
    full = wave[:, None].expand(-1, int(bounds[-1]))
    if live is None:
        return full.clone()
    out = torch.where(live, full, 0)
    ends = bounds[1:] - 1
    ends = ends[ends >= bounds[:-1]]  # lanes with no feature send nothing
    out[:, ends] = out[:, ends].clamp(min=1)
    return out


@dataclass
class Flow:
    """How a value's messages leave its producer: one per feature per block, each lane one at a time.

    ``ready[q, f]`` is when message ``(q, f)`` can leave the producer's edge column (for a result that
    stays where it is made, ``back`` set: when its last share is made, ``runtime/homes.py``); a lane
    sends its messages first come first served (``depart``), one wavelet per cycle.

    **Zeros are filtered at the sender.** ``live[q, f]`` says whether message ``(q, f)`` holds a nonzero
    value (None: every one does). A message whose values are all zero is not sent: no wavelets, no
    link time. Each lane ends each block with an end-of-block mark so that a reader knows the block is
    complete: the control bit of the lane's last message, or, when that message is filtered, one control
    wavelet of its own (``sends``).
    """

    value: str
    dtype: str
    features: int
    lanes: int
    rows: int
    block: int
    wave: torch.Tensor  # [blocks] wavelets per message
    east: int  # the column messages leave from (-1: the host, west of column 0)
    ready: torch.Tensor  # [blocks, features]
    live: torch.Tensor | None = None  # [blocks, features] bool: which messages hold a nonzero
    back: torch.Tensor | None = None  # [features] streaming: kept this many columns west of ``east``
    # [blocks, features] streaming, a program output: its departures in its own step, where the
    # stored values that step reads leave through the same ramps (``ramps.output_departs``)
    own: torch.Tensor | None = None
    # [blocks] streaming, kept in row tiles from column 0: wavelets of each block's share on column 0,
    # and [features] which features' column-0 share is there (``ramps.shared_departs``); None: no tiles
    home0: tuple[torch.Tensor, torch.Tensor] | None = None
    _departs: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)  # ``waiting``, ``done``: copies share

    @property
    def blocks(self) -> int:
        """How many blocks the value comes in."""
        return len(self.wave)

    @property
    def bounds(self) -> torch.Tensor:
        """``lane_bounds`` of the value's features."""
        if "bounds" not in self._shared:
            self._shared["bounds"] = lane_bounds(self.features, self.lanes)
        return self._shared["bounds"]

    @property
    def lane(self) -> torch.Tensor:
        """``[features]``: the lane each feature travels on."""
        if "lane" not in self._shared:
            feats = torch.arange(self.features)
            self._shared["lane"] = torch.searchsorted(self.bounds, feats, right=True) - 1
        return self._shared["lane"]

    @property
    def last(self) -> torch.Tensor:
        """``[features]``: the last feature of each feature's lane (the one that carries the block's end)."""
        if "last" not in self._shared:
            self._shared["last"] = self.bounds[1:][self.lane] - 1
        return self._shared["last"]

    @property
    def sends(self) -> torch.Tensor:
        """``[blocks, features]``: wavelets each message puts on its lane (0: filtered), the lone
        end-of-block wavelet of a lane whose last message is filtered included."""
        if "sends" not in self._shared:
            self._shared["sends"] = lane_sends(self.wave, self.live, self.bounds)
        return self._shared["sends"]

    @property
    def filtered(self) -> torch.Tensor:
        """``[blocks, features]``: wavelets the sender did not send because the message was all zero
        (less the lone end-of-block wavelets that replaced some)."""
        return self.wave[:, None] - self.sends

    def depart(self, t0: int = 0) -> torch.Tensor:
        """``[blocks, features]``: when each message's head leaves, sent no earlier than ``t0`` (a stored
        value that a streaming-mode kernel reads in its own step is sent again then)."""
        if self.own is not None and self.ready.numel() and t0 <= int(self.ready.min()):
            return self.own
        if t0 not in self._departs:
            if self.waits(t0):
                self._departs[t0] = self._waiting() + t0
            elif self.ready.numel() and t0 <= (first := int(self.ready.min())):
                # nothing is held back by t0: the lanes' queues move with ``ready``, so the departures
                # counted from the first message serve every moved copy (``reuse.moved``)
                if "free" not in self._shared:
                    self._shared["free"] = self._queued(self.ready - first)
                self._departs[t0] = self._shared["free"] + first
            else:
                self._departs[t0] = self._queued(self.ready.clamp(min=t0))
        return self._departs[t0]

    def _queued(self, ready: torch.Tensor) -> torch.Tensor:
        """``[blocks, features]``: when each message's head leaves if its lane sends its messages in the
        order they are ready (ties: block by block, feature by feature), one wavelet a cycle."""
        if compiled.available(ready):
            got = compiled.lane_departs(ready, self.sends, self.bounds)
            if got is not None:
                return got
        pe = self.lane[None, :].expand(self.blocks, -1).reshape(-1)
        wave = self.sends.reshape(-1)
        finish = fifo(pe, ready.reshape(-1), wave)
        return (finish - wave).reshape(self.blocks, self.features)

    def waits(self, t0: int) -> bool:
        """Whether every message is ready by ``t0`` (then they leave in closed form, ``waiting``)."""
        return self.features > 0 and int(self.ready.max()) <= t0

    def waiting(self) -> tuple[torch.Tensor, tuple]:
        """Departures, counted from the start, of messages all waiting at it (each lane sends its own in
        order, block by block), and their ``digest``; they depend on the wavelets and lanes alone, so
        a moved copy shares them."""
        if "digest" not in self._shared:
            self._shared["digest"] = digest(self._waiting())
        return self._shared["start"], self._shared["digest"]

    def _waiting(self) -> torch.Tensor:
        """``waiting``'s departures alone (the digest is taken only when asked for)."""
        if "start" not in self._shared:
            sends, lane, first = self.sends, self.lane, self.bounds[:-1]
            if compiled.available(sends):
                self._shared["start"] = compiled.lane_starts(sends, self.bounds)
                return self._shared["start"]
            within = torch.cumsum(sends, 1) - sends  # sent before it in its block, every lane
            within = within - within[:, first[lane]]  # ... in its own lane
            per_lane = torch.zeros((self.blocks, self.lanes), dtype=torch.int64).index_add_(1, lane, sends)
            before = torch.cumsum(per_lane, 0) - per_lane  # the lane's earlier blocks
            self._shared["start"] = before[:, lane] + within
        return self._shared["start"]

    @property
    def done(self) -> int:
        """When the last message has left the producer. Times are never negative, so the lanes' queues
        move with ``ready``: kept from its first message, it serves every moved copy."""
        if self.features == 0:
            return int(self.ready.max()) if self.ready.numel() else 0
        first = int(self.ready.min())
        if "done" not in self._shared:
            self._shared["done"] = int((self.depart() + self.sends).max()) - first
        return self._shared["done"] + first

    def end(self, streaming: bool, t0: int) -> int:
        """When the kernel whose result this is ends, in either executor: its last message has left
        (pipelined), or is wholly at the region's edge, where it stays until a later step sends it, its
        lanes passing one wavelet a cycle (streaming), or, where it stays on the PEs that made it
        (``back``, ``runtime/homes.py``), when its last share is made. An empty result (a cat's empty
        cache) sends nothing and ends at the kernel's start ``t0``."""
        if not self.ready.numel():
            return t0
        if streaming and self.back is not None:
            return int(self.ready.max())
        if streaming:
            return max(self.done, int((self.ready + self.sends).max()))
        return self.done


@dataclass
class KernelTime:
    """One kernel's timing: when it ran, each PE's busy cycles, and what it received or skipped."""

    name: str
    op: str
    start: int
    end: int
    busy: torch.Tensor  # [region pes] cycles of task work, row-major in the region
    overhead: torch.Tensor  # [region pes] the task-start part of busy
    blocks: int
    messages: int = 0
    skipped: int = 0  # input messages the sender filtered (all-zero vectors)
    axpys: int = 0
    skipped_axpys: int = 0
    waits_on: str | int | None = None  # the input (or "load", "previous") whose arrival came last
    load: tuple[int, int] | None = None  # streaming: when its weights were loaded
    bus: tuple[torch.Tensor, torch.Tensor] | None = None  # wavelets per vertical link [width, height]
    _sums: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)  # moved copies share

    def busy_sums(self) -> tuple[int, int, int]:
        """The busiest PE's cycles, all PEs' busy cycles and their task-start part, summed once."""
        if "busy" not in self._sums:
            top = int(self.busy.max()) if self.busy.numel() else 0
            self._sums["busy"] = (top, int(self.busy.sum()), int(self.overhead.sum()))
        return self._sums["busy"]


@dataclass
class Timeline:
    """What ``simulate`` returns: per-kernel timings, value flows, and the makespan."""

    kernels: list[KernelTime]
    flows: dict[str, Flow]
    cycles: int
    output_done: dict[str, int] = field(default_factory=dict)
