"""What a program holds, as plain data and as tables: kernels, regions, nnz, SRAM, imbalance, colors, traffic.

``summary(program)`` gives one dict per kernel and the program's totals; ``kernel_table`` and
``totals_table`` render them with rich for ``sparsefx inspect model.sfxp`` and ``sparsefx lower``::

    >>> import sparsefx
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5, torch.ones(2, 8))
    >>> s = summary(sparsefx.lower(sm, torch.ones(2, 8), mesh=(4, 4)))
    >>> s["totals"]["nnz"], s["totals"]["kernels"], s["kernels"][0]["op"]
    (16, 1, 'sparse_matmul')
"""

from __future__ import annotations

import math
from typing import Any

from .held import held_peak
from .layout import sparse_bytes, weight_bytes
from .memory import SRAM_LABEL, itemsize, sram_needed
from .program import Kernel, ProgramData

__all__ = ["summary", "kernel_table", "totals_table", "mapping"]


def _route_wavelets(program: ProgramData) -> dict[str, int]:
    """Wavelets each value route carries once per call: the value's elements (32-bit wavelets)."""
    out = {}
    for r in program.routes:
        if r.kind != "value":
            continue
        v = program.value(r.value)
        words = math.ceil(math.prod(v.shape) * itemsize(v.dtype) / program.hardware.wavelet_bytes)
        out[r.name] = words
    return out


def summary(program: ProgramData) -> dict[str, Any]:
    """Per-kernel rows and program totals (plain data; JSON-able)."""
    colors: dict[str, set[int]] = {}
    for r in program.routes:
        for name in {r.src, *r.dsts} - {"host"}:
            colors.setdefault(name, set()).add(r.color)
    traffic = _route_wavelets(program)
    rows = []
    for k in program.kernels:
        rows.append(
            {
                "name": k.name,
                "op": k.op,
                "fn": k.attrs.get("fn", k.attrs.get("kind", "")),
                "region": [k.region.x, k.region.y, k.region.width, k.region.height],
                "pes": k.region.pes,
                "shape": list(k.shape),
                "nnz": k.stats.get("nnz"),
                "dense": k.stats.get("dense"),
                "imbalance": k.stats.get("imbalance"),
                "sram_max": sram_needed(program, k) if program.has_payloads else k.stats.get("sram_max"),
                "colors": sorted(colors.get(k.name, ())),
                "mapping": mapping(k),
            }
        )
    sparse = [r for r in rows if r["nnz"] is not None]
    nnz, dense = sum(r["nnz"] for r in sparse), sum(r["dense"] for r in sparse)
    used = {(k.region.x, k.region.width) for k in program.kernels}
    stored, stored_nnz = sparse_bytes(program)
    totals = {
        "mesh": str(program.mesh),
        "mode": program.mode,
        "placement": program.placement,
        "kernels": len(rows),
        "sparse_kernels": len(sparse),
        "nnz": nnz,
        "dense": dense,
        "density": nnz / dense if dense else None,
        "max_imbalance": max((r["imbalance"] for r in sparse), default=None),
        "sram_max": max((r["sram_max"] or 0 for r in rows), default=0),
        "sram_bytes": program.hardware.sram_bytes,
        "colors": program.colors_used,
        "color_limit": program.hardware.colors,
        "routes": len(program.routes),
        "value_wavelets": sum(traffic.values()),
        "weight_stream_bytes": _weight_stream_bytes(program) if program.mode == "streaming" else 0,
        "bytes_per_nonzero": stored / stored_nnz if stored_nnz else None,
        "kept": _kept(program),
        "columns_used": sum(w for _, w in used) if program.mode == "pipelined" else program.mesh.width,
    }
    return {"kernels": rows, "totals": totals}


def _kept(program: ProgramData) -> dict[str, Any] | None:
    """Streaming: the busiest PE counting the values kept between steps (``runtime/held.py``)."""
    peak = held_peak(program)
    if peak is None:
        return None
    return {"step": peak.step, "pe": [peak.x, peak.y], "bytes": peak.total, "kept_bytes": peak.held}


def _weight_stream_bytes(program: ProgramData) -> int:
    """Streaming mode: the bytes every sparse matmul streams in from off-mesh memory per call
    (``layout.weight_bytes``: values, indices, per-PE ranges and counts, bias)."""
    return sum(weight_bytes(program, k) for k in program.kernels if k.op == "sparse_matmul")


