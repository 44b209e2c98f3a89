"""The README's frozen-speed tables are the ones ``benchmarks/freeze.py --readme`` writes: one per-layer
row per sparsity and shape it measures, a cell per token count naming a kernel freeze has, and one
whole-model row per sparsity and thread count with a cell per case."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import benchmark_module
from sparsefx.frozen.kernels import KERNELS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
bench = benchmark_module("freeze")
CELL = re.compile(r"^(\d+\.\d+)x \(([a-z]+)\)$")


def _tables() -> list[list[list[str]]]:
    inside = README.split(bench.START, 1)[1].split(bench.END, 1)[0]
    tables, rows = [], []
    for line in [*inside.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_the_readme_holds_the_tables_once_with_the_command() -> None:
    assert README.count(bench.START) == 1 and README.count(bench.END) == 1
    assert bench.COMMAND in README.split(bench.START, 1)[1].split(bench.END, 1)[0]
    assert len(_tables()) == 2


def test_the_per_layer_rows_are_the_benchmarks_shapes_and_tokens() -> None:
    layers = _tables()[0]
    assert layers[0] == ["layer (in x out)", "sparsity", *(f"{t} tokens" for t in bench.TOKENS)]
    body = layers[2:]
    shapes = [f"{i}x{o}" for i, o in bench.SHAPES]
    assert [r[0] for r in body] == shapes * (len(body) // len(shapes)) and len(body) % len(shapes) == 0
    for row in body:
        for cell in row[2:]:
            match = CELL.match(cell)
            assert match and match.group(2) in KERNELS, cell


def test_the_whole_model_rows_have_a_cell_per_case() -> None:
    model = _tables()[1]
    cases = [f"{b} x {t} tokens" for b, t in bench.CASES]
    assert model[0] == ["whole GPT-2 small", "sparsity", "threads", *cases, "freeze", "size"]
    for row in model[2:]:
        assert all(re.fullmatch(r"\d+\.\d+x", c) for c in row[3 : 3 + len(cases)]), row
        assert re.fullmatch(r"\d+\.\d s", row[-2]) and re.fullmatch(r"\d+ MB of \d+ MB", row[-1]), row
