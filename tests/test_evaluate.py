"""The value semantics of a dataflow program: ``evaluate`` equals the compiled model it was lowered from."""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import pytest
import torch
import transformers
from torch import nn

import sparsefx
from conftest import HF_VOCAB, LOWER_MESH, compile_builtins, tiny_bert_config, tiny_gpt2_config
from sparsefx.errors import EmulationError, LoweringError
from sparsefx.passes.lower import lower_graph
from sparsefx.passes.lower.place_sparse import place_sparse
from sparsefx.runtime import sparse_eval
from sparsefx.runtime.evaluate import evaluate, rebuild_outputs
from sparsefx.runtime.mesh import HardwareSpec
from sparsefx.runtime.semantics import RULES

MODES = ("pipelined", "streaming")
PLACEMENTS = ("block", "balanced")
MESH = LOWER_MESH
VOCAB = HF_VOCAB


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype == want.dtype and torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def fresh_like(example: torch.Tensor, high: int = 256) -> torch.Tensor:
    """A new random input of the example's shape and dtype (token ids in [0, high) for int64)."""
    if example.dtype == torch.int64:
        return torch.randint(0, high, example.shape)
    return torch.randn(example.shape, dtype=example.dtype)


@pytest.fixture(scope="module")
def compiled() -> dict[str, tuple[sparsefx.SparseModel, tuple]]:
    return compile_builtins()


