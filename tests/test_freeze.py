"""``sparsefx.freeze``: every kernel equals the dense product on awkward masks and inputs; a frozen model
equals the compiled one on fresh inputs (built-in and Hugging Face models), keeps its output types and
generation, round-trips its state through ``torch.load(weights_only=True)``, and refuses to train."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable

import pytest
import torch
from torch import nn

import sparsefx
from conftest import HF_VOCAB, tiny_bert_config, tiny_gpt2_config, tiny_llama_config
from sparsefx.errors import FreezeError
from sparsefx.frozen.choose import BUCKETS, kernel_for
from sparsefx.frozen.kernels import KERNELS, NUMBA, NUMBA_KERNELS, available_kernels, runs_here, stand_in
from sparsefx.frozen.packed import pack
from sparsefx.frozen.sparse_linear import SparseLinear
from sparsefx.models.registry import build_model

KERNEL_NAMES = [k for k in KERNELS if runs_here(k)]


@pytest.fixture
def sparse_kernels(monkeypatch) -> tuple[str, ...]:
    """Every layer takes sparse kernels, whatever this machine's timings say (the outputs are what is
    tested here, not the choice)."""
    import importlib

    one = "lookup" if runs_here("lookup") else "spmv"  # a decoding step on lookup where it runs
    choice = (one, "spmv", "torch", "rows", "tiles") if NUMBA else ("torch",) * len(BUCKETS)
    monkeypatch.setattr(importlib.import_module("sparsefx.frozen.freeze"), "choose", lambda *a, **k: choice)
    return choice


def _masks(out_f: int, in_f: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(out_f * 1000 + in_f)
    random = torch.rand(out_f, in_f, generator=g) < 0.1
    empty_rows = random.clone()
    empty_rows[::3] = False
    empty_cols = random.clone()
    empty_cols[:, 1::2] = False
    one = torch.zeros(out_f, in_f, dtype=torch.bool)
    one[out_f // 2, in_f - 1] = True
    return {
        "random": random,
        "empty rows": empty_rows,
        "empty columns": empty_cols,
        "one nonzero": one,
        "all dense": torch.ones(out_f, in_f, dtype=torch.bool),
        "all pruned": torch.zeros(out_f, in_f, dtype=torch.bool),
    }


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("tokens", [1, 3, 8, 33, 130])
@pytest.mark.parametrize("in_f", [24, 64, 100])  # rows of 100: spmv's vector steps and a tail; lookup's
# blocks of 32 inputs: one cut short (24), two whole (64), three and a short one (100)
def test_each_kernel_equals_the_masked_dense_product(kernel: str, tokens: int, in_f: int) -> None:
    torch.manual_seed(tokens)
    w = torch.randn(40, in_f)
    w[0, 0] = float("nan")  # a NaN where the mask prunes never reaches an output
    for what, mask in _masks(40, in_f).items():
        mask = mask.clone()
        mask[0, 0] = False
        p = pack(w, mask)
        x = torch.randn(tokens, in_f)
        for bias in (None, torch.randn(40)):
            expected = torch.nn.functional.linear(x, torch.where(mask, w, 0.0), bias)
            got = KERNELS[kernel](p, x, bias)
            assert got.shape == (tokens, 40) and got.is_contiguous(), what  # as timed, so as returned
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), (kernel, what, bias is None)


@pytest.mark.skipif(not NUMBA, reason="tiles is a numba kernel")
def test_tiles_writes_an_output_of_1024_features_through_blocks() -> None:
    """Rows 4 KiB apart would meet in one cache set: ``tiles`` writes them through a block (``BLOCKED``),
    and the result is the same."""
    from sparsefx.frozen.tiling import BLOCKED, TOKENS
    from sparsefx.frozen.tiling import token_layout as _token_layout

    assert (_token_layout(1024), _token_layout(3072), _token_layout(768), _token_layout(50257)) == (
        BLOCKED, BLOCKED, TOKENS, TOKENS,
    )  # fmt: skip
    torch.manual_seed(0)
    w, mask, bias = torch.randn(1024, 24), torch.rand(1024, 24) < 0.3, torch.randn(1024)
    p = pack(w, mask)
    for tokens in (1, 8, 33):
        x = torch.randn(tokens, 24)
        expected = torch.nn.functional.linear(x, torch.where(mask, w, 0.0), bias)
        assert torch.allclose(KERNELS["tiles"](p, x, bias), expected, rtol=1e-4, atol=1e-5), tokens


@pytest.mark.skipif(not NUMBA, reason="tiles is a numba kernel")
@pytest.mark.parametrize("tiles_a_chunk", [1, 2, 100])
def test_tiles_takes_any_chunk_of_tiles(tiles_a_chunk: int, monkeypatch) -> None:
    """A work item of ``tiles`` is a block of rows over a chunk of tiles: every chunk size, and a last
    chunk cut short, give the same product."""
    import sparsefx.frozen.tiling as tiling_module

    monkeypatch.setattr(tiling_module, "CHUNK_BYTES", 24 * 32 * 4 * tiles_a_chunk)
    torch.manual_seed(tiles_a_chunk)
    w, mask, bias = torch.randn(70, 24), torch.rand(70, 24) < 0.3, torch.randn(70)
    p = pack(w, mask)
    x = torch.randn(130, 24)  # 5 tiles of 32
    expected = torch.nn.functional.linear(x, torch.where(mask, w, 0.0), bias)
    assert torch.allclose(KERNELS["tiles"](p, x, bias), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("in_f", [40_000, 70_000])
def test_wide_layers_index_their_columns_unsigned(in_f: int) -> None:
    """Up to 65,536 input features the column indices take 16 bits, read unsigned (past 32,767 a signed
    read would go negative); past that they take 32."""
    torch.manual_seed(0)
    w = torch.randn(3, in_f)
    mask = torch.rand(3, in_f) < 0.01
    mask[:, [0, 32_767, 32_768, in_f - 1]] = True
    p = pack(w, mask)
    assert p.indices.dtype == (torch.int16 if in_f <= 65_536 else torch.int32)
    x = torch.randn(2, in_f)
    expected = torch.nn.functional.linear(x, torch.where(mask, w, 0.0))
    for kernel in KERNEL_NAMES:
        assert torch.allclose(KERNELS[kernel](p, x), expected, rtol=1e-4, atol=1e-4), kernel


def test_a_bad_packed_state_is_refused_when_loaded() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    layer = SparseLinear(pack(lin.weight, torch.rand(40, 24) < 0.3), lin.bias, ("dense",) * len(BUCKETS))
    good = {k: v.clone() for k, v in layer.state_dict().items()}
    bad_index, bad_rows, bad_choice = dict(good), dict(good), dict(good)
    bad_index["weight_indices"] = good["weight_indices"].clone().fill_(24)
    bad_rows["weight_indptr"] = good["weight_indptr"].flip(0)
    bad_choice["kernel_choice"] = torch.full((len(BUCKETS),), 9, dtype=torch.int8)
    for state, message in (
        (bad_index, "column indices reach 24; valid ones are 0 to 23"),
        (bad_rows, "row pointers run from"),
        (bad_choice, "kernel_choice is"),
    ):
        with pytest.raises(FreezeError, match=message):
            SparseLinear(layer.packed, lin.bias, layer.choice).load_state_dict(state)
    fresh = SparseLinear(layer.packed, lin.bias, layer.choice)
    fresh.load_state_dict(good)
    x = torch.randn(5, 24)
    assert torch.equal(fresh(x), layer(x))


def test_a_frozen_layer_takes_non_contiguous_broadcast_and_empty_inputs() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    mask = torch.rand(40, 24) < 0.2
    for choice in [(k,) * len(BUCKETS) for k in KERNEL_NAMES]:
        layer = SparseLinear(pack(lin.weight, mask), lin.bias, choice)
        ref = lambda x: torch.nn.functional.linear(x, lin.weight * mask, lin.bias)  # noqa: E731
        with torch.no_grad():
            x = torch.randn(24, 5, 3).permute(2, 1, 0)  # [3, 5, 24], not contiguous
            assert torch.allclose(layer(x), ref(x), rtol=1e-4, atol=1e-5), choice
            x = torch.randn(1, 24).expand(6, 24)  # a broadcast row
            assert torch.allclose(layer(x), ref(x), rtol=1e-4, atol=1e-5), choice
            for x in (torch.randn(1, 1, 24), torch.randn(7, 24)):  # a decoding step; a 2-D input
                y = layer(x)
                assert y.is_contiguous() and torch.allclose(y, ref(x), rtol=1e-4, atol=1e-5), choice
            assert layer(torch.randn(0, 24)).shape == (0, 40)
    with pytest.raises(FreezeError, match="takes 24 input features"):
        layer(torch.randn(2, 7))


def test_kernel_for_takes_the_largest_bucket_at_or_below_the_tokens() -> None:
    choice = ("spmv", "torch", "torch", "rows", "rows")
    assert [kernel_for(choice, t) for t in (1, 7, 8, 127, 128, 5000)] == [
        "spmv",
        "spmv",
        "torch",
        "torch",
        "rows",
        "rows",
    ]
    assert available_kernels("torch") == ["torch", "dense"]
    # between two buckets a sparse kernel runs only where both measured sparse; at a bucket, its own
    choice = ("spmv", "dense", "tiles", "tiles", "dense")
    assert [kernel_for(choice, t) for t in (1, 2, 8, 9, 32, 200, 512, 4096)] == [
        "spmv", "dense", "dense", "dense", "tiles", "dense", "dense", "dense",
    ]  # fmt: skip
    lin = torch.nn.Linear(6, 4)
    layer = SparseLinear(pack(lin.weight, torch.ones(4, 6, dtype=torch.bool)), lin.bias, choice)
    ran: list[str] = []
    layer._bind = lambda name, p, b: lambda x: ran.append(name) or KERNELS[name](p, x, b)
    layer._bind_one = lambda name, p, b: lambda x: ran.append(name) or KERNELS[name](p, x.reshape(1, -1), b)
    with torch.no_grad():
        for tokens in (1, 2, 8, 9, 32, 200, 512, 4096):
            x = torch.randn(tokens, 6)
            assert torch.allclose(layer(x), lin(x), rtol=1e-4, atol=1e-5)
            want = kernel_for(choice, tokens)
            assert ran[-1] == stand_in(want), tokens


@pytest.mark.parametrize("name", ["mlp", "gpt-tiny", "zoo-data-dependent", "zoo-dict", "zoo-gpt2-conv1d"])
def test_frozen_built_in_models_equal_the_compiled_model(name: str, sparse_kernels) -> None:
    spec = build_model(name, seed=0)
    sm = sparsefx.compile(spec.model, 0.9, spec.args, example_kwargs=spec.kwargs).eval()
    fast = sparsefx.freeze(sm)
    assert any(r.kernels for r in fast.freeze_report), "no layer was packed"
    fresh = build_model(name, seed=1)  # fresh inputs of the same kind
    with torch.no_grad():
        expected, got = sm(*fresh.args, **fresh.kwargs), fast(*fresh.args, **fresh.kwargs)
    flat_e, flat_g = torch.utils._pytree.tree_flatten(expected), torch.utils._pytree.tree_flatten(got)
    assert flat_e[1] == flat_g[1]  # the same output structure
    for e, g in zip(flat_e[0], flat_g[0]):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.fixture
def hf_gpt2(sparse_kernels) -> tuple:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(tiny_gpt2_config(use_cache=True)).eval()
    ids = torch.randint(0, HF_VOCAB, (2, 12))
    sm = sparsefx.compile(model, 0.9, (ids,)).eval()
    return model, sm, sparsefx.freeze(sm)


def test_a_frozen_hf_gpt2_keeps_its_output_type_and_packs_its_conv1d_layers(hf_gpt2) -> None:
    model, sm, fast = hf_gpt2
    packed = [r.weight for r in fast.freeze_report if r.kernels]
    assert "transformer.h.0.attn.c_attn.weight" in packed and "transformer.h.1.mlp.c_proj.weight" in packed
    layer = fast.module.transformer.h[0].attn.c_attn
    assert isinstance(layer, SparseLinear)  # its .weight reads as the Conv1D's did: [in, out], masked
    assert torch.equal(layer.weight, model.transformer.h[0].attn.c_attn.weight.detach())
    ids = torch.randint(0, HF_VOCAB, (3, 9))  # another batch and length
    with torch.no_grad():
        expected, got = sm(ids), fast(ids)
    assert type(got) is type(expected)
    assert torch.allclose(got.logits, expected.logits, rtol=1e-4, atol=1e-5)


def test_a_frozen_hf_gpt2_generates_with_its_cache(hf_gpt2) -> None:
    model, _, fast = hf_gpt2  # compile pruned the model's own weights in place: it is the masked model
    ids = torch.randint(0, HF_VOCAB, (1, 5))
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(fast.generate(ids, **kwargs), model.generate(ids, **kwargs))


@pytest.mark.parametrize("which", ["bert", "llama"])
def test_frozen_hf_encoders_and_llama_equal_the_compiled_model(which: str, sparse_kernels) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if which == "bert":
        model = transformers.BertModel(tiny_bert_config())
    else:
        config = tiny_llama_config(num_attention_heads=4, max_position_embeddings=64)  # 2 heads a key
        model = transformers.LlamaForCausalLM(config)
    model.eval()
    sm = sparsefx.compile(model, 0.9, (torch.randint(0, HF_VOCAB, (2, 10)),)).eval()
    fast = sparsefx.freeze(sm)
    assert sum(bool(r.kernels) for r in fast.freeze_report) >= 4
    ids = torch.randint(0, HF_VOCAB, (2, 7))
    with torch.no_grad():
        expected, got = sm(ids), fast(ids)
    key = "last_hidden_state" if which == "bert" else "logits"
    assert torch.allclose(got[key], expected[key], rtol=1e-4, atol=1e-5)


def test_the_state_round_trips_through_a_weights_only_load(sparse_kernels) -> None:
    spec = build_model("gpt-tiny", seed=0)
    sm = sparsefx.compile(spec.model, 0.9, spec.args).eval()
    fast = sparsefx.freeze(sm)
    state = fast.state_dict()
    assert (
        "module.blocks.0.attn.qkv.weight_values" in state and "module.blocks.0.attn.qkv.weight" not in state
    )
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    other = sparsefx.freeze(sparsefx.compile(build_model("gpt-tiny", seed=5).model, 0.9, spec.args).eval())
    other.load_state_dict(loaded)
    for k, v in other.state_dict().items():
        assert torch.equal(v, state[k]), k
    with torch.no_grad():
        assert torch.equal(other(*spec.args), fast(*spec.args))
    assert fast.frozen_bytes < fast.dense_bytes / 2


def test_a_frozen_model_is_a_snapshot_and_packs_a_tied_weight_once(sparse_kernels) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32, bias=False)
    model = torch.nn.Sequential(lin, torch.nn.ReLU(), torch.nn.Linear(32, 32, bias=False))
    model[2].weight = lin.weight  # one tensor, two layers
    sm = sparsefx.compile(model, 0.5).eval()
    fast = sparsefx.freeze(sm)
    layers = [m for m in fast.modules() if isinstance(m, SparseLinear)]
    assert len(layers) == 2 and layers[0].weight_values is layers[1].weight_values
    x = torch.randn(4, 32)
    with torch.no_grad():
        before = fast(x)
        lin.weight.add_(1.0)  # training the compiled model on does not reach the frozen one
        assert torch.equal(fast(x), before)


def test_a_frozen_model_refuses_to_train() -> None:
    """(A layer that stays dense, too: the refusals are the model's.)"""
    sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(16, 16)), 0.5).eval()
    fast = sparsefx.freeze(sm)
    with pytest.raises(FreezeError, match="for inference"):
        fast.train()
    with pytest.raises(FreezeError, match="nothing to train"):
        torch.optim.SGD(fast.parameters(), lr=0.1)
    with pytest.raises(FreezeError, match="no gradients"):
        fast(torch.randn(2, 16, requires_grad=True))
    fast.eval()  # eval is fine
    with pytest.raises(FreezeError, match="takes a SparseModel"):
        sparsefx.freeze(torch.nn.Linear(2, 2))
    with pytest.raises(FreezeError, match="backend 'mkl' is not one of auto, torch"):
        sparsefx.freeze(sm, backend="mkl")


