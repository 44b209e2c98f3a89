"""How the reference machine moves a value's messages: from the sender along its lane, then up or down
the columns to the PEs that read it, every hop a request to ``Fabric`` (``runtime/events.py``).

A message is one feature ``f`` of one block ``q`` of rows of a value. It leaves its sender on the
sender's ramp (one wavelet per cycle), then travels its lane row: east from the producer's edge in a
pipelined program (one route shared by every reader); in a streaming program west to column 0 and
back east, sent again for each reader in that reader's step; east from the producer's edge off the
mesh for a program output (to the host, ``runtime/host.py``), in either mode; east from the host
(column -1) for a program input. At each column where PEs read it, it forks up and down the column.
Its head moves one hop per ``hop_cycles`` past each link that served it; a PE has it when the last
wavelet has come, ``sends`` cycles after the head. A message the sender filtered (all zero) is not
sent: a PE that needed it learns so from the lane's end-of-block mark, which rides on the lane's last
message of the block (``timeline.lane_sends``), reaching its row on the lane and then moving one hop
per row.

A reader registers what it needs (``need``) before the message leaves; ``launch`` sends it. Every
message of a value leaves its lane in order, block by block, whether or not a reader needs it (a
streaming step sends the stored value again whole), as the fast clock's lanes send them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .blocking import blocked, sized
from .events import Events, Fabric, Link
from .program import lane_bounds
from .timeline import lane_sends

__all__ = ["Sent", "Journeys", "live_flags"]

Arrival = Callable[[int], None]


def live_flags(tensor: torch.Tensor, block: int, blocks: int, features: int) -> torch.Tensor | None:
    """``[blocks, features]``: whether message ``(q, f)`` of a value holds a nonzero (None: empty value)."""
    if tensor.numel() == 0 or features == 0:
        return None
    return sized(blocked((tensor != 0).reshape(-1, features), block), blocks, features)


@dataclass
class Sent:
    """A value as its producer sends it: geometry, wavelets, zero flags, and when each message is ready."""

    name: str
    dtype: str
    features: int
    lanes: int
    rows: int
    block: int
    wave: list[int]  # wavelets per message, per block
    east: int  # the column messages leave from (-1: the host)
    color: int
    tensor: torch.Tensor
    ready: list[list[int]] = field(default_factory=list)  # [block][feature], -1 until known
    # streaming, a result kept where it was made (``runtime/homes.py``): each row tile's column of
    # each feature ([tile][feature]) and its rows of each block ([tile][block]); None: at ``east``
    homes: tuple[list[list[int]], list[list[int]]] | None = None
    back: torch.Tensor | None = None  # with ``homes``: ``homes.back``, the fast clock's ``Flow.back``

    def __post_init__(self) -> None:
        bounds = lane_bounds(self.features, self.lanes)
        self.bounds = bounds.tolist()
        # zeros filtered at the sender, from the value the PEs hold, by the rule both executors send by
        self.flags = live_flags(self.tensor, self.block, len(self.wave), self.features)
        self.live = None if self.flags is None else self.flags.tolist()
        self.sends = lane_sends(torch.tensor(self.wave, dtype=torch.int64), self.flags, bounds).tolist()
        if not self.ready:
            self.ready = [[-1] * self.features for _ in self.wave]

    @property
    def blocks(self) -> int:
        return len(self.wave)

    def lane(self, f: int) -> int:
        """The lane (row of the sender's region) feature ``f`` travels on."""
        return bisect.bisect_right(self.bounds, f) - 1

    def rows_in(self, q: int) -> int:
        """Rows of block ``q``."""
        return min(self.block, self.rows - q * self.block)

    def last(self, f: int) -> int:
        """The last feature of ``f``'s lane: its message carries the lane's end-of-block mark."""
        return self.bounds[self.lane(f) + 1] - 1

    def cover(self, q: int, b: int, rows: int, streams: bool) -> range:
        """The blocks of this value that a reader's block ``q`` of ``b`` rows (of ``rows``) needs."""
        if not streams or rows != self.rows:
            return range(self.blocks)
        lo, hi = q * b, min((q + 1) * b, rows) - 1
        return range(lo // self.block, hi // self.block + 1)


@dataclass
class _Route:
    """Who reads one message: PEs by column and row, and PEs that learn from the lane's end mark."""

    dests: dict[int, dict[int, list[Arrival]]] = field(default_factory=dict)
    marks: dict[int, list[tuple[int, Arrival]]] = field(default_factory=dict)


def _joined(route: _Route, n: int) -> _Route:
    """``route`` for a message sent in ``n`` shares: each reader's callback runs once, when the last
    share has come, with that cycle."""

    def join(then: Arrival) -> Arrival:
        seen: list[int] = []

        def note(t: int) -> None:
            seen.append(t)
            if len(seen) == n:
                then(max(seen))

        return note

    dests = {x: {y: [join(t) for t in ts] for y, ts in ys.items()} for x, ys in route.dests.items()}
    marks = {x: [(dy, join(t)) for dy, t in ms] for x, ms in route.marks.items()}
    return _Route(dests, marks)


class Journeys:
    """Readers' needs and the messages' journeys (module docstring). ``row_of(v, f)`` is the mesh row of
    feature ``f``'s lane."""

    def __init__(
        self, events: Events, fabric: Fabric, hop: int, streaming: bool, row0: dict[str, int]
    ) -> None:
        self.ev, self.fabric, self.hop, self.streaming = events, fabric, hop, streaming
        self.row0 = row0  # value -> the mesh row of its lane 0
        self._routes: dict[tuple[str, str, int, int], _Route] = {}

    def row(self, v: Sent, f: int) -> int:
        return self.row0[v.name] + v.lane(f)

    def need(self, v: Sent, key: str, q: int, f: int, x: int, y: int, then: Arrival) -> None:
        """PE ``(x, y)`` reads message ``(q, f)`` of ``v`` (route ``key``: one per reader in a streaming
        program, shared in a pipelined one); ``then(cycle)`` when it has it, or knows it was filtered."""
        if v.sends[q][f] > 0:
            route = self._route(v, key, q, f)
            route.dests.setdefault(x, {}).setdefault(y, []).append(then)
        else:
            route = self._route(v, key, q, v.last(f))
            route.marks.setdefault(x, []).append((abs(y - self.row(v, f)), then))

    def _route(self, v: Sent, key: str, q: int, f: int) -> _Route:
        return self._routes.setdefault((v.name, key, q, f), _Route())

    def launch(self, v: Sent, key: str, q: int, f: int, start: int) -> None:
        """Send message ``(q, f)`` of ``v`` on route ``key``, its head leaving the sender at ``start``.
        A value kept where its row tiles made it (``Sent.homes``) goes from each tile with a share of
        the block, each share on its own PE's ramp, on the lane's schedule (``homes.py``:
        ``start`` is the message's slot from the east column): each share leaves its PE so as to pass
        column 0 right after the share before it; a reader has the message when it has every share."""
        route = self._routes.pop((v.name, key, q, f), None) or _Route()  # read or not, it leaves its lane
        if v.homes is None or key == "host" or not self.streaming:
            self._send(v, route, f, v.sends[q][f], v.east, start, not self.streaming or key == "host")
            return
        px, rows = v.homes
        shares = [(px[t][f], n) for t, n in enumerate(r[q] for r in rows) if n]
        whole = v.sends[q][f]
        if len(shares) > 1:
            route = _joined(route, len(shares))
        ahead = 0  # wavelets of the shares before this one
        for i, (x, n) in enumerate(shares):
            if whole == v.wave[q]:  # a share of the rows: its own wavelets
                s = math.ceil(whole * n / max(v.rows_in(q), 1))
            else:  # filtered: the last share carries the lane's end mark, if it has one
                s = whole if i == len(shares) - 1 else 0
            self._send(v, route, f, s, x, start + (v.east - x) * self.hop + ahead, False)
            ahead += s

    def _send(self, v: Sent, route: _Route, f: int, s: int, e: int, start: int, east: bool) -> None:
        """``s`` wavelets of feature ``f``'s message from column ``e`` (-1: the host) along ``route``:
        ``east`` (pipelined, or to the host) on along the lane, else (streaming) west to column 0 first."""
        row = self.row(v, f)
        cols = set(route.dests) | set(route.marks)
        if east and e >= 0:
            for x in sorted(c for c in cols if c <= e):
                self._column(v, route, x, row, start + self.hop, s)
            cols = {c for c in cols if c > e}
            lane = [((c, row, "E"), c + 1) for c in range(e, max(cols, default=e))]
            first = None
        elif e >= 0:  # streaming: west to column 0, then east
            lane = [((c, row, "W"), c - 1 if c == 1 else None) for c in range(e, 0, -1)]
            lane += [((c, row, "E"), c + 1) for c in range(0, max(cols, default=0))]
            first = 0 if e == 0 else None
        else:  # from the host, west of column 0
            lane = [((c, row, "E"), c + 1) for c in range(-1, max(cols, default=-1))]
            first = None
        def ramp(g: int) -> None:
            if first is not None and first in cols:
                self._column(v, route, first, row, g, s)
            if cols:
                self._hop(v, route, cols, lane, 0, g, s, row)

        self.fabric.request((e, row, "R"), start, s, v.color, ramp)

    def _hop(
        self,
        v: Sent,
        route: _Route,
        cols: set[int],
        lane: list[tuple[Link, int | None]],
        i: int,
        t: int,
        s: int,
        row: int,
    ) -> None:
        if i == len(lane):
            return
        link, col = lane[i]

        def granted(g: int) -> None:
            head = g + self.hop
            if col is not None and col in cols:
                self._column(v, route, col, row, head, s)
            self._hop(v, route, cols, lane, i + 1, head, s, row)

        self.fabric.request(link, t, s, v.color, granted)

    def _column(self, v: Sent, route: _Route, x: int, row: int, head: int, s: int) -> None:
        """The head is at ``(x, row)`` at ``head``: deliver here, and fork up and down the column."""
        for dy, then in route.marks.get(x, ()):
            t = head + s + dy * self.hop
            self.ev.at(t, then, t)
        ys = route.dests.get(x)
        if not ys:
            return
        for then in ys.get(row, ()):
            self.ev.at(head + s, then, head + s)
        for step in (1, -1):
            far = max(((y - row) * step for y in ys), default=0)
            if far > 0:
                self._vertical(v, ys, x, row, step, far, head, s)

    def _vertical(
        self, v: Sent, ys: dict[int, list[Arrival]], x: int, y: int, step: int, left: int, t: int, s: int
    ) -> None:
        def granted(g: int) -> None:
            head = g + self.hop
            for then in ys.get(y + step, ()):
                self.ev.at(head + s, then, head + s)
            if left > 1:
                self._vertical(v, ys, x, y + step, step, left - 1, head, s)

        self.fabric.request((x, y, "S" if step > 0 else "N"), t, s, v.color, granted)
