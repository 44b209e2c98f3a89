"""``arbiter.round_robin`` serves a link's waiting messages as the reference's ``Fabric`` does: on seeded
random queues (many ties ... spread out, one link ... several, one color ... several, messages of no
wavelets), every message starts when the fabric grants it, compiled and in plain Python alike."""

from __future__ import annotations

import pytest
import torch

from sparsefx.runtime.arbiter import round_robin
from sparsefx.runtime.events import Events, Fabric


def _fabric(link: torch.Tensor, ready: torch.Tensor, cost: torch.Tensor, color: torch.Tensor) -> list[int]:
    """Each message's grant from the reference's fabric, requested in the given order."""
    ev = Events()
    fabric = Fabric(ev)
    start = [-1] * len(link)

    def grant(i: int):
        def then(t: int) -> None:
            start[i] = t

        return then

    def ask(i: int) -> None:
        fabric.request((int(link[i]), 0, "E"), int(ready[i]), int(cost[i]), int(color[i]), grant(i))

    for i in range(len(link)):  # each request made when its head reaches the link, as the executors do
        ev.at(int(ready[i]), ask, i)
    ev.run()
    return start


@pytest.mark.parametrize("numba", ["1", "0"])
def test_round_robin_starts_every_message_when_the_fabric_grants_it(monkeypatch, numba):
    monkeypatch.setenv("SPARSEFX_NUMBA", numba)
    g = torch.Generator().manual_seed(7)
    for trial in range(120):
        n = int(torch.randint(1, 80, (1,), generator=g))
        links, colors, spread = [1, 3][trial % 2], [1, 2, 4][trial % 3], [2, 20, 500][trial % 3]
        link = torch.randint(0, links, (n,), generator=g)
        color = torch.randint(0, colors, (n,), generator=g)
        ready = torch.randint(0, spread, (n,), generator=g)
        cost = torch.randint(0, 6, (n,), generator=g)  # some of no wavelets
        assert round_robin(link, ready, cost, color).tolist() == _fabric(link, ready, cost, color), trial


def test_a_late_color_is_served_as_soon_as_the_message_in_progress_is_done():
    link, color = torch.zeros(4, dtype=torch.int64), torch.tensor([0, 0, 0, 1])
    starts = round_robin(link, torch.tensor([0, 0, 0, 3]), torch.tensor([4, 4, 4, 2]), color)
    assert starts.tolist() == [0, 6, 10, 4]  # first come first served would give [0, 4, 8, 12]
