"""The rich table the commands print: figure columns never wrap, text columns fold when narrow.

>>> t = make_table("sparse parameters", "parameter", "shape", "dense FLOPs")
>>> [(c.header, c.no_wrap) for c in t.columns]
[('parameter', False), ('shape', True), ('dense\\nFLOPs', True)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["FIGURES", "make_table"]

# Columns of figures and short codes: never wrapped nor cut; every other column folds when narrow.
FIGURES = (
    "shape",
    "algorithm",
    "sparsity",
    "init",
    "decision",
    "target",
    "actual",
    "dense FLOPs",
    "sparse FLOPs",
)


def make_table(title: str, *columns: str) -> Table:
    """A left-titled table with ``columns``; a FLOPs header may take two lines."""
    from rich.table import Table

    from sparsefx.report import number_column, text_column

    table = Table(title=title, title_justify="left")
    for column in columns:
        if column not in FIGURES:
            text_column(table, column)
        elif column.endswith("FLOPs"):
            number_column(table, column.replace(" ", "\n"))
        else:
            number_column(table, column, justify="left")
    return table
