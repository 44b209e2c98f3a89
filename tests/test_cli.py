"""The ``sparsefx`` command, run the way users run it.

Every subprocess imports torch (about 3 s), so the demo and one error run in fresh processes, started
together once per module; the other commands run through ``cli.main`` in this process with their
streams as buffers (no terminal), as do checks that need no fresh process (``--debug`` tracebacks,
exit codes 1 and 130).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparsefx
from conftest import cli_in_process
from sparsefx import cli
from sparsefx.commands import validate
from sparsefx.models.registry import build_model

PATTERNS_YAML = """\
sparsity:
  algorithm: static
  sparsity: 0.8
  param_name_patterns: "net\\\\.[02]\\\\.weight"
"""

ERRORS = {
    "bad-level": ["validate", "1.5", "--model", "mlp"],
    "unknown-model": ["validate", "0.9", "--model", "no-such-model"],
    "unknown-algorithm": ["validate", "{sparsity: 0.9, algorithm: rigll}", "--model", "mlp"],
    "missing-file": ["validate", "{tmp}/missing.yaml", "--model", "mlp"],
}

COMMANDS = {  # in this process
    "validate-float": ["validate", "0.9", "--model", "mlp"],
    "validate-yaml": ["--log-level", "DEBUG", "validate", "{tmp}/patterns.yaml", "--model", "mlp"],
    "inspect-table": ["inspect", "--model", "mlp", "--config", "0.9", "--graph"],
}
FRESH = {  # in fresh processes
    "demo": ["demo", "--steps", "5"],
    "error-bad-level": ERRORS["bad-level"],
}
INSPECT_JSON = ["inspect", "--model", "mlp", "--config", "0.9", "--format", "json"]


@pytest.fixture(scope="module")
def results(config_dir: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run every command in ``FRESH`` concurrently, in a fresh ``python -m sparsefx.cli`` each, and
    those in ``COMMANDS`` in this process meanwhile."""
    tmp = config_dir
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")}
    env.update(NO_COLOR="1", OMP_NUM_THREADS="1")  # one thread each: the processes share the cores
    running = {
        name: subprocess.Popen(
            [sys.executable, "-m", "sparsefx.cli", *_argv(argv, tmp)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
            env=env,
        )
        for name, argv in FRESH.items()
    }
    plain = dict.fromkeys(("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")) | {"NO_COLOR": "1"}
    done = {name: cli_in_process(_argv(argv, tmp), plain, tmp) for name, argv in COMMANDS.items()}
    for name, proc in running.items():
        out, err = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "patterns.yaml").write_text(PATTERNS_YAML)
    return tmp


def _argv(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv]


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def _tables(stdout: str) -> tuple[str, str]:
    """The sparse table and everything from the dense table on."""
    sparse, dense = stdout.split("dense parameters", 1)
    return sparse, dense


def test_validate_float_config(results: dict) -> None:
    sparse, dense = _tables(_ok(results["validate-float"]))
    for name in ("net.0.weight", "net.2.weight", "net.4.weight"):
        assert name in sparse
    for name in ("net.0.bias", "net.2.bias", "net.4.bias"):
        assert name in dense and name not in sparse
    assert "default exclusion: ndim <= 1" in dense
    assert "static" in sparse and "90.0%" in sparse
    assert "3 sparse / 3 dense parameters" in dense
    assert "85,002 dense -> 8,969 sparse" in dense  # exact keep counts: 1,638 + 6,553 + 256 kept, 522 biases
    assert "every decision" not in dense


def test_validate_yaml_file_with_patterns_and_debug_reasons(results: dict) -> None:
    sparse, dense = _tables(_ok(results["validate-yaml"]))
    assert "net.0.weight" in sparse and "net.2.weight" in sparse
    assert "net.4.weight" not in sparse and "net.4.weight" in dense
    assert "80.0%" in sparse
    assert "no pattern matched" in dense
    assert "2 sparse / 4 dense parameters" in dense
    decisions = dense.split("every decision", 1)[1]  # --log-level DEBUG lists every reason
    assert decisions.count("matched param_name_patterns") == 2
    assert decisions.count("no pattern matched") == 4
    assert "sparse 80.0%" in decisions


