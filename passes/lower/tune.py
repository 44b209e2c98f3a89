"""Tune each sparse matmul's mapping on the emulator's clock: its width, its row cuts, its block size.

**Width** (weight-streaming mode). One kernel runs at a time from column 0, and a matmul could take
every column up to its outputs. Every column costs something, though: each PE's input and output
ranges and its column offsets are loaded from off-mesh memory like the nonzeros, and partial sums cross
more PEs on their way east. On a 757x996 mesh a 768-to-768 layer at 90% has about one nonzero per PE
at full width, and its ranges and offsets come to some 27 MB against 0.35 MB of nonzeros, so the load
sets its time. The widths tried run from the narrowest whose PEs hold the data up to the kernel's cap,
doubling (``widths``); once ``WORSE_IN_A_ROW`` widths in a row are expected slower than the best so
far the search stops. A streaming kernel's time counts the part of its weight load (``cost.load_cycles``)
that the kernel before it does not hide: a load overlaps the previous kernel's run (timed alone,
``hidden_behind``) but never its own. On 64x64 the layer norm or GELU before a GPT-2 layer hides
most of its load and the layers keep the whole mesh; on ``wse2`` a layer norm hides little of 27 MB
and most layers take 23 columns. In pipelined mode the width is the share ``place.py`` gave.

**Row cuts** (balanced placement). Cutting every column's nonzeros into equal runs evens out the PEs,
but a row's inputs then drift off its lane, and each feature that drifted forks up or down the column
to reach it. On a layer whose inputs are most of its traffic (GPT-2 small's 3072-input projection on a
64x64 mesh) the forks cost more than the imbalance they remove; on one whose outputs are (its
768-to-3072 expansion) the balance wins. Every width is placed with no limit (``None``: every PE
within one nonzero), and the ``CUT_WIDTHS`` width(s) that did best there at the other limits in
``DRIFTS`` too (``0``: each row holds exactly its lane's features). The kernel
records its limit in ``attrs["drift"]`` (absent: none).

**Block size** and **ranking**: every (width, limit, block size) is ranked by the cycles the cost
rules give it in closed form (``blocks.ranked``: ``runtime.estimate.sparse_alone``, plus the kernels
that take its block size, a GELU after the layer, timed, and the unhidden load), and only the
``blocks.TIMED_CANDIDATES`` best are timed on the clock: the width, cut and block size are chosen
for those kernels too, and a search costs a few timings, not one per mapping (``wse2`` has hundreds).

The fastest mapping timed wins; ties go to the better ranked. A later kernel of the
same shape, region and density (the next layer of a stack) takes the first one's width and limit
untimed, and with balanced placement its block size too (a balanced cut spreads any layer's nonzeros
alike; a block placement's imbalance follows each layer's mask, so ``plan_blocks`` searches it). The
dense baseline gets the same search over widths (``dense_plan.py``), so each side is compared at its own
best. For example, on a 768-to-768 layer at 90% on a 64x64 mesh the unlimited cut takes about 5,200
cycles alone and the cut held within 16 features about 3,200::

    >>> widths(3, 40)
    [3, 5, 10, 20, 40]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sparsefx.runtime.alone import kernel_alone
from sparsefx.runtime.cost import load_cycles, rows_of
from sparsefx.runtime.csc import imbalance
from sparsefx.runtime.encoding import sparse_arrays
from sparsefx.runtime.layout import Layout, layout, placed, weight_bytes
from sparsefx.runtime.memory import pe_bytes
from sparsefx.runtime.op_kinds import ROW_MATMULS
from sparsefx.runtime.program import Kernel, ProgramData, Region

from .blocks import TIMED_CANDIDATES, WORSE_IN_A_ROW, ranked, timed
from .builder import Pending
from .install import install
from .place_sparse import place_sparse

__all__ = [
    "CUT_WIDTHS",
    "Choice",
    "DRIFTS",
    "Report",
    "widths",
    "search",
    "tune_sparse",
    "rowwise",
    "hidden_behind",
]

DRIFTS: tuple[int | None, ...] = (None, 16, 0)
"""The limits tried, in order of preference."""

CUT_WIDTHS = 1
"""Widths at which the limits after the first are placed and ranked: those where the first did best.
On GPT-2 small at 90% (64x64 and ``wse2``, streaming) 1 and 2 gave programs of the same cycles;
1 places fewer."""

Report = Callable[[str, int, int], None]
"""``report(kernel name, kernels done, kernels in all)``: progress through a tuning loop."""


@dataclass(frozen=True)
class Choice:
    """A sparse matmul's mapping: cycles alone with the kernels that take its block size (and its
    unhidden weight load when streaming), width, row-cut limit, block size, its own cycles alone
    without the load, and what ``place`` returned for it."""

    cycles: int
    width: int
    drift: int | None
    rows: int
    run: int
    layout: Any = field(default=None, compare=False, repr=False)


def rowwise(k: Kernel) -> bool:
    """Whether ``k`` is a sparse matmul over rows (whose mapping is tuned; a convolution's is not)."""
    return k.op == "sparse_matmul" and k.attrs.get("kind") in ROW_MATMULS


def widths(narrowest: int, cap: int) -> list[int]:
    """Widths to try, narrowest first: ``cap`` halved until it reaches ``narrowest``, and ``narrowest``."""
    out, w = [], max(cap, 1)
    while w > narrowest:
        out.append(w)
        w //= 2
    return sorted({*out, max(min(narrowest, cap), 1)})


def search(
    program: ProgramData,
    k: Kernel,
    narrowest: int,
    drifts: Sequence[int | None],
    place: Callable[[Kernel, int | None], Any],
    hidden: int = 0,
) -> Choice | None:
    """The fastest mapping of ``k`` (module docstring), or None when none fits. ``place(k, drift)`` lays
    out its data on ``k.region`` as it stands and returns the layout (a ``Layout``, or the arrays it
    installed; a limit that cuts as an earlier one did at this width is not ranked again); ``hidden``:
    cycles of its load the kernel before hides. Every width is ranked under the first limit, the other
    limits at the ``CUT_WIDTHS`` width(s) where it did best; each (width, limit, block size) by its
    expected cycles (``blocks.ranked``, with its unhidden load). The ``TIMED_CANDIDATES`` best are timed
    on the clock; ties go to the earlier ranked. Leaves ``k`` at its starting region, laid out as
    last timed."""
    start = k.region
    tried = widths(narrowest, start.width) if program.mode == "streaming" else [start.width]
    pool: list[tuple[int, int, int, int | None, int]] = []  # (expected, order, width, drift, rows)
    seen: dict[int, list[Any]] = {w: [] for w in tried}  # layouts at each width: limits often cut alike
    installed: tuple[int, int | None, Any, Layout] | None = None  # (width, drift, laid, layout): k's now

    def rank(w: int, limits: Sequence[int | None]) -> int | None:
        """Rank ``k`` at width ``w`` under ``limits``; the best expected cycles (None: nothing fits)."""
        nonlocal installed
        k.region = Region(start.x, start.y, w, start.height)
        here: int | None = None
        for drift in limits:
            laid = place(k, drift)
            if any(_same(laid, other) for other in seen[w]):
                installed = None  # placed, but its layout was not read
                continue
            seen[w].append(laid)
            known = _known(program, k, laid)
            installed = (w, drift, laid, known)
            load = _unhidden(program, k, hidden)
            for c in ranked(program, k, known):
                pool.append((c.estimate + load, len(pool), w, drift, c.rows))
                here = c.estimate + load if here is None else min(here, c.estimate + load)
        return here

    by_width: dict[int, int] = {}  # the first limit at each width, narrowest first
    worse = 0
    for w in tried:
        here = rank(w, drifts[:1])
        if here is None:
            continue
        worse = worse + 1 if by_width and here >= min(by_width.values()) else 0
        by_width[w] = here
        if worse == WORSE_IN_A_ROW:
            break
    for w in sorted(by_width, key=by_width.__getitem__)[:CUT_WIDTHS] if by_width else tried:
        rank(w, drifts[1:])  # the other limits where the first did best
    best: Choice | None = None
    for _, _, w, drift, rows in sorted(pool)[:TIMED_CANDIDATES]:
        k.region = Region(start.x, start.y, w, start.height)
        if installed is None or installed[:2] != (w, drift):  # lay it out again, as it was ranked
            laid = place(k, drift)
            installed = (w, drift, laid, _known(program, k, laid))
        laid, known = installed[2:]
        cycles, alone = timed(program, k, known, rows)
        cycles += _unhidden(program, k, hidden)
        if best is None or cycles < best.cycles:
            best = Choice(cycles, w, drift, rows, alone, laid)
    k.region = start
    return best


def _known(program: ProgramData, k: Kernel, laid: Any) -> Layout:
    """The layout ``place`` returned or installed on ``k``: a placement's arrays are read as they are."""
    if isinstance(laid, Layout):
        return laid
    if isinstance(laid, dict):
        got = placed(laid, int(k.attrs["in_features"]), int(k.attrs["out_features"]))
        if got is not None:
            return got
    return layout(program, k)


def _unhidden(program: ProgramData, k: Kernel, hidden: int) -> int:
    """Streaming: the cycles of ``k``'s weight load that the kernel before it does not hide."""
    if program.mode != "streaming":
        return 0
    return max(0, load_cycles(weight_bytes(program, k), program.hardware) - hidden)


def _same(a: Any, b: Any) -> bool:
    """Whether two layouts (``place``'s results: dicts of arrays or ``Layout``s) are the same."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    if isinstance(a, Layout) and isinstance(b, Layout):
        fields = ("in_lo", "in_hi", "out_lo", "span", "counts")
        return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)
    return False


def tune_sparse(
    program: ProgramData,
    pending: list[Pending],
    narrowest: dict[str, int],
    placement: str,
    report: Report | None = None,
) -> dict[str, int]:
    """Put each row-wise sparse matmul at its fastest mapping; returns the block sizes found
    (``plan_blocks`` takes them and searches for the rest). ``narrowest``: each kernel's fewest columns;
    ``report(name, done, total)`` is called before each kernel (progress)."""
    found: dict[str, int] = {}
    ran: dict[str, int] = {}  # the tuned kernels' cycles alone
    chosen: dict[Hashable, Choice | None] = {}  # by shape, region and density: a stack's layers repeat
    drifts = DRIFTS if placement == "balanced" else (None,)
    tuned = [
        i for i, (k, p) in enumerate(zip(program.kernels, pending)) if rowwise(k) and p.sparse is not None
    ]
    for done, i in enumerate(tuned):
        k, p = program.kernels[i], pending[i]
        if report is not None:
            report(k.name, done, len(tuned))

        as_placed = (k.region.width, None)  # place-data's layout: no limit, at the starting width
        placed = {role: t for role, t in sparse_arrays(program, k).items() if role != "bias"}

        def place(
            k: Kernel, drift: int | None, p: Pending = p, placed: dict = placed, at: tuple = as_placed
        ) -> dict:
            if (k.region.width, drift) == at:
                arrays = placed
            else:
                w, h = k.region.width, k.region.height
                arrays = place_sparse(p.sparse.weight, p.sparse.mask, w, h, placement, drift)
            _install(program, k, arrays)
            return arrays

        hidden = hidden_behind(program, i, ran)
        key = (_signature(k, p), narrowest.get(k.name, 1), hidden)
        timed = key not in chosen
        if timed:  # leaves k laid out as it was last tried
            chosen[key] = search(program, k, narrowest.get(k.name, 1), drifts, place, hidden)
        choice = chosen[key]
        if choice is None:  # nothing fits: keep the even cut
            _install(program, k, placed)
            continue
        if timed:  # the layout the search kept
            k.region = Region(k.region.x, k.region.y, choice.width, k.region.height)
            _install(program, k, choice.layout)
        elif (choice.width, choice.drift) != as_placed:  # a repeat: its own weights, the first one's mapping
            k.region = Region(k.region.x, k.region.y, choice.width, k.region.height)
            place(k, choice.drift)
        k.attrs.pop("drift", None)
        if choice.drift is not None:
            k.attrs["drift"] = choice.drift
        if timed or placement == "balanced":  # a balanced cut spreads any layer's nonzeros alike; a
            found[k.name] = choice.rows  # block placement's imbalance follows each layer's own mask
        ran[k.name] = choice.run
    return found


def hidden_behind(program: ProgramData, i: int, ran: dict[str, int]) -> int:
    """Streaming: cycles of kernel ``i``'s load that the kernel before it hides (its time alone: from
    ``ran`` if tuned already, else timed with all its rows in one block; 0 for the first kernel)."""
    if program.mode != "streaming" or i == 0:
        return 0
    before = program.kernels[i - 1]
    if before.name in ran:
        return ran[before.name]
    attrs = before.attrs
    unset = "rows_in_flight" not in attrs
    if unset:
        attrs["rows_in_flight"] = max(rows_of(before.shape), 1)
    try:
        return kernel_alone(program, before).end
    finally:
        if unset:
            attrs.pop("rows_in_flight")


def _signature(k: Kernel, p: Pending) -> tuple:
    """What the choice depends on: the weight's shape, the region, and the density to 1%."""
    assert p.sparse is not None
    density = round(float(p.sparse.mask.float().mean()), 2)
    return (k.attrs["in_features"], k.attrs["out_features"], k.region.width, k.region.height, density)


def _install(program: ProgramData, k: Kernel, arrays: dict) -> None:
    install(program, k, arrays)
    k.stats["imbalance"] = round(imbalance(arrays["nz_ptr"]), 4)
    k.stats["sram_max"] = int(pe_bytes(program, k).max()) if k.region.pes else 0
