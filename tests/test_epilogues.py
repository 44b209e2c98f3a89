"""An activation after a sparse matmul is the matmul's epilogue (``passes/lower/fuse_epilogues.py``):
applied on the PE where each sum ends up, timed as a task there by both executors."""

from __future__ import annotations

import pytest
import torch

import sparsefx
from sparsefx.errors import VerifyError
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.passes.lower.builder import Pending
from sparsefx.passes.lower.fuse_epilogues import fuse_epilogues
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.blocking import block_sizes
from sparsefx.runtime.cost import epilogue_cycles, rows_of
from sparsefx.runtime.summary import mapping
from sparsefx.runtime.text import parse_program

LINEAR = ["*.attn.*.weight", "*.mlp.*.weight", "lm_head.weight"]


def _fc(name: str = "fc", kind: str = "linear") -> Pending:
    return Pending(name, "sparse_matmul", ("x",), (4, 8), "float32", {"kind": kind})


def _act(fn: str, src: str = "fc", name: str = "act") -> Pending:
    return Pending(
        name, "elementwise", (src,), (4, 8), "float32", {"fn": fn, "args": [{"in": 0}], "kwargs": {}}
    )


def _reader(src: str = "act") -> Pending:
    return Pending("out", "elementwise", (src, "x"), (4, 8), "float32", {"fn": "add"})


def test_only_an_activation_that_alone_reads_a_row_matmul_joins_it() -> None:
    joined = fuse_epilogues([_fc(), _act("relu"), _reader()], ["out"])
    assert [p.name for p in joined] == ["fc", "out"] and joined[1].inputs == ("fc", "x")
    assert joined[0].attrs["epilogue"] == {"fn": "relu", "kwargs": {}}
    kept = [
        [_fc(), _act("sigmoid"), _reader()],  # sigmoid(0) is not 0: zero sums would no longer be zero
        [_fc(), _act("relu"), _reader(), _reader("fc")],  # the matmul's result has another reader
        [_fc(kind="conv2d"), _act("relu"), _reader()],  # a convolution sends its channels together
    ]
    for pending in kept:
        assert [p.name for p in fuse_epilogues(pending, ["out"])] == [p.name for p in pending]
    assert len(fuse_epilogues([_fc(), _act("relu")], ["act"])) == 2  # the activation is an output
    assert len(fuse_epilogues([_fc(), _act("relu"), _reader()], ["fc", "out"])) == 3  # so is the matmul


@pytest.fixture(scope="module", params=["streaming", "pipelined"])
def gpt(request: pytest.FixtureRequest) -> tuple[sparsefx.DataflowProgram, sparsefx.SparseModel, str]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, vocab_size=64, max_seq_len=32)).eval()
    ids = torch.randint(0, 64, (2, 16))
    sm = sparsefx.compile(model, {"algorithm": "static", "sparsity": 0.9, "param_filter": LINEAR}, (ids,))
    mesh = (16, 16) if request.param == "streaming" else (64, 32)
    return sparsefx.lower(sm, (ids,), mesh=mesh, mode=request.param), sm, request.param


def test_a_gpt_mlp_has_no_gelu_kernel_and_both_executors_compute_what_pytorch_does(gpt) -> None:
    program, sm, _ = gpt
    assert not [k for k in program.kernels if k.op == "elementwise" and k.attrs.get("fn") == "gelu"]
    fused = [k for k in program.kernels if "epilogue" in k.attrs]
    assert len(fused) == 2 and all(k.attrs["epilogue"]["fn"] == "gelu" for k in fused)
    assert all(mapping(k).endswith("gelu epilogue") for k in fused)  # as sparsefx inspect shows it
    ids = torch.randint(0, 64, (2, 16))  # fresh inputs
    want = sm.eval()(ids)
    fast = sparsefx.run(program, (ids,))
    reference = sparsefx.run(program, (ids,), executor="reference")
    torch.testing.assert_close(fast.outputs, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(reference.outputs, want, rtol=1e-4, atol=1e-5)
    assert abs(fast.stats.cycles / reference.stats.cycles - 1) <= 0.05
    baseline = dense_program(program)
    assert baseline is not None and all("epilogue" in baseline.kernel(k.name).attrs for k in fused)


def test_the_epilogue_round_trips_through_text_and_files(gpt, tmp_path) -> None:
    program, _, _ = gpt
    assert str(parse_program(str(program))) == str(program)
    program.save(tmp_path / "p.sfxp")
    loaded = sparsefx.load_program(tmp_path / "p.sfxp")
    assert [k.attrs.get("epilogue") for k in loaded.kernels] == [
        k.attrs.get("epilogue") for k in program.kernels
    ]


@pytest.mark.parametrize("executor", ["fast", "reference"])
def test_each_whole_sum_pays_its_epilogue_on_its_pe(gpt, executor: str) -> None:
    """The kernels' busy cycles with the epilogues, less those of the same program without them, are
    exactly one epilogue task for each output of each block on both executors."""
    program, _, _ = gpt
    ids = torch.randint(0, 64, (2, 16))

    def busy() -> dict[str, int]:
        stats = sparsefx.run(program, (ids,), executor=executor).stats
        return {k.name: round(k.busy_mean * program.kernel(k.name).region.pes) for k in stats.kernels}

    with_them = busy()
    fused = [k for k in program.kernels if "epilogue" in k.attrs]
    kept = {k.name: k.attrs.pop("epilogue") for k in fused}
    try:
        without = busy()
    finally:
        for k in fused:
            k.attrs["epilogue"] = kept[k.name]
    for k in fused:
        sizes = block_sizes(rows_of(k.shape), int(k.attrs["rows_in_flight"])).tolist()
        each = sum(epilogue_cycles(k, int(n), program.hardware) for n in sizes)
        assert with_them[k.name] - without[k.name] == int(k.attrs["out_features"]) * each, k.name


@pytest.mark.parametrize(
    "bad", [{"fn": "sigmoid", "kwargs": {}}, "gelu", {"fn": "gelu", "kwargs": [1]}, {"fn": "relu", "x": 1}]
)
def test_verify_refuses_a_bad_epilogue_naming_it(gpt, bad) -> None:
    """A program file is untrusted: an epilogue the executors would not know is a ``VerifyError``."""
    program, _, _ = gpt
    k = next(k for k in program.kernels if "epilogue" in k.attrs)
    kept = k.attrs["epilogue"]
    k.attrs["epilogue"] = bad
    try:
        with pytest.raises(VerifyError, match=rf"kernel '{k.name}'.*attrs\['epilogue'\] is .*expected"):
            program.verify()
    finally:
        k.attrs["epilogue"] = kept
    program.verify()
