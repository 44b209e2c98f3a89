"""Results that stay where they are made (``runtime/homes.py``): in a streaming program a kernel without
stored weights keeps its result on its row tiles' PEs, and a sparse matmul each output on the column
where its sum ends; both executors end its step when its last share is made and send each share again
from its PE, the SRAM model counts the shares there, and outputs stay PyTorch's."""

from __future__ import annotations

import math

import pytest
import torch

import sparsefx
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.held import held_peak, kept_beside
from sparsefx.runtime.homes import CONV, back, kept_where, stays, sums
from sparsefx.runtime.memory import bias_pes, pe_bytes


@pytest.fixture(scope="module")
def gpt() -> tuple:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, vocab_size=64, max_seq_len=64)).eval()
    ids = torch.randint(0, 64, (2, 16))
    sm = sparsefx.compile(model, 0.8, (ids,))
    return sm, ids, sparsefx.lower(sm, (ids,), mesh=(16, 16), mode="streaming")


def test_which_results_stay(gpt):
    sm, ids, p = gpt
    kinds = {k.op: stays(p, k) for k in p.kernels if k.name not in p.outputs}
    assert kinds["matmul"] and kinds["softmax"] and kinds["layer_norm"] and kinds["elementwise"]
    assert kinds["sparse_matmul"] and not kinds["layout"] and not kinds["constant"]
    assert not any(stays(p, p.kernel(name)) for name in p.outputs)
    piped = sparsefx.lower(sm, (ids,), mesh=(32, 16), mode="pipelined")
    assert not any(stays(piped, k) for k in piped.kernels)


def test_a_tiled_result_ends_when_its_last_share_is_made_in_both_executors(gpt):
    _, ids, p = gpt
    tiled = [k for k in p.kernels if k.attrs.get("row_tiles", 1) > 1 and stays(p, k)]
    assert tiled
    fast = simulate(p)
    for k in tiled:
        flow = fast.flows[k.name]
        assert flow.back is not None and torch.equal(flow.back, back(p, k))
        kt = next(t for t in fast.kernels if t.name == k.name)
        assert kt.end == int(flow.ready.max())  # no trip to the region's edge
        assert int(back(p, k).max()) <= k.region.width - 1


def test_a_sparse_matmul_spreads_each_lane_of_its_result_over_its_columns(gpt):
    _, _, p = gpt
    fast = simulate(p)
    matmuls = [k for k in p.kernels if k.op == "sparse_matmul" and stays(p, k)]
    assert matmuls and all(k.attrs.get("kind") not in CONV for k in matmuls)
    for k in matmuls:
        lo, hi = p.array(k, "out_lo").long(), p.array(k, "out_hi").long()
        col = torch.arange(k.region.pes) % k.region.width
        last, home = sums(p, k)
        for o in range(int(k.attrs["out_features"])):  # the last column a PE of which holds output o
            holds = (lo <= o) & (o < hi)
            assert int(last[o]) == (int(col[holds].max()) if bool(holds.any()) else k.region.width - 1)
        x, y, nbytes = kept_where(p, k)
        per_pe = torch.unique(y * p.mesh.width + x, return_counts=True)[1]
        lane_features = -(-int(k.attrs["out_features"]) // k.region.height)
        assert int(per_pe.max()) <= -(-lane_features // k.region.width)  # a lane's features spread
        flow = fast.flows[k.name]
        assert torch.equal(flow.back, k.region.width - 1 - home)
        kt = next(t for t in fast.kernels if t.name == k.name)
        assert kt.end == int(flow.ready.max())  # no trip to the region's edge
        if "bias" in k.arrays:  # each bias on its output's lane, on the column where its sum is whole
            lanes = (bias_pes(p, k) // k.region.width).tolist()
            assert lanes == sorted(lanes) and torch.equal(bias_pes(p, k) % k.region.width, last)


def test_both_executors_agree_and_match_pytorch(gpt):
    sm, _, p = gpt
    fresh = torch.randint(0, 64, (2, 16))
    fast = sparsefx.run(p, (fresh,))
    ref = sparsefx.run(p, (fresh,), executor="reference")
    expected = sm.eval()(fresh)
    assert torch.allclose(fast.outputs, expected, rtol=1e-4, atol=1e-5)
    assert torch.allclose(ref.outputs, expected, rtol=1e-4, atol=1e-5)
    assert abs(fast.stats.cycles / ref.stats.cycles - 1) <= 0.05
    spans = {k.name: k.end - k.start for k in ref.stats.kernels}
    matmuls = {k.name for k in p.kernels if k.op == "sparse_matmul" and stays(p, k)}
    checked = 0
    for k in fast.stats.kernels:
        kernel = p.kernel(k.name)
        # a tiled result, and a reader of a sparse matmul's spread result (a residual add reads it
        # beside a value whose shares leave through some of the same ramps, ``ramps.py``); a sparse
        # matmul reading one (the MLP's second layer, since the GELU is the first's epilogue) has the
        # known fork gap of its own inputs (``_FORK_GAP`` in ``test_ramps.py``), within the total's 5%
        reads_spread = matmuls & set(kernel.inputs) and kernel.op != "sparse_matmul"
        if (stays(p, kernel) and kernel.attrs.get("row_tiles", 1) > 1) or reads_spread:
            assert abs(k.end - k.start - spans[k.name]) <= 0.05 * spans[k.name], k.name
            checked += 1
    assert checked >= 4


def test_the_sram_model_counts_each_share_on_its_pe(gpt):
    _, _, p = gpt
    tiled = next(k for k in p.kernels if k.attrs.get("row_tiles", 1) > 1 and stays(p, k))
    matmul = next(k for k in p.kernels if k.op == "sparse_matmul" and stays(p, k))
    for k in (tiled, matmul):
        x, y, nbytes = kept_where(p, k)
        assert int(nbytes.sum()) == math.prod(k.shape) * 4  # every element once, fp32
        assert int(x.min()) >= k.region.x and int(x.max()) < k.region.x + k.region.width
        assert len(set(x.tolist())) > 1  # spread over its tiles' or sums' columns, not one east column
    own = pe_bytes(p, matmul)  # its biases on the PEs where the sums end, one value each
    bias = torch.zeros_like(own).index_add_(0, bias_pes(p, matmul), torch.full_like(bias_pes(p, matmul), 4))
    assert int(bias.sum()) == 4 * int(matmul.attrs["out_features"]) and int(own.sum()) >= int(bias.sum())
    beside = kept_beside(p)
    assert all(int(v.min()) >= 0 for v in beside.values())
    peak = held_peak(p)
    assert peak is not None and peak.total <= p.hardware.sram_bytes