def test_without_numba_freeze_uses_torchs_kernels_and_says_so_once(monkeypatch) -> None:
    """The real choice, without numba: only torch's kernels and dense are candidates."""
    import importlib

    from sparsefx.frozen import kernels

    freeze_module = importlib.import_module("sparsefx.frozen.freeze")  # the module, not the function

    monkeypatch.setattr(kernels, "NUMBA", False)
    monkeypatch.setattr(freeze_module, "_warned", False)
    assert kernels.available_kernels() == ["torch", "dense"]
    sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(32, 32)), 0.9).eval()
    with pytest.warns(UserWarning, match="numba is not installed"):
        fast = sparsefx.freeze(sm)
    assert {k for r in fast.freeze_report for k in r.kernels} <= {"torch", "dense"}
    lin = sm.masks  # a layer frozen where numba was, run where it is not
    layer = SparseLinear(pack(torch.randn(32, 32), next(iter(lin.values()))), None, ("spmv",) + ("rows",) * 4)
    assert layer.kernel(1) == "torch" and layer.kernel(200) == "torch"
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.allclose(fast(x), sm(x), rtol=1e-4, atol=1e-5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sparsefx.freeze(sm)  # said once


def test_a_lookup_layer_runs_spmv_where_the_machine_has_no_avx512(monkeypatch) -> None:
    """A model frozen on an AVX-512 machine, loaded on one without: its ``lookup`` buckets run ``spmv``
    (and ``torch`` without numba), with the same result."""
    from sparsefx.frozen import kernels, lookup

    monkeypatch.setattr(lookup, "supported", lambda: False)
    assert "lookup" not in kernels.available_kernels()
    torch.manual_seed(0)
    lin = nn.Linear(40, 24)
    mask = torch.rand(24, 40) < 0.2
    layer = SparseLinear(pack(lin.weight, mask), lin.bias, ("lookup",) * len(BUCKETS))
    assert layer.kernel(1) == ("spmv" if NUMBA else "torch")
    x = torch.randn(1, 40)
    with torch.no_grad():
        assert torch.allclose(layer(x), nn.functional.linear(x, lin.weight * mask, lin.bias), atol=1e-5)


def test_the_lookup_layout_holds_each_nonzero_once_in_as_many_steps_as_the_fullest_row() -> None:
    """Decoded, ``lookup``'s layout is the masked weight exactly; each block of 16 rows by 32 inputs
    has as many steps as its fullest row has nonzeros there."""
    from sparsefx.frozen import lookup

    torch.manual_seed(0)
    for out_f, in_f in ((40, 100), (16, 32), (1, 1), (33, 70)):
        w, mask = torch.randn(out_f, in_f), torch.rand(out_f, in_f) < 0.3
        mask[0] = True  # a full row
        layout = lookup.build(pack(w, mask))
        groups, blocks = -(-out_f // 16), -(-in_f // 32)
        counts = torch.zeros(groups * 16, blocks * 32, dtype=torch.long)
        counts[:out_f, :in_f] = mask.long()
        fullest = counts.reshape(groups, 16, blocks, 32).sum(-1).amax(1)  # [groups, blocks]
        steps = torch.from_numpy(layout.steps.astype("int64")).reshape(groups, blocks + 1)
        assert torch.equal(steps.diff(dim=1), fullest)
        assert torch.equal(steps[1:, 0], steps[:-1, -1]) and int(steps[0, 0]) == 0
        decoded = torch.zeros(groups * 16, blocks * 32)
        values = torch.from_numpy(layout.values).reshape(-1, 16)
        positions = torch.from_numpy(layout.positions.astype("int64")).reshape(-1, 16)
        for g in range(groups):
            for b in range(blocks):
                for s in range(int(steps[g, b]), int(steps[g, b + 1])):
                    for lane in range(16):
                        decoded[g * 16 + lane, b * 32 + positions[s, lane]] += values[s, lane]
        assert torch.equal(decoded[:out_f, :in_f], torch.where(mask, w, 0.0))
        assert not decoded[out_f:].any() and not decoded[:, in_f:].any()


def test_a_bfloat16_model_freezes_and_runs_dense_kernels() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = model.to(torch.bfloat16)
    sm = sparsefx.compile(model, 0.9).eval()
    fast = sparsefx.freeze(sm)
    assert [r.why_dense for r in fast.freeze_report] == ["bfloat16: the sparse kernels take float32"] * 2
    assert not any(isinstance(m, SparseLinear) for m in fast.modules())
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        got, expected = fast(x), sm(x)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_a_layer_no_sparse_kernel_beats_stays_the_original_module(monkeypatch) -> None:
    import importlib

    monkeypatch.setattr(
        importlib.import_module("sparsefx.frozen.freeze"), "choose", lambda *a, **k: ("dense",) * 5
    )
    sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(16, 16)), 0.5).eval()
    fast = sparsefx.freeze(sm)
    assert type(fast.module[0]) is torch.nn.Linear and not fast.module[0].weight.requires_grad
    (row,) = fast.freeze_report
    assert row.kernels == () and row.why_dense == "dense measured fastest at every size"
    assert row.frozen_bytes == row.dense_bytes
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert torch.allclose(fast(x), sm(x), rtol=1e-4, atol=1e-5)


