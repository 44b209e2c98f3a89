"""A head merge sends its result in its reader's blocks (``blocks.result_blocks``, ``cost.block_rows``).

The merge waits for every head of its input before it starts, but once it has them nothing stops it
sending the first rows first: in a streaming program the matmul after it then starts on the first
block's messages instead of waiting for every row of every feature of its lane."""

from __future__ import annotations

import pytest
import torch

import sparsefx
from sparsefx.models.gpt import GPT, GPTConfig
from sparsefx.runtime.cost import block_rows
from sparsefx.runtime.summary import mapping
from sparsefx.runtime.text import parse_program

LINEAR = ["*.attn.*.weight", "*.mlp.*.weight", "lm_head.weight"]


@pytest.fixture(scope="module")
def lowered() -> tuple[sparsefx.DataflowProgram, sparsefx.SparseModel, tuple]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, vocab_size=64, max_seq_len=64)).eval()
    ids = torch.randint(0, 64, (2, 32))
    sm = sparsefx.compile(model, {"algorithm": "static", "sparsity": 0.9, "param_filter": LINEAR}, (ids,))
    program = sparsefx.lower(sm, (ids,), mesh=(16, 16), mode="streaming")
    return program, sm, (ids,)


def _merge(program: sparsefx.DataflowProgram) -> sparsefx.Kernel:
    return program.kernel("flatten")


def test_the_merge_sends_in_its_readers_blocks(lowered: tuple) -> None:
    program, _, _ = lowered
    merge = _merge(program)
    readers = [k for k in program.kernels if merge.name in k.inputs]
    assert merge.attrs["result_rows"] == min(block_rows(r) for r in readers) == block_rows(merge)
    assert block_rows(merge) < 64  # 2 x 32 rows, in more than one block
    assert "result in" in mapping(merge)
    assert str(parse_program(str(program))) == str(program)


def test_both_executors_compute_what_pytorch_does_and_agree(lowered: tuple) -> None:
    program, sm, args = lowered
    want = sm.eval()(*args)
    fast = sparsefx.run(program, args)
    reference = sparsefx.run(program, args, executor="reference")
    torch.testing.assert_close(fast.outputs, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(reference.outputs, want, rtol=1e-4, atol=1e-5)
    assert abs(fast.stats.cycles - reference.stats.cycles) <= 0.05 * reference.stats.cycles


@pytest.mark.parametrize("executor", ["fast", "reference"])
def test_the_matmul_after_the_merge_ends_sooner_than_with_one_block(lowered: tuple, executor: str) -> None:
    """The same program with the merge's result in one block (as before): on either executor the
    matmul reading it waits for whole messages and ends later (on the fast clock 5,168 cycles against
    5,074; on the reference 5,258 against 5,217)."""
    program, _, args = lowered

    def ends() -> dict[str, int]:
        return {k.name: k.end for k in sparsefx.run(program, args, executor=executor).stats.kernels}

    blocked = ends()
    merge = _merge(program)
    kept = merge.attrs.pop("result_rows")
    try:
        whole = ends()
    finally:
        merge.attrs["result_rows"] = kept
    assert blocked["masked_linear_1"] < whole["masked_linear_1"], (blocked, whole)
