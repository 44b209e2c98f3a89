"""The README's per-kernel mapping table is the one ``benchmarks/mapping.py`` writes: its columns, one
row per kernel of a GPT-2 layer with figures that parse, the sparse matmuls faster than their dense
baselines, and the attention matmuls in row tiles. No model runs here."""

from __future__ import annotations

from pathlib import Path

from conftest import benchmark_module

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


bench = benchmark_module("mapping")


def _table() -> tuple[list[str], list[list[str]]]:
    assert README.count(bench.START) == 1 and README.count(bench.END) == 1
    inside = README.split(bench.START, 1)[1].split(bench.END, 1)[0]
    lines = [line for line in inside.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]


def test_the_table_has_the_benchmarks_columns_and_a_layers_kernels():
    header, rows = _table()
    assert header == list(bench.COLUMNS)
    names = [r[0] for r in rows]
    assert names[0] == "blocks_0_ln_1" and "blocks_1_ln_1" not in names
    assert sum(r[1] == "sparse_matmul" for r in rows) == 4  # qkv, attention out, mlp fc and proj
    for r in rows:
        assert len(r) == len(bench.COLUMNS) and r[3]
        span, step = int(r[4].replace(",", "")), int(r[6].replace(",", ""))
        assert step >= span  # a streaming step starts no later than its first task


def test_sparse_matmuls_beat_their_dense_baselines_and_attention_runs_in_row_tiles():
    _, rows = _table()
    for r in rows:
        sparse, dense = (int(c.replace(",", "")) for c in r[4:6])
        if r[1] == "sparse_matmul":
            assert sparse < dense and "packed indices" in r[3]
        if r[1] == "matmul":
            assert "row tiles" in r[3]
