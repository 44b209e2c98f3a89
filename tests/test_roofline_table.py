"""The README's token-roofline table is the one ``benchmarks/roofline.py`` writes: one row per mesh and
batch it measures, in order, each either the lowering's refusal or figures that parse and stay within
their ideals, with whether the program fits SRAM. Only the overflow column's own test lowers a model."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import sparsefx
from conftest import benchmark_module
from sparsefx.runtime.held import held_peak
from sparsefx.runtime.mesh import hardware

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIGURE = re.compile(r"^(\d+\.\d+)x of (\d+(?:\.\d+)?)x \(([a-z ]+?) (\d+)%(?:; dense ops (\d+)%)?\)$")
OVERFLOW = re.compile(r"^no: \d+ KB on PE \(\d+, \d+\) in step \S+ \(.+ kept\), \d+ KB a PE$")


bench = benchmark_module("roofline")


def test_the_readme_holds_the_table_once_with_the_command_and_the_picture():
    assert README.count(bench.START) == 1 and README.count(bench.END) == 1
    assert README.index(bench.START) < README.index(bench.END)
    after = README.split(bench.END, 1)[1].split("\n## ", 1)[0]
    assert bench.PLOT in after and (ROOT / bench.PLOT).exists()


def test_the_rows_are_the_benchmarks_cases_in_order():
    inside = README.split(bench.START, 1)[1].split(bench.END, 1)[0]
    header = next(line for line in inside.splitlines() if line.startswith("|"))
    assert [c.strip() for c in header.strip().strip("|").split("|")] == list(bench.COLUMNS)
    rows = bench.table_in(README)
    want = [(m, f"{b} x {bench.TOKENS} = {b * bench.TOKENS:,}") for m in bench.MESHES for b in bench.BATCHES]
    stale = "the README's roofline table is stale: run " + bench.COMMAND
    assert [tuple(row[:2]) for row in rows] == want, stale


def test_every_figure_parses_and_stays_within_its_ideal():
    parts = set(bench.PARTS.values())
    lowered = 0
    for row in bench.table_in(README):
        assert len(row) == len(bench.COLUMNS), row
        if row[2].startswith("does not lower: "):
            assert row[3:] == ["-", "-", "-"], row
            continue
        lowered += 1
        for cell, named in ((row[2], parts - {"dense ops"}), (row[3], parts)):
            m = FIGURE.match(cell)
            assert m, f"{cell!r} is not 'realized of ideal (part share)'"
            realized, ideal, part, share = float(m.group(1)), float(m.group(2)), m.group(3), int(m.group(4))
            assert 0 < realized <= ideal and part in named and 0 < share <= 100, row
            if m.group(5) is not None:  # the dense ops beside a larger part: the whole model's cell only
                assert cell is row[3] and part != "dense ops" and int(m.group(5)) <= share, row
        assert 0 <= float(row[4]) <= 1, row
        assert row[5] == "yes" or OVERFLOW.match(row[5]), row
    assert lowered >= 2


def test_a_program_whose_kept_values_overflow_is_named_in_the_last_column():
    """An 8 KB-a-PE machine and 2,048 rows: the lowering warns, and the row names the step, the PE and
    the value kept there; with 32 rows every step fits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    sm = sparsefx.compile(model, 0.9, (torch.randn(4, 32),))
    small = dataclasses.replace(hardware(), sram_bytes=8192)
    with pytest.warns(UserWarning, match="for later steps"):
        over = sparsefx.lower(sm, (torch.randn(2048, 32),), mesh=(8, 8), mode="streaming", hardware=small)
    peak = held_peak(over)
    said = bench._overflow(over)
    assert said is not None and OVERFLOW.match(said), said
    assert f"PE ({peak.x}, {peak.y}) in step {peak.step} ({peak.values[0]}" in said and "8 KB a PE" in said
    fits = sparsefx.lower(sm, (torch.randn(32, 32),), mesh=(8, 8), mode="streaming", hardware=small)
    assert bench._overflow(fits) is None


def test_the_prose_under_the_table_quotes_its_64x64_figures():
    """The paragraph after the table cites the 64x64 rows that lower: speedups, load shares, dense-op
    shares and the kept bytes of the rows that overflow, as the table has them."""
    after = " ".join(README.split(bench.END, 1)[1].split("\n## ", 1)[0].split())
    rows = [r for r in bench.table_in(README) if r[0] == "64x64" and not r[2].startswith("does not lower")]
    assert len(rows) >= 2

    def listed(cells: list[str]) -> str:
        return ", ".join(cells)

    assert f"({listed([r[2].split(' of ')[0] for r in rows])} on 64x64)" in after
    assert f"({listed([r[3].split(' of ')[0] for r in rows])})" in after
    assert f"({listed([r[4] for r in rows])})" in after
    dense = [re.search(r"dense ops (\d+%)", r[3]).group(1) for r in rows]
    assert f"({listed(dense)} of the sparse run)" in after
    kept = [re.match(r"no: (\d+ KB)", r[5]).group(1) for r in rows if r[5] != "yes"]
    assert not kept or f"({' and '.join(kept)} against a PE's 48 KB)" in after
