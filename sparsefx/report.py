"""Tables and bars for people: sparsity per parameter, FLOPs dense versus sparse.

Shared by the CLI and the demo::

    >>> sparsity_bar(0.5, 4)
    '██  '
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import rich.console
from rich.table import Table

if TYPE_CHECKING:
    from .accounting import FlopReport
    from .model import SparseModel

__all__ = ["make_console", "is_ascii", "sparsity_bar", "sparsity_table", "flop_table"]

_BLOCKS = " ▏▎▍▌▋▊▉█"


def make_console() -> rich.console.Console:
    """A console for stdout; wide when stdout is a file or pipe, so parameter names are never cut."""
    console = rich.console.Console()
    return console if console.is_terminal else rich.console.Console(width=200)


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


def sparsity_table(sm: SparseModel, ascii_only: bool = False) -> Table:
    """One row per sparse parameter: shape, target and actual sparsity, nnz and a bar of the actual level."""
    table = Table(title="sparse parameters", title_justify="left")
    for name, justify in (
        ("parameter", "left"),
        ("shape", "left"),
        ("target", "right"),
        ("actual", "right"),
        ("nnz / numel", "right"),
        ("sparsity", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)
    for row in sm.sparsity_report():
        table.add_row(
            row.name,
            _shape(row.shape),
            f"{row.target:.1%}",
            f"{row.actual:.1%}",
            f"{row.nnz:,} / {row.numel:,}",
            sparsity_bar(row.actual, ascii_only=ascii_only),
        )
    return table


def flop_table(report: FlopReport, title: str = "FLOPs and parameters") -> Table:
    """Dense versus sparse forward FLOPs, training-step FLOPs and parameters, with reduction factors."""
    table = Table(title=title, title_justify="left")
    for name, justify in (("", "left"), ("dense", "right"), ("sparse", "right"), ("reduction", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for label, dense, sparse in (
        ("forward FLOPs", report.dense_forward, report.sparse_forward),
        ("train-step FLOPs", report.dense_train, report.sparse_train),
        ("parameters", report.dense_params, report.sparse_params),
    ):
        table.add_row(label, f"{dense:,}", f"{sparse:,}", _reduction(dense, sparse))
    return table


def _reduction(dense: int, sparse: int) -> str:
    if sparse == 0:
        return "inf" if dense else "-"
    factor = dense / sparse
    return f"{factor:.2f}x" if math.isfinite(factor) else "-"


def _shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape))
