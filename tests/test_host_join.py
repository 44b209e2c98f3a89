"""A streamed matmul that the model returns goes to the host part by part, and the host puts it together.

``passes/lower/host_join.py``: no ``cat`` kernel keeps the parts on the mesh; each part is a program
output, in the host as soon as it is made, and the output tree's ``cat`` node rebuilds the value. The
dense baseline does the same with its own passes.
"""

from __future__ import annotations

import pytest
import torch

import sparsefx
from sparsefx.errors import EmulationError
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.held import held_peak
from sparsefx.runtime.mesh import HardwareSpec
from sparsefx.runtime.outputs import rebuild_outputs

SMALL = HardwareSpec(sram_bytes=4096)


class Twice(torch.nn.Module):
    """Returns the wide layer's result and reads it again."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 64), torch.nn.Linear(64, 256)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.b(torch.relu(self.a(x)))
        return y, torch.relu(y)


def _wide(seed: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 256))
    return model.eval(), torch.randn(8, 16)


def _lower(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.nn.Module, sparsefx.DataflowProgram]:
    sm = sparsefx.compile(model, 0.5, (x,))
    return sm, sparsefx.lower(sm, (x,), mesh=(2, 8), mode="streaming", hardware=SMALL)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_returned_streamed_matmul_leaves_part_by_part(seed: int, tmp_path) -> None:
    sm, program = _lower(*_wide(seed))
    parts = [k.name for k in program.kernels if k.name.startswith("masked_linear_1.part")]
    assert len(parts) >= 2 and "masked_linear_1" not in {k.name for k in program.kernels}
    assert program.outputs == parts
    assert program.output_tree == {
        "type": "cat", "dim": 1, "items": [{"type": "tensor", "index": i} for i in range(len(parts))]
    }  # fmt: skip
    peak = held_peak(program)
    assert peak is None or not set(peak.values) & set(parts)  # nothing of the output waits on the mesh
    timeline = simulate(program)
    ends = {kt.name: kt.end for kt in timeline.kernels}
    assert timeline.output_done[parts[0]] < ends[parts[-1]]  # in the host before the last part is made
    assert timeline.cycles == max([*ends.values(), *timeline.output_done.values()])

    dense = dense_program(program)
    assert dense is not None and dense.kernels[-1].op == "sparse_matmul"  # its passes, no cat
    assert all(n.rsplit(".dense", 1)[0] in parts for n in dense.outputs) and len(dense.outputs) > len(parts)

    x = torch.randn(8, 16)
    fast = sparsefx.run(program, (x,))
    ref = sparsefx.run(program, (x,), executor="reference")
    for out in (fast.outputs, ref.outputs):
        torch.testing.assert_close(out, sm.eval()(x), rtol=1e-4, atol=1e-5)
    assert abs(fast.stats.cycles / ref.stats.cycles - 1) <= 0.05

    again = sparsefx.parse_program(str(program))
    assert str(again) == str(program) and again.output_tree == program.output_tree
    program.save(tmp_path / "p.sfxp")
    loaded = sparsefx.load_program(tmp_path / "p.sfxp")
    assert str(loaded) == str(program)
    assert torch.equal(sparsefx.run(loaded, (x,)).outputs, fast.outputs)


def test_a_streamed_matmul_another_kernel_reads_keeps_its_cat() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    sm, program = _lower(Twice().eval(), x)
    names = [k.name for k in program.kernels]
    cat = next(k for k in program.kernels if k.attrs.get("fn") == "cat")
    assert all(".part" in v for v in cat.inputs) and names.index(cat.name) < len(names) - 1
    assert cat.name in program.outputs and not any(".part" in n for n in program.outputs)
    y, r = sparsefx.run(program, (x,)).outputs
    want = sm.eval()(x)
    torch.testing.assert_close(y, want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(r, want[1], rtol=1e-4, atol=1e-5)


FIRST, SECOND = {"type": "tensor", "index": 0}, {"type": "tensor", "index": 1}


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"type": "cat", "dim": 2, "items": [FIRST]}, "has dim 2; its tensors have 2"),
        ({"type": "cat", "dim": True, "items": [FIRST]}, "has dim True"),
        ({"type": "cat", "dim": 0, "items": []}, "it needs tensors"),
        ({"type": "cat", "dim": 0, "items": [{"type": "const", "value": 1}]}, "it needs tensors"),
        ({"type": "cat", "dim": 0, "items": [FIRST, SECOND]}, "do not fit together"),
    ],
)
def test_a_bad_cat_node_is_an_emulation_error(node: dict, message: str) -> None:
    with pytest.raises(EmulationError, match=message):
        rebuild_outputs(node, [torch.ones(2, 3), torch.ones(2, 4)])


def test_a_cat_node_puts_its_tensors_together_in_any_structure() -> None:
    tree = {"type": "tuple", "items": [
        {"type": "cat", "dim": -1, "items": [{"type": "tensor", "index": 1}, {"type": "tensor", "index": 0}]},
        {"type": "tensor", "index": 0},
    ]}  # fmt: skip
    a, b = torch.randn(2, 3), torch.randn(2, 4)
    joined, alone = rebuild_outputs(tree, [a, b])
    assert torch.equal(joined, torch.cat([b, a], -1)) and alone is a
