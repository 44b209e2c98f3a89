"""A causal attention's mask is applied inside its softmax (``attrs["causal"]``), so no mask kernel is
made and the scores are not sent again for it; in streaming mode that softmax spreads over its columns
in row tiles. Outputs stay PyTorch's on both executors, square or not, and the attribute survives the
text form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sparsefx
from sparsefx.runtime.text import parse_program, print_program


class _Causal(torch.nn.Module):
    def __init__(self, d: int, queries: int) -> None:
        super().__init__()
        self.proj, self.queries = torch.nn.Linear(d, d), queries

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).unflatten(-1, (2, -1)).transpose(1, 2)  # [B, heads, T, d / heads]
        return F.scaled_dot_product_attention(h[:, :, -self.queries :], h, h, is_causal=True)


@pytest.mark.parametrize("mode", ["streaming", "pipelined"])
@pytest.mark.parametrize("queries", [16, 5])  # square, and fewer queries than keys (top-left aligned)
def test_the_mask_is_the_softmaxs_own_and_outputs_match_pytorch(mode: str, queries: int) -> None:
    torch.manual_seed(0)
    sm = sparsefx.compile(_Causal(16, queries), 0.5)
    x = torch.randn(1, 16, 16)
    program = sparsefx.lower(sm, (x,), mesh=(16, 8), mode=mode)
    ops = [k.op for k in program.kernels]
    assert "constant" not in ops and "elementwise" not in ops, ops  # no mask, no add of it
    softmax = next(k for k in program.kernels if k.op == "softmax")
    assert softmax.attrs["causal"] is True
    fresh = torch.randn(1, 16, 16)
    expected = sm.eval()(fresh)
    for executor in ("fast", "reference"):
        got = sparsefx.run(program, (fresh,), executor=executor).outputs
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    again = parse_program(print_program(program))
    assert again.kernel(softmax.name).attrs["causal"] is True


def test_a_streaming_causal_softmax_runs_in_row_tiles_beside_the_attention_matmuls() -> None:
    torch.manual_seed(0)
    sm = sparsefx.compile(_Causal(16, 16), 0.5)
    x = torch.randn(1, 16, 16)
    program = sparsefx.lower(sm, (x,), mesh=(16, 8), mode="streaming")
    softmax = next(k for k in program.kernels if k.op == "softmax")
    assert softmax.region.width > 1 and softmax.attrs.get("row_tiles", 1) > 1
    piped = sparsefx.lower(sm, (x,), mesh=(16, 8), mode="pipelined")
    assert next(k for k in piped.kernels if k.op == "softmax").region.width == 1
