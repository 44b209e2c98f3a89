"""Lowering compiled models to dataflow programs: they verify, and their weights reassemble exactly."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import transformers

import sparsefx
from conftest import HF_VOCAB, LOWER_MESH, compile_builtins, tiny_bert_config, tiny_gpt2_config
from sparsefx.errors import LoweringError, VerifyError
from sparsefx.runtime.csc import assemble
from sparsefx.runtime.mesh import HardwareSpec

MODES = ("pipelined", "streaming")
PLACEMENTS = ("block", "balanced")
MESH = LOWER_MESH


@pytest.fixture(scope="module")
def compiled() -> dict[str, tuple[sparsefx.SparseModel, tuple]]:
    return compile_builtins()


def expected_weight(sm: sparsefx.SparseModel, kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's weight as [out, in] from the model itself: weight * mask, and the mask."""
    name = kernel.attrs["param"]
    weight = sm.get_parameter(name).detach()
    masks = sm.masks
    mask = masks[name] if name in masks else torch.ones(weight.shape, dtype=torch.bool)
    kind = kernel.attrs["kind"]
    if kind in ("conv1d", "conv2d"):
        groups = kernel.attrs.get("groups", 1)
        out, per = weight.shape[:2]
        full_w = torch.zeros((out, per * groups, *weight.shape[2:]), dtype=weight.dtype)
        full_m = torch.zeros(full_w.shape, dtype=torch.bool)
        step = out // groups
        for g in range(groups):
            rows, cols = slice(g * step, (g + 1) * step), slice(g * per, (g + 1) * per)
            full_w[rows, cols], full_m[rows, cols] = weight[rows], mask[rows]
        weight, mask = full_w.reshape(out, -1), full_m.reshape(out, -1)
    elif kind in ("addmm", "matmul"):
        weight, mask = weight.t(), mask.t()
    return weight * mask, mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", list(MESH))
def test_builtin_models_verify_and_reassemble_exactly(compiled, name: str, mode: str, placement: str) -> None:
    sm, args = compiled[name]
    program = sparsefx.lower(sm, args, mesh=MESH[name], mode=mode, placement=placement)
    program.verify()
    assert str(sparsefx.parse_program(str(program))) == str(program)
    assert_reassembles(sm, program)


def assert_reassembles(sm: sparsefx.SparseModel, program) -> None:
    """Every sparse kernel's per-PE slices rebuild the model's weight * mask bit for bit."""
    sparse = [k for k in program.kernels if k.op == "sparse_matmul"]
    assert {k.attrs["param"] for k in sparse} >= set(sm.plan.sparse)
    for k in sparse:
        arrays = {role: program.arrays[array] for role, array in k.arrays.items()}
        got_w, got_m = assemble(
            arrays, k.attrs["in_features"], k.attrs["out_features"], k.region.width, k.region.height
        )
        want_w, want_m = expected_weight(sm, k)
        a = k.attrs.get("out_offset", 0)  # a part of a weight streamed in passes
        want_w, want_m = want_w[a : a + k.attrs["out_features"]], want_m[a : a + k.attrs["out_features"]]
        assert torch.equal(got_m, want_m), k.name
        assert torch.equal(got_w, want_w), k.name
        assert k.stats["nnz"] == int(want_m.sum())
        assert k.stats["imbalance"] >= 1.0


