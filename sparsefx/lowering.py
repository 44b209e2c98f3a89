"""``sparsefx.lower``: a compiled model, for one kind of call, to a ``DataflowProgram``.

It takes the model's eval-mode graph for the example call (captured now if the model has none for
it; the model's own mode is left as it was) and lowers it with ``sparsefx.passes.lower``::

    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), 0.5)
    >>> program = lower(sm, torch.randn(2, 8), mesh=(4, 4))
    >>> [k.op for k in program.kernels], program.kernels[0].stats["nnz"], program.meta["capture"]
    (['sparse_matmul', 'elementwise'], 16, 'fx')
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from .capture import is_guard_check
from .compiler import normalize_inputs
from .dispatch import CapturedModule
from .errors import LoweringError
from .model import SparseModel
from .passes.count_flops import CountFlops
from .passes.lower import lower_graph
from .passes.manager import PassManager
from .passes.meta import FLOPS
from .passes.shape_prop import PropagateShapes
from .runtime.mesh import HardwareSpec, MeshSpec
from .runtime.program import DataflowProgram

__all__ = ["lower"]


def lower(
    sm: SparseModel,
    example_inputs: Any,
    mesh: MeshSpec | tuple[int, int] | str = (64, 64),
    mode: str = "pipelined",
    placement: str = "balanced",
    hardware: HardwareSpec | str | None = None,
    *,
    debug: bool = False,
    on_step: Callable[[str], None] | None = None,
    on_kernel: Callable[[str, int, int], None] | None = None,
) -> DataflowProgram:
    """Lower ``sm`` for a call with ``example_inputs`` (a tensor, a tuple of args or a dict of kwargs).

    ``mesh`` is ``(width, height)``, ``"WxH"``, a ``MeshSpec`` or a preset name (``wse2``, ``wse3``,
    ``tiny``, ``small``, ``medium``); ``mode`` ``"pipelined"`` or ``"streaming"``; ``placement``
    ``"block"`` or ``"balanced"``; ``hardware`` a ``HardwareSpec`` or a preset name.
    ``on_step(name)`` is called before each lowering step and ``on_kernel(name, done, total)`` before
    each sparse matmul a step times on the clock (for progress bars).
    """
    if not isinstance(sm, SparseModel):
        raise LoweringError(
            f"lower takes a compiled model (sparsefx.compile(model, config)), not a {type(sm).__name__}"
        )
    args, kwargs = normalize_inputs(example_inputs)
    graph = _eval_graph(sm, args, kwargs)
    _count_flops(graph, args, kwargs)
    program = lower_graph(
        graph,
        args,
        kwargs,
        mesh,
        mode,
        placement,
        hardware,
        skip=is_guard_check,
        debug=debug,
        on_step=on_step,
        on_kernel=on_kernel,
    )
    written = program.meta.get("state_not_updated")
    if written:
        warnings.warn(
            f"the model's forward writes {', '.join(written)}; the program computes with the values they "
            "had when it was lowered and does not update them, so its outputs match the model's only while "
            "that state does not change",
            stacklevel=2,
        )
    root = sm._root
    program.meta |= {
        "model": type(root.tree if isinstance(root, CapturedModule) else root).__name__,
        "capture": sm.capture_method,
        "sparse_params": sorted(sm.plan.sparse),
    }
    return program


def _count_flops(graph: fx.GraphModule, args: tuple, kwargs: dict) -> None:
    """Run propagate-shapes and count-flops on a graph captured after compile (which runs only the rewrite),
    so that lowering reads count-flops' figures for every kernel. The compile-time graphs, whose counts
    accounting reads, already have theirs and are left alone."""
    if FLOPS in graph.meta:
        return
    PassManager([PropagateShapes((args, kwargs)), CountFlops()], label="lower")(graph)


def _eval_graph(sm: SparseModel, args: tuple, kwargs: dict) -> fx.GraphModule:
    root = sm._root
    if not isinstance(root, CapturedModule):
        parts = ", ".join(f"{p!r}" for p in sm.graphs if p) or "none"
        raise LoweringError(
            f"the model was captured in parts (captured submodules: {parts}); its root "
            f"{type(root).__name__}.forward runs eagerly, so there is no whole-model graph to lower. "
            f"Capture log: {'; '.join(sm.capture_log[-2:]) or 'empty'}"
        )
    was_training = sm.training
    sm.eval()
    try:
        with torch.no_grad():
            sm(*args, **kwargs)  # captures (or recaptures) the eval graph for this call if needed
            return root.graph_for(args, kwargs).graph_module
    finally:
        sm.train(was_training)
