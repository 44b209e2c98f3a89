"""The fast clock against the event-driven reference on seeded random cases (``agreement_cases.py``).

Each case is a small random model (an MLP, a conv net or a one-layer GPT), sparsity, mesh, mode,
placement, batch and input zero pattern, drawn from ``random.Random(SEED)``. Both executors' outputs
must equal PyTorch's, and their total cycles must be within ``TOLERANCE`` (10%) of each other: the
executors share the cost rules, and the fast clock only approximates the queues the reference plays
out message by message. ``benchmarks/agreement_random.py`` runs the same generator on more cases.

A case outside 10% whose outputs agree is a gap between the executors, not a bug of this test: it is
kept, under ``KNOWN_GAPS``, as a strict xfail that names the gap, and fails once the gap closes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from agreement_cases import TOLERANCE, Case, draw_cases, gap, run_case

SEED = 0
N = 24
"""The first ``N`` cases of the seed run here: 28 s with ``-n 0`` on two cores that other work loaded."""

KNOWN_GAPS = {
    20: "pipelined conv net on 10x12: the fast clock ends its flatten (a layout kernel, [72, 4] to [2, 144]) "
    "at cycle 347, the reference at 439; fast / reference 374 / 450 = 0.831 (0.821 with block placement)",
}
"""Cases (by index, of seed ``SEED``) outside 10%: the executors do the same work (equal per-PE busy
cycles and AXPYs, checked by hand) and their outputs equal PyTorch's, but the fast clock times a
kernel of a pipelined program differently from the reference. A case past ``N`` runs here too."""

CASES = draw_cases(max([N, *(i + 1 for i in KNOWN_GAPS)]), SEED)
RUN = [c for c in CASES if c.index < N or c.index in KNOWN_GAPS]

_results: dict[int, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread, as in the suite's workers: the cases' tensors are tiny, and a second thread
    only waits on the first (with ``-n 0`` and 16 cases the file took 135 s on two loaded cores, 21 s on
    one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _result(case: Case) -> dict[str, Any]:
    """``run_case(case)``, once per module."""
    if case.index not in _results:
        _results[case.index] = run_case(case)
    return _results[case.index]


def _describe(r: dict[str, Any]) -> str:
    return (
        f"case {r['label']} (seed {r['seed']}, {r['kernels']} kernels): fast {r['fast']} / reference "
        f"{r['reference']} = {r['ratio']:.3f}"
    )


@pytest.mark.parametrize("case", RUN, ids=lambda c: c.label)
def test_both_executors_compute_what_pytorch_does(case: Case) -> None:
    r = _result(case)
    assert r["fast_ok"], f"{_describe(r)}: fast outputs differ from PyTorch's by {r['fast_error']:.3g}"
    assert r["reference_ok"], (
        f"{_describe(r)}: reference outputs differ from PyTorch's by {r['reference_error']:.3g}"
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[c.index]))
        if c.index in KNOWN_GAPS
        else c
        for c in RUN
    ],
    ids=lambda c: c.label,
)
def test_total_cycles_agree_within_10_percent(case: Case) -> None:
    r = _result(case)
    assert gap(r) <= TOLERANCE, f"{_describe(r)}, outside {TOLERANCE:.0%}"


def test_the_worst_case_is_within_10_percent() -> None:
    """Every case but the known gaps within 10%; the message names the worst of them and the gaps."""
    results = [_result(c) for c in RUN]
    checked = [r for r in results if r["index"] not in KNOWN_GAPS]
    worst = max(checked, key=gap)
    outside = [_describe(r) for r in checked if gap(r) > TOLERANCE]
    known = [_describe(r) for r in results if r["index"] in KNOWN_GAPS]
    assert not outside, (
        f"{len(outside)} of {len(checked)} cases outside {TOLERANCE:.0%}: {'; '.join(outside)}. "
        f"Worst: {_describe(worst)}. Known gaps: {'; '.join(known)}"
    )
