"""``sparsefx.compile``: capture, resolve the config, run the passes, wrap as a SparseModel.

>>> sm = compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()), 0.5)
>>> [n.target.__name__ for n in sm.graph_module.graph.nodes if n.op == "call_function"]
['masked_linear']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .capture import Captured, capture
from .config import ParamDecision, SparsityConfig, SparsityPlan, load_config
from .errors import CaptureError, ConfigError
from .model import SparseModel
from .ops import prune_
from .passes.count_flops import CountFlops
from .passes.insert_masks import InsertMasks
from .passes.manager import PassManager
from .passes.rewrite_sparse_ops import RewriteSparseOps
from .passes.select_params import SelectSparseParams
from .passes.shape_prop import PropagateShapes

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
) -> SparseModel:
    """Compile ``model`` into a SparseModel whose forward equals ``model`` run with ``weight * mask``.

    ``config`` is anything ``load_config`` accepts (float, dict, list, YAML path or text,
    SparsityConfig). ``example_inputs`` (a tensor, a tuple of args, or a dict of kwargs) is needed
    when fx tracing fails, and for FLOP counts.
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    cfg = load_config(config) if config is not None else None
    plan = dense_plan(model) if cfg is None else resolve_plan(cfg, model)
    _reject_unsupported(cfg, plan)
    args, kwargs = normalize_inputs(example_inputs, example_kwargs)
    captured = capture(model, args, kwargs, method=capture_method)
    _check_captured(captured, plan)
    history: list[tuple[str, str]] = []
    for path, gm in captured.graphs.items():
        prefix = f"{path}." if path else ""
        pipeline = PassManager(
            [
                PropagateShapes(captured.inputs.get(path)),
                SelectSparseParams(plan, prefix),
                InsertMasks(),
                RewriteSparseOps(),
                CountFlops(),
            ],
            debug=debug,
            label=path,
        )
        pipeline(gm)
        history += [(f"{path}:{name}" if path else name, code) for name, code in pipeline.history]
    _prune_weights(captured.root, plan)
    return SparseModel(
        captured.root,
        graphs=captured.graphs,
        config=cfg,
        plan=plan,
        capture_method=captured.method,
        capture_log=captured.log,
        graph_history=history,
        example_inputs=captured.inputs,
    )


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


def resolve_plan(cfg: SparsityConfig, model: nn.Module) -> SparsityPlan:
    """Decide every parameter of ``model``: config filters, ``requires_dense``, embedding modules."""
    return cfg.resolve(
        model.named_parameters(), dense=_dense_modules(model), default_dense=_embeddings(model)
    )


def _embeddings(model: nn.Module) -> dict[str, str]:
    """Weights of embedding modules, whatever they are named (GPT-2 calls them ``wte``/``wpe``)."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            for pname, _ in module.named_parameters(recurse=False):
                found[f"{path}.{pname}" if path else pname] = (
                    f"default exclusion: {type(module).__name__} module"
                )
    return found


def _dense_modules(model: nn.Module) -> dict[str, str]:
    """Parameters of modules marked ``requires_dense = True`` (the module's own parameters only)."""
    dense = {}
    for path, module in model.named_modules():
        if getattr(module, "requires_dense", False):
            for pname, _ in module.named_parameters(recurse=False):
                dense[f"{path}.{pname}" if path else pname] = "requires_dense (module)"
    return dense


def _reject_unsupported(cfg: SparsityConfig | None, plan: SparsityPlan) -> None:
    if cfg is None:
        return
    used = {cfg.groups[d.group].algorithm for d in plan.sparse.values() if d.group is not None}
    dynamic = sorted(a for a in used if a != "static")
    if dynamic:
        raise ConfigError(
            f"sparsity.algorithm: {', '.join(map(repr, dynamic))} parsed and validated, but compile does not "
            "support dynamic sparsity yet; use algorithm 'static' (dynamic algorithms are coming)"
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


def _prune_weights(root: nn.Module, plan: SparsityPlan) -> None:
    """Zero the pruned entries of every sparse weight, so stored weights agree with their masks."""
    for name in plan.sparse:
        weight = root.get_parameter(name)
        if weight.device.type != "meta":
            prune_(weight.data, root.get_buffer(f"{name}_mask"))
