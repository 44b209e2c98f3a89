"""Bad example inputs and models that raise give one CaptureError line; no torch warning or log leaks."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import sparsefx


def test_wrongly_shaped_example_inputs_name_the_shapes(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with caplog.at_level(logging.DEBUG, logger="torch"), pytest.raises(sparsefx.CaptureError) as info:
        sparsefx.compile(model, 0.5, torch.randn(3, 5))
    message = str(info.value)
    assert "\n" not in message
    assert "(float32[3, 5]) do not fit Sequential" in message and "[3, 5] X [8, 8]" in message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no fake-tensor log"


class Checks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 8:
            raise ValueError(f"expected 8 features, got {x.shape[-1]}")
        return self.fc(x)


def test_a_forward_that_raises_on_the_example_inputs_is_a_capture_error() -> None:
    with pytest.raises(sparsefx.CaptureError, match=r"raised on the example inputs \(float32\[2, 5\]\)"):
        sparsefx.compile(Checks(), 0.5, torch.randn(2, 5))
    assert sparsefx.compile(Checks(), 0.5, torch.randn(2, 8)).capture_method == "export"


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(x)[0])


def test_no_torch_warning_leaks_out_of_the_passes() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sm = sparsefx.compile(Recurrent(), 0.5, torch.randn(2, 5, 8))
    assert [str(w.message) for w in caught] == []
    assert "lstm.weight_ih_l0" in sm.masks
    sparsefx.compile(Recurrent(), 0.5, torch.randn(2, 5, 8), debug=True)  # a warning: PassError


FACTORIES = {
    "raises": """
        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                if h.sum() > 1e9:  # value-dependent: fx and export give up, partial capture runs it
                    return h
                raise RuntimeError("this model cannot run")

        def build():
            return Broken(), ((torch.randn(2, 8),), {})
    """,
    "kernel": """
        def build():
            return nn.Sequential(nn.Linear(8, 8), nn.ReLU()), ((torch.randn(2, 5),), {})
    """,
}
EXPECTED = {"raises": "this model cannot run", "kernel": "do not fit Sequential"}


@pytest.mark.parametrize("case", sorted(FACTORIES))
def test_inspect_of_a_model_whose_forward_raises_exits_2(case: str, tmp_path: Path) -> None:
    source = "import torch\nfrom torch import nn\n" + textwrap.dedent(FACTORIES[case])
    (tmp_path / "user_model.py").write_text(source)
    run = subprocess.run(
        [sys.executable, "-m", "sparsefx.cli", "inspect", "--model", "user_model:build", "--config", "0.5"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1 and EXPECTED[case] in run.stderr, run.stderr
    assert "FLOP" not in run.stdout