def test_a_tied_lm_head_made_sparse_by_its_embeddings_name_is_packed(sparse_kernels) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(tiny_gpt2_config()).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, HF_VOCAB, (2, 8))
    sm = sparsefx.compile(model, {"sparsity": 0.9, "param_filter": ["transformer.wte.weight"]}, (ids,))
    fast = sparsefx.freeze(sm.eval())
    (row,) = fast.freeze_report
    assert row.weight == "transformer.wte.weight" and row.kernels == sparse_kernels
    assert isinstance(fast.module.lm_head, SparseLinear)
    assert type(fast.module.transformer.wte) is torch.nn.Embedding  # reads the masked table, dense
    ids = torch.randint(0, HF_VOCAB, (3, 6))
    with torch.no_grad():
        assert torch.allclose(fast(ids).logits, sm(ids).logits, rtol=1e-4, atol=1e-5)


def test_timing_the_kernels_leaves_nothing_in_the_layers_weight() -> None:
    """Timing the kernels makes a dense copy and other layouts of the weight; they go with the timing,
    so a layer holds only what its own kernels read."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 96)
    p = pack(lin.weight, torch.rand(96, 256) < 0.1)
    from sparsefx.frozen.choose import choose

    choose(p, available_kernels(), lin.bias, rounds=1)
    assert p._cache == {}


def test_a_layer_dense_at_some_sizes_keeps_a_dense_copy_in_memory_not_in_its_state() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    mask = torch.rand(40, 24) < 0.2
    layer = SparseLinear(pack(lin.weight, mask), lin.bias, ("dense", "torch", "torch", "torch", "torch"))
    with torch.no_grad():
        layer(torch.randn(1, 24))
    assert "dense" in layer.packed._cache
    assert set(layer.state_dict()) == {
        "weight_values",
        "weight_indices",
        "weight_indptr",
        "bias",
        "kernel_choice",
    }


@pytest.mark.skipif(not NUMBA, reason="the loops are numba's")
def test_each_parallel_loop_has_its_own_disk_cache() -> None:
    """numba keys its disk cache by a function's name and line, not by ``parallel``: a parallel loop
    compiled from the serial one's function would load the serial code from the cache."""
    from sparsefx.frozen import loops

    for name in ("rows", "rows_tokens", "tiles", "tiles8"):
        serial, parallel = getattr(loops, name), getattr(loops, f"{name}_parallel")
        assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")
        assert serial._cache._cache_file._index_name != parallel._cache._cache_file._index_name, name


