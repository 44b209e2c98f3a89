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


@pytest.mark.parametrize("seed", range(12))
def test_route_checks_match_the_tensor_form(seed: int) -> None:
    """The compiled per-route checks (``runtime/verify_loops.py``) find the duplicate PEs and the hops
    no one receives that the tensor form finds by sorting (``verify._check_batch``)."""
    from sparsefx.runtime import verify, verify_loops

    g = torch.Generator().manual_seed(seed)
    width, height, routes_n = 7, 5, 6
    pes = width * height
    sizes = torch.randint(1, 9, (routes_n,), generator=g)
    within = torch.repeat_interleave(torch.arange(routes_n), sizes)
    pe = torch.cat([torch.randperm(pes, generator=g)[: int(n)] for n in sizes])
    if seed % 3 == 0:  # a route sets one PE twice
        pe[1] = pe[0]
    rx = torch.randint(0, 32, (len(pe),), generator=g)
    tx = torch.randint(0, 32, (len(pe),), generator=g)
    ends = torch.sort(torch.randperm(len(pe), generator=g)[: len(pe) // 2]).values
    to_host = torch.rand(len(ends), generator=g) > 0.5
    first, bad = verify_loops.route_checks(within, pe, rx, tx, ends, to_host, width, height)
    key = within * pes + pe
    order = torch.argsort(key)
    skey = key[order]
    twice = (skey[1:] == skey[:-1]).nonzero()
    assert first == (int(skey[int(twice[0])]) if len(twice) else -1)
    if first >= 0:
        return  # the verifier stops at the duplicate
    tensor_form = verify._hop_flags(within[ends], pe[ends], tx[ends], rx[order], skey, to_host, width, height)
    assert torch.equal(bad, tensor_form)


@pytest.mark.parametrize("seed", range(16))
def test_first_clash_matches_a_stable_sort(seed: int) -> None:
    """The compiled clash check finds the least shared key and the pair of routes a stable sort by key
    puts next to each other first, as the tensor form (``verify._clash``) reports them."""
    from sparsefx.runtime import verify, verify_loops

    g = torch.Generator().manual_seed(seed)
    pes, n = 30, int(torch.randint(1, 200, (1,), generator=g))
    key = torch.randint(0, 5, (n,), generator=g) * pes + torch.randint(0, pes, (n,), generator=g)
    who = torch.randint(0, [1, 3, 40][seed % 3], (n,), generator=g)
    got = verify_loops.first_clash(key, who, pes)
    assert got is not None and got == verify._first_clash_sorted(key, who)
    order = torch.argsort(key, stable=True)  # a clash is two routes on one key, or none is
    k, w = key[order], who[order]
    assert (got[0] >= 0) == bool(((k[1:] == k[:-1]) & (w[1:] != w[:-1])).any())
