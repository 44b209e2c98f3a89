"""The text form of a ``DataflowProgram``: ``print_program`` writes it, ``parse_program`` reads it back.

The printer lives in ``runtime/textprint.py`` (below ``DataflowProgram``, whose ``str()`` it is) and is
re-exported here; the parser builds the public ``DataflowProgram`` (``runtime/dataflow.py``).

One line per item, in this order (MLIR-like: ``%name`` is a value, ``dtype[shape]`` a type, ``{...}``
JSON data with sorted keys)::

    sparsefx.program 3                        the format and its version
    mesh 4x4 mode=pipelined placement=block
    hardware name="wse2" sram_bytes=49152 ... every HardwareSpec field, as JSON
    meta {...}
    input %x : float32[8, 16]                 one line per host input
    output %fc2                               one line per program output
    output_tree {"index": 0, "type": "tensor"}
    %fc1 = sparse_matmul(%x) @[0,0 2x2] : float32[8, 32] nnz=256 routes=[x.fc1, fc1.relu] colors=[0, 1]
        attrs={...} arrays={values: fc1.values, ...} tasks=[recv(color=0, trigger=data)] stats={...}
        source="fc1"                          (one line per kernel, in program order)
    route x.fc1 color=0 value=%x host -> [%fc1] kind=value lanes=2 runs[0:2] step=-1
    array fc1.values : float32[256] bytes=1024  one line per per-PE data array
    end kernels=3 routes=4 arrays=5 bytes=2048  counts and total bytes: a cut-off text is an error

A kernel's ``nnz`` is its ``stats["nnz"]``; its ``routes`` (the routes that start or end at it) and
``colors`` (theirs) are derived, and the parser checks them against the route lines, as it checks
each array's bytes and the ``end`` line. ``attrs``, ``arrays``, ``tasks``, ``stats`` and ``source``
are left out when empty. Names that are not words (letters, digits, ``_``, ``.``) are JSON strings.
Blank lines and lines starting with ``//`` are skipped. Parsing gives the program without payloads
(``arrays`` empty, ``specs`` kept); every other field, and the text, round-trips (attrs, stats, meta
and output_tree must be plain JSON data: lists, not tuples)::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import Kernel, Region, Route, Stream
    >>> p = DataflowProgram(MeshSpec(2, 1), HardwareSpec(), "pipelined", "block",
    ...                     inputs=[Stream("x", (2, 4), "float32")], outputs=["relu"])
    >>> p.kernels.append(Kernel("relu", "elementwise", Region(0, 0, 2, 1), ("x",), (2, 4), "float32",
    ...                         attrs={"fn": "relu"}))
    >>> p.routes.append(Route("x.relu", 0, "x", "host", ("relu",)))
    >>> text = print_program(p)
    >>> print(text.split("\\n")[7])
    %relu = elementwise(%x) @[0,0 2x1] : float32[2, 4] routes=[x.relu] colors=[0] attrs={"fn": "relu"}
    >>> q = parse_program(text)
    >>> q.kernels == p.kernels and q.routes == p.routes and print_program(q) == text
    True
    >>> parse_program(text.replace("colors=[0]", "colors=[1]"))
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: line 8, column 52: expected routes=[x.relu] colors=[0] (as the ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparsefx.errors import LoweringError, ProgramFormatError

from .dataflow import DataflowProgram
from .mesh import HardwareSpec, MeshSpec
from .program import ArraySpec, Kernel, Region, Route, Stream, Task
from .textprint import (
    FORMAT,
    READS,
    VERSION,
    names_text,
    print_program,
    routes_by_kernel,
    size_text,
    type_text,
)
from .textscan import Cursor

__all__ = ["print_program", "parse_program", "FORMAT", "VERSION"]

_ORDER = tuple(
    ["header", "mesh", "hardware", "meta", "input", "output", "output_tree", "%", "route", "array", "end"]
)
_REPEATED = frozenset({"input", "output", "%", "route", "array"})
_SHOWN = {k: f"an {k!r} line" if k[0] in "aeiou" else f"a {k!r} line" for k in _ORDER} | {
    "header": f"the header '{FORMAT} {VERSION}'",
    "%": "a kernel line (%name = op(...) ...)",
}
_KERNEL_FIELDS = "end of line (kernel fields: nnz, routes, colors, attrs, arrays, tasks, stats, source)"


# -- parsing -----------------------------------------------------------------------------------------
def parse_program(text: str) -> DataflowProgram:
    """The program ``print_program`` wrote, without payloads; ``ProgramFormatError`` on any flaw.

    >>> parse_program("sparsefx.program 4")
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: line 1, column 18: expected version 1, 2 or 3 (this sparsefx reads ...
    """
    if not isinstance(text, str):
        raise ProgramFormatError(f"a program text is a str, not {type(text).__name__}")
    return _Parser().parse(text)


class _Parser:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {"inputs": [], "outputs": [], "kernels": [], "routes": [], "specs": {}}
        self.version = VERSION
        self.claims: list[tuple[Cursor, int, str, list[str], list[int]]] = []  # kernels' routes, colors

    def parse(self, text: str) -> DataflowProgram:
        state, lineno = -1, 0
        for lineno, line in enumerate(text.split("\n"), 1):
            if not line.strip(" ") or line.lstrip(" ").startswith("//"):
                continue
            c = Cursor(line, lineno)
            kind = "%" if c.at("%") else "header" if c.peek_word() == FORMAT else c.peek_word()
            at = _ORDER.index(kind) if kind in _ORDER else -1
            if at < state or (at == state and kind not in _REPEATED):
                raise c.error(_expected_after(state))
            missing = [k for k in _ORDER[state + 1 : at] if k not in _REPEATED]
            if missing:
                raise c.error(_SHOWN[missing[0]])
            state = at
            if kind != "%":
                c.keyword(FORMAT if kind == "header" else kind)
            getattr(self, "_" + ("kernel" if kind == "%" else kind))(c)
            c.end(_KERNEL_FIELDS if kind == "%" else None)
        if state != len(_ORDER) - 1:
            raise ProgramFormatError(
                f"line {lineno}: expected {_expected_after(state)}; the text ends (is it cut off?)"
            )
        return DataflowProgram(**self.fields)

    # -- one method per line kind -----------------------------------------------------------------
    def _header(self, c: Cursor) -> None:
        start = c.skip()
        version = c.int(f"version {VERSION}")
        if version not in READS:
            reads = ", ".join(str(v) for v in READS[:-1]) + f" or {READS[-1]}"
            raise c.error(f"version {reads} (this sparsefx reads versions {reads})", start)
        self.version = version

    def _mesh(self, c: Cursor) -> None:
        start = c.skip()
        try:
            self.fields["mesh"] = MeshSpec(*c.dims())
        except LoweringError as exc:
            raise c.error(f"a mesh of at least 1x1 PEs ({exc})", start) from None
        self.fields["mode"] = c.keyed("mode", c.name, "a mode")
        self.fields["placement"] = c.keyed("placement", c.name, "a placement")

    def _hardware(self, c: Cursor) -> None:
        start = c.skip()
        names = [f.name for f in dataclasses.fields(HardwareSpec)]
        if self.version < 2:  # version 1 had no vector starts: the field takes its default
            names.remove("vector_start_cycles")
        if self.version < 3:  # nor had versions 1 and 2 the SRAM bandwidth
            names.remove("sram_bytes_per_cycle")
        data = {name: c.keyed(name, c.json, f"the {name}") for name in names}
        if not isinstance(data["name"], str) or not isinstance(data["simd_widths"], dict):
            raise c.error("a hardware name string and a simd_widths object", start)
        try:
            self.fields["hardware"] = HardwareSpec.from_json(data)
        except (LoweringError, TypeError) as exc:
            raise c.error(f"valid hardware ({exc})", start) from None

    def _meta(self, c: Cursor) -> None:
        self.fields["meta"] = c.object("the meta object")

    def _input(self, c: Cursor) -> None:
        name = c.value()
        c.expect(":")
        dtype, shape = c.type()
        self.fields["inputs"].append(Stream(name, shape, dtype))

    def _output(self, c: Cursor) -> None:
        self.fields["outputs"].append(c.value())

    def _output_tree(self, c: Cursor) -> None:
        self.fields["output_tree"] = c.json("the output tree")

    def _kernel(self, c: Cursor) -> None:
        name = c.value()
        c.expect("=")
        op, inputs = c.name("an op kind"), tuple(c.items("(", ")", c.value))
        c.expect("@[")
        x = c.int("the region's x")
        c.expect(",")
        region = Region(x, c.int("the region's y"), *c.dims())
        c.expect("]")
        c.expect(":")
        dtype, shape = c.type()
        stats: dict[str, Any] = {"nnz": c.keyed("nnz", c.json, "the nnz")} if c.peek_word() == "nnz" else {}
        start = c.skip()
        routes = c.keyed("routes", c.items, "[", "]", c.name, "a route name")
        self.claims.append((c, start, name, routes, c.keyed("colors", c.items, "[", "]", c.int, "a color")))
        attrs = c.keyed("attrs", c.object, "the attrs object") if c.peek_word() == "attrs" else {}
        arrays: dict[str, str] = {}
        for role, array in (
            c.keyed("arrays", c.items, "{", "}", _pair, c) if c.peek_word() == "arrays" else ()
        ):
            if role in arrays:
                raise c.error(f"roles that appear once ({role!r} repeats)")
            arrays[role] = array
        tasks = tuple(c.keyed("tasks", c.items, "[", "]", _task, c)) if c.peek_word() == "tasks" else ()
        if c.peek_word() == "stats":
            start = c.skip()
            more = c.keyed("stats", c.object, "the stats object")
            if "nnz" in more:
                raise c.error("stats without 'nnz' (it is written nnz=..., before routes)", start)
            stats.update(more)
        source = c.keyed("source", c.json, "the source string") if c.peek_word() == "source" else ""
        if not isinstance(source, str):
            raise c.error("the source as a quoted string", c.pos - 1)
        kernel = Kernel(name, op, region, inputs, shape, dtype, attrs, arrays, tasks, stats, source)
        self.fields["kernels"].append(kernel)

    def _route(self, c: Cursor) -> None:
        name, color = c.name("a route name"), c.keyed("color", c.int, "a color")
        value, src = c.keyed("value", c.value), c.endpoint()
        c.expect("->")
        dsts = tuple(c.items("[", "]", c.endpoint))
        kind, lanes = c.keyed("kind", c.name, "a route kind"), c.keyed("lanes", c.int, "a lane count")
        c.keyword("runs")
        c.expect("[")
        first = c.int("the first run")
        c.expect(":")
        count = c.int("the end of the runs") - first
        c.expect("]")
        step = c.keyed("step", c.int, "a step")
        self.fields["routes"].append(Route(name, color, value, src, dsts, kind, lanes, first, count, step))

    def _array(self, c: Cursor) -> None:
        start = c.skip()
        name = c.name("an array name")
        if name in self.fields["specs"]:
            raise c.error(f"an array named once ({name!r} is listed twice)", start)
        c.expect(":")
        spec = ArraySpec(*c.type())
        c.field("bytes")
        _checksize_text(c, size_text([spec]), f"the bytes of {type_text(spec.dtype, spec.shape)}")
        self.fields["specs"][name] = spec

    def _end(self, c: Cursor) -> None:
        f = self.fields
        for key, items in (("kernels", f["kernels"]), ("routes", f["routes"]), ("arrays", f["specs"])):
            start = c.skip()
            if c.keyed(key, c.int, f"the number of {key}") != len(items):
                raise c.error(f"{key}={len(items)}, as the lines above give", start)
        c.field("bytes")
        _checksize_text(c, size_text(f["specs"].values()), "the arrays' total bytes")
        by_kernel = routes_by_kernel(f["routes"])
        for kc, start, name, routes, colors in self.claims:
            real = by_kernel.get(name, [])
            want = ([r.name for r in real], sorted({r.color for r in real}))
            if (routes, colors) != want:
                raise kc.error(
                    f"routes=[{names_text(want[0])}] colors={want[1]} (as the route lines give)", start
                )


def _expected_after(state: int) -> str:
    if state < 0:
        return _SHOWN["header"]
    options = []
    for kind in _ORDER[state:]:
        if kind != _ORDER[state] or kind in _REPEATED:
            options.append(_SHOWN[kind])
            if kind not in _REPEATED:
                break
    return " or ".join(options) or "nothing after the 'end' line"


def _pair(c: Cursor) -> tuple[str, str]:
    role = c.name("an array role")
    c.expect(":")
    return role, c.name("an array name")


def _task(c: Cursor) -> Task:
    name = c.name("a task name")
    c.expect("(")
    color = c.keyed("color", c.int, "a color")
    c.expect(",")
    trigger = c.keyed("trigger", c.name, "a trigger")
    c.expect(")")
    return Task(name, color, trigger)


def _checksize_text(c: Cursor, size: str, what: str) -> None:
    start = c.skip()
    if ("?" if c.accept("?") else str(c.int(what))) != size:
        raise c.error(f"{what}: {size}", start)
