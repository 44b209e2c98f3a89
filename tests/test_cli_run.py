"""``sparsefx run PROGRAM``: tables, JSON, the report files, inputs from a file, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sparsefx
from conftest import LOWER_MESH
from sparsefx.cli import main
from sparsefx.models import build_model
from sparsefx.runtime.random_inputs import random_inputs
from sparsefx.runtime.report import report_data


@pytest.fixture(scope="module")
def program_file(tmp_path_factory) -> str:
    """The built-in mlp at 90% lowered pipelined, in a program file."""
    torch.manual_seed(0)
    spec = build_model("mlp")
    sm = sparsefx.compile(spec.model, 0.9, spec.args)
    path = tmp_path_factory.mktemp("run") / "mlp.sfxp"
    sparsefx.lower(sm, spec.args, mesh=LOWER_MESH["mlp"]).save(str(path))
    return str(path)


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("sparsefx: error: ") and "\n" not in err, captured.err
    assert "Traceback" not in err and captured.out == ""
    return err


def test_run_prints_the_report_and_writes_the_files(program_file, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    files = {"json": tmp_path / "r.json", "heatmap": tmp_path / "busy.png", "trace": tmp_path / "t.json"}
    argv = ["run", program_file, "-o", str(files["json"]), "--trace", str(files["trace"])]
    assert main([*argv, "--heatmap", str(files["heatmap"]), "--seed", "5"]) == 0
    out = capsys.readouterr().out
    program = sparsefx.load_program(program_file)
    stats = sparsefx.run(program, random_inputs(program, seed=5)).stats
    for title in ("run summary", "sparse against the dense baseline", "where the cycles go", "kernels"):
        assert title in out
    assert f"{stats.cycles:,}" in out and f"{stats.dense.dense_cycles:,}" in out
    assert "random, seed 5" in out and "MLP on a 16x16 mesh" in out
    for what in ("JSON report", "Chrome trace", "heatmap"):
        assert f"wrote the {what} to" in out
    report = json.loads(files["json"].read_text())
    assert report["cycles"] == stats.cycles and report["program_file"] == program_file
    assert report == json.loads(json.dumps(report_data(stats, program) | {"program_file": program_file}))
    trace = json.loads(files["trace"].read_text())
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"] == [k.name for k in stats.kernels]
    assert files["heatmap"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_to_stdout_is_clean(program_file, capsys) -> None:
    assert main(["run", program_file, "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert captured.err == ""
    assert data["program"]["mode"] == "pipelined" and data["executor"] == "fast"
    assert sum(data["parts"].values()) == data["cycles"] > 0


def test_inputs_from_a_safetensors_file(program_file, tmp_path, capsys) -> None:
    from safetensors.torch import save_file

    program = sparsefx.load_program(program_file)
    x = {"x": torch.randn(program.inputs[0].shape)}
    assert [s.name for s in program.inputs] == ["x"]
    path = tmp_path / "inputs.safetensors"
    save_file(x, str(path))
    assert main(["run", program_file, "--inputs", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cycles"] == sparsefx.run(program, x).stats.cycles
    save_file({"y": x["x"]}, str(path))
    assert main(["run", program_file, "--inputs", str(path)]) == 2
    assert "inputs ['y'] are not inputs of the program" in _one_line_error(capsys)
    save_file({"x": x["x"][:2]}, str(path))
    assert main(["run", program_file, "--inputs", str(path)]) == 2
    assert "input 'x' has shape [2, 64]" in _one_line_error(capsys)
    path.write_bytes(b"not safetensors")
    assert main(["run", program_file, "--inputs", str(path)]) == 2
    assert "cannot read the inputs file" in _one_line_error(capsys)


def test_the_reference_executor_runs_when_asked(tmp_path, capsys) -> None:
    """``--executor reference`` runs the reference executor: the JSON is its report on the same random
    inputs, which names it, and not the fast executor's. A two-layer MLP on a 4x4 mesh keeps it quick."""
    torch.manual_seed(0)
    x = torch.randn(2, 32)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    path = str(tmp_path / "small.sfxp")
    sparsefx.lower(sparsefx.compile(model, 0.9, (x,)), (x,), mesh=(4, 4)).save(path)
    assert main(["run", path, "--executor", "reference", "--format", "json", "--seed", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["executor"] == "reference"
    program = sparsefx.load_program(path)
    inputs = random_inputs(program, seed=3)
    for name in ("reference", "fast"):
        stats = sparsefx.run(program, inputs, executor=name).stats
        report = json.loads(json.dumps(report_data(stats, program) | {"program_file": path}))
        assert (printed == report) is (name == "reference"), name


def test_bad_input_is_one_line_and_exit_2(program_file, tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "missing.sfxp")]) == 2
    assert "missing.sfxp" in _one_line_error(capsys)
    bogus = tmp_path / "bogus.sfxp"
    bogus.write_bytes(b"not a zip at all")
    assert main(["run", str(bogus)]) == 2
    assert "bogus.sfxp" in _one_line_error(capsys)
    assert main(["run", program_file, "--executor", "warp"]) == 2
    assert "warp" in _one_line_error(capsys)
    assert main(["run", program_file, "--trace", str(tmp_path / "no" / "such" / "dir" / "t.json")]) == 2
    assert "cannot write" in _one_line_error(capsys)
    assert not Path(tmp_path / "no").exists()