def test_pipelined_regions_do_not_overlap_and_fill_the_lanes(compiled) -> None:
    sm, args = compiled["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=(64, 64))
    xs = [(k.region.x, k.region.x + k.region.width) for k in program.kernels]
    assert all(a1 <= b0 for (_, a1), (b0, _) in zip(xs, xs[1:]))
    assert {k.region.height for k in program.kernels} == {program.meta["lanes"]}
    assert program.colors_used <= program.hardware.colors


def test_every_op_of_the_model_is_lowered(compiled) -> None:
    """Nothing is dropped: every masked op and attention of gpt-tiny has its kernels."""
    sm, args = compiled["gpt-tiny"]
    program = sparsefx.lower(sm, args, mesh=(64, 64))
    ops = [k.op for k in program.kernels]
    assert ops.count("sparse_matmul") == 9  # 4 masked linears x 2 blocks + the dense lm_head
    assert ops.count("matmul") == 4  # scores and context per block
    assert ops.count("softmax") == 2 and ops.count("layer_norm") == 5 and ops.count("embedding") == 1
    assert program.outputs == ["lm_head"] and program.output_tree == {"type": "tensor", "index": 0}


def test_streaming_runs_a_layer_too_big_for_the_mesh_in_passes(compiled) -> None:
    """Weights stream in: a matmul whose data exceeds the mesh's SRAM runs as slices of its outputs."""
    sm, args = compiled["mlp"]
    small = HardwareSpec(sram_bytes=4096)
    with pytest.raises(LoweringError, match="bytes|columns"):
        sparsefx.lower(sm, args, mesh=(2, 8), hardware=small)  # pipelined: everything resident at once
    program = sparsefx.lower(sm, args, mesh=(2, 8), mode="streaming", hardware=small)
    program.verify()
    parts = [k for k in program.kernels if ".part" in k.name]
    assert parts and all(k.op == "sparse_matmul" and "out_offset" in k.attrs for k in parts)
    whole = {k.name.split(".part")[0] for k in parts}
    for name in whole:
        attrs = program.kernel(name).attrs
        assert {key: attrs[key] for key in ("fn", "dim", "lanes")} == {"fn": "cat", "dim": 1, "lanes": 8}
    assert_reassembles(sm, program)
    assert str(sparsefx.parse_program(str(program))) == str(program)


def test_the_model_keeps_its_mode(compiled) -> None:
    sm, args = compiled["mlp"]
    sm.train()
    sparsefx.lower(sm, args, mesh=(16, 16))
    assert sm.training


def test_hf_gpt2_from_export_lowers() -> None:
    torch.manual_seed(0)
    config = tiny_gpt2_config()
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, HF_VOCAB, (2, 16))
    sm = sparsefx.compile(model, 0.9, (ids,))
    program = sparsefx.lower(sm, (ids,), mesh=(64, 64), mode="streaming")
    program.verify()
    assert_reassembles(sm, program)  # GPT-2's Conv1D weights are [in, out], read through addmm
    assert {k.attrs["kind"] for k in program.kernels if k.op == "sparse_matmul"} >= {"addmm"}
    assert str(sparsefx.parse_program(str(program))) == str(program)
    kinds = {k.op for k in program.kernels}
    assert {"sparse_matmul", "matmul", "softmax", "layer_norm", "embedding"} <= kinds


def test_hf_bert_encoder_from_export_lowers() -> None:
    """A BERT encoder with token-type and position embeddings and an attention mask, called by keywords."""
    torch.manual_seed(0)
    config = tiny_bert_config()
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, HF_VOCAB, (2, 16))
    types = torch.zeros_like(ids)
    types[:, 8:] = 1
    call = {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids)}
    sm = sparsefx.compile(model, 0.9, call)
    program = sparsefx.lower(sm, call, mesh=(64, 64), mode="streaming", placement="block")
    program.verify()
    assert [s.name for s in program.inputs] == ["input_ids", "token_type_ids", "attention_mask"]
    assert [k.op for k in program.kernels].count("embedding") == 2  # words and token types
    assert program.output_tree["type"] == "dataclass"
    assert program.output_tree["keys"] == ["last_hidden_state", "pooler_output"]
    assert str(sparsefx.parse_program(str(program))) == str(program)


