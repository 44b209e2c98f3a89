"""Outputs leave the mesh through the host's I/O, charged at its bandwidth, by one rule in both executors.

Outputs go east from their producer's east column off the mesh, and the host takes them
``host_wavelets_per_cycle`` wavelets a cycle for all rows together (``runtime/host.py``). An output
spread over more lanes than the host takes wavelets a cycle is bound by the host, not by its links.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import sparsefx
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.host import edge_queued, in_host, outputs_in_host
from sparsefx.runtime.mesh import hardware
from sparsefx.runtime.reference import execute
from sparsefx.runtime.run import _Activity
from sparsefx.runtime.stats import _links


def _timelines(host_bytes_per_s: float, mode: str) -> tuple[dict, float]:
    """A linear's 16 x 256 output (4,096 fp32 wavelets on 64 lanes), timed by both executors."""
    torch.manual_seed(0)
    x = torch.randn(16, 8)
    sm = sparsefx.compile(torch.nn.Linear(8, 256), 0.5, (x,))
    hw = dataclasses.replace(hardware(), host_bytes_per_s=host_bytes_per_s)
    program = sparsefx.lower(sm, (x,), mesh=(4, 64), mode=mode, hardware=hw)
    activity = _Activity(program)
    _, ref = execute(program, (x,), listener=activity)
    activity.to_host()
    return {"reference": ref, "fast": simulate(program, activity.seen)}, hw.host_wavelets_per_cycle


def test_a_slow_host_binds_the_outputs_in_both_executors() -> None:
    """Pipelined (a streaming program's outputs take the same route east, ``runtime/journeys.py``)."""
    quick, _ = _timelines(150e9, "pipelined")
    slow, rate = _timelines(1.5e9, "pipelined")  # 0.44 wavelets a cycle: the host takes 4,096 in 9,290+
    floor = math.ceil(16 * 256 / rate)
    for name in ("reference", "fast"):
        done = slow[name].output_done["masked_linear"]
        assert done >= floor, (name, done, floor)
        assert quick[name].output_done["masked_linear"] < floor, name  # at 150 GB/s the links bind
        assert slow[name].cycles == max(done, max(k.end for k in slow[name].kernels))
    ref, fast = slow["reference"].cycles, slow["fast"].cycles
    assert abs(fast - ref) <= 0.05 * ref, (ref, fast)


def test_the_host_queue_adds_time_only_when_the_edge_outruns_it() -> None:
    """The same messages, once with a host faster than the links and once slower: only the slow one
    waits, and then it drains at its rate from the first head."""
    heads = torch.arange(0, 128, dtype=torch.int64)  # 128 lanes' messages arrive a cycle apart
    sends = torch.full((128,), 512, dtype=torch.int64)
    assert torch.equal(in_host(heads, sends, rate=1000.0), heads + sends)  # the links bind
    slow = in_host(heads, sends, rate=44.0)
    assert int(slow.max()) == math.ceil(128 * 512 / 44.0)  # the host binds: busy from cycle 0
    assert bool((slow >= heads + sends).all())
    assert bool((slow[1:] >= slow[:-1]).all())  # first in, first out


def test_outputs_share_one_host_queue() -> None:
    a = (torch.tensor([0]), torch.tensor([440]))
    assert outputs_in_host({"a": a}, 44.0) == {"a": 440}
    assert outputs_in_host({"a": a, "b": a}, 44.0) == {"a": 440, "b": 440}  # 880 / 44 = 20: links bind
    assert outputs_in_host({"a": a, "b": a}, 1.0) == {"a": 440, "b": 880}  # b waits behind a
    assert outputs_in_host({"a": (torch.tensor([]), torch.tensor([]))}, 1.0) == {"a": 0}


def test_the_traffic_counts_the_outputs_way_to_the_host() -> None:
    """``stats.wavelets`` and ``link_hops`` count each output's messages east from its producer's east
    column to the mesh's edge, as they count the messages kernels read."""
    torch.manual_seed(0)
    x = torch.randn(16, 8)
    sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU()), 0.5, (x,))
    program = sparsefx.lower(sm, (x,), mesh=(12, 8), mode="streaming")
    timeline = simulate(program)
    flow = timeline.flows[program.outputs[0]]
    assert 0 <= flow.east < program.mesh.width - 2  # the output has columns to cross
    alone = dataclasses.replace(program, outputs=[])
    with_out, without = _links(program, timeline), _links(alone, timeline)
    assert with_out.sent - without.sent == int(flow.sends.sum()) > 0
    assert with_out.hops - without.hops == int(flow.sends.sum()) * (program.mesh.width - flow.east - 1)
    assert any(x > flow.east and d == "E" for x, _, d, _ in with_out.hottest)


def test_each_outputs_last_message_is_timed_as_message_by_message() -> None:
    """``outputs_in_host`` bins messages by arrival (or sorts them, when arrivals are too spread out for
    bins); on seeded random messages, rates and spreads, both give every output exactly the latest of
    its messages' ``in_host`` times with all outputs in one queue, in output order on ties."""
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        rate = [44.1176, 1.0, 2.5, 1000.0, 7.3][trial % 5]
        spread = [3, 50, 5000, 10**7][trial % 4]  # 10**7 over few messages: the sorting path
        messages = {}
        for j in range(1 + trial % 4):
            n = int(torch.randint(0, 40, (1,), generator=g))
            heads = torch.randint(0, spread, (n,), generator=g) + 10**6 * (trial % 3)
            messages[f"out{j}"] = (heads, torch.randint(0, [2, 40, 400][trial % 3], (n,), generator=g))
        names = [n for n, (h, _) in messages.items() if h.numel()]
        expected = {n: 0 for n in messages}
        if names:
            finish = in_host(
                torch.cat([messages[n][0] for n in names]), torch.cat([messages[n][1] for n in names]), rate
            )
            for n, part in zip(names, finish.split([messages[n][0].numel() for n in names])):
                expected[n] = int(part.max())
        assert outputs_in_host(messages, rate) == expected, (trial, rate, spread)


class _TwoLinears(torch.nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(features, features), torch.nn.Linear(features, features)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x1), self.b(x2)


@pytest.mark.parametrize(
    ("mesh", "within"), [((8, 8), 0.05), ((16, 16), 0.05), ((10, 8), 0.05), ((12, 10), 0.06)]
)
def test_outputs_made_side_by_side_take_turns_on_their_rows(mesh: tuple[int, int], within: float) -> None:
    """Pipelined, two independent linears side by side: both results leave east along the same rows
    and share each row's last link, so the fast clock's total comes within 5% of the reference's
    (0.900 on 8x8, 0.938 on 16x16, 0.943 on 10x8 and 0.888 on 12x10 with each output's lanes to
    themselves). On 12x10 (0.944) the first linear's results also meet the second's partial sums on
    its region's east links, which the fast clock does not queue. A lone output's heads never move."""
    torch.manual_seed(0)
    sm = sparsefx.compile(_TwoLinears(64), 0.9)
    gen = torch.Generator().manual_seed(sum(mesh))
    x1, x2 = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
    program = sparsefx.lower(sm, (x1, x2), mesh=mesh, mode="pipelined")
    fast, ref = (sparsefx.run(program, (x1, x2), executor=e).stats.cycles for e in ("fast", "reference"))
    assert abs(fast / ref - 1) <= within, (fast, ref)
    heads = [torch.tensor([[3, 9, 20]])]
    assert edge_queued(heads, [torch.tensor([[6, 6, 1]])], [torch.tensor([[0, 0, 0]])]) is heads
