"""What a run measured, for people and for files: rich tables, a JSON report and a busy-cycles heatmap.

``tables(stats)`` gives the summary, the dense-baseline comparison, where the cycles (and the gap to
the ideal speedup) go, one row per kernel and the hottest links; ``report_data`` is ``stats.to_json()``
with the program's name, mesh and mode, strict JSON (a non-finite figure becomes ``null``);
``write_json`` and ``write_heatmap`` write files atomically. The Chrome trace is ``runtime/trace.py``::

    >>> import sparsefx
    >>> torch.manual_seed(0) and None
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), 0.9)
    >>> program = sparsefx.lower(sm, torch.randn(8, 64), mesh=(8, 8))
    >>> stats = sparsefx.run(program, torch.randn(8, 64)).stats
    >>> [t.title for t in tables(stats)]
    ['run summary', 'sparse against the dense baseline', 'where the cycles go', 'kernels', 'hottest links']
    >>> data = report_data(stats, program)
    >>> data["program"]["mesh"], data["cycles"] == stats.cycles
    ('8x8', True)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from sparsefx.atomic import atomic_write
from sparsefx.errors import ProgramWriteError

from .memory import SRAM_LABEL
from .program import ProgramData
from .stats import PARTS, RunStats

__all__ = [
    "tables",
    "summary_table",
    "comparison_table",
    "parts_table",
    "kernel_table",
    "links_table",
    "report_data",
    "write_json",
    "write_heatmap",
    "heatmap_title",
    "PART_NAMES",
    "fmt_seconds",
]

PART_NAMES = {
    "mac": "MAC work",
    "imbalance": "load imbalance",
    "task_overhead": "task overhead",
    "communication": "communication",
    "weight_load": "weight loading",
    "dense_ops": "dense ops",
}
"""Report names of ``stats.PARTS``."""

_DIRECTIONS = {"E": "east", "W": "west", "S": "south", "N": "north"}


def fmt_seconds(seconds: float) -> str:
    """A duration in the unit that suits it (ASCII: ``us`` for microseconds).

    >>> fmt_seconds(1.024e-4), fmt_seconds(2.5e-9), fmt_seconds(3.0)
    ('102.4 us', '2.5 ns', '3.000 s')
    """
    for unit, scale in (("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3)):
        if abs(seconds) < scale * 1000:
            return f"{seconds / scale:.1f} {unit}"
    return f"{seconds:.3f} s"


def _table(title: str, *columns: str, text: tuple[str, ...] = ()) -> Any:
    """A left-titled table: the first column and those in ``text`` fold; figure columns never wrap."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        if i == 0 or column in text:
            table.add_column(column, overflow="fold")
        else:
            table.add_column(column, justify="right", no_wrap=True)
    return table


