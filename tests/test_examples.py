"""The examples run as scripts with tiny step counts and print the nnz figures each round must have."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sparsefx.models import build_model
from sparsefx.sparse.init import keep_count

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RUNS = {
    "iterative_pruning": ["--dense-steps", "4", "--steps", "3", "--batch", "16"],
    "spdf": ["--steps", "4", "--finetune-steps", "3", "--batch", "16"],
}
LEVEL_NNZ = re.compile(r"\((\d+(?:\.\d+)?)% sparse\): nnz (\d+) / (\d+)")


def _expected_nnz(level: float) -> int:
    """Kept entries of the built-in MLP's weight matrices at ``level`` (the default filter's choice)."""
    model = build_model("mlp").model
    return sum(keep_count(p.numel(), level) for p in model.parameters() if p.ndim > 1)


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    """Every example's stdout; the scripts run at the same time."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in RUNS.items()
    }
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{stderr}"
        results[name] = stdout
    return results


def _levels_and_nnz(stdout: str) -> list[tuple[float, int, int]]:
    return [(float(level) / 100, int(nnz), int(total)) for level, nnz, total in LEVEL_NNZ.findall(stdout)]


def test_iterative_pruning_rounds_prune_to_each_level(outputs: dict[str, str]) -> None:
    stdout = outputs["iterative_pruning"]
    total = _expected_nnz(0.0)
    assert f"dense: nnz {total} / {total}" in stdout
    rounds = re.findall(r"^round (\d+) ", stdout, flags=re.MULTILINE)
    assert rounds == ["1", "2", "3"], stdout
    assert _levels_and_nnz(stdout) == [(level, _expected_nnz(level), total) for level in (0.5, 0.75, 0.9)]
    assert _expected_nnz(0.9) == 8447  # floor(1638.4) + floor(6553.6) + 256; float64 int() gave 8446
    assert "retrained: loss" in stdout


def test_spdf_pretrains_sparse_then_redensifies(outputs: dict[str, str]) -> None:
    stdout = outputs["spdf"]
    total = _expected_nnz(0.0)
    assert _levels_and_nnz(stdout) == [
        (level, _expected_nnz(level), total) for level in (0.75, 0.0, 0.25, 0.75)
    ]
    for label in ("pre-training", "(a) dense fine-tuning", "(b) partial redensification to 25%"):
        assert label in stdout, stdout
    assert "(25% of dense)" in stdout and "(100% of dense)" in stdout


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``examples/<name>.py`` (registered in sys.modules for the test only: dataclasses need it).

    ``examples/`` goes on sys.path, as it is when the script runs, for the shared ``_task`` module.
    """
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("iterative_pruning", ["--levels", "0.9", "0.5"]),
        ("iterative_pruning", ["--levels", "1.0"]),
        ("spdf", ["--redensify-to", "1.5"]),
    ],
)
def test_bad_levels_are_usage_errors(
    name: str, args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exc:
        _load(name, monkeypatch).main(args)
    assert exc.value.code == 2
    assert "must" in capsys.readouterr().err
