"""The scanner under the program text form (``runtime/text.py``): one ``Cursor`` per line.

A cursor reads a line left to right, skipping spaces between items, and raises ``ProgramFormatError``
naming the line, the column, the text it found and what it expected. Names are bare words
(``fc1.values``) or JSON strings (``"a name"``); ``name_text`` writes a name the way ``name`` reads it.
Embedded data is JSON, read with the standard decoder (no ``eval``, no backtracking regex)::

    >>> c = Cursor('%fc1 = sparse_matmul(%"my x") attrs={"lanes": 2}', 3)
    >>> c.value(), c.expect("="), c.name(), c.expect("("), c.value(), c.expect(")")
    ('fc1', None, 'sparse_matmul', None, 'my x', None)
    >>> c.field("attrs"), c.json(), c.end()
    (None, {'lanes': 2}, None)
    >>> Cursor("4y4", 1).dims()
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: line 1, column 2: expected 'x'; found 'y4' in '4y4'
    >>> name_text("fc1.values"), name_text("a b"), dumps({"b": [1.5], "a": None})
    ('fc1.values', '"a b"', '{"a": null, "b": [1.5]}')
"""

from __future__ import annotations

import json
from typing import Any

from sparsefx.errors import ProgramFormatError

from .strict_json import unique_keys

__all__ = ["Cursor", "name_text", "dumps", "is_word"]

_WORD_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_WORD = _WORD_START | frozenset("0123456789.")
_DIGITS = frozenset("0123456789")
_MAX_DIGITS = 64  # longer integers are malformed (and would hit int()'s digit limit)


def is_word(text: str) -> bool:
    """Whether ``text`` prints bare: a letter or ``_``, then letters, digits, ``_`` and ``.``."""
    return bool(text) and text[0] in _WORD_START and all(ch in _WORD for ch in text)


def name_text(name: str) -> str:
    """``name`` bare when it is a word, else as a JSON string."""
    return name if is_word(name) else json.dumps(name)


def dumps(value: Any) -> str:
    """Canonical one-line JSON: sorted keys, ``", "`` and ``": "`` separators, ASCII, exact floats."""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


_DECODER = json.JSONDecoder(
    object_pairs_hook=unique_keys(lambda key: ValueError(f"the key {key!r} appears twice"))
)