@pytest.mark.skipif(not NUMBA, reason="the parallel loops are numba's")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_numba_kernels_give_the_same_product_on_one_and_two_threads(threads: int) -> None:
    from sparsefx.frozen.kernels import bind_columns

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(threads)
        w, mask, bias = torch.randn(130, 48), torch.rand(130, 48) < 0.3, torch.randn(130)
        p, dense = pack(w, mask), torch.where(mask, w, 0.0)
        for tokens in (1, 8, 77):
            x = torch.randn(tokens, 48)
            for kernel in filter(runs_here, NUMBA_KERNELS):
                got = KERNELS[kernel](p, x, bias)
                assert torch.allclose(got, x @ dense.T + bias, rtol=1e-4, atol=1e-5), (kernel, tokens)
            for kernel in ("rows", "tiles"):
                out = torch.empty(130, tokens)
                bind_columns(kernel, p, bias)(x.T.contiguous(), out)
                assert torch.allclose(out, dense @ x.T + bias[:, None], rtol=1e-4, atol=1e-5), (
                    kernel,
                    tokens,
                )
    finally:
        torch.set_num_threads(before)


def test_a_sparse_kernel_is_chosen_only_where_it_beats_dense_in_both_sets_of_rounds(monkeypatch) -> None:
    import sparsefx.frozen.choose as choose_module

    def sets(*medians: dict[str, float]):
        answers = iter(medians)
        return lambda run, names, calls, rounds, cold: {k: v for k, v in next(answers).items() if k in names}

    run = {"tiles": lambda: None, "torch": lambda: None, "dense": lambda: None}
    both = sets({"tiles": 0.5, "torch": 0.9, "dense": 1.0}, {"tiles": 0.6, "torch": 0.9, "dense": 1.0})
    monkeypatch.setattr(choose_module, "_medians", both)
    assert choose_module.fastest(run) == "tiles"
    one = sets({"tiles": 0.5, "torch": 0.9, "dense": 1.0}, {"tiles": 0.97, "torch": 0.99, "dense": 1.0})
    monkeypatch.setattr(choose_module, "_medians", one)  # its mean beats dense by 26%, one set by 3%
    assert choose_module.fastest(run) == "dense"
    near = sets({"tiles": 0.93, "torch": 0.99, "dense": 1.0}, {"tiles": 0.93, "torch": 0.99, "dense": 1.0})
    monkeypatch.setattr(choose_module, "_medians", near)  # 7% faster twice: within a shared machine's noise
    assert choose_module.fastest(run) == "dense"


