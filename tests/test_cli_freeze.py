"""``sparsefx bench`` and ``sparsefx freeze``: the tables and JSON of a frozen model's timing, and a
frozen state written atomically that a weights-only load reads back into the same frozen model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import sparsefx
from sparsefx import cli
from sparsefx.models.registry import build_model


def test_bench_prints_each_packed_layer_and_the_whole_model(tmp_path: Path, capsys, monkeypatch) -> None:
    import importlib

    choice = ("torch",) * 5  # every layer packed, whatever this machine's timings say
    monkeypatch.setattr(importlib.import_module("sparsefx.frozen.freeze"), "choose", lambda *a, **k: choice)
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "mlp", "--config", "0.9", "--rounds", "3", "--json", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "frozen against dense" in text and "whole model:" in text and "MB dense" in text
    report = json.loads(out.read_text())
    assert report["model"] == "mlp" and report["whole"]["speedup"] > 0 and len(report["whole"]["rounds"]) == 3
    sm = sparsefx.compile(build_model("mlp", seed=0).model, 0.9)
    assert [r["layer"] for r in report["layers"]] == [n.rpartition(".")[0] for n in sm.masks]
    assert all(
        r["kernel"] in ("spmv", "rows", "torch", "dense") and r["tokens"] >= 1 for r in report["layers"]
    )


def test_freeze_writes_a_state_a_weights_only_load_reads_back(tmp_path: Path, capsys, monkeypatch) -> None:
    import importlib

    choice = ("torch",) * 5  # packed, so the state holds packed weights
    monkeypatch.setattr(importlib.import_module("sparsefx.frozen.freeze"), "choose", lambda *a, **k: choice)
    path = tmp_path / "frozen.pt"
    assert (
        cli.main(["freeze", "--model", "mlp", "--config", "0.9", "--backend", "torch", "-o", str(path)]) == 0
    )
    assert f"wrote {path}" in capsys.readouterr().out
    state = torch.load(path, weights_only=True)
    spec = build_model("mlp", seed=0)
    fast = sparsefx.freeze(sparsefx.compile(spec.model, 0.9, spec.args).eval(), backend="torch")
    assert set(state) == set(fast.state_dict()) and any(k.endswith("weight_values") for k in state)
    fast.load_state_dict(state)
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temp file left


def test_a_bad_config_is_one_line_and_exit_2(capsys) -> None:
    assert cli.main(["bench", "--model", "mlp", "--config", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1.5" in err
