"""IdentityMap: a dict keyed by object identity whose entries go when their key is collected.

Hot paths look up per-tensor state (a mask's bit pattern, a bound weight's cleanliness) on every
forward and backward; this costs one dict lookup and one weakref call, a few times cheaper than
``torch.utils.weak.WeakIdKeyDictionary``, which builds a reference object per lookup::

    >>> t = torch.zeros(2)
    >>> m = IdentityMap()
    >>> m[t] = "state"
    >>> m.get(t), m.get(torch.zeros(2))
    ('state', None)
    >>> del t
    >>> len(m)
    0
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["IdentityMap"]

V = TypeVar("V")


class IdentityMap(Generic[V]):
    """Map objects (by identity, not equality) to values; an entry goes when its key is collected.

    ``on_empty`` is called whenever the last entry goes (popped or collected)::

        >>> m = IdentityMap(on_empty=lambda: print("empty"))
        >>> t = torch.zeros(1)
        >>> m[t] = 1
        >>> del t
        empty
    """

    def __init__(self, on_empty: Callable[[], None] | None = None) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], V]] = {}
        self._on_empty = on_empty

    def get(self, key: object, default: V | None = None) -> V | None:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
        return default

    def __contains__(self, key: object) -> bool:
        entry = self._entries.get(id(key))
        return entry is not None and entry[0]() is key

    def __getitem__(self, key: object) -> V:
        entry = self._entries.get(id(key))
        if entry is None or entry[0]() is not key:
            raise KeyError(key)
        return entry[1]

    def __setitem__(self, key: object, value: V) -> None:
        slot = id(key)
        entries, on_empty = self._entries, self._on_empty

        def drop(ref: weakref.ref[Any]) -> None:
            current = entries.get(slot)
            if current is not None and current[0] is ref:
                del entries[slot]
                if not entries and on_empty is not None:
                    on_empty()

        self._entries[slot] = (weakref.ref(key, drop), value)

    def pop(self, key: object, default: V | None = None) -> V | None:
        entry = self._entries.get(id(key))
        if entry is None or entry[0]() is not key:
            return default
        del self._entries[id(key)]
        if not self._entries and self._on_empty is not None:
            self._on_empty()
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)
