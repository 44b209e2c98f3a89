"""Tables and bars for people: sparsity per parameter, FLOPs dense versus sparse.

Shared by the CLI and the demo::

    >>> sparsity_bar(0.5, 4)
    '██  '
"""

from __future__ import annotations

import io
import math
import os
import sys
from typing import TYPE_CHECKING

import rich.console
from rich.measure import Measurement
from rich.table import Table

if TYPE_CHECKING:
    from .accounting import FlopReport
    from .model import SparseModel

__all__ = [
    "make_console",
    "output_width",
    "is_ascii",
    "sparsity_bar",
    "sparsity_table",
    "flop_table",
    "fits",
    "text_column",
    "number_column",
]

_BLOCKS = " ▏▎▍▌▋▊▉█"
PIPED_WIDTH = 200  # the width of piped output when no terminal width is known
BAR_WIDTH = 10


def make_console() -> rich.console.Console:
    """A console for stdout. On a terminal rich finds the width (``COLUMNS`` wins); piped output
    gets :func:`output_width` rather than rich's 80."""
    console = rich.console.Console()
    return console if console.is_terminal else rich.console.Console(width=output_width())


def output_width(default: int = PIPED_WIDTH) -> int:
    """The width for output that is not a terminal: ``COLUMNS``, else the width of the terminal that
    stderr or stdin is (``sparsefx inspect ... | less``), else ``default``."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for stream in (sys.stderr, sys.stdin):
        try:
            if stream is not None and stream.isatty():
                return os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            continue
    return default


def text_column(table: Table, header: str) -> None:
    """A column of names or prose: folds onto more lines when the table is too wide, never ends in "…"."""
    table.add_column(header, overflow="fold")


def number_column(table: Table, header: str, justify: str = "right") -> None:
    """A column of figures: never wrapped nor cut, so a narrow table squeezes the text columns instead."""
    table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]


def is_ascii(console: rich.console.Console) -> bool:
    return not console.encoding.lower().startswith("utf")


def sparsity_bar(fraction: float, width: int = 20, ascii_only: bool = False) -> str:
    """A bar ``width`` cells wide, filled to ``fraction`` (clamped to [0, 1]), in eighths of a cell.

    >>> sparsity_bar(0.5, 4)
    '██  '
    >>> sparsity_bar(0.5, 4, ascii_only=True)
    '##..'
    """
    fraction = min(1.0, max(0.0, fraction))
    if ascii_only:
        full = round(fraction * width)
        return "#" * full + "." * (width - full)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    cells = "█" * full + (_BLOCKS[part] if part else "")
    return cells.ljust(width)


def sparsity_table(sm: SparseModel, ascii_only: bool = False, width: int | None = None) -> Table:
    """One row per sparse parameter: shape, target and actual sparsity, nnz and a bar of the actual level.

    The figures are never cut: in a table wider than ``width`` the bar is left out first, then the
    parameter names fold onto more lines.
    """
    rows = [
        (
            row.name,
            _shape(row.shape),
            f"{row.target:.1%}",
            f"{row.actual:.1%}",
            f"{row.nnz:,} / {row.numel:,}",
        )
        for row in sm.sparsity_report()
    ]
    bars = [sparsity_bar(row.actual, BAR_WIDTH, ascii_only=ascii_only) for row in sm.sparsity_report()]
    table = _sparsity_table(rows, bars)
    if width is not None and not fits(table, width):
        table = _sparsity_table(rows, None)
    return table


def _sparsity_table(rows: list[tuple[str, ...]], bars: list[str] | None) -> Table:
    table = Table(title="sparse parameters", title_justify="left")
    text_column(table, "parameter")
    number_column(table, "shape", justify="left")
    number_column(table, "target")
    number_column(table, "actual")
    number_column(table, "nnz / numel")
    if bars is not None:
        table.add_column("sparsity", no_wrap=True, overflow="crop")
    for i, row in enumerate(rows):
        table.add_row(*row, *([bars[i]] if bars is not None else []))
    return table


def fits(table: Table, width: int) -> bool:
    """Does ``table`` show every cell on one line within ``width`` columns?

    >>> table = Table()
    >>> table.add_column("name"); table.add_row("x" * 30)
    >>> fits(table, 80), fits(table, 20)
    (True, False)
    """
    console = rich.console.Console(file=io.StringIO(), width=width)
    unbounded = console.options.update(max_width=1_000_000)
    return Measurement.get(console, unbounded, table).maximum <= width


def flop_table(report: FlopReport, title: str = "FLOPs and parameters") -> Table:
    """Dense versus sparse forward FLOPs, training-step FLOPs and parameters, with reduction factors."""
    table = Table(title=title, title_justify="left")
    text_column(table, "")
    for name in ("dense", "sparse", "reduction"):
        number_column(table, name)
    for label, dense, sparse in (
        ("forward FLOPs", report.dense_forward, report.sparse_forward),
        ("train-step FLOPs", report.dense_train, report.sparse_train),
        ("parameters", report.dense_params, report.sparse_params),
    ):
        table.add_row(label, f"{dense:,}", f"{sparse:,}", _reduction(dense, sparse))
    uncounted = getattr(report, "uncounted", ())
    if uncounted:
        shown = ", ".join(uncounted[:5]) + (", ..." if len(uncounted) > 5 else "")
        why = f" ({report.partial})" if getattr(report, "partial", None) else ""
        table.caption = f"partial: {len(uncounted)} node(s) not counted: {shown}{why}"
        table.caption_justify = "left"
    return table


def _reduction(dense: int, sparse: int) -> str:
    if sparse == 0:
        return "inf" if dense else "-"
    factor = dense / sparse
    return f"{factor:.2f}x" if math.isfinite(factor) else "-"


def _shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape))
