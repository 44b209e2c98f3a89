"""The cost rules as both executors charge them: a task starts once, each AXPY pays a vector start, a
partial sum that meets another is added in, and a matmul that keeps every weight loads no indices."""

from __future__ import annotations

import dataclasses
from math import ceil

import pytest
import torch

import sparsefx
from sparsefx.errors import LoweringError
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.cost import (
    OPERANDS,
    axpy_cycles,
    partial_add_cycles,
    sparse_task_cycles,
    task_cycles,
    vector_cycles,
)
from sparsefx.runtime.encoding import PACKED_ROLES, range_bytes
from sparsefx.runtime.layout import dense_layout, weight_bytes
from sparsefx.runtime.mesh import HardwareSpec


def test_a_task_starts_once_and_each_axpy_pays_a_vector_start() -> None:
    """At 32-row blocks a nonzero used to pay the task start four times per 128 rows; now a task (one
    input column on one PE for one block) pays it once, and each AXPY its vector start."""
    hw = HardwareSpec()
    simd = hw.simd_widths["float32"]
    assert axpy_cycles(32, "float32", hw) == hw.vector_start_cycles + 32 // simd
    axpy = axpy_cycles(32, "float32", hw)
    assert sparse_task_cycles(5, 32, "float32", hw) == hw.task_start_cycles + 5 * axpy
    assert sparse_task_cycles(0, 32, "float32", hw) == 0  # no nonzeros, no task
    assert task_cycles(6, 32, "float32", hw) == hw.task_start_cycles + 6 * (hw.vector_start_cycles + 16)
    assert partial_add_cycles(32, "float32", hw) == axpy_cycles(32, "float32", hw)


@pytest.mark.parametrize("executor", ["fast", "reference"])
def test_one_pe_busy_cycles_are_its_tasks(executor: str) -> None:
    """A dense 8-to-3 layer on one PE: each block runs one task per input column, the task start once
    and three AXPYs; no partial sum travels, so there is nothing to add."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3, bias=False)
    x = torch.randn(12, 8)
    program = sparsefx.lower(sparsefx.compile(model, 0.0, (x,)), (x,), mesh=(1, 1))
    k = program.kernels[0]
    b = k.attrs["rows_in_flight"]
    sizes = [b] * (12 // b) + ([12 % b] if 12 % b else [])
    hw = program.hardware
    want = sum(8 * sparse_task_cycles(3, n, "float32", hw) for n in sizes)
    stats = sparsefx.run(program, (x,), executor=executor).stats
    assert int(stats.pe_busy.sum()) == want


def test_partial_sums_that_meet_are_added_by_the_pe_they_meet_at() -> None:
    """A 4-to-1 layer on one column of two rows: each row holds half the inputs and a part of the one
    output, whose lane is row 0; row 1's part travels up and row 0 adds it in, once per block. Both
    executors charge it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    x = torch.randn(6, 4)
    program = sparsefx.lower(sparsefx.compile(model, 0.0, (x,)), (x,), mesh=(1, 2))
    k = program.kernels[0]
    assert (k.region.width, k.region.height) == (1, 2)
    b = k.attrs["rows_in_flight"]
    sizes = [min(b, 6 - q) for q in range(0, 6, b)]
    hw = program.hardware
    tasks = sum(2 * sparse_task_cycles(1, n, "float32", hw) for n in sizes)  # per row: 2 columns
    adds = sum(partial_add_cycles(n, "float32", hw) for n in sizes)
    for executor in ("fast", "reference"):
        busy = sparsefx.run(program, (x,), executor=executor).stats.pe_busy
        assert busy.reshape(-1).tolist() == [tasks + adds, tasks], executor


def _streaming(sparsity: float) -> sparsefx.DataflowProgram:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16))
    x = torch.randn(8, 32)
    return sparsefx.lower(sparsefx.compile(model, sparsity, (x,)), (x,), mesh=(8, 8), mode="streaming")


