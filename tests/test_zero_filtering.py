"""Zeros are filtered at the sender: a message whose values are all zero is not sent.

A message is one feature of one block of rows. An all-zero one puts no wavelet on any link and starts
no task on a sparse matmul; its reader learns that the block is complete from its lane's end-of-block
mark (the control bit of the lane's last message, or one control wavelet when that message is
filtered too). Both executors filter the same messages, the stats count what was saved, and the dense
baseline filters the same zeros, so activation sparsity never inflates the weight-sparsity speedup.
"""

from __future__ import annotations

import math

import pytest
import torch

import sparsefx
from sparsefx.runtime.cost import block_rows, wavelets
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.program import lane_bounds

EXECUTORS = ("fast", "reference")


def _mlp(bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256, bias=bias), torch.nn.ReLU(), torch.nn.Linear(256, 64, bias=bias)
    )


def _lowered(model: torch.nn.Module, x: torch.Tensor, mode: str = "streaming") -> tuple:
    sm = sparsefx.compile(model, 0.9, (x,))
    mesh = (8, 8) if mode == "streaming" else (16, 8)
    return sm, sparsefx.lower(sm, (x,), mesh=mesh, mode=mode)


def _expected_filtered(program: sparsefx.DataflowProgram, values: dict[str, torch.Tensor]) -> int:
    """Wavelets the senders save, counted from the values themselves: every all-zero message of every
    value a kernel reads, and of every output, less the lone end-of-block wavelet of a lane whose last
    message is all zero."""
    hw, saved = program.hardware, 0
    producers = {k.name: k for k in program.kernels}
    for reads in [k.inputs for k in program.kernels] + [program.outputs]:
        for name in dict.fromkeys(reads):
            flat = values[name].reshape(-1, values[name].shape[-1])
            rows, f = flat.shape
            if name in producers:  # a kernel's result, in its blocks, on its lanes
                p = producers[name]
                b, dtype = block_rows(p), p.dtype
                lanes = min(int(p.attrs.get("lanes", p.region.height)), f, p.region.height)
                wave = [wavelets(min(b, rows - i), dtype, hw) for i in range(0, rows, b)]
            else:  # a program input: one block, stretched to the host link
                b, lanes = rows, min(program.mesh.height, f)
                dtype = next(s.dtype for s in program.inputs if s.name == name)
                wave = [math.ceil(wavelets(rows, dtype, hw) * max(1.0, lanes / hw.host_wavelets_per_cycle))]
            ends = {int(e) - 1 for e in lane_bounds(f, max(lanes, 1))[1:]}
            for q, w in enumerate(wave):
                zero = ~(flat[q * b : (q + 1) * b] != 0).any(dim=0)
                saved += sum(w - (j in ends) for j in zero.nonzero().flatten().tolist())
    return saved


def _values(program: sparsefx.DataflowProgram, x: torch.Tensor) -> dict[str, torch.Tensor]:
    from sparsefx.runtime.evaluate import evaluate

    seen = {program.inputs[0].name: x}
    evaluate(program, (x,), listener=lambda k, _, result: seen.__setitem__(k.name, result))
    return seen


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_all_zero_input_sends_no_message_and_starts_no_task(executor: str) -> None:
    """An all-zero input to a ReLU MLP without biases: every value is zero, so every message is
    filtered. Before, 11,264 wavelets went out exactly as with a dense input."""
    model = _mlp(bias=False)
    x = torch.randn(4, 64)
    sm, program = _lowered(model, x)
    dense = sparsefx.run(program, (x,), executor=executor).stats
    zero = sparsefx.run(program, (torch.zeros(4, 64),), executor=executor).stats
    assert zero.axpys == 0 and zero.skipped_axpys == dense.axpys + dense.skipped_axpys
    assert zero.wavelets_filtered > 0 and zero.wavelets < dense.wavelets
    assert zero.wavelets_filtered == _expected_filtered(program, _values(program, torch.zeros(4, 64)))
    assert zero.cycles < dense.cycles / 2, (zero.cycles, dense.cycles)
    first = zero.kernels[0]
    assert first.end - first.start < (dense.kernels[0].end - dense.kernels[0].start) / 2


@pytest.mark.parametrize("mode", ["streaming", "pipelined"])
def test_the_saved_wavelets_are_the_zero_messages_of_random_patterns(mode: str) -> None:
    """Seeded random zero patterns (whole rows, whole features, scattered elements): each executor's
    count of filtered wavelets equals the all-zero messages counted from the values, and the two
    executors agree on it exactly."""
    model = _mlp()
    sm, program = _lowered(model, torch.randn(4, 64), mode)
    gen = torch.Generator().manual_seed(23)
    for _ in range(3):
        x = torch.randn(4, 64, generator=gen)
        x = x * (torch.rand(4, 1, generator=gen) < 0.5) * (torch.rand(1, 64, generator=gen) < 0.7)
        x = x * (torch.rand(4, 64, generator=gen) < 0.8)
        want = _expected_filtered(program, _values(program, x))
        got = [sparsefx.run(program, (x,), executor=e).stats for e in EXECUTORS]
        assert [s.wavelets_filtered for s in got] == [want, want]
        assert got[0].wavelets == got[1].wavelets


def test_relu_activation_sparsity_shows_in_cycles_and_traffic() -> None:
    """One token at a time (a message is one value), a ReLU MLP's hidden layer is about half zeros:
    the run sends fewer wavelets and takes fewer cycles than the same program with every message sent
    (the clock without the zero pattern)."""
    model = _mlp()
    x = torch.randn(1, 64)
    sm, program = _lowered(model, x)
    stats = sparsefx.run(program, (x,)).stats
    everything = simulate(program)  # no zero pattern: every message sent
    assert stats.wavelets_filtered > 0
    assert stats.cycles < everything.cycles
    assert stats.axpys < sum(kt.axpys for kt in everything.kernels)


def test_the_dense_baseline_filters_the_same_zeros() -> None:
    """An all-zero input makes the dense baseline faster too: activation sparsity counts on both sides,
    so the weight-sparsity speedup stays within its ideal."""
    model = _mlp(bias=False)
    x = torch.randn(4, 64)
    sm, program = _lowered(model, x)
    dense_in = sparsefx.run(program, (x,)).stats.dense
    zero_in = sparsefx.run(program, (torch.zeros(4, 64),)).stats.dense
    assert zero_in.dense_cycles < dense_in.dense_cycles
    assert zero_in.layers_realized <= zero_in.layers_ideal