def mapping(k: Kernel) -> str:
    """The lowering's choices for a kernel, in short: rows a block, row tiles, the balanced placement's
    drift, packed indices, an epilogue.

        >>> from sparsefx.runtime.program import Region
        >>> mapping(Kernel("s", "matmul", Region(0, 0, 64, 64), ("q", "k"), (1536, 128), "float32",
        ...     attrs={"rows_in_flight": 1536, "row_tiles": 32}))
        '1536 rows a block, 32 row tiles'
    """
    a, parts = k.attrs, []
    if "rows_in_flight" in a:
        parts.append(f"{a['rows_in_flight']} rows a block")
    if "result_rows" in a:
        parts.append(f"result in {a['result_rows']}-row blocks")
    if int(a.get("row_tiles", 1)) > 1:
        parts.append(f"{a['row_tiles']} row tiles")
    if a.get("drift") is not None:
        parts.append(f"drift {a['drift']}")
    if "pe_nnz" in k.arrays:
        parts.append("packed indices")
    if isinstance(a.get("epilogue"), dict):
        parts.append(f"{a['epilogue'].get('fn')} epilogue")
    return ", ".join(parts)


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def kernel_table(program: ProgramData, limit: int | None = None) -> Any:
    """A rich table with one row per kernel (the first ``limit`` and a count of the rest)."""
    from rich.table import Table

    s = summary(program)
    table = Table(
        title=f"{len(s['kernels'])} kernels on a {program.mesh} mesh ({program.mode}, {program.placement})"
    )
    for col in ("kernel", "op", "region", "nnz", "imbalance", "SRAM needed", "colors", "mapping"):
        table.add_column(col, justify="right" if col in ("nnz", "imbalance", "SRAM needed") else "left")
    rows = s["kernels"] if limit is None else s["kernels"][:limit]
    for r in rows:
        x, y, w, h = r["region"]
        table.add_row(
            r["name"],
            f"{r['op']} {r['fn']}".strip(),
            f"{x},{y} {w}x{h}",
            _fmt(r["nnz"], ","),
            _fmt(r["imbalance"], ".3f"),
            _fmt(r["sram_max"], ","),
            ",".join(map(str, r["colors"])),
            r["mapping"],
        )
    if limit is not None and len(s["kernels"]) > limit:
        table.caption = f"... and {len(s['kernels']) - limit} more kernels"
    return table


def totals_table(program: ProgramData) -> Any:
    """A rich table of the program's totals."""
    from rich.table import Table

    t = summary(program)["totals"]
    table = Table(title="Program totals")
    table.add_column("what")
    table.add_column("value", justify="right")
    density = "-" if t["density"] is None else f"{t['density']:.1%}"
    rows = [
        ("mesh, mode, placement", f"{t['mesh']}, {t['mode']}, {t['placement']}"),
        ("kernels (sparse matmuls)", f"{t['kernels']} ({t['sparse_kernels']})"),
        ("nonzeros stored / dense", f"{t['nnz']:,} / {t['dense']:,} ({density})"),
        ("worst load imbalance (max/mean nnz per PE)", _fmt(t["max_imbalance"], ".3f")),
        (SRAM_LABEL, f"{t['sram_max']:,} of {t['sram_bytes']:,} bytes"),
        ("colors used", f"{t['colors']} of {t['color_limit']}"),
        ("routes", str(t["routes"])),
        ("value traffic per call (32-bit wavelets)", f"{t['value_wavelets']:,}"),
        ("columns used", f"{t['columns_used']} of {program.mesh.width}"),
    ]
    if t["bytes_per_nonzero"] is not None:
        rows.append(("bytes per nonzero (values, indices, ranges)", f"{t['bytes_per_nonzero']:.2f}"))
    if program.mode == "streaming":
        rows.append(("weights streamed in per call", f"{t['weight_stream_bytes']:,} bytes"))
    if t["kept"] is not None:
        kept = t["kept"]
        over = " (over: lowering warned)" if kept["bytes"] > t["sram_bytes"] else ""
        rows.append((
            "SRAM of the busiest PE with the values kept between steps",
            f"{kept['bytes']:,} of {t['sram_bytes']:,} bytes, {kept['kept_bytes']:,} kept, PE "
            f"({kept['pe'][0]}, {kept['pe'][1]}) in step {kept['step']}{over}",
        ))  # fmt: skip
    for row in rows:
        table.add_row(*row)
    return table
