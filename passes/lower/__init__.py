"""Lowering a captured graph to a ``DataflowProgram`` for a mesh of PEs (``sparsefx.lower`` is the entry).

``lower_graph`` runs the steps of ``steps.py`` under the ``PassManager`` on one graph and its example
call: walk the graph into kernels (``rules.py``), size their regions (``place.py``), place their data
(``place_sparse.py``, ``place_balanced.py``), connect them (``connect.py``) and verify the program::

    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()))
    >>> program = lower_graph(gm, (torch.randn(2, 8),), {}, mesh=(4, 4))
    >>> [k.op for k in program.kernels], program.kernels[0].stats["nnz"]
    (['sparse_matmul', 'elementwise'], 32)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from sparsefx.errors import LoweringError
from sparsefx.runtime.dataflow import DataflowProgram
from sparsefx.runtime.mesh import PRESETS, HardwareSpec, MeshSpec, mesh_spec
from sparsefx.runtime.mesh import hardware as hardware_spec
from sparsefx.runtime.program import MODES, PLACEMENTS

from ..manager import PassManager
from . import steps

__all__ = ["lower_graph"]


def lower_graph(
    graph: fx.GraphModule,
    args: tuple,
    kwargs: dict,
    mesh: MeshSpec | tuple[int, int] | str = (64, 64),
    mode: str = "pipelined",
    placement: str = "balanced",
    hardware: HardwareSpec | str | None = None,
    *,
    skip: Callable[[fx.Node], bool] | None = None,
    debug: bool = False,
    on_step: Callable[[str], None] | None = None,
    on_kernel: Callable[[str, int, int], None] | None = None,
) -> DataflowProgram:
    """Lower ``graph`` called with ``args``/``kwargs`` (run in eval mode, no grad).

    ``mesh`` is ``(width, height)``, ``"WxH"``, a ``MeshSpec`` or a preset name; ``hardware`` a
    ``HardwareSpec`` or a preset name (default: the mesh preset's, else WSE-2). ``skip(node)`` names
    nodes that compute nothing the program needs (an exported graph's guard check). ``on_step(name)``
    is called before each step and ``on_kernel(name, done, total)`` before each sparse matmul that
    ``plan-blocks`` times (``done`` of ``total`` timed so far; the dense baseline's, named
    ``"<kernel> (dense baseline)"``, count on their own): progress bars.
    """
    if mode not in MODES:
        raise LoweringError(f"mode {mode!r} is not valid; use one of {', '.join(MODES)}")
    if placement not in PLACEMENTS:
        raise LoweringError(f"placement {placement!r} is not valid; use one of {', '.join(PLACEMENTS)}")
    target = mesh_spec(mesh)
    preset = mesh if isinstance(mesh, str) and mesh in PRESETS else None
    hw = hardware_spec(hardware if hardware is not None else preset)
    state = steps.LoweringState(graph, args, kwargs, target, hw, mode, placement)
    state.meta["skip"] = skip
    state.meta["on_kernel"] = on_kernel
    passes = [_Announce(s, on_step) for s in steps.STEPS] if on_step else list(steps.STEPS)
    manager = PassManager(passes, debug=debug, text=steps.text, verify=lambda s: None, label="lower")
    manager(state)
    program = state.program
    assert program is not None
    program.meta = {"lanes": state.meta["lanes"]}
    if state.meta.get("kept_overflow"):  # sparsefx.lower warns with it
        program.meta["kept_overflow"] = state.meta["kept_overflow"]
    written = state.meta["walk"].written_state
    if written:  # the program computes with their values at lowering; it cannot update them
        program.meta["state_not_updated"] = written
    return program


class _Announce:
    """A step that reports its name before it runs."""

    def __init__(self, step: Any, on_step: Callable[[str], None]) -> None:
        self.step, self.on_step, self.name = step, on_step, step.name

    def __call__(self, state: Any) -> Any:
        self.on_step(self.name)
        return self.step(state)
