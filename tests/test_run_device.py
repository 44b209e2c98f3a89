"""``sparsefx.run`` on a device: the values are computed there, the clock runs on the host.

The clock schedules small integers over many tiny tensors: on a GPU every op is a launch and every
read a host sync, so ``run`` keeps it on the CPU and brings the zero patterns there in one copy. Without
a GPU, ``second_device`` stands in for one; ``Reads`` counts what would be a host sync there."""

from __future__ import annotations

import pytest
import torch

import sparsefx
from conftest import LOWER_MESH
from second_device import DEVICE, HOST, SecondDevice, _side
from sparsefx.models import build_model
from sparsefx.runtime import run as run_module
from sparsefx.runtime.random_inputs import random_inputs
from sparsefx.runtime.report import report_data

MODELS = ("gpt-tiny", "mlp")
_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu")


class Reads(SecondDevice):
    """``SecondDevice`` that also records every read of a device tensor by the host (a sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "")
        if args and isinstance(args[0], torch.Tensor) and self.side(args[0]) == DEVICE:
            to_host = name == "to" and HOST in [_side(a) for a in (*args[1:], (kwargs or {}).get("device"))]
            if name in _READS or to_host:
                self.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs)


@pytest.fixture(scope="module")
def programs() -> dict[str, sparsefx.DataflowProgram]:
    torch.manual_seed(0)
    out = {}
    for name in MODELS:
        spec = build_model(name)
        sm = sparsefx.compile(spec.model, 0.9, spec.args)
        out[name] = sparsefx.lower(sm, spec.args, mesh=LOWER_MESH[name], mode="streaming")
    return out


@pytest.mark.parametrize("name", MODELS)
def test_the_clock_runs_on_the_host_and_the_stats_match(programs, name, monkeypatch) -> None:
    program = programs[name]
    x = random_inputs(program, seed=7)
    want = sparsefx.run(program, x)
    calls = []
    real = run_module.simulate

    def clock(p, activity=None, *rest, **kw):  # noqa: ANN001, ANN202
        calls.append((rest, kw, [side.side(t) for t in (activity or {}).values()]))
        return real(p, activity, *rest, **kw)

    monkeypatch.setattr(run_module, "simulate", clock)
    with SecondDevice() as side:
        got = sparsefx.run(program, x, device="meta")
        assert all(t.device.type == "meta" for t in torch.utils._pytree.tree_flatten(got.outputs)[0])
    assert len(calls) == 2  # the program and its dense baseline, neither given a device
    assert all(rest == () and kw == {} and set(sides) == {HOST} for rest, kw, sides in calls), calls
    assert report_data(got.stats, program) == report_data(want.stats, program)
    assert side.sides[DEVICE] > 0


@pytest.mark.parametrize("name", MODELS)
def test_a_run_on_a_device_reads_it_once(programs, name) -> None:
    """Once its payloads are on the device, a run reads the device only to bring the zero patterns and
    NaN checks home (one copy) and to check an embedding's ids (its min and max), not once per value."""
    program = programs[name]
    with SecondDevice():
        sparsefx.run(program, random_inputs(program, seed=1), device="meta")  # payloads moved, merged
    with Reads() as reads:
        sparsefx.run(program, random_inputs(program, seed=2), device="meta")
    embeddings = sum(k.op == "embedding" for k in program.kernels)
    assert reads.reads.count("cpu") == 1, reads.reads
    assert len(reads.reads) <= 1 + 2 * embeddings, reads.reads


def test_nonfinite_inputs_are_still_reported_from_the_device(programs) -> None:
    program = programs["mlp"]
    (name,) = [s.name for s in program.inputs]
    x = {name: torch.full(tuple(program.inputs[0].shape), float("nan"))}
    with SecondDevice(), pytest.warns(UserWarning, match="read NaN or inf"):
        sparsefx.run(program, x, device="meta")
