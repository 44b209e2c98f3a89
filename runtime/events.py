"""The reference machine's clock: one queue of events in time order, links that arbitrate, PEs that queue.

``Events`` holds every event of a whole program in one heap, ordered by cycle. Within a cycle, what
*happens* (a message's head reaches a router, a task finishes) comes before what is *decided* (which
waiting message a link serves, which waiting task a PE starts), so a decision sees everything that
arrived in its cycle.

``Fabric`` is the mesh's links (``Link``: ``(x, y, direction)``, ``R`` a PE's ramp onto the fabric,
``x = -1`` the host west of column 0). A link carries one wavelet per cycle in each direction. A
message holds a link for its wavelets back to back (wormhole); routers buffer what waits, so a
message blocked at one link never holds the links behind it. **Arbitration:** when a link frees, it
serves the waiting messages whose heads have arrived, round-robin by color: the first color after
the one it served last (colors are small integers), and within a color the message that arrived
first. Program order never decides::

    >>> ev = Events()
    >>> fabric = Fabric(ev)
    >>> got = []
    >>> fabric.request((0, 0, "E"), 0, 4, color=1, then=lambda t: got.append(("a", t)))
    >>> fabric.request((0, 0, "E"), 2, 3, color=1, then=lambda t: got.append(("b", t)))
    >>> fabric.request((0, 0, "E"), 1, 2, color=2, then=lambda t: got.append(("c", t)))
    >>> ev.run()
    >>> got  # "c" came before "b" and is the next color after 1
    [('a', 0), ('c', 4), ('b', 6)]

``Cores`` runs each PE's tasks one at a time: when the PE is free it starts the waiting task that
arrived first (ties: the lower ``order``).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable

__all__ = ["Events", "Fabric", "Cores", "Link"]

Link = tuple[int, int, str]
HAPPEN, DECIDE = 0, 1


class Events:
    """One heap of ``(cycle, phase, sequence)``-ordered events for the whole program."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Callable, tuple]] = []
        self._seq = 0
        self.now = 0
        self.count = 0

    def at(self, t: int, fn: Callable, *args: object, phase: int = HAPPEN) -> None:
        """Call ``fn(*args)`` at cycle ``t`` (never before the current cycle)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), phase, self._seq, fn, args))

    def run(self) -> None:
        """Play every event in order, including those the events add."""
        heap = self._heap
        while heap:
            t, _, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.count += 1
            fn(*args)


class Fabric:
    """The links (module docstring): requests, round-robin arbitration by color, wavelets carried."""

    def __init__(self, events: Events) -> None:
        self.ev = events
        self.free: dict[Link, int] = {}
        # per link, per color: a heap of (ready, sequence, wavelets, then)
        self.waiting: dict[Link, dict[int, list[tuple[int, int, int, Callable[[int], None]]]]] = {}
        self.served: dict[Link, int] = {}
        self.wavelets: Counter[Link] = Counter()
        self._seq = 0

    def request(self, link: Link, ready: int, wavelets: int, color: int, then: Callable[[int], None]) -> None:
        """A message of ``wavelets`` whose head reaches ``link`` at ``ready`` asks for it; ``then(start)``
        is called when the link starts carrying it (at ``ready``, for a message of no wavelets)."""
        if wavelets <= 0:
            self.ev.at(ready, then, ready)
            return
        self.wavelets[link] += wavelets
        self._seq += 1
        colors = self.waiting.setdefault(link, {})
        heapq.heappush(colors.setdefault(color, []), (ready, self._seq, wavelets, then))
        self.ev.at(max(ready, self.free.get(link, 0)), self._serve, link, phase=DECIDE)

    def _serve(self, link: Link) -> None:
        now = self.ev.now
        colors = self.waiting.get(link)
        if not colors or self.free.get(link, 0) > now:
            return
        here = sorted(c for c, q in colors.items() if q[0][0] <= now)
        if not here:
            return
        last = self.served.get(link, -1)
        color = next((c for c in here if c > last), here[0])  # round-robin: the next color after the last
        queue = colors[color]
        _, _, wavelets, then = heapq.heappop(queue)
        if not queue:
            del colors[color]
        self.served[link] = color
        self.free[link] = now + wavelets
        if colors:
            first = min(q[0][0] for q in colors.values())
            self.ev.at(max(now + wavelets, first), self._serve, link, phase=DECIDE)
        then(now)

    def busiest(self, n: int) -> list[tuple[Link, int]]:
        """The ``n`` links that carried the most wavelets, with their counts."""
        return self.wavelets.most_common(n)


class Cores:
    """Each PE's tasks, one at a time, first arrived first run."""

    def __init__(self, events: Events) -> None:
        self.ev = events
        self.free: dict[object, int] = {}
        self.waiting: dict[object, list[tuple[int, int, int, int, Callable[[int], None]]]] = {}
        self._seq = 0

    def submit(self, pe: object, arrival: int, order: int, cost: int, then: Callable[[int], None]) -> None:
        """A task of ``cost`` cycles for ``pe``, ready at ``arrival``; ``then(finish)`` when it is done."""
        self._seq += 1
        heapq.heappush(self.waiting.setdefault(pe, []), (arrival, order, self._seq, cost, then))
        self.ev.at(max(arrival, self.free.get(pe, 0)), self._start, pe, phase=DECIDE)

    def _start(self, pe: object) -> None:
        now = self.ev.now
        queue = self.waiting.get(pe)
        if not queue or self.free.get(pe, 0) > now or queue[0][0] > now:
            return
        _, _, _, cost, then = heapq.heappop(queue)
        finish = now + cost
        self.free[pe] = finish
        self.ev.at(finish, then, finish)
        if queue:
            self.ev.at(max(finish, queue[0][0]), self._start, pe, phase=DECIDE)
