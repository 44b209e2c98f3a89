"""The compiled task queues (``runtime/compiled.py``) give the tensor form's finishes, tie rules included."""

from __future__ import annotations

import pytest
import torch

from sparsefx.runtime import compiled
from sparsefx.runtime import queues as q

pytest.importorskip("numba")


def _tensor_form(monkeypatch: pytest.MonkeyPatch, fn, *args):
    with monkeypatch.context() as m:
        m.setenv("SPARSEFX_NUMBA", "0")
        assert not compiled.available(*[a for a in args if isinstance(a, torch.Tensor)])
        return fn(*args)


@pytest.mark.parametrize("seed", range(40))
def test_fifo_matches_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 3000, (1,), generator=g))
    pes = int(torch.randint(1, 50, (1,), generator=g))
    spread = [1, 5, 100, 10**6][seed % 4]  # many ties ... all distinct
    pe = torch.randint(0, pes, (n,), generator=g) + [0, 7, 1000][seed % 3]
    arrival = torch.randint(-spread, spread, (n,), generator=g)
    if seed % 5 == 0:  # arrivals in order on each PE, as lanes mostly see them
        arrival = torch.sort(arrival).values
    cost = torch.randint(0, 9, (n,), generator=g) * (torch.rand(n, generator=g) > 0.2)
    assert compiled.available(pe, arrival, cost)
    assert torch.equal(q.fifo(pe, arrival, cost), _tensor_form(monkeypatch, q.fifo, pe, arrival, cost))


@pytest.mark.parametrize("seed", range(40))
def test_queues_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    blocks = int(torch.randint(1, 12, (1,), generator=g))
    pairs = int(torch.randint(1, 4000, (1,), generator=g))
    pes = int(torch.randint(1, 300, (1,), generator=g))
    pe = torch.sort(torch.randint(0, pes, (pairs,), generator=g)).values  # pairs PE by PE
    spread = [3, 50, 10**5][seed % 3]
    arr = torch.randint(0, spread, (blocks, pairs), generator=g)
    if seed % 2:  # later blocks arrive later, as they do on the mesh
        arr += torch.arange(blocks)[:, None] * spread
    cost = torch.randint(1, 20, (blocks, pairs), generator=g) * (torch.rand(blocks, pairs, generator=g) > 0.3)
    assert compiled.available(arr) and compiled.fits(pe, arr, blocks)
    best, busy = q.queues(pe, arr, cost, pes)
    want_best, want_busy = _tensor_form(monkeypatch, q.queues, pe, arr, cost, pes)
    assert torch.equal(best, want_best) and torch.equal(busy, want_busy)


def test_keys_that_do_not_fit_take_the_tensor_form() -> None:
    pe = torch.zeros(4, dtype=torch.int64)
    arrival = torch.tensor([0, 1 << 61, 5, 3])
    assert not compiled.fits(pe, arrival)
    assert q.fifo(pe, arrival, torch.ones(4, dtype=torch.int64)).tolist() == [1, (1 << 61) + 1, 6, 4]
