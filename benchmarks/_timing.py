"""Shared benchmark helpers: interleaved timing, robust summaries, paired ratios, tables, JSON.

The machines these benchmarks run on are shared and noisy, so every headline figure is a ratio of
two things measured side by side in the same process: ``interleave`` runs the candidates
round-robin (rotating who goes first each round), and ``paired_ratios`` divides each candidate's
sample by the baseline's sample from the same round before taking the median.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

__all__ = [
    "Summary",
    "interleave",
    "summarize",
    "median_ci",
    "paired_ratios",
    "print_table",
    "fmt_seconds",
    "fmt_ratio",
    "fmt_ci",
    "verdict",
    "add_json_arg",
    "write_json",
    "environment",
    "console",
]

# Wide enough for the tables when output goes to a file or pipe (rich would assume 80 columns).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


@dataclass(frozen=True)
class Summary:
    """Median and spread of a list of samples (seconds, or a unitless ratio).

    ``ci_low``/``ci_high`` bound the median with 95% confidence (``median_ci``).
    """

    median: float
    p25: float
    p75: float
    min: float
    max: float
    n: int
    ci_low: float
    ci_high: float

    def as_dict(self) -> dict[str, float]:
        """Plain dict for JSON output."""
        return asdict(self)


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 1] of already sorted values."""
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> Summary:
    """Median, quartiles, min, max and the median's 95% confidence interval of ``samples`` (at least one)."""
    if not samples:
        raise ValueError("summarize needs at least one sample")
    s = sorted(samples)
    low, high = median_ci(s)
    return Summary(
        _percentile(s, 0.5), _percentile(s, 0.25), _percentile(s, 0.75), s[0], s[-1], len(s), low, high
    )


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median: two order statistics.

    The number of samples below the true median is Binomial(n, 1/2), so the interval from the
    j-th smallest to the j-th largest sample covers the median with probability
    ``1 - 2 P(B < j)``; ``j`` is the largest rank that keeps that at least ``confidence``. It
    assumes only that the samples (here: per-round ratios) are independent draws of one
    distribution, not that they are normal. With very few samples it is [min, max].

    >>> median_ci([float(v) for v in range(1, 101)])
    (40.0, 61.0)
    """
    s = sorted(samples)
    n = len(s)
    if n == 0:
        raise ValueError("median_ci needs at least one sample")
    alpha = (1.0 - confidence) / 2
    below, j = 0.0, 0  # below = P(B < j + 1) as j grows
    while j < n // 2:
        below += math.comb(n, j) / 2.0**n
        if below > alpha:
            break
        j += 1
    j = max(j, 1)
    return s[j - 1], s[n - j]


def interleave(
    fns: Mapping[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    *,
    number: int = 1,
    before_each: Callable[[], Any] | None = None,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Time each ``fn`` round-robin; return ``{name: [seconds per call, one per round]}``.

    Each round calls every function ``number`` times in a row and records the mean time per call;
    the order rotates by one each round so no candidate always runs first (or right after the
    same neighbour). ``warmup`` rounds run first and are discarded. ``before_each`` (e.g.
    ``gc.collect``) runs, untimed, before each timed block; ``on_round(i)`` after each round.
    """
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            if before_each is not None:
                before_each()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = (time.perf_counter() - start) / number
            if r >= warmup:
                samples[name].append(elapsed)
        if on_round is not None:
            on_round(r - warmup)
    return samples


def paired_ratios(samples: Mapping[str, Sequence[float]], baseline: str) -> dict[str, list[float]]:
    """Per-round ratios ``samples[name][i] / samples[baseline][i]`` for every name but the baseline."""
    base = samples[baseline]
    return {
        name: [v / b for v, b in zip(values, base)] for name, values in samples.items() if name != baseline
    }


def fmt_seconds(s: float) -> str:
    """Seconds with a unit that keeps three significant figures."""
    if s >= 1.0:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_ratio(summary: Summary) -> str:
    """``1.03× [1.01–1.06]``: median with the interquartile range."""
    return f"{summary.median:.3f}× [{summary.p25:.3f}–{summary.p75:.3f}]"


def fmt_ci(summary: Summary) -> str:
    """``1.03× (95% CI 1.02–1.04)``: median with its confidence interval."""
    return f"{summary.median:.3f}× (95% CI {summary.ci_low:.3f}–{summary.ci_high:.3f}, n={summary.n})"


def verdict(ok: bool) -> str:
    """Rich markup for PASS / FAIL."""
    return "[bold green]PASS[/]" if ok else "[bold red]FAIL[/]"


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a simple rich table; the first column is left-aligned, the rest right-aligned."""
    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def markdown_table(intro: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A README's generated text between its markers: ``intro`` (the settings and the command), then
    the table of ``rows`` under ``columns``."""
    lines = ["", intro, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines + [""])


def add_json_arg(parser: argparse.ArgumentParser) -> None:
    """Add the shared ``--json PATH`` option."""
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")


def write_json(path: str, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temporary file in the same folder, then ``os.replace``)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bench-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_between_markers(path: Path, start: str, end: str, body: str) -> None:
    """Rewrite the text between ``start`` and ``end`` in ``path`` (a README's generated table) with
    ``body``, atomically; a file that does not hold each marker once, in order, is refused."""
    text = path.read_text(encoding="utf-8")
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise SystemExit(f"{path} must hold {start} once, then {end} once")
    head, rest = text.split(start)
    new = head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".readme-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def environment() -> dict[str, Any]:
    """What the figures depend on: versions, threads, CPU count and load when the run started."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": list(load) if load else None,
        "machine": platform.machine(),
    }
