"""runtime/memo.py: results kept per payload while it lives, or per geometry within a byte budget."""

from __future__ import annotations

import gc

import torch

from sparsefx.runtime import memo


def test_results_follow_their_owner_and_its_version() -> None:
    owner, builds = torch.arange(4.0), []

    def total() -> float:
        builds.append(1)
        return float(owner.sum())

    assert memo.kept(owner, "total", total) == 6.0
    assert memo.kept(owner, "total", total) == 6.0 and len(builds) == 1
    owner[0] = 10.0  # changed in place: derived again
    assert memo.kept(owner, "total", total) == 16.0 and len(builds) == 2
    other = torch.arange(4.0)  # equal values, another payload: its own entry
    assert memo.kept(other, "total", lambda: -1.0) == -1.0
    key = id(other)
    del other
    gc.collect()
    assert key not in memo._BY_OWNER  # dropped with its owner


def test_geometries_are_kept_within_the_byte_budget(monkeypatch) -> None:
    monkeypatch.setattr(memo, "GEOMETRY_BYTES", 3 * 8 * 100)  # three results of 100 int64 each
    monkeypatch.setattr(memo, "_BY_KEY", type(memo._BY_KEY)())
    monkeypatch.setattr(memo, "_held", [0])
    builds = []

    def build(i: int):
        builds.append(i)
        return (torch.full((100,), i), i)

    for i in range(5):
        assert memo.kept(None, ("g", i), lambda i=i: build(i))[1] == i
    assert list(memo._BY_KEY) == [("g", 2), ("g", 3), ("g", 4)]  # the least recently used went first
    assert memo._held[0] == 3 * 800
    assert memo.kept(None, ("g", 0), lambda: build(0))[1] == 0 and builds[-1] == 0  # built again
    big = memo.kept(None, "big", lambda: torch.zeros(1000, dtype=torch.int64))  # over the budget alone
    assert big.numel() == 1000 and "big" not in memo._BY_KEY
