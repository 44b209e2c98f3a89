"""The README's cost-sensitivity table is the one ``benchmarks/sensitivity.py`` writes: its rows are the
benchmark's variants, in order, and every figure in it parses. No model runs here."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from conftest import benchmark_module

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


bench = benchmark_module("sensitivity")


def test_the_readme_holds_the_markers_once_in_order():
    assert README.count(bench.START) == 1 and README.count(bench.END) == 1
    assert README.index(bench.START) < README.index(bench.END)


def test_the_rows_are_the_benchmarks_variants():
    rows = bench.table_in(README)
    assert [tuple(row[:3]) for row in rows] == [v.cells() for v in bench.variants()], (
        "the README's sensitivity table is stale: run " + bench.COMMAND
    )


def test_the_prose_names_every_assumption_the_benchmark_varies():
    section = README.split("### How much the figures rest on assumptions", 1)[1].split(bench.START, 1)[0]
    prose = " ".join(section.split())
    words = ("One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine")
    count = words[len(bench.ASSUMPTIONS) - 1]
    assert f"{count} costs" in prose, f"the README's count of assumed costs is not {count}"
    for name, field, *_ in bench.ASSUMPTIONS:
        assert name in prose, f"the README's sensitivity section does not name {name} ({field})"
    assert bench.COMMAND in README.split(bench.END, 1)[1].split("\n## ", 1)[0]


def test_the_header_is_the_benchmarks():
    inside = README.split(bench.START, 1)[1].split(bench.END, 1)[0]
    header = next(line for line in inside.splitlines() if line.startswith("|"))
    assert [c.strip() for c in header.strip().strip("|").split("|")] == list(bench.HEADER)


def test_every_figure_parses_and_agrees_with_the_caption():
    inside = " ".join(README.split(bench.START, 1)[1].split(bench.END, 1)[0].split())
    caption = re.search(r"ideal is (\d+\.\d+)x, the whole model's FLOP ratio (\d+\.\d+)x", inside)
    assert caption, "the caption no longer gives the ideal and the FLOP ratio"
    ideal, flops = float(caption.group(1)), float(caption.group(2))
    rows = bench.table_in(README)
    assert rows
    for row in rows:
        assert len(row) == len(bench.HEADER), row
        for cell, target in ((row[3], ideal), (row[4], flops)):
            m = bench.SPEEDUP.match(cell)
            assert m, f"{cell!r} is not a speedup with its fraction"
            x, fraction = float(m.group(1)), float(m.group(2))
            assert x > 0 and fraction > 0
            assert math.isclose(x / fraction, target, rel_tol=0.02), (row, target)


def test_the_variants_halve_and_double_each_assumption_once():
    vs = bench.variants()
    assert vs[0].factor == 1.0 and len(vs) == 1 + 2 * len(bench.ASSUMPTIONS)
    fields = [v.field for v in vs[1:]]
    assert fields == [a[1] for a in bench.ASSUMPTIONS for _ in (0, 1)]
    hw = vs[0].hardware
    assert (hw.task_start_cycles, hw.vector_start_cycles, hw.simd_widths["float32"]) == (8, 2, 2)
    by = {(v.field, v.factor): v.hardware for v in vs[1:]}
    assert by[("`task_start_cycles`", 0.5)].task_start_cycles == hw.task_start_cycles // 2
    assert by[("`vector_start_cycles`", 2.0)].vector_start_cycles == hw.vector_start_cycles * 2
    assert by[('`simd_widths["float32"]`', 0.5)].simd_widths["float32"] == 1
    assert by[('`simd_widths["float32"]`', 2.0)].simd_widths["float16"] == hw.simd_widths["float16"]
    assert by[("`weight_bytes_per_s`", 2.0)].weight_bytes_per_s == 2 * hw.weight_bytes_per_s


def test_rewriting_keeps_every_byte_outside_the_markers(tmp_path):
    page = tmp_path / "README.md"
    before, after = "# title\n\ntext  \r\n", "\nmore\n" + "é" * 3
    page.write_text(f"{before}{bench.START}\nold\n{bench.END}{after}", encoding="utf-8", newline="")
    result = {
        "assumption": "a", "field": "f", "value": "v", "linear_realized": 5.0, "linear_fraction": 0.5,
        "realized": 2.0, "efficiency": 0.9, "sparsity": 0.9, "mesh": "64x64", "ideal": 10.0,
        "flop_ratio": 2.2,
    }  # fmt: skip
    bench.write_readme([result], page)
    text = page.read_bytes().decode("utf-8")
    assert text.startswith(before + bench.START + "\n\n") and text.endswith("\n\n" + bench.END + after)
    assert bench.table_in(text) == [["a", "f", "v", "5.00x (0.500)", "2.00x (0.900)"]]
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temporary file left
    with pytest.raises(ValueError):
        bench.replace_between_markers("no markers", "body")
