"""The progress line long commands show on stderr while they work (``lower``, ``bench``, ``freeze``).

It is transient (gone when the work ends) and shown only on a terminal, so piped output and JSON stay
clean::

    >>> with progress_line("lowering") as bar:
    ...     task = bar.add_task("capture", total=2)
    ...     bar.update(task, completed=2)
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_line"]


def progress_line(verb: str) -> Any:
    """A ``rich.progress.Progress`` reading ``<verb>: <task description>``, a bar and the time taken."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(f"{verb}: {{task.description}}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
