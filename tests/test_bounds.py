"""Bad sizes are refused by name before anything is allocated, and the SRAM figure has one definition.

- ``sparsefx.lower`` with example inputs the model cannot take is a ``LoweringError`` naming them;
- a mesh larger than the limit (the ``wse3`` preset's PEs, or ``SPARSEFX_MAX_MESH_PES``) is a
  ``LoweringError`` from ``MeshSpec``, ``lower`` and ``mesh_spec``, checked before the model runs;
- ``sparsefx inspect`` and ``sparsefx run`` report the same SRAM figure under the same label.

Hostile program texts and files (huge meshes among them) are in ``test_program_text.py`` and
``test_program_files.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

import sparsefx
from sparsefx import cli
from sparsefx.errors import LoweringError
from sparsefx.runtime.memory import SRAM_LABEL, sram_needed
from sparsefx.runtime.mesh import MAX_MESH_PES, MAX_MESH_PES_ENV, PRESETS, MeshSpec, max_mesh_pes, mesh_spec
from sparsefx.runtime.summary import summary


@pytest.fixture(scope="module")
def mlp() -> sparsefx.SparseModel:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    return sparsefx.compile(model, 0.5, torch.randn(8, 16))


# -- example inputs that do not fit --------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "dtype", "found"),
    [
        ((2, 9), torch.float32, r"mat1 and mat2 shapes cannot be multiplied \(2x9 and 16x32\)"),
        ((2, 16), torch.float64, r"same dtype"),
    ],
)
def test_lower_with_inputs_the_model_cannot_take(mlp, shape, dtype, found: str) -> None:
    x = torch.randn(shape, dtype=dtype)
    training = mlp.training
    with pytest.raises(LoweringError, match=found) as info:
        sparsefx.lower(mlp, x, mesh=(8, 8))
    message = str(info.value)
    given = f"{str(dtype).removeprefix('torch.')}{list(shape)}"
    assert f"example inputs ({given}) do not fit Sequential" in message
    assert "at graph node masked_linear" in message  # the node that refused them
    assert "compiled with example inputs (float32[8, 16])" in message  # what the model takes
    assert mlp.training == training  # its mode is left as it was


# -- mesh sizes ----------------------------------------------------------------------------------
def test_the_limit_is_the_largest_preset() -> None:
    assert MAX_MESH_PES == max(mesh.pes for mesh, _ in PRESETS.values()) == PRESETS["wse3"][0].pes
    assert max_mesh_pes() == MAX_MESH_PES
    MeshSpec(762, 1172)  # the limit itself is fine
    MeshSpec(1172, 762)


@pytest.mark.parametrize("mesh", [(100000, 100000), "30000x30000", MAX_MESH_PES + 1])
def test_too_large_meshes_are_refused_by_name(mesh) -> None:
    spec = (mesh, 1) if isinstance(mesh, int) else mesh
    text = f"{spec[0]}x{spec[1]}" if isinstance(spec, tuple) else spec
    with pytest.raises(
        LoweringError, match=f"mesh {text} has .* PEs; sparsefx takes at most 893,064"
    ) as info:
        mesh_spec(spec)
    assert MAX_MESH_PES_ENV in str(info.value)


def test_lower_refuses_a_huge_mesh_before_running_the_model(mlp) -> None:
    calls = []
    handle = mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(LoweringError, match="mesh 100000x100000 has 10,000,000,000 PEs"):
            sparsefx.lower(mlp, torch.randn(8, 16), mesh=(100000, 100000))
    finally:
        handle.remove()
    assert not calls


def test_the_lower_command_refuses_a_huge_mesh_in_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "big.sfxp"
    argv = ["lower", "--model", "mlp", "--config", "0.9", "--mesh", "30000x30000", "-o", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparsefx: error: mesh 30000x30000 has 900,000,000 PEs; sparsefx takes at most")
    assert MAX_MESH_PES_ENV in err and not out.exists()


def test_the_environment_raises_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_MESH_PES_ENV, str(2 * MAX_MESH_PES))
    assert MeshSpec(1000, 1000).pes == 10**6
    with pytest.raises(LoweringError, match=f"at most {2 * MAX_MESH_PES:,}, as {MAX_MESH_PES_ENV} allows"):
        MeshSpec(2000, 1000)
    monkeypatch.setenv(MAX_MESH_PES_ENV, "10")  # it never lowers the limit: the presets stay usable
    assert max_mesh_pes() == MAX_MESH_PES and mesh_spec("wse3").pes == MAX_MESH_PES
    monkeypatch.setenv(MAX_MESH_PES_ENV, "lots")
    assert MeshSpec(4, 4).pes == 16  # the variable is read only for a mesh past the presets
    with pytest.raises(LoweringError, match=f"{MAX_MESH_PES_ENV}='lots' is not valid"):
        MeshSpec(1000, 1000)


# -- one SRAM figure ----------------------------------------------------------------------------
def test_inspect_and_run_report_the_same_sram_figure(mlp, tmp_path, capsys) -> None:
    program = sparsefx.lower(mlp, torch.randn(8, 16), mesh=(8, 8))
    assert any(k.attrs.get("rows_in_flight", 2) > 2 for k in program.kernels)  # where they used to differ
    for k in program.kernels:  # measured again after plan-blocks chose the rows in flight
        assert k.stats.get("sram_max", sram_needed(program, k)) == sram_needed(program, k)
    stats = sparsefx.run(program, torch.randn(8, 16)).stats
    assert (
        summary(program)["totals"]["sram_max"]
        == stats.sram_max
        == max(sram_needed(program, k) for k in program.kernels)
    )
    path = tmp_path / "mlp.sfxp"
    program.save(str(path))
    assert cli.main(["inspect", str(path), "--format", "json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert cli.main(["run", str(path), "--format", "json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert inspected["totals"]["sram_max"] == ran["sram_max"] == stats.sram_max
    assert cli.main(["inspect", str(path)]) == 0
    inspect_table = capsys.readouterr().out
    assert cli.main(["run", str(path)]) == 0
    run_table = capsys.readouterr().out
    for table in (inspect_table, run_table):  # one label, the same number
        assert " ".join(table.split()).count(f"{stats.sram_max:,}") >= 1
    assert "SRAM needed" in inspect_table and "SRAM needed" in run_table
    assert SRAM_LABEL.startswith("SRAM needed by the busiest PE")
