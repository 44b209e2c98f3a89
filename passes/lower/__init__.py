"""Lowering: a compiled sparse model -> a ``DataflowProgram`` for a mesh of PEs.

``lower`` takes the model's eval-mode graph for the example call and runs the steps of
``steps.py`` under the ``PassManager``: walk the graph into kernels (``rules.py``), size their
regions (``place.py``), place their data (``place_sparse.py`` for the sparse matmuls), connect them
(``connect.py``) and verify the program::

    >>> import sparsefx
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), 0.5)
    >>> program = lower(sm, torch.randn(2, 8), mesh=(4, 4))
    >>> [k.op for k in program.kernels], program.kernels[0].stats["nnz"]
    (['sparse_matmul', 'elementwise'], 16)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sparsefx.errors import LoweringError
from sparsefx.runtime.mesh import HardwareSpec, MeshSpec, mesh_spec
from sparsefx.runtime.mesh import hardware as hardware_spec
from sparsefx.runtime.program import MODES, PLACEMENTS, DataflowProgram

from ..manager import PassManager
from . import steps

__all__ = ["lower"]


def lower(
    sm: Any,
    example_inputs: Any,
    mesh: MeshSpec | tuple[int, int] | str = (64, 64),
    mode: str = "pipelined",
    placement: str = "balanced",
    hardware: HardwareSpec | str | None = None,
    *,
    debug: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> DataflowProgram:
    """Lower compiled model ``sm`` for one call with ``example_inputs`` (a tensor, a tuple or a dict).

    ``mesh`` is ``(width, height)``, ``"WxH"``, a ``MeshSpec`` or a preset name; ``hardware`` a
    ``HardwareSpec`` or a preset name (default: the mesh preset's, else WSE-2). ``on_step(name)`` is
    called before each step (for progress bars). The model is lowered in eval mode; its own mode is
    left as it was.
    """
    from sparsefx.compiler import normalize_inputs
    from sparsefx.dispatch import CapturedModule
    from sparsefx.model import SparseModel

    if mode not in MODES:
        raise LoweringError(f"mode {mode!r} is not valid; use one of {', '.join(MODES)}")
    if placement not in PLACEMENTS:
        raise LoweringError(f"placement {placement!r} is not valid; use one of {', '.join(PLACEMENTS)}")
    if not isinstance(sm, SparseModel):
        raise LoweringError(
            f"lower takes a compiled model (sparsefx.compile(model, config)), not a {type(sm).__name__}"
        )
    target = mesh_spec(mesh)
    hw = hardware_spec(
        hardware if hardware is not None else (mesh if isinstance(mesh, str) and mesh in _presets() else None)
    )
    args, kwargs = normalize_inputs(example_inputs)
    graph = _eval_graph(sm, args, kwargs, CapturedModule)
    state = steps.LoweringState(graph, args, kwargs, target, hw, mode, placement)
    passes = [_Announce(s, on_step) for s in steps.STEPS] if on_step else list(steps.STEPS)
    manager = PassManager(passes, debug=debug, text=steps.text, verify=lambda s: None, label="lower")
    manager(state)
    program = state.program
    assert program is not None
    program.meta = {
        "model": type(sm._root.tree if isinstance(sm._root, CapturedModule) else sm._root).__name__,
        "capture": sm.capture_method,
        "lanes": state.meta["lanes"],
        "sparse_params": sorted(sm.plan.sparse),
    }
    return program


def _presets() -> dict:
    from sparsefx.runtime.mesh import PRESETS

    return PRESETS


def _eval_graph(sm: Any, args: tuple, kwargs: dict, captured_cls: type) -> torch.fx.GraphModule:
    root = sm._root
    if not isinstance(root, captured_cls):
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


class _Announce:
    """A step that reports its name before it runs."""

    def __init__(self, step: Any, on_step: Callable[[str], None]) -> None:
        self.step, self.on_step, self.name = step, on_step, step.name

    def __call__(self, state: Any) -> Any:
        self.on_step(self.name)
        return self.step(state)