def test_a_matmul_that_keeps_every_weight_loads_a_dense_layout() -> None:
    """At sparsity 0 a layer's weights are a dense layout: values, each PE's ranges and the bias, no
    row indices or column offsets. The dense baseline's all-ones kernels follow the same rule, so the
    program and its baseline load the same bytes, and the run is its own baseline."""
    program = _streaming(0.0)
    baseline = dense_program(program)
    assert baseline is not None
    for k in (k for k in program.kernels if k.op == "sparse_matmul"):
        assert dense_layout(program, k)
        values = int(k.attrs["in_features"]) * int(k.attrs["out_features"])
        bias = int(k.attrs["out_features"]) * 4
        ranges = range_bytes(k.attrs["in_features"], k.attrs["out_features"])
        assert weight_bytes(program, k) == (values * 4 + ranges * k.region.pes + bias)
        plain = baseline.kernel(k.name)
        assert plain.region == k.region
        assert weight_bytes(baseline, plain) == weight_bytes(program, k)
    c = sparsefx.run(program, (torch.randn(8, 32),)).stats.dense
    assert c is not None and c.dense_cycles == c.sparse_cycles


def test_a_pruned_matmul_loads_its_indices() -> None:
    """A layer with pruned weights is a sparse layout: every array it holds is loaded."""
    program = _streaming(0.5)
    for k in (k for k in program.kernels if k.op == "sparse_matmul"):
        assert not dense_layout(program, k)
        assert weight_bytes(program, k) == sum(program.specs[a].nbytes for a in k.arrays.values())
        assert set(PACKED_ROLES) <= set(k.arrays)  # its indices packed, a byte a nonzero


def test_the_vector_start_is_a_hardware_number() -> None:
    """``vector_start_cycles`` is checked like ``task_start_cycles``: an integer >= 0."""
    assert HardwareSpec(vector_start_cycles=0).vector_start_cycles == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(LoweringError, match="vector_start_cycles"):
            HardwareSpec(vector_start_cycles=bad)
    assert HardwareSpec().vector_start_cycles == 2


def test_sram_bandwidth_binds_where_a_vector_operation_moves_more_than_it_serves() -> None:
    """A vector operation moves ``OPERANDS`` values an element through SRAM (an AXPY reads y and x and
    writes y). On WSE-2 that is 24 bytes a cycle at fp32's 2 lanes and fp16's 4, under the 27.7 the
    published 20 PB/s gives each PE, so the lanes bind; on a PE with a quarter of it the traffic does."""
    hw = HardwareSpec()
    assert 27 < hw.sram_bytes_per_cycle < 28 and OPERANDS == 3
    slow = HardwareSpec(sram_bytes_per_cycle=hw.sram_bytes_per_cycle / 4)
    for dtype, size in (("float32", 4), ("float16", 2), ("bfloat16", 2)):
        lanes = hw.simd_widths[dtype]
        for rows in (1, 7, 32, 128, 1000):
            assert vector_cycles(rows, dtype, hw) == hw.vector_start_cycles + -(-rows // lanes)
            moved = rows * OPERANDS * size / slow.sram_bytes_per_cycle
            want = hw.vector_start_cycles + max(-(-rows // lanes), ceil(moved))
            assert vector_cycles(rows, dtype, slow) == want
    with pytest.raises(LoweringError, match="sram_bytes_per_cycle"):
        HardwareSpec(sram_bytes_per_cycle=0)


@pytest.mark.parametrize("executor", ["fast", "reference"])
def test_both_executors_charge_the_sram_bandwidth(executor: str) -> None:
    """The same program on a PE with a quarter of the SRAM bandwidth: every task takes longer by the
    rule, in both executors, and its values are the same."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3, bias=False)
    x = torch.randn(12, 8)
    program = sparsefx.lower(sparsefx.compile(model, 0.0, (x,)), (x,), mesh=(1, 1))
    sizes = _sizes(program.kernels[0].attrs["rows_in_flight"], 12)
    wse2 = sparsefx.run(program, (x,), executor=executor)
    program.hardware = dataclasses.replace(program.hardware, sram_bytes_per_cycle=27.68166089965398 / 4)
    slow = sparsefx.run(program, (x,), executor=executor)
    want = sum(8 * sparse_task_cycles(3, n, "float32", program.hardware) for n in sizes)
    assert int(slow.stats.pe_busy.sum()) == want > int(wse2.stats.pe_busy.sum())
    assert torch.equal(slow.outputs, wse2.outputs)


def _sizes(b: int, rows: int) -> list[int]:
    return [b] * (rows // b) + ([rows % b] if rows % b else [])
