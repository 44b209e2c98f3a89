"""``sparsefx.compile``: capture, resolve the config, run the passes, wrap as a SparseModel.

>>> sm = compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()), 0.5)
>>> [n.target.__name__ for n in sm.graph_module.graph.nodes if n.op == "call_function"]
['masked_linear']
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

from torch import fx, nn

from .bound import binding_of
from .capture import Captured, capture, capture_graph
from .config import ParamDecision, SparsityPlan, load_config
from .dispatch import CapturedModule, Variant, call_key, describe_call, shapes_of
from .errors import CaptureError
from .masks import mask_name
from .model import SparseModel
from .passes.count_flops import CountFlops
from .passes.insert_masks import InsertMasks
from .passes.manager import PassManager
from .passes.meta import INPUT_ERROR
from .passes.rewrite_sparse_ops import RewriteSparseOps
from .passes.select_params import SelectSparseParams
from .passes.shape_prop import PropagateShapes
from .shell import private_copy, private_tree, rehome
from .sparse.build import build_algorithm
from .sparse.select import resolve_plan

__all__ = ["compile", "normalize_inputs", "dense_plan", "resolve_plan"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def compile(
    model: nn.Module,
    config: Any,
    example_inputs: Any = None,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    capture_method: str = "auto",
    debug: bool = False,
    bind: bool = True,
) -> SparseModel:
    """Compile ``model`` into a SparseModel whose forward equals ``model`` run with ``weight * mask``.

    ``config`` is anything ``load_config`` accepts (float, dict, list, YAML path or text,
    SparsityConfig). ``example_inputs`` (a tensor, a tuple of args, or a dict of kwargs) is needed
    when fx tracing fails, and for FLOP counts. The SparseModel trains ``model``'s own Parameter
    objects and zeroes their pruned weights in place; ``bind=False`` builds the masks but binds no
    algorithm and changes no weight (``sparsefx.flops`` compiles that way).
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if bind:
        model = _warn_if_shared(model)
    cfg = load_config(config) if config is not None else None
    plan = dense_plan(model) if cfg is None else resolve_plan(cfg, model)
    sparsity = build_algorithm(cfg) if cfg is not None else None
    start = sparsity.initial_plan(plan) if sparsity is not None else plan
    args, kwargs = normalize_inputs(example_inputs, example_kwargs)
    tree = private_tree(model)
    captured = capture(tree, args, kwargs, method=capture_method)
    history: list[tuple[str, str]] = []
    for path, gm in captured.graphs.items():
        rehome(gm, tree.get_submodule(path))
        history += _run_passes(gm, path, start, captured.inputs.get(path), debug=debug)
        _check_inputs_fit(model, gm, path, captured.inputs.get(path))
    _check_captured(captured, plan)
    root = _install(tree, captured, start)
    sm = SparseModel(
        root,
        graphs=captured.graphs,
        config=cfg,
        plan=plan,
        capture_method=captured.method,
        capture_log=captured.log,
        graph_history=history,
        example_inputs=captured.inputs,
        sparsity=sparsity,
    )
    if sparsity is not None and bind:
        sparsity.bind(sm, plan, graph_masked=True)  # owns the masks; zeroes the pruned weights
    return sm


def _run_passes(
    gm: fx.GraphModule, path: str, plan: SparsityPlan, inputs: Inputs | None, *, debug: bool = False
) -> list[tuple[str, str]]:
    """The pipeline on one captured graph; returns ``[(pass name, graph code)]``."""
    prefix = f"{path}." if path else ""
    pipeline = PassManager(
        [
            PropagateShapes(inputs),
            SelectSparseParams(plan, prefix),
            InsertMasks(),
            RewriteSparseOps(),
            CountFlops(),
        ],
        debug=debug,
        label=path,
    )
    pipeline(gm)
    return [(f"{path}:{name}" if path else name, code) for name, code in pipeline.history]


def _install(tree: nn.Module, captured: Captured, plan: SparsityPlan) -> nn.Module:
    """Wrap each captured module as a CapturedModule at its path; the module to run at the root."""
    root = tree
    for path, gm in captured.graphs.items():
        sub = tree.get_submodule(path)
        inputs = captured.inputs.get(path)
        key = call_key(sub.training, *inputs) if inputs is not None else None
        static = path in captured.static
        first = Variant(gm, captured.methods.get(path, captured.method), static)
        shapes = shapes_of(*inputs) if static and inputs is not None else None
        build = functools.partial(_variant, plan, path)
        module = CapturedModule(sub, first, key, build, path=path, shapes=shapes)
        if not path:
            root = module
            continue
        parent, _, name = path.rpartition(".")
        tree.get_submodule(parent)._modules[name] = module
    return root


