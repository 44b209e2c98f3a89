"""Printing a program's text form (the format is described in ``runtime/text.py``, which also parses it).

Only the printer: it sits below ``DataflowProgram`` (``runtime/dataflow.py``), whose ``str()`` it is, and
works on any ``ProgramData``. The helpers the parser checks a text against are here too, so that both
sides compute sizes and route lists the same way::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import ArraySpec, ProgramData
    >>> print_program(ProgramData(MeshSpec(2, 1), HardwareSpec(), "pipelined", "block")).split("\\n")[1]
    'mesh 2x1 mode=pipelined placement=block'
    >>> type_text("float32", (2, 4)), size_text([ArraySpec("int16", (3,))])
    ('float32[2, 4]', '6')
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .mesh import HardwareSpec
from .program import DTYPES, Kernel, ProgramData, Route
from .textscan import dumps, name_text

__all__ = [
    "print_program",
    "FORMAT",
    "VERSION",
    "READS",
    "type_text",
    "names_text",
    "size_text",
    "routes_by_kernel",
]

FORMAT = "sparsefx.program"
VERSION = 3
"""The header line is ``f"{FORMAT} {VERSION}"`` (2: the hardware line has ``vector_start_cycles``; 3:
it has ``sram_bytes_per_cycle``, and the output tree may have ``cat`` nodes). Texts of ``READS`` parse
(a hardware field an older text lacks takes its default); others are refused."""

READS = (1, 2, 3)


def _value(name: str) -> str:
    return "%" + name_text(name)


def _endpoint(name: str) -> str:
    return "host" if name == "host" else _value(name)


def type_text(dtype: str, shape: tuple[int, ...]) -> str:
    """``dtype[d0, d1, ...]``, as input and array lines write a type."""
    return f"{name_text(dtype)}[{', '.join(str(d) for d in shape)}]"


def names_text(names: Any) -> str:
    """Names separated by ``", "``, each bare or quoted (``name_text``)."""
    return ", ".join(name_text(n) for n in names)


def size_text(specs: Any) -> str:
    """The bytes of the arrays ``specs``, or ``?`` if one has a dtype that is not in ``DTYPES``."""
    specs = list(specs)
    return "?" if any(s.dtype not in DTYPES for s in specs) else str(sum(s.nbytes for s in specs))


def routes_by_kernel(routes: list[Route]) -> dict[str, list[Route]]:
    """Each name -> the routes that start or end at it, in program order (``routes_of``)."""
    out: dict[str, list[Route]] = {}
    for r in routes:
        for name in dict.fromkeys((r.src, *r.dsts)):
            out.setdefault(name, []).append(r)
    return out


def _kernel_line(k: Kernel, routes: list[Route]) -> str:
    stats = dict(k.stats)
    reg = k.region
    parts = [
        f"{_value(k.name)} = {name_text(k.op)}({', '.join(map(_value, k.inputs))})",
        f"@[{reg.x},{reg.y} {reg.width}x{reg.height}] : {type_text(k.dtype, k.shape)}",
    ]
    if "nnz" in stats:
        parts.append(f"nnz={dumps(stats.pop('nnz'))}")
    parts.append(f"routes=[{names_text(r.name for r in routes)}]")
    parts.append(f"colors=[{', '.join(str(c) for c in sorted({r.color for r in routes}))}]")
    if k.attrs:
        parts.append(f"attrs={dumps(k.attrs)}")
    if k.arrays:
        roles = (f"{name_text(role)}: {name_text(array)}" for role, array in sorted(k.arrays.items()))
        parts.append(f"arrays={{{', '.join(roles)}}}")
    if k.tasks:
        tasks = (f"{name_text(t.name)}(color={t.color}, trigger={name_text(t.trigger)})" for t in k.tasks)
        parts.append(f"tasks=[{', '.join(tasks)}]")
    if stats:
        parts.append(f"stats={dumps(stats)}")
    if k.source:
        parts.append(f"source={json.dumps(k.source)}")
    return " ".join(parts)


def print_program(p: ProgramData) -> str:
    """The text form of ``p`` (see the module docstring); no trailing newline."""
    hw = " ".join(f"{f.name}={dumps(getattr(p.hardware, f.name))}" for f in dataclasses.fields(HardwareSpec))
    lines = [
        f"{FORMAT} {VERSION}",
        f"mesh {p.mesh.width}x{p.mesh.height} mode={name_text(p.mode)} placement={name_text(p.placement)}",
        f"hardware {hw}",
        f"meta {dumps(p.meta)}",
    ]
    lines += [f"input {_value(s.name)} : {type_text(s.dtype, s.shape)}" for s in p.inputs]
    lines += [f"output {_value(name)}" for name in p.outputs]
    lines.append(f"output_tree {dumps(p.output_tree)}")
    by_kernel = routes_by_kernel(p.routes)
    lines += [_kernel_line(k, by_kernel.get(k.name, [])) for k in p.kernels]
    for r in p.routes:
        ends = f"{_endpoint(r.src)} -> [{', '.join(map(_endpoint, r.dsts))}]"
        lines.append(
            f"route {name_text(r.name)} color={r.color} value={_value(r.value)} {ends}"
            f" kind={name_text(r.kind)} lanes={r.lanes} runs[{r.first}:{r.first + r.count}] step={r.step}"
        )
    for name, spec in p.specs.items():
        array_type = type_text(spec.dtype, spec.shape)
        lines.append(f"array {name_text(name)} : {array_type} bytes={size_text([spec])}")
    counts = f"kernels={len(p.kernels)} routes={len(p.routes)} arrays={len(p.specs)}"
    lines.append(f"end {counts} bytes={size_text(p.specs.values())}")
    return "\n".join(lines)
