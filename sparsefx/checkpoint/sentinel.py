"""The NaN-sentinel format: pruned positions hold NaN, so a plain dense checkpoint carries the masks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import CheckpointError
from ..masks import follows_mask, masked_params
from ..ops import prune_
from .files import PathLike, atomic_save, read_file
from .state import (
    SPARSE_HINT,
    check_fits,
    check_optimizer_fits,
    check_optimizer_state,
    check_state_dict,
    describe,
    load_model,
    load_optimizer,
    names,
    param_index,
)

__all__ = ["export_nan_sentinel", "import_nan_sentinel", "save_nan_sentinel", "load_nan_sentinel"]

_NAN = float("nan")


def export_nan_sentinel(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """``{"model": dense state dict, "optimizer": state dict | None}`` with NaN at every pruned
    position of the weights and their same-shape optimizer states, and no mask entries."""
    masked = masked_params(model)
    by_param = {id(param): (name, mask) for name, (param, mask) in masked.items()}
    mask_ids = {id(mask) for _, mask in masked.values()}
    state = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) in mask_ids:
            continue
        hit = by_param.get(id(value))
        state[key] = value.detach() if hit is None else _nan_at_pruned(value.detach(), hit[1], key)
    opt_state = None
    if optimizer is not None:
        opt_state = optimizer.state_dict()
        masks = {id(param): mask for param, mask in masked.values()}
        opt_state["state"] = _map_states(
            optimizer, opt_state, masks, lambda t, mask: t.masked_fill(~mask, _NAN)
        )
    return {"model": state, "optimizer": opt_state}


def _nan_at_pruned(weight: Tensor, mask: Tensor, key: str) -> Tensor:
    if not weight.is_floating_point():
        raise CheckpointError(f"{key}: a {weight.dtype} weight cannot hold NaN sentinels")
    if bool((torch.isnan(weight) & mask).any()):
        raise CheckpointError(
            f"{key}: kept weights are NaN (did training diverge?); the NaN-sentinel format would read "
            "them as pruned"
        )
    return weight.masked_fill(~mask, _NAN)


def _map_states(
    optimizer: torch.optim.Optimizer,
    opt_state: dict,
    masks: Mapping[int, Tensor],
    fill: Callable[[Tensor, Tensor], Tensor],
) -> dict:
    """``opt_state["state"]`` with ``fill(tensor, mask)`` applied to every masked state (new dicts)."""
    states = dict(opt_state["state"])
    for param, index in param_index(optimizer, opt_state):
        mask, entry = masks.get(id(param)), states.get(index)
        if mask is None or not entry:
            continue
        states[index] = {
            key: fill(value, mask.to(value.device)) if follows_mask(key, value, param) else value
            for key, value in entry.items()
        }
    return states


def import_nan_sentinel(
    model: nn.Module,
    checkpoint: Mapping[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    *,
    source: str = "checkpoint",
) -> None:
    """Load a NaN-sentinel checkpoint: mask = ~isnan(weight), NaN becomes 0 in weights and states.

    Every masked parameter of ``model`` takes its mask from the checkpoint (all True when its weight
    holds no NaN); same-shape optimizer states get 0 where they hold NaN at pruned positions. NaN
    in a tensor that has no mask buffer is an error. Nothing is loaded unless everything fits.
    """
    state, opt_state = _sentinel_parts(checkpoint, source)
    masked = masked_params(model)
    mask_ids = {id(mask) for _, mask in masked.values()}
    own = {k: v for k, v in model.state_dict(keep_vars=True).items() if id(v) not in mask_ids}
    check_fits(own, state, source, hints=False)  # the NaN-sentinel format has no mask entries
    by_param = {id(param): name for name, (param, _) in masked.items()}
    dense, keeps, stray = {}, {}, []
    for key, value in state.items():
        nans = torch.isnan(value) if value.is_floating_point() or value.is_complex() else None
        name = by_param.get(id(own[key]))
        if name is None:
            if nans is not None and bool(nans.any()):
                stray.append(key)
            dense[key] = value
            continue
        keeps[name] = ~nans if nans is not None else torch.ones_like(value, dtype=torch.bool)
        dense[key] = value.masked_fill(nans, 0.0) if nans is not None else value
    if stray:
        raise CheckpointError(
            f"{source}: {names(stray)} hold NaN but the model has no mask for them; {SPARSE_HINT}"
        )
    if optimizer is not None:
        if opt_state is None:
            raise CheckpointError(f"{source}: holds no optimizer state")
        check_optimizer_state(opt_state, f"{source}: optimizer")
        check_optimizer_fits(optimizer, opt_state, source)
        masks = {id(masked[name][0]): keep for name, keep in keeps.items()}
        zeroed = _map_states(optimizer, opt_state, masks, _zero_pruned_nan)
        opt_state = {**opt_state, "state": zeroed}
    load_model(model, dense, source, strict=False)
    with torch.no_grad():
        for name, keep in keeps.items():
            param, mask = masked[name]
            mask.copy_(keep)
            prune_(param, mask)
    if optimizer is not None:
        load_optimizer(optimizer, opt_state, source)


def _zero_pruned_nan(state: Tensor, keep: Tensor) -> Tensor:
    """NaN -> 0 at pruned positions: the inverse of export, so a state exported dense stays as it was."""
    return state.masked_fill(~keep & torch.isnan(state), 0.0)


def _sentinel_parts(checkpoint: Any, source: str) -> tuple[dict[str, Tensor], Any]:
    if isinstance(checkpoint, Mapping) and isinstance(checkpoint.get("model"), Mapping):
        state, opt_state = dict(checkpoint["model"]), checkpoint.get("optimizer")
    elif isinstance(checkpoint, Mapping) and all(isinstance(v, Tensor) for v in checkpoint.values()):
        state, opt_state = dict(checkpoint), None
    else:
        raise CheckpointError(f"{source}: not a NaN-sentinel checkpoint: it holds {describe(checkpoint)}")
    check_state_dict(state, f"{source}: model")
    return state, opt_state


def save_nan_sentinel(
    path: PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Write ``export_nan_sentinel(model, optimizer)`` to ``path`` atomically."""
    atomic_save(export_nan_sentinel(model, optimizer), path)


def load_nan_sentinel(
    path: PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Read a NaN-sentinel file (weights only) and ``import_nan_sentinel`` it; returns what was read."""
    checkpoint = read_file(path)
    import_nan_sentinel(model, checkpoint, optimizer, source=str(path))
    return checkpoint
