"""Tables stay readable in an 80-column terminal, and piped output uses the real width."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import cli_in_process


def _cli(*args: str, columns: str | None) -> str:
    """``sparsefx ARGS``'s stdout, run in this process with no terminal anywhere (stdout, stderr and
    stdin are buffers), so only ``COLUMNS`` can say a width."""
    result = cli_in_process(list(args), {"COLUMNS": columns, "LINES": None})
    assert result.returncode == 0, result.stderr
    return result.stdout


def _piped(*args: str) -> str:
    """``sparsefx ARGS``'s stdout from a fresh process whose streams are pipes, ``COLUMNS`` unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [sys.executable, "-m", "sparsefx.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _table_rows(text: str, title: str) -> list[list[str]]:
    """The cells of the body rows of the table titled ``title`` (box-drawing or ASCII borders)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        if line.startswith(("│", "|")):
            rows.append([cell.strip() for cell in re.split(r"[│|]", line)[1:-1]])
        elif rows and not line.startswith(("├", "┡", "┏", "┃", "┌", "└", "+", "╞")):
            break
    return rows


@pytest.fixture(scope="module")
def inspect_80() -> str:
    return _cli("inspect", "--model", "gpt-tiny", "--config", "0.9", columns="80")


def test_inspect_at_80_columns_keeps_every_sparsity_figure(inspect_80: str) -> None:
    assert max(len(line) for line in inspect_80.splitlines()) <= 80
    rows = [r for r in _table_rows(inspect_80, "sparse parameters") if any(r)]
    figures = [r for r in rows if re.fullmatch(r"\d+\.\d%", r[2] or "")]
    assert len(figures) == 8, inspect_80  # gpt-tiny: qkv, proj, fc, proj in each of 2 blocks
    for row in figures:
        target, actual, nnz = row[2], row[3], row[4]
        assert "…" not in "".join(row[1:5])
        assert target == "90.0%" and re.fullmatch(r"\d+\.\d%", actual)
        assert re.fullmatch(r"[\d,]+ / [\d,]+", nnz), row


def test_inspect_node_table_keeps_numbers_at_80_columns(inspect_80: str) -> None:
    title = "graph nodes that read a weight or count FLOPs"
    rows = _table_rows(inspect_80, title)
    assert rows
    numeric = [cell for row in rows for cell in row[3:]]
    assert not any("…" in cell for cell in numeric), inspect_80
    assert all(len(line) <= 80 for line in inspect_80.splitlines())
    assert "33,554,432" in inspect_80 and "10,904,064" in inspect_80  # the FLOP totals, whole


def test_validate_at_80_columns_keeps_sparsity_figures() -> None:
    out = _cli("validate", "0.9", "--model", "gpt2-small", columns="80")
    assert max(len(line) for line in out.splitlines()) <= 80
    rows = [r for r in _table_rows(out, "sparse parameters") if any(r)]
    levels = [r[3] for r in rows if r[3]]
    assert len(levels) == 48 and set(levels) == {"90.0%"}  # 4 linears in each of 12 blocks
    assert not any("…" in cell for row in rows for cell in row[1:])


def test_piped_output_uses_columns_when_set_and_a_wide_default_otherwise() -> None:
    wide = _cli("validate", "0.9", "--model", "gpt-tiny", columns="150")
    summary = next(line for line in wide.splitlines() if line.startswith("8 sparse / "))
    assert len(summary) <= 150 and "fewer)" in summary  # one line at 150 columns
    assert max(len(line) for line in wide.splitlines()) <= 150
    narrow = _cli("validate", "0.9", "--model", "gpt-tiny", columns="60")
    assert max(len(line) for line in narrow.splitlines()) <= 60
    default = _cli("validate", "0.9", "--model", "gpt-tiny", columns=None)
    assert max(len(line) for line in default.splitlines()) > 80  # not rich's 80 when nothing is known
    assert _piped("validate", "0.9", "--model", "gpt-tiny") == default  # and so in a real pipe


def test_output_width_prefers_columns_then_a_terminal_then_the_wide_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparsefx import report

    monkeypatch.setenv("COLUMNS", "97")
    assert report.output_width() == 97
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(report.sys, "stderr", None)
    monkeypatch.setattr(report.sys, "stdin", None)
    assert report.output_width() == report.PIPED_WIDTH > 80