def _traced(log: list[str]) -> dict[str, Callable[[], None]]:
    return {k: (lambda k=k: log.append(k)) for k in ("tiles", "dense")}


def test_a_cold_sample_is_one_call_after_the_cache_is_emptied(monkeypatch) -> None:
    """Timed cold, every sample of every kernel is one call with ``cache.evict`` just before it."""
    import sparsefx.frozen.cache as cache_module
    import sparsefx.frozen.choose as choose_module

    log: list[str] = []
    monkeypatch.setattr(cache_module, "evict", lambda: log.append("evict"))
    choose_module.fastest(_traced(log), rounds=3, cold=True)
    warmup = log[:4]  # a call each, then one call each to size its samples
    assert warmup == ["tiles", "tiles", "dense", "dense"]
    samples = log[4:]
    assert len(samples) == 2 * (3 * 2 + 3 * 2)  # two sets of 3 rounds, two kernels (both finalists)
    assert samples[::2] == ["evict"] * (len(samples) // 2) and "evict" not in samples[1::2]


def test_a_warm_sample_starts_after_an_untimed_call(monkeypatch) -> None:
    """Timed warm, a sample's calls follow one untimed call of the same kernel, never another's."""
    import sparsefx.frozen.cache as cache_module
    import sparsefx.frozen.choose as choose_module

    log: list[str] = []
    monkeypatch.setattr(cache_module, "evict", lambda: log.append("evict"))
    monkeypatch.setattr(choose_module, "SAMPLE", 0.0)  # one timed call a sample
    choose_module.fastest(_traced(log), rounds=3)
    assert "evict" not in log and log.count("tiles") == log.count("dense") == 2 + 2 * 3 * 2
    runs = [len(list(g)) for _, g in itertools.groupby(log[4:])]
    assert all(n % 2 == 0 for n in runs)  # each sample: the untimed call, then the timed one


def test_sysfs_cache_sizes_are_read_as_bytes() -> None:
    from sparsefx.frozen import cache

    assert [cache._parse(s) for s in ("32768K\n", "1M", "512", "2G")] == [2**25, 2**20, 512, 2**31]
    assert cache.last_level_bytes() >= 2**20


@pytest.mark.parametrize(("cache_bytes", "cold"), [(2**40, False), (2**10, True)])
def test_a_model_larger_than_the_cache_times_its_kernels_cold(monkeypatch, cache_bytes, cold) -> None:
    """freeze times kernels cold exactly where the model's weights exceed the last-level cache."""
    import importlib

    import sparsefx.frozen.cache as cache_module

    freeze_module = importlib.import_module("sparsefx.frozen.freeze")
    seen: list[bool] = []

    def choose(*args, cold=False, **kwargs):
        seen.append(cold)
        if cold:
            cache_module.evict()  # as a cold timing does: its buffer is freed when freeze is done
        return ("dense",) * len(BUCKETS)

    monkeypatch.setattr(freeze_module, "choose", choose)
    monkeypatch.setattr(cache_module, "last_level_bytes", lambda: cache_bytes)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    fast = sparsefx.freeze(sparsefx.compile(model, 0.9).eval())
    assert fast.timed_cold is cold and seen == [cold]  # one measurement: the layers share a shape
    assert cache_module._buffer.cache_info().currsize == 0
