"""Streaming programs load an embedding's table rows the ids pick (one per id, from the host), not its
whole table; pipelined programs keep the table on the mesh. ``verify`` refuses the gather elsewhere."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sparsefx
from sparsefx.errors import VerifyError
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime.layout import weight_bytes
from sparsefx.runtime.memory import pe_bytes


@pytest.fixture(scope="module")
def gpt() -> tuple:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, vocab_size=512, max_seq_len=64)).eval()
    ids = torch.randint(0, 512, (2, 16))
    return sparsefx.compile(model, 0.8, (ids,)), ids


def test_a_streaming_embedding_loads_one_row_per_id(gpt):
    sm, ids = gpt
    p = sparsefx.lower(sm, (ids,), mesh=(16, 16), mode="streaming")
    emb = next(k for k in p.kernels if k.op == "embedding")
    assert emb.attrs["gather"] == "host"
    table = p.specs[emb.arrays["table"]]
    assert emb.attrs["shapes"]["table"] == [512, 32]
    assert weight_bytes(p, emb) == ids.numel() * 32 * 4  # 32 ids of 32 fp32 values, not 512 rows
    assert int(pe_bytes(p, emb).sum()) < table.nbytes  # the table is not kept on the PEs
    fresh = torch.randint(0, 512, (2, 16))
    out = sparsefx.run(p, (fresh,))
    assert torch.allclose(out.outputs, sm.eval()(fresh), rtol=1e-4, atol=1e-5)
    ref = sparsefx.run(p, (fresh,), executor="reference")
    assert abs(out.stats.cycles / ref.stats.cycles - 1) <= 0.05


def test_a_pipelined_embedding_keeps_its_table_and_verify_refuses_a_gather_there(gpt):
    sm, ids = gpt
    p = sparsefx.lower(sm, (ids,), mesh=(48, 16), mode="pipelined")
    emb = next(k for k in p.kernels if k.op == "embedding")
    assert "gather" not in emb.attrs
    assert int(pe_bytes(p, emb).sum()) >= p.specs[emb.arrays["table"]].nbytes
    emb.attrs["gather"] = "host"
    with pytest.raises(VerifyError, match="gather='host'"):
        p.verify()


def test_verify_refuses_a_gather_on_another_kernel(gpt):
    sm, ids = gpt
    p = sparsefx.lower(sm, (ids,), mesh=(16, 16), mode="streaming")
    k = next(k for k in p.kernels if k.op == "layer_norm")
    p.kernels[p.kernels.index(k)] = dataclasses.replace(k, attrs=dict(k.attrs, gather="host"))
    with pytest.raises(VerifyError, match="only an embedding"):
        p.verify()
