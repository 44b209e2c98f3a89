"""The fast executor on a device other than the CPU: its values and its clock run there, the stats
come back the same. Without a GPU, ``second_device`` stands in for one and refuses what a GPU would."""

from __future__ import annotations

import pytest
import torch

import sparsefx
from conftest import HF_VOCAB, LOWER_MESH, compile_builtins, tiny_gpt2_config
from second_device import DEVICE, HOST, CrossDevice, SecondDevice
from sparsefx.cli import main
from sparsefx.errors import EmulationError
from sparsefx.runtime import reuse
from sparsefx.runtime.evaluate import evaluate
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.random_inputs import random_inputs
from sparsefx.runtime.report import report_data
from sparsefx.runtime.run import _Activity

MODES = ("pipelined", "streaming")


@pytest.fixture(scope="module")
def programs() -> dict[tuple[str, str], sparsefx.DataflowProgram]:
    return {
        (name, mode): sparsefx.lower(sm, args, mesh=LOWER_MESH[name], mode=mode)
        for name, (sm, args) in compile_builtins().items()
        for mode in MODES
    }


def _leaves(tree) -> list[torch.Tensor]:
    return torch.utils._pytree.tree_flatten(tree)[0]


def test_the_stand_in_refuses_what_a_gpu_refuses() -> None:
    with SecondDevice() as side:
        d, h = torch.arange(4, device="meta"), torch.arange(4)
        for wrong in (
            lambda: d + h,
            lambda: h[d],
            lambda: d.numpy(),
            lambda: torch.cumsum(d, 0, out=torch.empty(4, dtype=torch.int64)),
            lambda: torch.zeros(4).index_add_(0, d, torch.ones(4)),
        ):
            with pytest.raises(CrossDevice):
                wrong()
        with torch.device("meta"):
            made = torch.zeros(4, dtype=torch.int64)
        assert made.device.type == "meta" and torch.full_like(made, 1).device.type == "meta"
        with pytest.raises(CrossDevice):
            made + h
        # what a GPU allows: host scalars, host indices into a device tensor, explicit moves
        assert (d[h.flip(0)] + torch.tensor(1)).tolist() == [4, 3, 2, 1]
        moved = h.to(d.device)
        assert moved is not h and (moved + made).tolist() == [0, 1, 2, 3]
        assert (d.cpu() + h).tolist() == [0, 2, 4, 6] and d.cpu().device.type == "cpu"
    assert side.sides[DEVICE] > 0 and side.sides[HOST] > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LOWER_MESH))
def test_run_on_a_second_device_matches_the_cpu(programs, name, mode) -> None:
    program = programs[name, mode]
    x = random_inputs(program, seed=3)
    want = sparsefx.run(program, x)  # first, so what the CPU run keeps is there to be misused
    with SecondDevice() as side:
        got = sparsefx.run(program, x, device="meta")
        assert all(t.device.type == "meta" for t in _leaves(got.outputs))
        again = sparsefx.run(program, x)  # the CPU again, after the device: nothing kept crosses over
    for a, b, c in zip(_leaves(want.outputs), _leaves(got.outputs), _leaves(again.outputs), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert report_data(got.stats, program) == report_data(want.stats, program)
    assert report_data(again.stats, program) == report_data(want.stats, program)
    assert side.sides[DEVICE] > 0  # the values are computed there; the clock runs on the host


def test_the_reference_executor_moves_a_model_output_whole() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(tiny_gpt2_config(n_layer=1)).eval()  # one layer: the output is
    ids = torch.randint(0, HF_VOCAB, (1, 8))  # what is under test, and every op pays the device's dispatch
    sm = sparsefx.compile(model, 0.9, (ids,))
    program = sparsefx.lower(sm, (ids,), mesh=(8, 8), mode="streaming")
    x = random_inputs(program, seed=6)
    want = sparsefx.run(program, x, executor="reference")
    with SecondDevice():
        got = sparsefx.run(program, x, executor="reference", device="meta")
        assert type(got.outputs) is type(want.outputs)  # a ModelOutput stays one, its tensors moved
        assert all(t.device.type == "meta" for t in _leaves(got.outputs.to_tuple()))
    assert torch.equal(got.outputs.logits, want.outputs.logits)
    (fresh,) = x.values()
    torch.testing.assert_close(want.outputs.logits, sm.eval()(fresh).logits, rtol=1e-4, atol=1e-5)


def test_the_clock_makes_its_tensors_on_the_device(programs, monkeypatch) -> None:
    monkeypatch.setattr(reuse, "REUSE", False)  # every kernel timed afresh, none taken from earlier runs
    program = programs["gpt-tiny", "streaming"]
    x = random_inputs(program, seed=4)
    seen = _Activity(program)
    evaluate(program, x, None, listener=seen)
    want = simulate(program, seen.seen)
    with SecondDevice() as side:
        got = simulate(program, seen.seen, "meta")
    assert got.cycles == want.cycles and [k.end for k in got.kernels] == [k.end for k in want.kernels]
    assert all(torch.equal(a.busy, b.busy) for a, b in zip(got.kernels, want.kernels))
    assert all(k.busy.device.type == "cpu" for k in got.kernels)  # the stats read them on the CPU
    # host tensors: the timeline handed back, and layouts read from the program's arrays
    assert side.sides[DEVICE] > 5 * side.sides[HOST], side.sides


@pytest.mark.parametrize("bad", ["warp9", "cuda:7" if not torch.cuda.is_available() else "cuda:999"])
def test_a_bad_device_is_an_emulation_error(programs, bad, tmp_path, capsys) -> None:
    program = programs["mlp", "pipelined"]
    with pytest.raises(EmulationError, match=f"device '{bad}' is not .*'cpu'"):
        sparsefx.run(program, random_inputs(program), device=bad)
    path = tmp_path / "mlp.sfxp"
    program.save(str(path))
    assert main(["run", str(path), "--device", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparsefx: error: ") and bad in err and "\n" not in err
    assert main(["run", str(path), "--device", "cpu", "--all"]) == 0
    assert "fast executor on cpu" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_run_on_a_gpu_matches_the_cpu(programs, mode) -> None:
    program = programs["gpt-tiny", mode]
    x = random_inputs(program, seed=5)
    want, got = sparsefx.run(program, x), sparsefx.run(program, x, device="cuda")
    for a, b in zip(_leaves(want.outputs), _leaves(got.outputs), strict=True):
        assert b.device.type == "cuda" and torch.allclose(a, b.cpu(), rtol=1e-4, atol=1e-5)
    assert report_data(got.stats, program) == report_data(want.stats, program)