def summary_table(stats: RunStats) -> Any:
    """Cycles, time, interval and throughput (pipelined), utilization, traffic, SRAM and AXPYs."""
    table = _table("run summary", "what", "value")
    rows = [
        ("executor", stats.executor),
        ("mesh, mode", f"{stats.mesh[0]}x{stats.mesh[1]}, {stats.mode}"),
        ("cycles", f"{stats.cycles:,}"),
        ("latency", f"{fmt_seconds(stats.seconds)} at {stats.clock_hz / 1e6:,.0f} MHz"),
    ]
    if stats.mode == "pipelined":
        interval = fmt_seconds(stats.interval / stats.clock_hz)
        rows += [
            ("steady-state interval", f"{stats.interval:,} cycles ({interval})"),
            ("throughput", f"{stats.throughput:,.0f} inputs/s"),
        ]
    rows += [
        ("utilization (busy PEs)", f"{stats.utilization:.1%}"),
        ("imbalance (busiest PE / mean)", f"{stats.imbalance:.2f}"),
        ("wavelets sent", f"{stats.wavelets:,}"),
        ("link hops", f"{stats.link_hops:,}"),
    ]
    if stats.mode == "streaming":
        rows.append(("weight bytes streamed", f"{stats.weight_bytes:,}"))
    if stats.bytes_per_nonzero is not None:
        rows.append(("bytes per nonzero (values, indices, ranges)", f"{stats.bytes_per_nonzero:.2f}"))
    total = stats.axpys + stats.skipped_axpys
    share = f" ({stats.skipped_axpys / total:.1%})" if total else ""
    rows += [
        (SRAM_LABEL, f"{stats.sram_max:,} bytes"),
        ("AXPYs done", f"{stats.axpys:,}"),
        ("AXPYs skipped (zero inputs)", f"{stats.skipped_axpys:,}{share}"),
        ("critical path", f"{len(stats.critical_path):,} kernels"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def comparison_table(stats: RunStats) -> Any:
    """Each speedup beside its own ideal: the sparse layers' beside ``1 / (1 - s)``, the whole model's
    beside its FLOP ratio; the matmuls kept dense; or why there is no dense baseline."""
    c = stats.dense
    if c is None:
        table = _table("sparse against the dense baseline", "dense baseline")
        table.add_row(f"no dense baseline: {stats.dense_unavailable or 'not computed'}")
        return table
    table = _table("sparse against the dense baseline", "what", "value")
    rows = [
        ("dense cycles", f"{c.dense_cycles:,}"),
        ("sparse cycles", f"{c.sparse_cycles:,}"),
        (f"sparse layers ({len(c.layers)} matmuls): sparsity", f"{c.layers_sparsity:.1%}"),
        ("sparse layers: realized speedup", _speedup(c.layers_realized) if c.layers else "-"),
        ("sparse layers: ideal speedup 1/(1-s)", _speedup(c.layers_ideal)),
        ("sparse layers: efficiency (realized / ideal)", f"{c.layers_efficiency:.1%}" if c.layers else "-"),
        ("matmuls kept dense", _names(c.dense_matmuls)),
        ("whole model: realized speedup", _speedup(c.realized)),
        ("whole model: ideal (dense / sparse FLOPs)", _speedup(c.flop_ratio)),
        ("whole model: efficiency (realized / ideal)", f"{c.efficiency:.1%}"),
        ("all weight matmuls: sparsity", f"{c.sparsity:.1%}"),
        ("all weight matmuls: 1/(1-s)", _speedup(c.ideal)),
        ("all weight matmuls: realized speedup", _speedup(c.linear_realized)),
    ]
    if stats.mode == "pipelined":  # inputs follow each other through the resident kernels
        rows += [
            ("steady-state interval: dense cycles", f"{c.dense_interval:,}"),
            ("steady-state interval: sparse cycles", f"{c.sparse_interval:,}"),
            ("throughput: realized speedup", _speedup(c.throughput_realized)),
        ]
    for row in rows:
        table.add_row(*row)
    table.caption = (
        "the whole model's ideal is its FLOP ratio, not 1/(1-s): matmuls kept dense, activation "
        "products and every other kernel cost the same on both sides"
    )
    if c.beyond_flop_ratio:
        table.caption += f"\n{c.beyond_flop_ratio}"
    table.caption_justify = "left"
    return table


def _speedup(value: float) -> str:
    return f"{value:,.2f}x" if math.isfinite(value) else "unbounded"


def _names(names: list[str], shown: int = 4) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def parts_table(stats: RunStats) -> Any:
    """The critical path's parts; with a dense baseline, each part's excess over ``(1 - s)`` times dense.

    The excesses add up to the gap: the sparse cycles less ``(1 - s)`` times the dense cycles.
    """
    c = stats.dense
    dense_columns = ("dense", "(1-s) x dense", "excess", "of the gap") if c is not None else ()
    table = _table("where the cycles go", "part", "cycles", "of the run", *dense_columns)
    run = max(stats.cycles, 1)
    gap = sum(c.parts[p]["excess"] for p in PARTS) if c is not None else 0.0
    for part in PARTS:
        cycles = stats.parts.get(part, 0)
        row = [PART_NAMES[part], f"{cycles:,}", f"{cycles / run:.1%}"]
        if c is not None:
            p = c.parts[part]
            row += [
                f"{p['dense']:,.0f}",
                f"{p['ideal']:,.0f}",
                f"{p['excess']:+,.0f}",
                _share(p["excess"], gap),
            ]
        table.add_row(*row)
    table.add_section()
    total = ["total", f"{sum(stats.parts.values()):,}", f"{sum(stats.parts.values()) / run:.1%}"]
    if c is not None:
        ideal = c.dense_cycles * (1 - c.sparsity)
        total += [f"{c.dense_cycles:,}", f"{ideal:,.0f}", f"{gap:+,.0f}", _share(gap, gap)]
        table.caption = "excess: sparse cycles over (1-s) x dense cycles; the excesses add up to the gap"
        table.caption_justify = "left"
    table.add_row(*total)
    return table


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole and math.isfinite(part / whole) else "-"


def kernel_table(stats: RunStats, limit: int | None = 40) -> Any:
    """One row per kernel in program order (the first ``limit``, and a count of the rest)."""
    columns = ("kernel", "op", "start", "end", "cycles", "busiest PE", "critical", "waits on")
    table = _table("kernels", *columns, text=("op", "waits on"))
    shown = stats.kernels if limit is None else stats.kernels[:limit]
    for k in shown:
        table.add_row(
            k.name,
            k.op,
            f"{k.start:,}",
            f"{k.end:,}",
            f"{k.cycles:,}",
            f"{k.busy_max:,}",
            "yes" if k.critical else "",
            k.waits_on or "-",
        )
    if len(shown) < len(stats.kernels):
        table.caption = f"... and {len(stats.kernels) - len(shown)} more kernels"
        table.caption_justify = "left"
    return table


def links_table(stats: RunStats) -> Any:
    """The busiest mesh links: the PE a link leaves, its direction and the wavelets it carried."""
    table = _table("hottest links", "link (from PE x,y)", "direction", "wavelets", text=("direction",))
    for x, y, direction, wavelets in stats.hottest_links:
        table.add_row(f"{x},{y}", _DIRECTIONS.get(direction, direction), f"{wavelets:,}")
    if not stats.hottest_links:
        table.caption = "no link carried any wavelet"
    return table


def tables(stats: RunStats, limit: int | None = 40) -> list[Any]:
    """Every table of the report, in the order to print them (module docstring)."""
    return [
        summary_table(stats),
        comparison_table(stats),
        parts_table(stats),
        kernel_table(stats, limit),
        links_table(stats),
    ]


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN nor Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def report_data(stats: RunStats, program: ProgramData | None = None) -> dict[str, Any]:
    """``stats.to_json()`` with the program's model name, mesh, mode and placement, as strict JSON data."""
    data: dict[str, Any] = {}
    if program is not None:
        data["program"] = {
            "model": program.meta.get("model"),
            "mesh": str(program.mesh),
            "mode": program.mode,
            "placement": program.placement,
            "kernels": len(program.kernels),
        }
    return _finite(data | stats.to_json())


def write_json(data: Any, path: str | os.PathLike[str]) -> None:
    """Write ``data`` as indented JSON, atomically."""
    text = (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()
    atomic_write(Path(path), lambda file: file.write(text), ProgramWriteError, "JSON report")


def write_heatmap(program: ProgramData, stats: RunStats, path: str | os.PathLike[str]) -> None:
    """A PNG of each PE's busy cycles over the mesh, every kernel's region outlined and labelled with its
    name and its busiest PE's cycles, the busiest three named in the title (needs matplotlib)."""
    from .draw import draw_grid

    notes = {k.name: f"{k.busy_max:,}" for k in stats.kernels}
    draw_grid(program, stats.pe_busy, path, "busy cycles per PE", heatmap_title(program, stats), notes)


def heatmap_title(program: ProgramData, stats: RunStats) -> str:
    """The heatmap's title: the run, and the three kernels whose busiest PE worked longest."""
    hottest = sorted(stats.kernels, key=lambda k: -k.busy_max)[:3]
    return (
        f"busy cycles per PE: {stats.cycles:,} cycles on a {program.mesh} mesh ({program.mode}), "
        f"utilization {stats.utilization:.1%}, imbalance {stats.imbalance:.2f}\nbusiest kernels: "
        + ", ".join(f"{k.name} ({k.busy_max:,} cycles on one PE)" for k in hottest)
    )