@pytest.fixture(scope="module")
def mlp_program(compiled) -> sparsefx.DataflowProgram:
    sm, args = compiled["mlp"]
    return sparsefx.lower(sm, args, mesh=MESH["mlp"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", list(MESH))
def test_builtin_models_evaluate_like_the_compiled_model(
    compiled, name: str, mode: str, placement: str
) -> None:
    sm, args = compiled[name]
    program = sparsefx.lower(sm, args, mesh=MESH[name], mode=mode, placement=placement)
    torch.manual_seed(1)
    inputs = tuple(fresh_like(a) for a in args)
    got = evaluate(program, inputs)
    sm.eval()
    with torch.no_grad():
        want = sm(*inputs)
    assert got.dtype == torch.float32 and close(got, want)


def test_inputs_are_never_written(compiled) -> None:
    sm, args = compiled["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=MESH["gpt-tiny"], mode="streaming")
    ids = fresh_like(args[0])
    before = ids.clone()
    evaluate(program, ids)
    assert torch.equal(ids, before)


def test_a_layer_streamed_in_passes_evaluates_whole(compiled) -> None:
    """A matmul cut into parts over slices of its outputs (streaming on a tiny SRAM) gives the same values."""
    sm, args = compiled["mlp"]
    program = sparsefx.lower(sm, args, mesh=(2, 8), mode="streaming", hardware=HardwareSpec(sram_bytes=4096))
    assert any("out_offset" in k.attrs for k in program.kernels)
    x = fresh_like(args[0])
    sm.eval()
    with torch.no_grad():
        assert close(evaluate(program, x), sm(x))


# -- Hugging Face models --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_gpt2() -> tuple[sparsefx.SparseModel, sparsefx.DataflowProgram]:
    torch.manual_seed(0)
    config = tiny_gpt2_config()
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, VOCAB, (2, 16))
    sm = sparsefx.compile(model, 0.9, (ids,))
    return sm, sparsefx.lower(sm, (ids,), mesh=(64, 64), mode="streaming", placement="balanced")


def bert_call(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    types = torch.zeros_like(ids)
    types[:, 8:] = 1
    mask = torch.ones_like(ids)
    mask[0, 12:] = 0  # padding at the end of the first sequence
    mask[1, 5 + seed % 3 :] = 0
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


@pytest.fixture(scope="module")
def hf_bert() -> tuple[sparsefx.SparseModel, sparsefx.DataflowProgram]:
    torch.manual_seed(0)
    config = tiny_bert_config()
    model = transformers.BertModel(config).eval()
    call = bert_call(0)
    sm = sparsefx.compile(model, 0.9, call)
    return sm, sparsefx.lower(sm, call, mesh=(64, 64), mode="streaming", placement="block")


def assert_same_output(got, want) -> None:
    """The same output class, and every field close."""
    assert type(got) is type(want)
    assert list(got) == list(want)
    for key in want:
        assert close(got[key], want[key]), key


def test_hf_gpt2_evaluates_like_the_compiled_model(hf_gpt2) -> None:
    sm, program = hf_gpt2
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    sm.eval()
    with torch.no_grad():
        want = sm(ids)
    got = evaluate(program, (ids,))
    assert isinstance(got, transformers.modeling_outputs.CausalLMOutputWithCrossAttentions)
    assert_same_output(got, want)


def test_hf_bert_called_by_keywords_evaluates_like_the_compiled_model(hf_bert) -> None:
    sm, program = hf_bert
    call = bert_call(1)
    sm.eval()
    with torch.no_grad():
        want = sm(**call)
    got = evaluate(program, call)
    assert isinstance(got, transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions)
    assert_same_output(got, want)
    positional = evaluate(program, tuple(call.values()))  # the same inputs by position
    assert all(torch.equal(positional[k], got[k]) for k in got)


def test_a_saved_and_loaded_program_gives_bit_identical_outputs(hf_bert, compiled, tmp_path) -> None:
    _, program = hf_bert
    path = tmp_path / "bert.sfxp"
    program.save(str(path))
    loaded = sparsefx.load_program(str(path))
    call = bert_call(2)
    before, after = evaluate(program, call), evaluate(loaded, call)
    assert type(before) is type(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
    sm, args = compiled["cnn"]
    cnn = sparsefx.lower(sm, args, mesh=MESH["cnn"], mode="streaming", placement="balanced")
    cnn.save(str(tmp_path / "cnn.sfxp"))
    x = fresh_like(args[0])
    assert torch.equal(evaluate(cnn, x), evaluate(sparsefx.load_program(str(tmp_path / "cnn.sfxp")), x))


# -- the sparse product -----------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_the_sparse_product_of_the_pe_slices_is_the_masked_matmul(placement: str, monkeypatch) -> None:
    """Any mask, any region; with tiny chunks too (many PE groups and row chunks give the same sums)."""
    torch.manual_seed(0)
    for out_f, in_f, width, height, density in (
        (7, 5, 3, 4, 0.5),
        (300, 40, 7, 9, 0.2),
        (33, 17, 5, 20, 0.9),
    ):
        w = torch.randn(out_f, in_f)
        m = torch.rand(out_f, in_f) < density
        arrays = place_sparse(w, m, width, height, placement)
        s = sparse_eval.read_slices(arrays, in_f, out_f, width, height, "kernel 'k'")
        x = torch.randn(11, in_f)
        whole = sparse_eval.product(s, x)
        assert torch.allclose(whole, x @ (w * m).t(), rtol=1e-5, atol=1e-5)
        with monkeypatch.context() as patch:
            patch.setattr(sparse_eval, "CHUNK_ELEMENTS", 16)
            patch.setattr(sparse_eval, "_ROWS_PER_CHUNK", 3)
            assert torch.allclose(sparse_eval.product(s, x), whole, rtol=1e-6, atol=1e-6)


def test_the_rules_cover_every_op_kind() -> None:
    from sparsefx.runtime.program import OPS

    assert set(RULES) == set(OPS)


# -- what the lowering had to carry -----------------------------------------------------------------------


class _Addmm(nn.Module):
    def __init__(self, bias_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))
        self.b = nn.Parameter(torch.randn(*bias_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.b, x, self.w, beta=0.5, alpha=2.0)


@pytest.mark.parametrize("bias_shape", [(4,), (1,), (1, 4), (4, 1), (4, 4)])
def test_addmm_biases_of_every_broadcast_shape(bias_shape: tuple[int, ...]) -> None:
    """A bias per output is the kernel's; one that varies by row (here rows == outputs) an add after it."""
    torch.manual_seed(0)
    model, x = _Addmm(bias_shape).eval(), torch.randn(4, 8)
    sm = sparsefx.compile(model, 0.5, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(4, 4))
    with torch.no_grad():
        assert close(evaluate(program, x), sm.eval()(x))


def test_fused_cpu_attention_keeps_its_mask() -> None:
    class Attention(nn.Module):
        def forward(self, q, k, v, mask):
            flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
            return flash(q, k, v, 0.0, False, attn_mask=mask)[0]

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    mask[..., -1] = float("-inf")
    program = lower_graph(torch.fx.symbolic_trace(Attention()), (q, k, v, mask), {}, mesh=(8, 8))
    assert close(evaluate(program, (q, k, v, mask)), Attention()(q, k, v, mask))


def test_a_convolution_with_non_zero_padding_is_a_lowering_error() -> None:
    conv = nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")
    with pytest.raises(LoweringError, match="padding_mode='reflect'"):
        lower_graph(torch.fx.symbolic_trace(nn.Sequential(conv)), (torch.randn(1, 2, 5, 5),), {}, mesh=(8, 8))


# -- output structures ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: object = None


def test_outputs_rebuild_tuples_lists_dicts_and_allowed_classes() -> None:
    a, b = torch.ones(1), torch.zeros(2)
    t = {"type": "tensor", "index": 0}
    tree = {
        "type": "tuple",
        "items": [
            {"type": "list", "items": [t, {"type": "tensor", "index": 1}]},
            {"type": "dict", "keys": ["k"], "items": [{"type": "const", "value": 3}]},
            {"type": "dataclass", "class": "collections.OrderedDict", "keys": ["first"], "items": [t]},
        ],
    }
    got = rebuild_outputs(tree, [a, b])
    assert isinstance(got, tuple) and got[0] == [a, b] and got[1] == {"k": 3}
    assert type(got[2]) is collections.OrderedDict and got[2]["first"] is a


def test_a_class_a_tree_names_is_never_imported_or_built_unless_allowed() -> None:
    """An output tree comes from an untrusted file: a class off the allow-list, even an imported dataclass,
    comes back as a dict of its fields, with a warning naming it."""
    tree = {
        "type": "dataclass",
        "class": "no_such_pkg.models.Out",
        "keys": ["x"],
        "items": [{"type": "const", "value": 1}],
    }
    for name in ("no_such_pkg.models.Out", "math.pi", f"{__name__}.Pair", "subprocess.Popen"):
        tree["class"] = name
        with pytest.warns(UserWarning, match=re.escape(name)):
            assert rebuild_outputs(tree, []) == {"x": 1}
    assert "no_such_pkg" not in __import__("sys").modules


def test_a_bad_output_tree_is_an_emulation_error() -> None:
    with pytest.raises(EmulationError, match="names output 2"):
        rebuild_outputs({"type": "tensor", "index": 2}, [torch.ones(1)])
    with pytest.raises(EmulationError, match="'set'"):
        rebuild_outputs({"type": "set", "items": []}, [])


# -- input errors -----------------------------------------------------------------------------------------


def test_input_errors_name_the_input_and_what_was_expected(compiled, hf_bert) -> None:
    sm, args = compiled["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=MESH["gpt-tiny"], mode="streaming")
    ids = args[0]
    batch, seq = ids.shape
    with pytest.raises(
        EmulationError, match=rf"'idx' has shape \[{batch + 1}, {seq}\]; .* lowered for \[{batch}, {seq}\]"
    ):
        evaluate(program, torch.zeros(batch + 1, seq, dtype=torch.int64))
    with pytest.raises(EmulationError, match=rf"'idx' has shape \[{batch}, {seq - 1}\]"):
        evaluate(program, ids[:, :-1])
    with pytest.raises(EmulationError, match="'idx' has dtype int32; the program was lowered for int64"):
        evaluate(program, ids.to(torch.int32))
    with pytest.raises(EmulationError, match="'idx' is a list, not a tensor"):
        evaluate(program, ([1, 2],))
    with pytest.raises(EmulationError, match="2 positional inputs given; the program takes 1"):
        evaluate(program, (ids, ids))
    with pytest.raises(EmulationError, match=r"inputs \['idx'\] are missing"):
        evaluate(program, ())
    with pytest.raises(EmulationError, match="ids 'idx' run from 0 to 999; the table has 256 rows"):
        evaluate(program, torch.full_like(ids, 999).index_fill_(1, torch.tensor([0]), 0))
    _, bert = hf_bert
    call = bert_call(0)
    with pytest.raises(EmulationError, match=r"inputs \['attention_mask'\] are missing"):
        evaluate(bert, {k: v for k, v in call.items() if k != "attention_mask"})
    with pytest.raises(EmulationError, match=r"inputs \['labels'\] are not inputs of the program"):
        evaluate(bert, {**call, "labels": call["input_ids"]})
    with pytest.raises(EmulationError, match="'attention_mask' has dtype float32"):
        evaluate(bert, {**call, "attention_mask": call["attention_mask"].float()})
    evaluate(bert, {**call, "head_mask": None})  # None: an argument the model was called without


# -- program errors ---------------------------------------------------------------------------------------


def _copy(program: sparsefx.DataflowProgram) -> sparsefx.DataflowProgram:
    """A copy whose kernels and arrays dict can be changed (the payload tensors are shared)."""
    kernels = [dataclasses.replace(k, attrs=dict(k.attrs), arrays=dict(k.arrays)) for k in program.kernels]
    return dataclasses.replace(program, kernels=kernels, arrays=dict(program.arrays))


def _first(program: sparsefx.DataflowProgram, op: str):
    return next(k for k in program.kernels if k.op == op)


@pytest.fixture(scope="module")
def relu_program() -> tuple[sparsefx.DataflowProgram, torch.Tensor]:
    """A linear layer and the ReLU after it; the ReLU is the output, so it stays a kernel of its own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
    x = torch.randn(8, 256)
    return sparsefx.lower(sparsefx.compile(model, 0.9, (x,)), (x,), mesh=MESH["mlp"]), x


def test_a_bad_epilogue_names_the_kernel(mlp_program, compiled) -> None:
    x = compiled["mlp"][1][0]
    fused = next(k for k in mlp_program.kernels if "epilogue" in k.attrs)  # the MLP's ReLUs are epilogues
    p = _copy(mlp_program)
    p.kernel(fused.name).attrs["epilogue"] = {"fn": "frobnicate", "kwargs": {}}
    with pytest.raises(EmulationError, match=rf"kernel '{fused.name}' .*epilogue .*frobnicate.* not one of"):
        evaluate(p, x)


def test_program_errors_name_the_kernel_and_the_value(relu_program) -> None:
    mlp_program, x = relu_program
    relu = _first(mlp_program, "elementwise").name
    fc = _first(mlp_program, "sparse_matmul").name
    p = _copy(mlp_program)
    _first(p, "elementwise").attrs["fn"] = "frobnicate"
    with pytest.raises(
        EmulationError, match=rf"kernel '{relu}' \(elementwise\): elementwise fn 'frobnicate'"
    ):
        evaluate(p, x)
    p = _copy(mlp_program)
    _first(p, "elementwise").attrs["args"] = [{"in": 3}]
    with pytest.raises(EmulationError, match=rf"kernel '{relu}' .*operand {{'in': 3}} names no input"):
        evaluate(p, x)
    p = _copy(mlp_program)
    _first(p, "elementwise").op = "teleport"
    with pytest.raises(EmulationError, match=rf"kernel '{relu}' .*op kind 'teleport' has no rule"):
        evaluate(p, x)
    p = _copy(mlp_program)
    values = _first(p, "sparse_matmul").arrays["values"]
    p.arrays[values] = p.arrays[values][:-1]
    with pytest.raises(EmulationError, match=rf"kernel '{fc}' \(sparse_matmul\): index ends \d+ nonzeros"):
        evaluate(p, x)
    p = _copy(mlp_program)
    bias = _first(p, "sparse_matmul").arrays["bias"]
    p.arrays[bias] = p.arrays[bias][:-1]
    with pytest.raises(EmulationError, match=rf"kernel '{fc}' .*array 'bias' has \d+ entries"):
        evaluate(p, x)
    p = _copy(mlp_program)
    del p.arrays[_first(p, "sparse_matmul").arrays["index"]]
    with pytest.raises(EmulationError, match="no payload"):
        evaluate(p, x)
    p = _copy(mlp_program)
    _first(p, "sparse_matmul").attrs["kind"] = "conv3d"
    with pytest.raises(EmulationError, match=rf"kernel '{fc}' .*sparse_matmul kind 'conv3d'"):
        evaluate(p, x)
    p = _copy(mlp_program)
    _first(p, "elementwise").shape = (1, 2)
    with pytest.raises(
        EmulationError, match=rf"kernel '{relu}' \(elementwise\): computes \[8, 256\]; the program"
    ):
        evaluate(p, x)
    with pytest.raises(EmulationError, match="no payloads"):
        evaluate(sparsefx.parse_program(str(mlp_program)), x)


def test_payload_size_errors_in_dense_kernels(compiled) -> None:
    sm, args = compiled["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=MESH["gpt-tiny"], mode="streaming")
    ids = fresh_like(args[0])
    for op, role in (("layer_norm", "weight"), ("embedding", "table"), ("constant", "value")):
        p = _copy(program)
        k = _first(p, op)
        name = k.arrays[role]
        p.arrays[name] = p.arrays[name][:-1]
        with pytest.raises(EmulationError, match=rf"kernel '{k.name}' \({op}\): array '{name}' has"):
            evaluate(p, ids)
    p = _copy(program)
    k = _first(p, "layout")
    k.attrs["fn"] = "twist"
    with pytest.raises(EmulationError, match=rf"kernel '{k.name}' \(layout\): layout fn 'twist'"):
        evaluate(p, ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_evaluate_on_a_gpu(compiled) -> None:
    sm, args = compiled["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=MESH["gpt-tiny"])
    ids = fresh_like(args[0])
    got = evaluate(program, ids, device="cuda")
    assert got.device.type == "cuda"
    assert torch.allclose(got.cpu(), evaluate(program, ids), rtol=1e-4, atol=1e-5)
    assert math.isfinite(float(got.abs().max()))
