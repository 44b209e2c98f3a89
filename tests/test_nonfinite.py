"""NaN and inf on the mesh: a sparse matmul multiplies only the weights it keeps.

The mesh stores a sparse layer's kept weights and nothing else, so a NaN or inf input reaches only the
outputs that a kept weight connects it to, exactly as a CSR product (``torch.sparse.mm``) gives. The
compiled model computes the masked dense product, where ``NaN * 0`` is NaN: there the same input spreads to
every output of its row. Both are right for what they model; these tests pin the difference down and
check that ``sparsefx.run`` says so when it happens.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import sparsefx

EXECUTORS = ("fast", "reference")


def _csr_forward(model: nn.Sequential, masks: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``model`` with each linear layer as a CSR product of its kept weights (what a sparse kernel does)."""
    h = x
    for name, layer in model.named_children():
        if not isinstance(layer, nn.Linear):
            h = layer(h)
            continue
        kept = torch.where(masks[f"{name}.weight"], layer.weight, 0).detach().to_sparse_csr()
        h = torch.sparse.mm(kept, h.T).T + layer.bias.detach()
    return h


@pytest.fixture(scope="module")
def mlp() -> tuple[nn.Sequential, sparsefx.SparseModel, sparsefx.DataflowProgram]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    sm = sparsefx.compile(model, 0.9, (x,)).eval()
    return model, sm, sparsefx.lower(sm, x, mesh=(8, 8))


def _poisoned(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 16, generator=gen)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3, 7] = float("-inf")
    return x


@pytest.mark.parametrize("executor", EXECUTORS)
def test_mesh_equals_a_csr_product_with_nan_and_inf_inputs(mlp, executor):
    model, sm, program = mlp
    for seed in range(3):
        x = _poisoned(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = sparsefx.run(program, x, executor=executor).outputs
        want = _csr_forward(model, sm.masks, x)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.isinf(), want.isinf())
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_masked_dense_model_spreads_nan_where_the_mesh_does_not(mlp):
    _, sm, program = mlp
    x = torch.randn(4, 16)
    x[1, 3] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = sparsefx.run(program, x).outputs
    with torch.no_grad():
        dense = sm(x)
    assert dense[1].isnan().all()  # NaN * 0 at every pruned weight of that input
    assert mesh.isnan().sum() < dense.isnan().sum()
    assert not (mesh.isnan() & ~dense.isnan()).any()  # the mesh's NaNs are a subset of the model's
    finite = ~dense.isnan()
    torch.testing.assert_close(mesh[finite], dense[finite], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_run_warns_when_a_sparse_matmul_reads_nan_or_inf(mlp, executor):
    _, _, program = mlp
    with pytest.warns(UserWarning, match=r"NaN or inf.*kept weights"):
        sparsefx.run(program, _poisoned(0), executor=executor)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sparsefx.run(program, torch.randn(4, 16), executor=executor)  # finite inputs: no warning
