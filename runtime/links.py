"""The mesh's links as the reference executor books them: one wavelet per link, direction and cycle.

A link is ``(x, y, direction)``: the wire leaving PE ``(x, y)`` toward ``E``, ``W``, ``S`` or
``N``, or ``R``, the ramp a PE sends its messages out on (``x = -1`` is the host, west of column 0).
A message of ``w`` wavelets holds a link for ``w`` cycles. ``Links.book`` gives it the first ``w``
free cycles at or after the cycle it is ready, so colors that share a link take turns: a message
booked earlier keeps its cycles, and one booked later waits for a gap long enough or for the end of
the queue::

    >>> links = Links()
    >>> links.book((0, 0, "E"), 0, 4), links.book((0, 0, "E"), 2, 3), links.book((0, 0, "E"), 9, 1)
    (0, 4, 9)
    >>> links.book((0, 0, "E"), 7, 2)  # the gap [7, 9) fits it
    7
    >>> links.busiest(1)
    [((0, 0, 'E'), 10)]
"""

from __future__ import annotations

import bisect
from collections import Counter

__all__ = ["Link", "Links"]

Link = tuple[int, int, str]


class Links:
    """Busy intervals of every link booked so far, and the wavelets each carried."""

    def __init__(self) -> None:
        self._starts: dict[Link, list[int]] = {}
        self._ends: dict[Link, list[int]] = {}
        self.wavelets: Counter[Link] = Counter()

    def book(self, link: Link, ready: int, wavelets: int) -> int:
        """Hold ``link`` for ``wavelets`` cycles from the first free cycle at or after ``ready``."""
        self.wavelets[link] += wavelets
        if wavelets <= 0:
            return ready
        starts = self._starts.setdefault(link, [])
        ends = self._ends.setdefault(link, [])
        i = bisect.bisect_right(ends, ready)  # the first interval still busy after ``ready``
        t = ready
        while i < len(starts) and starts[i] < t + wavelets:
            t = max(t, ends[i])
            i += 1
        # [t, t + wavelets) lies between interval i - 1 and interval i; merge with touching neighbours
        end = t + wavelets
        if i < len(starts) and starts[i] == end:
            end = ends[i]
            del starts[i], ends[i]
        if i > 0 and ends[i - 1] == t:
            ends[i - 1] = end
        else:
            starts.insert(i, t)
            ends.insert(i, end)
        return t

    def busiest(self, n: int) -> list[tuple[Link, int]]:
        """The ``n`` links that carried the most wavelets, with their counts."""
        return self.wavelets.most_common(n)
