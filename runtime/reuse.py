"""When the fast clock takes a kernel's earlier timing instead of timing it again.

A kernel's timing depends on its structure (what ``runtime/memo.py`` keys: the kernel's arrays and
geometry), its ``setting`` (attributes, hardware, mode) and its ``situation``: when its inputs'
messages leave their producers, counted from its start, and which of them are sent. The cost rules
only add and compare times, so a kernel met again in the same setting and situation takes the kept
timing moved to its start (``take``, ``moved``).

    >>> from collections import OrderedDict
    >>> from sparsefx.runtime.timeline import KernelTime
    >>> from sparsefx.runtime.program import Region
    >>> k = Kernel("k", "relu", Region(0, 0, 1, 1), ("x",), (1, 1), "fp32")
    >>> flow = Flow("k", "fp32", 1, 1, 1, 1, torch.tensor([1]), 0, torch.tensor([[5]]))
    >>> timed = lambda: (KernelTime("k", "relu", 2, 7, torch.zeros(1), torch.zeros(1), 1), flow)
    >>> kept = OrderedDict()
    >>> kt, _ = take(kept, ("same",), k, 2, timed)  # timed, kept relative to its start
    >>> kt, _ = take(kept, ("same",), k, 100, timed)  # met again 98 cycles later: moved
    >>> kt.start, kt.end
    (100, 105)
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .mesh import HardwareSpec
from .program import Kernel
from .timeline import Flow, KernelTime, digest

REUSE = True
"""Whether a kernel met again in the same situation (``situation``) takes its earlier timing. Tests
switch it off (``reuse.REUSE``, read when a clock is made) to check that the reused timings are the
ones the clock computes."""

SITUATIONS = 16
"""Timings kept per kernel structure: those of the most recently met situations (a program and its
dense baseline share them for kernels of the same geometry)."""

_NAMES = ("param", "dense")  # attributes that name things (the weight; the baseline's plan), not timing


def setting(k: Kernel, hw: HardwareSpec, streaming: bool) -> tuple:
    """What a kernel's timing depends on besides its structure and inputs: its attributes (but the
    names among them), the hardware and the mode."""
    attrs = sorted((n, v) for n, v in k.attrs.items() if n not in _NAMES)
    return repr(attrs), repr(hw), streaming


def situation(
    k: Kernel, flows: Mapping[str, Flow], t0: int, sent: torch.Tensor | None, own: torch.Tensor | None
) -> tuple:
    """What a kernel's timing depends on besides its structure and ``setting``, relative to its start
    ``t0``: how each input's messages leave their producer (when, counted from ``t0``, and how many
    wavelets), ``sent`` (a sparse matmul's ``[blocks, in_features]``: which input vectors are sent)
    and ``own`` (``[blocks, features]``: which of its results hold a nonzero, for an op whose tasks
    that make only zeros are not run). A program run again on inputs with the same zero pattern (a
    GELU model: none) meets every kernel in the situation of the first run. Tensors enter as 160-bit
    digests of their bytes."""
    parts: list[Any] = []
    for value in dict.fromkeys(k.inputs):
        f = flows[value]  # t0 is 0 outside streaming mode, as the clock reads departures
        when = f.waiting()[1] if f.waits(t0) else digest(f.depart(t0) - t0)
        live = None if f.live is None else digest(f.live)
        kept = None if f.back is None else digest(f.back)
        parts.append((f.east, f.features, f.lanes, f.rows, f.block, digest(f.wave), when, live, kept))
    if sent is not None:
        parts.append(digest(sent))
    if own is not None:
        parts.append(digest(own))
    return ("timed", *parts)


def take(
    timings: OrderedDict, key: tuple, k: Kernel, t0: int, time: Callable[[], tuple[KernelTime, Flow]]
) -> tuple[KernelTime, Flow]:
    """The timing of ``k`` starting at ``t0`` in situation ``key``: the one kept in ``timings`` (relative
    to its start) moved to ``t0``, else ``time()``'s, kept. Only the ``SITUATIONS`` most recently met
    are kept (a ReLU model meets a new zero pattern every run)."""
    if key in timings:
        timings.move_to_end(key)
    else:
        timings[key] = moved(k, *time(), -t0, True)
        while len(timings) > SITUATIONS:
            timings.popitem(last=False)
    return moved(k, *timings[key], t0)


def moved(k: Kernel, kt: KernelTime, flow: Flow, dt: int, keep: bool = False) -> tuple[KernelTime, Flow]:
    """A timing and result flow moved ``dt`` cycles later, as new objects named for ``k``. A timing
    kept for reuse (``keep``) names the input it waits on by its place among the kernel's inputs, as
    another kernel of the same structure may take it."""
    inputs = list(dict.fromkeys(k.inputs))
    waits = kt.waits_on
    if isinstance(waits, int):
        waits = inputs[waits]
    elif keep and waits in inputs:
        waits = inputs.index(waits)
    later = dataclasses.replace(kt, name=k.name, start=kt.start + dt, end=kt.end + dt, waits_on=waits)
    own = None if flow.own is None else flow.own + dt
    flow = dataclasses.replace(
        flow, value=k.name, ready=flow.ready + dt, own=own, _departs={}, _shared=flow._shared
    )
    return later, flow