def test_inspect_table(results: dict) -> None:
    out = _ok(results["inspect-table"])
    report = sparsefx.flops(build_model("mlp").model, build_model("mlp").args, config=0.9)
    for node in ("masked_linear", "masked_linear_1", "masked_linear_2"):
        assert f" {node} " in out
    assert "total" in out
    assert f"{report.dense_forward:,}" in out and f"{report.sparse_forward:,}" in out
    assert f"{report.dense_params:,}" in out and f"{report.sparse_params:,}" in out
    assert "batch=8" in out
    assert "def forward" in out and "sparsefx_ops_masked_linear" in out  # --graph
    assert "█" in out or "#" in out  # per-layer sparsity bars


def test_inspect_json_matches_flops_in_process(capsys) -> None:
    assert cli.main(INSPECT_JSON) == 0
    data = json.loads(capsys.readouterr().out)
    spec = build_model("mlp")
    report = sparsefx.flops(spec.model, spec.args, config=0.9)
    fields = (
        "dense_forward",
        "sparse_forward",
        "dense_train",
        "sparse_train",
        "dense_params",
        "sparse_params",
    )
    assert data["totals"] == {name: getattr(report, name) for name in fields}
    counted = [row for row in data["rows"] if row["dense_flops"] is not None]
    assert sum(row["dense_flops"] for row in counted) == report.dense_forward
    assert sum(row["sparse_flops"] for row in counted) == report.sparse_forward
    masked = {row["param"]: row for row in data["rows"] if row["op"] == "masked_linear"}
    assert sorted(masked) == ["net.0.weight", "net.2.weight", "net.4.weight"]
    assert all(row["sparse"] and row["target"] == 0.9 for row in masked.values())
    assert data["capture_method"] == "fx" and data["capture_log"] == []
    assert set(data["expressions"]) == {"dense_forward", "sparse_forward"}
    assert data["symbols"] == {"batch": 8}