class _EagerRoot(torch.nn.Module):
    """Python control flow on a tensor value in the root: fx and export fail, the root stays eager."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if float(x.sum()) > 0 else self.b(x)


def test_a_model_captured_in_parts_says_which_part_is_eager() -> None:
    x = torch.ones(2, 8)
    sm = sparsefx.compile(_EagerRoot(), 0.5, x)
    assert sm.capture_method == "partial"
    with pytest.raises(LoweringError, match="captured in parts .*its root _EagerRoot.forward runs eagerly"):
        sparsefx.lower(sm, x, mesh=(8, 8))


def test_errors_name_the_bad_value(compiled) -> None:
    sm, args = compiled["mlp"]
    with pytest.raises(LoweringError, match="mode 'fast' is not valid"):
        sparsefx.lower(sm, args, mode="fast")
    with pytest.raises(LoweringError, match="placement 'rows' is not valid"):
        sparsefx.lower(sm, args, placement="rows")
    with pytest.raises(LoweringError, match="takes a compiled model"):
        sparsefx.lower(torch.nn.Linear(2, 2), torch.ones(1, 2))
    gpt, gargs = compiled["gpt-tiny"]
    with pytest.raises(LoweringError, match="needs at least .* columns .* Use mode='streaming'"):
        sparsefx.lower(gpt, gargs, mesh=(16, 16))


class _Fft(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft(x).real


def test_an_op_without_a_rule_is_an_error_naming_it() -> None:
    sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), _Fft()), 0.5, torch.ones(2, 8))
    with pytest.raises(LoweringError, match="op 'fft_fft'|op 'fft'"):
        sparsefx.lower(sm, torch.ones(2, 8), mesh=(8, 8))


def test_sram_overflow_grows_the_region_or_says_how_much(compiled) -> None:
    """With a PE's SRAM one byte short of what the roomy program's busiest PE needs, its layer is grown
    until it fits (the stages are then balanced within what each kernel's SRAM needs) and every kernel
    fits; with far too little, the error says how much."""
    sm, args = compiled["mlp"]
    roomy = sparsefx.lower(sm, args, mesh=(24, 16))
    short = max(k.stats["sram_max"] for k in roomy.kernels) - 1
    tight = sparsefx.lower(sm, args, mesh=(24, 16), hardware=HardwareSpec(sram_bytes=short))
    busiest = max(roomy.kernels, key=lambda k: k.stats["sram_max"]).name
    before, after = (p.kernel(busiest) for p in (roomy, tight))
    assert before.stats["sram_max"] > short  # the roomy layout overflows
    assert after.stats["sram_max"] <= short < before.stats["sram_max"]  # grown, then its stage balanced
    assert all(k.stats["sram_max"] <= short for k in tight.kernels)
    tight.verify()
    with pytest.raises(LoweringError, match="needs more than 64 bytes of SRAM per PE"):
        sparsefx.lower(sm, args, mesh=(16, 16), hardware=HardwareSpec(sram_bytes=64))


def test_verify_names_the_kernel_and_pe(compiled) -> None:
    sm, args = compiled["mlp"]
    program = sparsefx.lower(sm, args, mesh=(16, 16))
    k0, k1 = program.kernels[:2]
    k1.region = dataclasses.replace(k1.region, x=k0.region.x)
    with pytest.raises(
        VerifyError, match=rf"kernel '{k1.name}': region .* overlaps kernel '{k0.name}' at PE"
    ):
        program.verify()

    program = sparsefx.lower(sm, args, mesh=(16, 16))
    k = program.kernels[0]
    program.arrays[k.arrays["index"]][-1] = 255  # packed: the last nonzero's gap never ends
    with pytest.raises(VerifyError, match=rf"kernel '{k.name}': index ends \d+ nonzeros in \d+ bytes"):
        program.verify()

    program = sparsefx.lower(sm, args, mesh=(16, 16))
    program.routes[0] = dataclasses.replace(program.routes[0], color=24)
    with pytest.raises(VerifyError, match="uses color 24; the hardware has 24"):
        program.verify()

    program = sparsefx.lower(sm, args, mesh=(16, 16))
    program.hardware = HardwareSpec(sram_bytes=256)
    with pytest.raises(VerifyError, match=r"PE \(\d+, \d+\) needs \d+ bytes of SRAM; a PE has 256"):
        program.verify()

    program = sparsefx.lower(sm, args, mesh=(16, 16))
    dropped = next(r for r in program.routes if r.kind == "value" and r.dsts and r.dsts[0] != "host")
    program.routes.remove(dropped)
    with pytest.raises(VerifyError, match="no route carries its input"):
        program.verify()


def test_a_route_that_loses_its_data_fails_verify(compiled) -> None:
    sm, args = compiled["mlp"]
    program = sparsefx.lower(sm, args, mesh=(16, 16))
    route = next(r for r in program.routes if r.kind == "value" and r.src != "host")
    runs = program.arrays["routes.runs"]
    runs[route.first, 1] += 1  # the first lane's run moves one row down: its hops land on nothing
    with pytest.raises(VerifyError):
        program.verify()


class _InPlace(torch.nn.Module):
    """In-place ops whose input is read again afterwards: readers must see the written value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = torch.nn.functional.relu(h, inplace=True)
        z = h + y  # h was written by the relu
        w = z.mul_(2)
        a = self.act(z)
        return z + a + w


class _InPlaceView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        x[:, :4].relu_()
        return x


def test_in_place_ops_are_followed_and_views_refused() -> None:
    from sparsefx.runtime.evaluate import evaluate

    x = torch.randn(4, 8)
    sm = sparsefx.compile(_InPlace(), 0.5, x)
    sm.eval()
    program = sparsefx.lower(sm, x, mesh=(8, 8))
    fresh = torch.randn(4, 8)
    assert torch.allclose(evaluate(program, fresh), sm(fresh), rtol=1e-4, atol=1e-5)
    gm = torch.fx.symbolic_trace(_InPlaceView())
    from sparsefx.passes.lower import lower_graph

    with pytest.raises(LoweringError, match="writes in place into .* a view"):
        lower_graph(gm, (x,), {}, mesh=(8, 8))


class _Attributes(torch.nn.Module):
    """``x.T`` and ``x.mT`` read data (they are not folded like ``x.shape``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h.T @ h + h.mT.sum() * h.shape[0]


def test_tensor_attributes_that_read_data_are_lowered_not_folded() -> None:
    from sparsefx.runtime.evaluate import evaluate

    x = torch.randn(4, 8)
    sm = sparsefx.compile(_Attributes(), 0.5, x)
    sm.eval()
    program = sparsefx.lower(sm, x, mesh=(8, 8))
    assert [k.attrs.get("dims") for k in program.kernels if k.attrs.get("fn") == "permute"] == [
        [1, 0],
        [1, 0],
    ]
    assert not [k for k in program.kernels if k.op == "constant"]  # before: h.T became a constant
    fresh = torch.randn(4, 8)
    assert torch.allclose(evaluate(program, fresh), sm(fresh), rtol=1e-4, atol=1e-5)


class _Noisy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.randn(x.shape[0], 8)


def test_random_draws_are_refused_not_frozen() -> None:
    x = torch.randn(4, 8)
    sm = sparsefx.compile(_Noisy(), 0.5, x)
    with pytest.raises(LoweringError, match=r"draws random numbers \(randn\)"):
        sparsefx.lower(sm, x, mesh=(8, 8))


class _RunningMean(torch.nn.Module):
    """Forward updates buffers (an EMA and a counter) in eval mode too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("running", torch.zeros(8))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.running.mul_(0.9).add_(h.mean(0) * 0.1)
        self.count += 1
        return h + self.running


def test_state_the_forward_writes_is_named_in_a_warning() -> None:
    x = torch.randn(4, 8)
    sm = sparsefx.compile(_RunningMean(), 0.5, x)
    with pytest.warns(
        UserWarning, match="forward writes running, count; the program computes with the values"
    ):
        program = sparsefx.lower(sm, x, mesh=(8, 8))
    assert program.meta["state_not_updated"] == ["running", "count"]
    assert str(sparsefx.parse_program(str(program))) == str(program)


def test_kernel_flops_are_count_flops_figures_at_the_lowered_shapes(compiled) -> None:
    from sparsefx.passes.lower.flops import counted_flops

    sm, args = compiled["mlp"]  # compiled (and counted) for a batch of 8
    at_compile = sparsefx.lower(sm, args, mesh=(16, 16))
    sm.eval()
    counted = counted_flops(sm._root.graph_for(args, {}).graph_module, args, {})
    for k in (k for k in at_compile.kernels if k.op == "sparse_matmul"):
        assert k.stats["flops"] == counted[k.name] == 2 * k.stats["nnz"] * args[0].shape[0]
    x = torch.randn(3, args[0].shape[1])  # another batch: counts made for 8 rows are not used for 3
    assert counted_flops(sm._root.graph_for((x,), {}).graph_module, (x,), {}) == {}
    program = sparsefx.lower(sm, x, mesh=(16, 16))  # its own 2 * nnz * rows then
    assert all(k.stats["flops"] == 2 * k.stats["nnz"] * 3 for k in program.kernels if k.op == "sparse_matmul")


class _AlwaysDropout(torch.nn.Module):
    """``F.dropout`` without ``training=`` drops in eval mode too (its default is True)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.fc(x), 0.1)


class _ModeDropout(_AlwaysDropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.fc(x), 0.1, training=self.training)


def test_an_active_dropout_is_refused_and_an_eval_one_is_the_identity() -> None:
    x = torch.randn(4, 8)
    sm = sparsefx.compile(_AlwaysDropout(), 0.5, x)
    with pytest.raises(LoweringError, match="dropout is active"):
        sparsefx.lower(sm, x, mesh=(8, 8))
    sm = sparsefx.compile(_ModeDropout(), 0.5, x)
    program = sparsefx.lower(sm, x, mesh=(8, 8))
    assert [k.op for k in program.kernels] == ["sparse_matmul"]


@pytest.mark.parametrize("mode", ["pipelined", "streaming"])
def test_two_routes_on_one_color_at_one_pe_fail_verify(compiled, mode) -> None:
    """Streaming programs are checked several steps at a time: a clash within a step is still found."""
    sm, args = compiled["mlp"]
    program = sparsefx.lower(sm, args, mesh=(16, 16), mode=mode)
    program.verify()
    route = next(r for r in program.routes if r.kind == "value" and r.src != "host")
    program.routes.append(dataclasses.replace(route, name=route.name + "_again"))  # same runs, same color
    with pytest.raises(VerifyError, match=f"routes '{route.name}' and '{route.name}_again' both use color"):
        program.verify()


def test_a_route_of_every_step_clashes_with_one_of_a_step(compiled) -> None:
    """Streaming: a route in use at every step (step -1) and one of a single step on the same color and
    PEs clash, whichever steps ``verify`` expands together."""
    sm, args = compiled["mlp"]
    program = sparsefx.lower(sm, args, mesh=(16, 16), mode="streaming")
    route = next(r for r in program.routes if r.kind == "value" and r.src != "host" and r.step >= 0)
    program.routes.append(dataclasses.replace(route, name=route.name + "_always", step=-1))
    always = re.escape(f"'{route.name}_always'")
    with pytest.raises(VerifyError, match=rf"{always} and '[^']+' both use|and {always} both use"):
        program.verify()
