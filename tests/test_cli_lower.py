"""``sparsefx lower`` and ``sparsefx inspect model.sfxp``: program files, tables, DOT and the mesh picture."""

from __future__ import annotations

import json

import pytest

import sparsefx
from sparsefx.cli import main


@pytest.fixture(scope="module")
def program_file(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("lower") / "mlp.sfxp")
    assert main(["lower", "--model", "mlp", "--config", "0.9", "--mesh", "16x16", "-o", path]) == 0
    return path


def test_lower_writes_a_program_that_loads_and_verifies(program_file: str, capsys) -> None:
    program = sparsefx.load_program(program_file)
    program.verify()
    assert [k.op for k in program.kernels].count("sparse_matmul") == 3
    assert program.mesh == sparsefx.MeshSpec(16, 16) and program.placement == "balanced"


def test_lower_json_summary(tmp_path, capsys) -> None:
    path = str(tmp_path / "s.sfxp")
    code = main(
        [
            "lower",
            "--model",
            "mlp",
            "--config",
            "0.9",
            "--mesh",
            "small",
            "--mode",
            "streaming",
            "--placement",
            "block",
            "-o",
            path,
            "--format",
            "json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["mode"] == "streaming" and data["totals"]["placement"] == "block"
    assert data["totals"]["weight_stream_bytes"] > 0
    assert data["totals"]["nnz"] == sum(k["nnz"] for k in data["kernels"] if k["nnz"] is not None)


def test_inspect_program_tables_dot_and_png(program_file: str, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # table titles on one line, whatever terminal the run inherits
    dot = tmp_path / "p.dot"
    code = main(["inspect", program_file, "--dot", str(dot)])
    out = capsys.readouterr().out
    assert code == 0
    assert "Program totals" in out and "masked_linear" in out and "colors used" in out
    text = dot.read_text()
    assert text.startswith("digraph program {") and '"host:in" -> "masked_linear"' in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "mesh.png"
    assert main(["inspect", program_file, "--png", str(png), "--heat", "sram"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_program_json(program_file: str, capsys) -> None:
    assert main(["inspect", program_file, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["kernels"] == len(data["kernels"]) == 3  # the ReLUs are the layers' epilogues


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    bogus = tmp_path / "bogus.sfxp"
    bogus.write_bytes(b"not a zip at all")
    assert main(["inspect", str(bogus)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparsefx: error:") and "\n" not in err and "bogus.sfxp" in err
    assert (
        main(["lower", "--model", "mlp", "--config", "0.9", "--mesh", "2x2", "-o", str(tmp_path / "x")]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert "needs at least 3 columns" in err and "streaming" in err and "\n" not in err
    assert not (tmp_path / "x").exists()
    assert (
        main(["lower", "--model", "mlp", "--config", "0.9", "--mesh", "64by64", "-o", str(tmp_path / "y")])
        == 2
    )
    assert "mesh '64by64' is not WIDTHxHEIGHT" in capsys.readouterr().err
    assert main(["inspect"]) == 2
    assert "--model SPEC" in capsys.readouterr().err