def _variant(
    plan: SparsityPlan, path: str, tree: nn.Module, args: tuple, kwargs: dict, prefer: str
) -> Variant:
    """Capture ``tree`` again for a new kind of call; the masks already exist, so only the rewrite runs."""
    gm, method, static = capture_graph(tree, args, kwargs, prefer)
    rehome(gm, tree)
    prefix = f"{path}." if path else ""
    PassManager([SelectSparseParams(plan, prefix), InsertMasks(), RewriteSparseOps()], label=path)(gm)
    return Variant(gm, method, static)


def _warn_if_shared(model: nn.Module) -> nn.Module:
    """Compiling a SparseModel, or a model compiled before, shares Parameter objects: say so.

    A SparseModel is compiled again from its module tree, without its masks and graphs.
    """
    if isinstance(model, SparseModel):
        warnings.warn(
            "sparsefx.compile: this model is already a compiled SparseModel; compiling it again starts "
            "from its module tree without its masks and graphs. Both models share their Parameter and "
            "buffer objects (the weights already pruned to the first config), and the newest compile "
            "selects their gradients; compile copy.deepcopy(model) for an independent model",
            UserWarning,
            stacklevel=3,
        )
        return _source_tree(model)
    bound = [name for name, p in model.named_parameters() if binding_of(p) is not None]
    if bound:
        warnings.warn(
            f"sparsefx.compile: {type(model).__name__} was compiled (or given to a sparsity algorithm) "
            f"before: {', '.join(bound[:3])}{' ...' if len(bound) > 3 else ''} are bound already. compile "
            "shares the caller's Parameter objects and zeroes their pruned weights in place, so both "
            "compiled models train the same tensors and the newest compile selects their gradients; "
            "compile copy.deepcopy(model) for independent models",
            UserWarning,
            stacklevel=3,
        )
    return model


def _source_tree(sm: SparseModel) -> nn.Module:
    """The module tree ``sm`` runs, with its captured modules unwrapped and its mask buffers dropped."""
    root = sm._root.tree if isinstance(sm._root, CapturedModule) else sm._root
    masks = {mask_name(name) for name in sm.masks}

    def strip(module: nn.Module, prefix: str) -> nn.Module:
        module = module.tree if isinstance(module, CapturedModule) else module
        clone = private_copy(module)
        for name in list(clone._buffers):
            if prefix + name in masks:
                del clone._buffers[name]
        clone._modules = {
            k: None if c is None else strip(c, f"{prefix}{k}.") for k, c in module._modules.items()
        }
        return clone

    return strip(root, "")


def normalize_inputs(example_inputs: Any, example_kwargs: Mapping[str, Any] | None = None) -> Inputs:
    """A tensor, a tuple/list of args, or a dict of kwargs -> ``(args, kwargs)``."""
    kwargs = dict(example_kwargs or {})
    if example_inputs is None:
        return (), kwargs
    if isinstance(example_inputs, Mapping):
        return (), {**example_inputs, **kwargs}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), kwargs
    return (example_inputs,), kwargs


def dense_plan(model: nn.Module) -> SparsityPlan:
    """A plan that keeps every parameter dense (for accounting a plain model)."""
    return SparsityPlan(
        tuple(
            ParamDecision(n, tuple(p.shape), False, reason="no config") for n, p in model.named_parameters()
        )
    )


def _check_inputs_fit(model: nn.Module, gm: fx.GraphModule, path: str, inputs: Inputs | None) -> None:
    """Example inputs that a kernel of the graph rejects (a shape or dtype mismatch) are a CaptureError."""
    error = gm.meta.get(INPUT_ERROR)
    if error is None or inputs is None:
        return
    what = f"{type(model).__name__}.{path}" if path else type(model).__name__
    raise CaptureError(
        f"example inputs {describe_call(*inputs)} do not fit {what}: {error}; "
        "pass inputs shaped and typed as its forward expects"
    )


def _check_captured(captured: Captured, plan: SparsityPlan) -> None:
    """Every sparse parameter must live inside a captured graph, or its mask could not be applied."""
    inside = set()
    for path, gm in captured.graphs.items():
        prefix = f"{path}." if path else ""
        inside.update(prefix + n for n, _ in gm.named_parameters(remove_duplicate=False))
    missing = [name for name in plan.sparse if name not in inside]
    if missing:
        raise CaptureError(
            f"sparse parameter(s) {', '.join(missing[:5])} are not read by any captured graph "
            f"(capture: {captured.method}; {' | '.join(captured.log) or 'no notes'}); exclude them from "
            "the config or make the module that uses them traceable"
        )
