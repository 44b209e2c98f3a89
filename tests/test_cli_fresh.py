"""The ``sparsefx`` command in a fresh process, with models from the current folder.

A test process has imported sparsefx's algorithms and the test folder's modules long before a command
runs, which hides what a user's first command meets: an algorithm module that is imported on first
need, and a ``--model package.module:factory`` found only through ``sys.path``. So every command here
runs in its own new process, from a temp folder that holds the model modules (``evalmodels.py``, a
``mypkg`` package); the commands start together, to share the torch import time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparsefx.config.registry import BUILTIN_ALGORITHMS

EVALMODELS = """\
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.ffn = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return self.ffn(x)


def tiny():
    return Tiny()
"""

MYPKG_MODELS = """\
import torch


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), torch.randn(2, 8)
"""

# A Model Zoo 1.8 file: flat keys, no algorithm (static by default).
FLAT_YAML = "sparsity: 0.5\ninit_method: topk\nseed: 1\nparam_name_patterns: 'ffn.*weight'\n"

# One config per built-in algorithm (the dynamic ones need a schedule that changes, or an update).
ALGORITHM_YAML = {
    "static": "algorithm: static\nsparsity: 0.5\n",
    "gmp": "algorithm: gmp\nsparsity: {type: polynomial, init: 0.0, final: 0.5, begin: 0, end: 10}\n"
    "update: {freq: 2}\n",
    "set": "algorithm: set\nsparsity: 0.5\nupdate: {freq: 10}\n",
    "rigl": "algorithm: rigl\nsparsity: 0.5\nupdate: {freq: 10}\n",
}


def _script() -> list[str]:
    """The installed ``sparsefx`` script (its own folder, not the current one, is first on its
    ``sys.path``), else ``python -m sparsefx.cli``."""
    script = Path(sys.executable).with_name("sparsefx")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sparsefx.cli"]


def _commands(here: Path, elsewhere: Path) -> dict[str, tuple[list[str], Path]]:
    """Five processes: each built-in algorithm once (static through the Model Zoo flat file, which names
    no algorithm), ``mypkg`` found from the folder that holds it and not found from another."""
    flat = ["inspect", "--model", "evalmodels:tiny", "--input-shape", "2,16", "--config", "flat.yaml"]
    return {
        "static": (flat, here),
        "gmp": (["validate", "gmp.yaml", "--model", "evalmodels:tiny"], here),
        "set": (["validate", "set.yaml", "--model", "mypkg.models:mlp"], here),
        "rigl": (["validate", "rigl.yaml", "--model", "evalmodels:tiny"], here),
        "missing-mypkg": (["validate", "0.5", "--model", "mypkg.models:mlp"], elsewhere),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    here = tmp_path_factory.mktemp("models")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (here / "evalmodels.py").write_text(EVALMODELS)
    (here / "mypkg").mkdir()
    (here / "mypkg" / "__init__.py").write_text("")
    (here / "mypkg" / "models.py").write_text(MYPKG_MODELS)
    (here / "flat.yaml").write_text(FLAT_YAML)
    for name, text in ALGORITHM_YAML.items():
        (here / f"{name}.yaml").write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORCE_COLOR", "COLUMNS")}
    env.update(NO_COLOR="1", OMP_NUM_THREADS="1")
    running = {
        name: subprocess.Popen(
            [*_script(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
        )
        for name, (argv, cwd) in _commands(here, elsewhere).items()
    }
    done = {}
    for name, proc in running.items():
        out, err = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "error" not in result.stderr
    return result.stdout


def test_every_builtin_algorithm_runs_in_a_fresh_process() -> None:
    commands = set(_commands(Path(), Path())) - {"missing-mypkg"}
    assert set(ALGORITHM_YAML) == set(BUILTIN_ALGORITHMS) == commands


@pytest.mark.parametrize("name", ("gmp", "rigl"))
def test_validate_a_dynamic_algorithm_in_a_fresh_process(results: dict, name: str) -> None:
    out = _ok(results[name])
    assert "ffn.0.weight" in out and "ffn.2.weight" in out and name in out


def test_inspect_a_model_zoo_flat_config_in_a_fresh_process(results: dict) -> None:
    out = _ok(results["static"])  # no algorithm key: static
    assert "ffn.0.weight" in out and "ffn.2.weight" in out and "50.0%" in out


def test_a_model_package_in_the_current_folder_is_found(results: dict) -> None:
    out = _ok(results["set"])
    assert "0.weight" in out and "set" in out


def test_model_package_not_found_says_where_it_looked_and_how_to_fix(results: dict) -> None:
    result = results["missing-mypkg"]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = result.stderr
    assert "No module named 'mypkg'" in message
    assert "looked for mypkg/ or mypkg.py in" in message
    assert "run from the folder that holds mypkg/" in message and "PYTHONPATH" in message
