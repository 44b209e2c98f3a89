"""The run report: tables, JSON report, Chrome trace, heatmap and random inputs, on real programs."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
import torch
from rich.console import Console

import sparsefx
from conftest import LOWER_MESH
from sparsefx.models import build_model
from sparsefx.runtime.random_inputs import SAFE_ID_BOUND, id_bounds, random_inputs
from sparsefx.runtime.report import PART_NAMES, report_data, tables, write_heatmap, write_json
from sparsefx.runtime.stats import PARTS, RunStats
from sparsefx.runtime.trace import LOADS_TID, write_trace


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[sparsefx.DataflowProgram, RunStats]]:
    """The built-in mlp at 90%, lowered pipelined and streaming, each run once on random inputs."""
    torch.manual_seed(0)
    spec = build_model("mlp")
    sm = sparsefx.compile(spec.model, 0.9, spec.args)
    out = {}
    for mode in ("pipelined", "streaming"):
        program = sparsefx.lower(sm, spec.args, mesh=LOWER_MESH["mlp"], mode=mode)
        out[mode] = (program, sparsefx.run(program, random_inputs(program, seed=1)).stats)
    return out


def _text(renderables: list) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    for r in renderables:
        console.print(r)
    return console.file.getvalue()


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
def test_tables_show_the_figures_with_separators(runs, mode) -> None:
    program, stats = runs[mode]
    text = _text(tables(stats, limit=None))
    assert f"{stats.cycles:,}" in text and stats.cycles >= 1000 and "," in f"{stats.cycles:,}"
    assert f"{stats.wavelets:,}" in text and f"{stats.link_hops:,}" in text
    assert f"{stats.dense.dense_cycles:,}" in text
    assert f"{stats.dense.ideal:,.2f}x" in text and f"{stats.dense.realized:,.2f}x" in text
    assert all(k.name in text for k in stats.kernels)
    assert all(PART_NAMES[p] in text for p in PARTS)
    assert ("steady-state interval" in text) == (mode == "pipelined")
    assert ("weight bytes streamed" in text) == (mode == "streaming")
    if mode == "streaming":
        assert f"{stats.weight_bytes:,}" in text and stats.weight_bytes > 0


def test_the_gap_splits_into_the_parts_excess(runs) -> None:
    _, stats = runs["pipelined"]
    c = stats.dense
    gap = stats.cycles - c.dense_cycles * (1 - c.sparsity)
    assert sum(p["excess"] for p in c.parts.values()) == pytest.approx(gap)
    text = _text(tables(stats))
    assert f"{gap:+,.0f}" in text and "100.0%" in text  # the total row: the gap, all of it


def test_kernel_rows_are_limited_with_a_count(runs) -> None:
    _, stats = runs["pipelined"]
    text = _text(tables(stats, limit=2))
    assert f"... and {len(stats.kernels) - 2} more kernels" in text


def test_no_dense_baseline_says_why(runs) -> None:
    _, stats = runs["pipelined"]
    alone = dataclasses.replace(stats, dense=None, dense_unavailable="the dense model does not fit: 2x2")
    text = _text(tables(alone))
    assert "no dense baseline: the dense model does not fit: 2x2" in text
    assert "realized speedup" not in text and "excess" not in text
    assert report_data(alone)["dense"] is None


def test_json_report_is_strict_and_written_atomically(runs, tmp_path) -> None:
    program, stats = runs["pipelined"]
    data = report_data(stats, program)
    assert data["program"] == {
        "model": "MLP",
        "mesh": str(program.mesh),
        "mode": "pipelined",
        "placement": program.placement,
        "kernels": len(program.kernels),
    }
    assert data["cycles"] == stats.cycles and sum(data["parts"].values()) == stats.cycles
    assert data["dense"]["efficiency"] == pytest.approx(stats.dense.efficiency)
    assert torch.equal(torch.tensor(data["pe_busy"]), stats.pe_busy)
    path = tmp_path / "report.json"
    write_json(data, path)
    assert json.loads(path.read_text()) == data
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    infinite = dataclasses.replace(stats, dense=dataclasses.replace(stats.dense, ideal=float("inf")))
    assert report_data(infinite)["dense"]["ideal"] is None  # strict JSON has no Infinity
    json.dumps(report_data(infinite), allow_nan=False)


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
def test_chrome_trace_has_every_kernel_once_at_the_clock(runs, mode, tmp_path) -> None:
    _, stats = runs[mode]
    path = tmp_path / "trace.json"
    write_trace(stats, path)
    trace = json.loads(path.read_text())
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    kernels = [e for e in complete if e["tid"] != LOADS_TID]
    assert [e["name"] for e in kernels] == [k.name for k in stats.kernels]
    assert len({e["tid"] for e in kernels}) == len(stats.kernels)  # one track each
    us = 1e6 / stats.clock_hz
    for e, k in zip(kernels, stats.kernels):
        assert e["ts"] == pytest.approx(k.start * us) and e["dur"] == pytest.approx((k.end - k.start) * us)
        assert e["cat"] == k.op and e["args"]["critical"] == k.critical
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(names[e["tid"]].startswith(e["name"]) for e in kernels)
    assert any(e["name"] == "process_name" for e in events)
    loads = [e for e in complete if e["tid"] == LOADS_TID]
    if mode == "pipelined":
        assert not loads and LOADS_TID not in names
        return
    assert names[LOADS_TID] == "weight loads"
    loaded = {k.name: k.load for k in stats.kernels if k.load is not None and k.load[1] > k.load[0]}
    assert len(loads) == len(loaded) > 0
    for e in loads:
        begin, end = loaded[e["args"]["kernel"]]
        assert e["ts"] == pytest.approx(begin * us) and e["dur"] == pytest.approx((end - begin) * us)


def test_heatmap_is_a_png(runs, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    program, stats = runs["pipelined"]
    path = tmp_path / "busy.png"
    write_heatmap(program, stats, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_random_inputs_follow_the_recorded_specs(runs) -> None:
    program, _ = runs["pipelined"]
    a, b = random_inputs(program, seed=3), random_inputs(program, seed=3)
    assert list(a) == [s.name for s in program.inputs]
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert all(tuple(a[s.name].shape) == s.shape and a[s.name].dtype == torch.float32 for s in program.inputs)
    assert not torch.equal(a[program.inputs[0].name], random_inputs(program, seed=4)[program.inputs[0].name])


def test_ids_stay_within_the_embedding_tables() -> None:
    class TwoTables(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big, self.small = torch.nn.Embedding(50, 8), torch.nn.Embedding(7, 8)
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, ids: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
            return self.fc(
                self.big(ids) + self.small(ids.reshape(-1).reshape(ids.shape)) + other.float().sum()
            )

    ids, other = torch.zeros(2, 5, dtype=torch.long), torch.zeros(3, dtype=torch.long)
    sm = sparsefx.compile(TwoTables(), 0.5, (ids, other))
    program = sparsefx.lower(sm, (ids, other), mesh=(16, 16))
    assert id_bounds(program) == {"ids": 7}  # the smaller table, through the reshapes
    for seed in range(5):
        x = random_inputs(program, seed)
        assert int(x["ids"].max()) < 7 and int(x["ids"].min()) >= 0
        assert int(x["other"].max()) < SAFE_ID_BOUND and x["other"].dtype == torch.int64
        got = sparsefx.run(program, x).outputs
        torch.testing.assert_close(got, sm.eval()(x["ids"], x["other"]), rtol=1e-4, atol=1e-5)