def _error(name: str, config_dir: Path, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """``ERRORS[name]`` in this process: the exit code, stdout and stderr."""
    code = cli.main(_argv(ERRORS[name], config_dir))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_an_error_in_a_fresh_process_is_one_line_and_exit_2(results: dict, config_dir: Path, capsys) -> None:
    result = results["error-bad-level"]  # as a user's shell sees it: nothing else on stderr
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip().splitlines() == [_error("bad-level", config_dir, capsys)[2].strip()]


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_is_one_line_and_exit_2(config_dir: Path, name: str, capsys) -> None:
    code, out, err = _error(name, config_dir, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sparsefx: error: ")
    assert "Traceback" not in err
    assert out == ""


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_debug_shows_traceback(config_dir: Path, name: str, capsys) -> None:
    plain = _error(name, config_dir, capsys)[2]
    assert cli.main(["--debug", *_argv(ERRORS[name], config_dir)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" in captured.err
    assert captured.err.strip().splitlines()[-1] == plain.strip()
    assert cli.main([*_argv(ERRORS[name], config_dir), "--debug"]) == 2  # after the subcommand too
    assert "Traceback" in capsys.readouterr().err


def test_bad_command_line_is_one_line(capsys) -> None:
    for argv in (["inspect", "--model", "mlp", "--input-shape", "8,x"], ["validate", "0.9"], ["bogus"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("sparsefx: error: "), err


def test_error_messages_name_the_problem(config_dir: Path, capsys) -> None:
    messages = {name: _error(name, config_dir, capsys)[2] for name in ERRORS}
    assert "1.5 is not in [0, 1)" in messages["bad-level"]
    assert "no-such-model" in messages["unknown-model"] and "gpt-tiny" in messages["unknown-model"]
    assert "rigll" in messages["unknown-algorithm"] and "rigl" in messages["unknown-algorithm"]
    assert "not found" in messages["missing-file"]


def test_demo_runs_end_to_end(results: dict) -> None:
    out = _ok(results["demo"])
    assert "equivalence check" in out and "max |diff|" in out
    assert "FAILED" not in out
    assert "pruned weights stayed exactly zero: ok" in out
    for label in ("forward FLOPs", "train-step FLOPs", "parameters", "reduction", "forward FLOPs saved"):
        assert label in out
    assert "emulated on the mesh (fresh inputs): outputs equal sm.eval()'s" in out
    for label in ("run summary", "realized speedup", "ideal speedup 1/(1-s)", "where the cycles go"):
        assert label in out
    assert "not available yet" not in out
    assert "frozen model (sparsefx.freeze) against the compiled model" in out
    assert "real CPU: the frozen model runs" in out and "on the emulated mesh" in out


def test_demo_writes_its_files(results: dict, config_dir: Path) -> None:
    out = _ok(results["demo"])
    folder = config_dir / "sparsefx-demo"  # the default --out, in the current directory
    assert f"wrote to sparsefx-demo{os.sep}" in out
    names = ("gpt-tiny.sfxp", "heatmap.png", "trace.json", "report.json")
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    for name in names:
        assert name in out
    program = sparsefx.load_program(str(folder / "gpt-tiny.sfxp"))
    report = json.loads((folder / "report.json").read_text())
    assert report["program"]["model"] == "GPT" and report["program"]["kernels"] == len(program.kernels)
    assert sum(report["parts"].values()) == report["cycles"] > 0
    trace = json.loads((folder / "trace.json").read_text())
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == len(program.kernels)
    assert (folder / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unexpected_error_exits_1_and_interrupt_130(monkeypatch, capsys) -> None:
    def boom(args: object) -> int:
        raise RuntimeError("boom\nsecond line")

    def interrupt(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(validate, "cmd_validate", boom)
    assert cli.main(["validate", "0.9", "--model", "mlp"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sparsefx: error: RuntimeError: boom | second line")

    monkeypatch.setattr(validate, "cmd_validate", interrupt)
    assert cli.main(["validate", "0.9", "--model", "mlp"]) == 130


def test_run_demo_is_deterministic_and_learns() -> None:
    from rich.console import Console

    from sparsefx.demo import run_demo

    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    threads = torch.get_num_threads()
    first = run_demo("mlp", sparsity=0.75, steps=20, seed=3, console=quiet)
    assert torch.get_num_threads() == threads  # one thread for a small model, restored after
    second = run_demo("mlp", sparsity=0.75, steps=20, seed=3, console=quiet)
    timed = {"seconds": 0.0, "frozen_speedup": 0.0}  # wall-clock figures
    assert dataclasses.replace(first, **timed) == dataclasses.replace(second, **timed)
    assert first.max_abs_diff <= 1e-5 and first.max_abs_diff_trained <= 1e-5
    assert first.pruned_stay_zero and first.masks_unchanged
    assert first.loss_after < first.loss_before
    assert first.flops.sparse_forward < first.flops.dense_forward
    assert first.emulated_max_diff <= 1e-4 and first.cycles > 0
    assert first.frozen_max_diff <= 1e-5 and first.frozen_speedup > 0
    assert first.ideal == pytest.approx(4.0, rel=1e-3)  # 1 / (1 - 0.75)
    assert first.files == ()  # no out folder, no files


def test_demo_fails_when_the_emulated_outputs_differ(monkeypatch, tmp_path) -> None:
    from rich.console import Console

    from sparsefx.demo import run_demo
    from sparsefx.errors import VerifyError

    real = sparsefx.run

    def off_by_one(program, inputs, **kwargs):
        result = real(program, inputs, **kwargs)
        return dataclasses.replace(result, outputs=result.outputs + 1)

    monkeypatch.setattr(sparsefx, "run", off_by_one)
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    with pytest.raises(VerifyError, match="emulated outputs differ from the model's"):
        run_demo("mlp", sparsity=0.5, steps=0, console=quiet, out=tmp_path / "demo")
    assert not (tmp_path / "demo").exists()  # nothing written for a failed check


def test_main_leaves_the_callers_logging_as_it_was(capsys) -> None:
    """A notebook or test that runs ``cli.main`` keeps its own ``sparsefx`` logger afterwards."""
    log = logging.getLogger("sparsefx")
    before = log.handlers[:], log.level, log.propagate
    assert cli.main(["--log-level", "DEBUG", "validate", "0.9", "--model", "mlp"]) == 0
    assert (log.handlers[:], log.level, log.propagate) == before
    assert cli.main(["validate", "1.5", "--model", "mlp"]) == 2  # and after an error
    assert (log.handlers[:], log.level, log.propagate) == before
    capsys.readouterr()
