"""``sparsefx.lower``: a compiled model, for one kind of call, to a ``DataflowProgram``.

It takes the model's eval-mode graph for the example call (captured now if the model has none for
it; the model's own mode is left as it was) and lowers it with ``sparsefx.passes.lower``::

    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), 0.5)
    >>> program = lower(sm, torch.randn(2, 8), mesh=(4, 4))
    >>> [k.op for k in program.kernels], program.kernels[0].stats["nnz"], program.meta["capture"]
    (['sparse_matmul', 'elementwise'], 16, 'fx')

Example inputs the model cannot take are a ``LoweringError`` naming them, the graph node that refused
them and the inputs the model was compiled with::

    >>> lower(sm, torch.randn(2, 9), mesh=(4, 4))
    Traceback (most recent call last):
    ...
    sparsefx.errors.LoweringError: example inputs (float32[2, 9]) do not fit Sequential: at graph node ...
"""

from __future__ import annotations

import linecache
import re
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from .capture import is_guard_check
from .compiler import normalize_inputs
from .dispatch import CapturedModule, describe_call
from .errors import LoweringError, SparseFXError
from .model import SparseModel
from .passes.count_flops import CountFlops
from .passes.lower import lower_graph
from .passes.manager import PassManager
from .passes.meta import FLOPS
from .passes.shape_prop import PropagateShapes
from .runtime.call import KEY as CONSTANTS
from .runtime.call import constant_inputs
from .runtime.dataflow import DataflowProgram
from .runtime.mesh import HardwareSpec, MeshSpec, mesh_spec

__all__ = ["lower"]

# What a kernel raises on inputs of the wrong shape or dtype (``passes/shape_prop.py`` reads the same).
_INPUT_ERRORS = (RuntimeError, ValueError, IndexError, TypeError, AssertionError)


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
    ``"block"`` or ``"balanced"``; ``hardware`` a ``HardwareSpec`` or a preset name. A mesh has at
    most ``runtime.mesh.max_mesh_pes()`` PEs (the ``wse3`` preset's, unless ``SPARSEFX_MAX_MESH_PES``
    raises it).
    ``on_step(name)`` is called before each lowering step and ``on_kernel(name, done, total)`` before
    each sparse matmul a step times on the clock (for progress bars).
    """
    if not isinstance(sm, SparseModel):
        raise LoweringError(
            f"lower takes a compiled model (sparsefx.compile(model, config)), not a {type(sm).__name__}"
        )
    mesh = mesh_spec(mesh)  # a bad or too large mesh fails before the model runs
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
    if program.meta.get("kept_overflow"):
        warnings.warn(f"sparsefx.lower: {program.meta['kept_overflow']}", stacklevel=2)
    written = program.meta.get("state_not_updated")
    if written:
        warnings.warn(
            f"the model's forward writes {', '.join(written)}; the program computes with the values they "
            "had when it was lowered and does not update them, so its outputs match the model's only while "
            "that state does not change",
            stacklevel=2,
        )
    root = sm._root
    model = root.tree if isinstance(root, CapturedModule) else root
    program.meta |= {
        "model": type(model).__name__,
        "capture": sm.capture_method,
        "sparse_params": sorted(sm.plan.sparse),
        CONSTANTS: constant_inputs(model.forward, args, kwargs),  # what run() checks non-tensors against
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
            try:
                sm(*args, **kwargs)  # captures (or recaptures) the eval graph for this call if needed
            except SparseFXError:
                raise
            except _INPUT_ERRORS as exc:
                raise LoweringError(_misfit(sm, args, kwargs, exc)) from exc
            return root.graph_for(args, kwargs).graph_module
    finally:
        sm.train(was_training)


def _misfit(sm: SparseModel, args: tuple, kwargs: dict, exc: BaseException) -> str:
    """Why the example inputs do not fit: the inputs, the graph node that refused them and its error,
    and the inputs the model was compiled with."""
    root = sm._root
    name = type(root.tree if isinstance(root, CapturedModule) else root).__name__
    lines = str(exc).strip().splitlines()
    error = lines[0] if lines else type(exc).__name__
    node = _failing_node(exc.__traceback__)
    at = f"at graph node {node}: " if node else ""
    compiled = sm.example_inputs.get("")
    was = f"; it was compiled with example inputs {describe_call(*compiled)}" if compiled else ""
    return (
        f"example inputs {describe_call(args, kwargs)} do not fit {name}: {at}{error}{was}; "
        "pass inputs shaped and typed as its forward expects"
    )


_ASSIGNMENT = re.compile(r"\s*(\w+)\s*=\s*([\w.]+)\(")


def _failing_node(tb: types.TracebackType | None) -> str | None:
    """``"name (target)"`` of the graph node whose line of generated graph code raised, if one did."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith("<eval_with_key>"):
            match = _ASSIGNMENT.match(linecache.getline(code.co_filename, tb.tb_lineno))
            found = f"{match[1]} ({match[2]})" if match else found
        tb = tb.tb_next
    return found
