"""The reference machine's clock: one event queue, links that arbitrate by time and color, PEs that run
the first-arrived task, and partial sums added in their route's order."""

from __future__ import annotations

import random

import torch

import sparsefx
from sparsefx.runtime.encoding import sparse_arrays
from sparsefx.runtime.events import Cores, Events, Fabric
from sparsefx.runtime.pe_values import route_product
from sparsefx.runtime.sparse_eval import product, read_slices


def _served(requests: list[tuple[int, int, int]], last: int | None = None) -> list[tuple[int, int]]:
    """Start cycle of each ``(ready, wavelets, color)`` request on one link, requested in list order."""
    ev = Events()
    fabric = Fabric(ev)
    link = (0, 0, "E")
    if last is not None:
        fabric.served[link] = last
    got: dict[int, int] = {}
    for i, (ready, wavelets, color) in enumerate(requests):
        fabric.request(link, ready, wavelets, color, lambda t, i=i: got.__setitem__(i, t))
    ev.run()
    return [(i, got[i]) for i in range(len(requests))]


def test_a_link_serves_the_message_that_arrived_first_not_the_one_asked_first():
    # asked in this order: a message ready at 10, then one ready at 2 (another kernel's, later in the program)
    assert _served([(10, 4, 1), (2, 5, 2)]) == [(0, 10), (1, 2)]
    # the later one, ready first, holds the link for its 5 wavelets; the first then waits for it
    assert _served([(4, 4, 1), (2, 5, 2)]) == [(0, 7), (1, 2)]


def test_messages_of_one_color_keep_their_order_and_colors_take_turns():
    rng = random.Random(0)
    for _ in range(20):
        requests = [(rng.randrange(6), rng.randrange(1, 4), rng.randrange(3)) for _ in range(8)]
        starts = dict(_served(requests))
        # a link carries one wavelet per cycle: no two messages overlap, and none starts before it is ready
        spans = sorted((starts[i], starts[i] + w) for i, (_, w, _) in enumerate(requests))
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        assert all(starts[i] >= ready for i, (ready, _, _) in enumerate(requests))
        # the link is never idle while a message waits
        for i, (ready, _, _) in enumerate(requests):
            busy = any(s <= t < e for t in range(ready, starts[i]) for s, e in spans)
            assert starts[i] == ready or busy
        for color in range(3):  # one color's messages go in the order they arrived
            mine = sorted((ready, i) for i, (ready, _, c) in enumerate(requests) if c == color)
            assert [starts[i] for _, i in mine] == sorted(starts[i] for _, i in mine)


def test_messages_waiting_together_are_served_round_robin_by_color():
    # three colors ready at cycle 0; the link last served color 1, so it serves 2, then 3, then 1
    assert _served([(0, 2, 1), (0, 2, 2), (0, 2, 3)], last=1) == [(0, 4), (1, 0), (2, 2)]


def test_a_pe_runs_the_task_that_arrived_first():
    ev = Events()
    cores = Cores(ev)
    done: dict[str, int] = {}
    cores.submit((0, 0), 5, 0, 3, lambda t: done.__setitem__("late", t))
    cores.submit((0, 0), 1, 1, 10, lambda t: done.__setitem__("early", t))
    cores.submit((1, 0), 5, 0, 3, lambda t: done.__setitem__("elsewhere", t))
    ev.run()
    assert done == {"early": 11, "late": 14, "elsewhere": 8}


def test_partial_sums_added_along_their_routes_give_the_product():
    for seed in range(3):
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        sm = sparsefx.compile(torch.nn.Linear(48, 40), 0.8)
        x = torch.randn(6, 48, generator=g)
        program = sparsefx.lower(sm, x, mesh=(4, 6))
        k = next(k for k in program.kernels if k.op == "sparse_matmul")
        arrays = sparse_arrays(program, k)
        s = read_slices(arrays, 48, 40, k.region.width, k.region.height, "test")
        lanes = int(k.attrs.get("lanes", k.region.height))
        got = route_product(s, x, k.region.width, k.region.height, min(lanes, 40, k.region.height))
        assert torch.allclose(got, product(s, x), rtol=1e-5, atol=1e-6)


def test_the_reference_plays_every_kernel_on_one_queue(monkeypatch):
    """Pipelined, two independent linears' messages meet on the host's links: one queue for both
    kernels means each kernel's messages wait for the other's, so together they take longer than the
    slower one alone."""
    from sparsefx.runtime import reference

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x1), self.b(x2)

    torch.manual_seed(0)
    sm = sparsefx.compile(Two(), 0.9)
    x1, x2 = torch.randn(4, 64), torch.randn(4, 64)
    program = sparsefx.lower(sm, (x1, x2), mesh=(8, 8), mode="pipelined")
    queues = []
    real = reference.Events

    class Spy(real):
        def __init__(self) -> None:
            super().__init__()
            queues.append(self)

    monkeypatch.setattr(reference, "Events", Spy)
    both = reference.time_patterns(program, {})
    assert len(queues) == 1 and queues[0].count > 0
    alone = [
        reference.time_patterns(program, {other: torch.zeros(4, 64, dtype=torch.bool)})
        for other in ("x2", "x1")
    ]
    assert both.cycles > max(t.cycles for t in alone)
