"""Pipelined stages of about equal time (``passes/lower/stages.py``): the columns shared again by what
each kernel measures, for the program and, with the same effort, for its dense baseline."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import sparsefx
from sparsefx.models.registry import build_model
from sparsefx.passes.lower import dense_plan, steps
from sparsefx.passes.lower.stages import balance
from sparsefx.runtime.baseline import dense_program
from sparsefx.runtime.fast import simulate
from sparsefx.runtime.stats import steady_interval

LINEAR = ["*.attn.*.weight", "*.mlp.*.weight", "lm_head.weight"]  # every linear layer, the LM head too


def _worst(busy: list[int], widths: list[int], new: list[int]) -> float:
    return max(b * w / n for b, w, n in zip(busy, widths, new))


@pytest.mark.parametrize("seed", range(40))
def test_balance_reaches_the_best_share_within_its_bounds(seed: int) -> None:
    """Against every share of the columns (brute force, 2 to 4 kernels): the largest predicted busy
    time is the least any share reaches, and each width stays within its minimum and its cap."""
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    busy = [rng.choice([0, rng.randint(1, 5000)]) for _ in range(n)]
    widths = [rng.randint(1, 3) for _ in range(n)]
    mins = [rng.randint(1, 2) for _ in range(n)]
    caps = [rng.choice([1, rng.randint(1, 8)]) for _ in range(n)]
    columns = sum(mins) + rng.randint(0, 8)
    new = balance(busy, widths, mins, caps, columns)
    assert sum(new) <= columns
    assert all(m <= w <= max(c, m) for w, m, c in zip(new, mins, caps)), (new, mins, caps)
    ranges = [range(m, max(c, m) + 1) for m, c in zip(mins, caps)]
    best = min(_worst(busy, widths, list(w)) for w in itertools.product(*ranges) if sum(w) <= columns)
    assert _worst(busy, widths, new) == pytest.approx(best), (busy, widths, mins, caps, columns, new)


def test_balance_hands_out_every_column_a_kernel_can_use() -> None:
    """Columns left once the interval is reached go to the slowest kernels that can widen."""
    assert balance([4000, 100, 1000], [1, 1, 2], [1, 1, 1], [8, 1, 8], 8) == [5, 1, 2]
    assert balance([4000, 100, 1000], [1, 1, 2], [1, 1, 1], [2, 1, 2], 8) == [2, 1, 2]  # the caps bind


def _lowered(unbalanced: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[sparsefx.DataflowProgram, tuple]:
    spec = build_model("gpt-tiny", seed=0)
    config = {"algorithm": "static", "sparsity": 0.9, "param_filter": LINEAR}
    sm = sparsefx.compile(spec.model, config, spec.args)
    with monkeypatch.context() as m:
        if unbalanced:  # the share by work alone, as place-data and the dense plan first make it
            for module in (steps, dense_plan):
                m.setattr(module, "rebalance", lambda start, *a, **k: start)
        program = sparsefx.lower(sm, spec.args, mesh="64x64", mode="pipelined")
    return program, (sm, spec.args)


def _interval(program: sparsefx.DataflowProgram) -> tuple[int, int]:
    timeline = simulate(program)
    return steady_interval(program, timeline), timeline.cycles


@pytest.fixture(scope="module")
def programs() -> dict[str, tuple]:
    with pytest.MonkeyPatch.context() as mp:
        balanced, model = _lowered(False, mp)
        by_work, _ = _lowered(True, mp)
    return {"balanced": balanced, "by_work": by_work, "model": model}


def test_the_balanced_pipeline_is_faster_and_its_outputs_are_pytorchs(programs: dict[str, tuple]) -> None:
    """gpt-tiny at 90% (its LM head too) on 64x64: shared by work, its sparse matmuls sit on two
    columns and the MLP's set the interval (12,072 cycles); balanced, the slowest kernels get the
    columns that kernels with time to spare give up, and the interval halves (5,264), with no longer
    latency. The program still computes what the model does."""
    balanced, by_work = programs["balanced"], programs["by_work"]
    (iv_b, lat_b), (iv_w, lat_w) = _interval(balanced), _interval(by_work)
    assert iv_b * 1.5 < iv_w and lat_b <= lat_w, (iv_b, lat_b, iv_w, lat_w)
    timed = {kt.name: kt.busy_sums()[0] for kt in simulate(by_work).kernels}
    slowest = max(timed, key=timed.__getitem__)
    assert balanced.kernel(slowest).region.width > by_work.kernel(slowest).region.width, slowest
    assert sum(k.region.width for k in balanced.kernels) <= balanced.mesh.width
    sm, args = programs["model"]
    result = sparsefx.run(balanced, args)
    torch.testing.assert_close(result.outputs, sm.eval()(*args), rtol=1e-4, atol=1e-5)


def test_the_dense_baseline_gets_the_same_effort(programs: dict[str, tuple]) -> None:
    """The dense plan's columns are balanced on its own clock too: its interval falls as the program's
    does, so the throughput speedup is not the baseline left cramped."""
    dense_b, dense_w = dense_program(programs["balanced"]), dense_program(programs["by_work"])
    assert dense_b is not None and dense_w is not None
    (iv_b, lat_b), (iv_w, lat_w) = _interval(dense_b), _interval(dense_w)
    assert iv_b * 1.5 < iv_w and lat_b <= lat_w, (iv_b, lat_b, iv_w, lat_w)
    stats = sparsefx.run(programs["balanced"], programs["model"][1]).stats.dense
    assert stats is not None and stats.dense_interval == iv_b
    assert 1.0 < stats.throughput_realized <= stats.flop_ratio


def test_balancing_is_deterministic(programs: dict[str, tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    again, _ = _lowered(False, monkeypatch)
    assert str(again) == str(programs["balanced"])


def test_the_demo_says_why_its_balanced_sparse_layers_run_longer() -> None:
    """The demo's model (its LM head dense), pipelined on 64x64: balanced, its sparse layers' spans sum
    to more than the dense baseline's, and the demo says why, with both intervals."""
    from sparsefx.demo import speedup_lines

    spec = build_model("gpt-tiny", seed=0)
    sm = sparsefx.compile(spec.model, {"algorithm": "static", "sparsity": 0.9}, spec.args)
    program = sparsefx.lower(sm, spec.args, mesh="64x64", mode="pipelined")
    stats = sparsefx.run(program, spec.args).stats
    c = stats.dense
    assert c is not None and c.layers_realized < 1 < c.throughput_realized
    said = [line for line in speedup_lines(program, stats) if "gave columns" in line]
    assert said and f"every {c.sparse_interval:,} cycles against {c.dense_interval:,}" in said[0]
