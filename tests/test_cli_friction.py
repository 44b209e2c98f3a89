"""What a CLI user feels: ``--version`` and ``--help`` answer at once (nothing heavy is imported)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sparsefx

HEAVY = ("torch", "torch.export", "sympy", "rich")


def _modules_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter and say which heavy modules it imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import sparsefx",
        "import sparsefx.cli",
        "import sparsefx.models.names",
        "import contextlib, io, sparsefx.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert sparsefx.cli.main(['--version']) == 0",
        "import contextlib, io, sparsefx.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert sparsefx.cli.main(['--help']) == 0",
        "import contextlib, io, sparsefx.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert sparsefx.cli.main(['validate', '--help']) == 0",
    ],
    ids=["import-sparsefx", "import-cli", "import-model-names", "version", "help", "validate-help"],
)
def test_light_paths_import_no_heavy_module(code: str) -> None:
    assert _modules_after(code) == dict.fromkeys(HEAVY, False)


def test_lazy_public_names_still_work() -> None:
    code = (
        "import torch, sparsefx\n"
        "from sparsefx import compile, CheckpointError, SparsityConfig\n"
        "assert compile is sparsefx.compile and SparsityConfig is sparsefx.SparsityConfig\n"
        "sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5)\n"
        "assert sm.sparsity_report()[0].nnz == 16\n"
        "assert sparsefx.sparse.RigL is not None and sparsefx.errors.CheckpointError is CheckpointError\n"
        "assert set(sparsefx.__all__) <= set(dir(sparsefx))\n"
    )
    assert _modules_after(code)["torch"]


def test_every_public_name_resolves() -> None:
    for name in sparsefx.__all__:
        assert getattr(sparsefx, name) is not None
    assert isinstance(sparsefx.__version__, str)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sparsefx.nope  # noqa: B018


def test_model_names_match_the_builders() -> None:
    from sparsefx.models import registry
    from sparsefx.models.names import BUILTIN_MODELS

    assert set(registry._BUILDERS) == set(BUILTIN_MODELS)
    assert registry.BUILTIN_MODELS is BUILTIN_MODELS
