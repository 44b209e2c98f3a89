"""Route runs expand to per-PE router entries (``runtime/routes.py``): the compiled pass gives the
tensor form's entries, off-mesh PEs, unknown ports and empty runs included."""

from __future__ import annotations

import pytest
import torch

from sparsefx.runtime import routes
from sparsefx.runtime.mesh import Dir, MeshSpec

pytest.importorskip("numba")


def _tensor_form(monkeypatch: pytest.MonkeyPatch, runs: torch.Tensor, mesh: MeshSpec):
    with monkeypatch.context() as m:
        m.setenv("SPARSEFX_NUMBA", "0")
        return routes.expand(runs, mesh)


@pytest.mark.parametrize("seed", range(20))
def test_compiled_expansion_matches_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    mesh = MeshSpec(*(int(torch.randint(1, 40, (1,), generator=g)) for _ in range(2)))
    n = int(torch.randint(0, 300, (1,), generator=g))
    ports = torch.tensor([0, 1, 2, 4, 8, 3, 40])  # the four directions, none, and bits no run goes
    runs = torch.stack(
        [
            torch.randint(-2, mesh.width + 2, (n,), generator=g),
            torch.randint(-2, mesh.height + 2, (n,), generator=g),
            ports[torch.randint(0, len(ports), (n,), generator=g)],
            torch.randint(-1, 30, (n,), generator=g),
            torch.randint(0, 32, (n,), generator=g),
            torch.randint(0, 32, (n,), generator=g),
            *torch.randint(-1, 30, (4, n), generator=g),
        ],
        1,
    ).to(torch.int32)
    got = routes.expand(runs, mesh)
    want = _tensor_form(monkeypatch, runs, mesh)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_run_east_with_a_tap_and_a_ramp_in() -> None:
    runs = torch.tensor([routes.run(1, 0, Dir.E, 3, rx_first=Dir.RAMP, tx_last=Dir.E, taps=(1, 3))])
    pe, rx, tx = routes.expand(runs, MeshSpec(3, 1))
    assert pe.tolist() == [1, 2, -1]  # the last PE is off the mesh
    assert [Dir.format(b) for b in rx] == ["RAMP", "W", "W"]
    assert [Dir.format(b) for b in tx] == ["E", "E|RAMP", "E|RAMP"]