class Cursor:
    """Reads one line of program text; every method skips the spaces before what it reads."""

    def __init__(self, line: str, lineno: int) -> None:
        self.line, self.lineno, self.pos = line, lineno, 0

    # -- errors ---------------------------------------------------------------------------------------
    def error(self, expected: str, pos: int | None = None) -> ProgramFormatError:
        """A ``ProgramFormatError`` at ``pos`` (default: the next item) saying what was expected."""
        pos = self.skip() if pos is None else pos
        rest = self.line[pos : pos + 30] if pos < len(self.line) else "end of line"
        lo = 0 if len(self.line) <= 160 else min(max(pos - 60, 0), len(self.line) - 150)
        shown = (
            ("..." if lo else "") + self.line[lo : lo + 150] + ("..." if lo + 150 < len(self.line) else "")
        )
        return ProgramFormatError(
            f"line {self.lineno}, column {pos + 1}: expected {expected}; found {rest!r} in {shown!r}"
        )

    # -- primitives -----------------------------------------------------------------------------------
    def skip(self) -> int:
        """Move past spaces; return the new position."""
        while self.pos < len(self.line) and self.line[self.pos] == " ":
            self.pos += 1
        return self.pos

    def at(self, literal: str) -> bool:
        """Whether the next item starts with ``literal`` (nothing is consumed)."""
        return self.line.startswith(literal, self.skip())

    def accept(self, literal: str) -> bool:
        """Consume ``literal`` if it comes next."""
        if self.at(literal):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str, what: str | None = None) -> None:
        """Consume ``literal`` or raise."""
        if not self.accept(literal):
            raise self.error(what or repr(literal))

    def end(self, what: str | None = None) -> None:
        """Raise unless only spaces are left."""
        if self.skip() < len(self.line):
            raise self.error(what or "end of line")

    def peek_word(self) -> str | None:
        """The bare word that comes next, if any (nothing is consumed)."""
        start = self.skip()
        end = start
        while end < len(self.line) and self.line[end] in (_WORD if end > start else _WORD_START):
            end += 1
        return self.line[start:end] or None

    # -- items ----------------------------------------------------------------------------------------
    def word(self, what: str = "a word") -> str:
        """A bare word."""
        found = self.peek_word()
        if found is None:
            raise self.error(what)
        self.pos += len(found)
        return found

    def keyword(self, word: str) -> None:
        """The bare word ``word`` (not just a word starting with it)."""
        if self.peek_word() != word:
            raise self.error(repr(word))
        self.pos += len(word)

    def field(self, key: str) -> None:
        """``key=``."""
        self.keyword(key)
        self.expect("=", f"'=' after {key}")

    def name(self, what: str = "a name (a word or a quoted string)") -> str:
        """A bare word or a JSON string."""
        if self.at('"'):
            value = self.json(what)
            if not isinstance(value, str):  # pragma: no cover - a leading quote decodes to a string
                raise self.error(what)
            return value
        return self.word(what)

    def value(self) -> str:
        """``%name``: a value (a program input or a kernel's result)."""
        self.expect("%", "'%' and a value name")
        if self.pos < len(self.line) and self.line[self.pos] == " ":
            raise self.error("a value name right after '%'")
        return self.name("a value name")

    def endpoint(self) -> str:
        """A route's end: ``host`` or a ``%value``."""
        if self.at("%"):
            start = self.skip()
            if (name := self.value()) == "host":
                raise self.error("the host written as host, not %host", start)
            return name
        if self.peek_word() != "host":
            raise self.error("'host' or a %value")
        self.pos += 4
        return "host"

    def int(self, what: str = "an integer") -> int:
        """A decimal integer, optionally negative."""
        start = self.skip()
        end = start + (self.line.startswith("-", start))
        digits = end
        while end < len(self.line) and self.line[end] in _DIGITS:
            end += 1
        if end == digits or end - digits > _MAX_DIGITS:
            raise self.error(what, start)
        self.pos = end
        return int(self.line[start:end])

    def dims(self) -> tuple[int, int]:
        """``WxH``."""
        width = self.int("a width")
        self.expect("x")
        return width, self.int("a height")

    def json(self, what: str = "a JSON value") -> Any:
        """One JSON value (objects may not repeat a key)."""
        start = self.skip()
        try:
            value, self.pos = _DECODER.raw_decode(self.line, start)
        except (ValueError, RecursionError) as exc:
            raise self.error(f"{what} ({str(exc).split(':')[0]})", start) from None
        return value

    def object(self, what: str) -> dict[str, Any]:
        """A JSON object."""
        start = self.skip()
        value = self.json(what)
        if not isinstance(value, dict):
            raise self.error(f"{what} ({{...}})", start)
        return value

    def keyed(self, key: str, read: Any, *args: Any) -> Any:
        """``key=`` then what ``read(*args)`` reads."""
        self.field(key)
        return read(*args)

    def type(self) -> tuple[str, tuple[int, ...]]:
        """``dtype[d0, d1, ...]``: a dtype name and a shape."""
        return self.name("a dtype"), tuple(self.items("[", "]", self.dim))

    def dim(self) -> int:
        """A dimension: an integer >= 0."""
        start = self.skip()
        if self.at("-"):
            raise self.error("a dimension (an integer >= 0)", start)
        return self.int("a dimension")

    def items(self, open_: str, close: str, read: Any, *args: Any) -> list[Any]:
        """``open_ item, item ... close``, each item read by ``read(*args)``."""
        self.expect(open_)
        out: list[Any] = []
        if self.accept(close):
            return out
        while True:
            out.append(read(*args))
            if self.accept(close):
                return out
            self.expect(",", f"',' or {close!r}")
