"""sparsefx checkpoints: model, optimizer and algorithm state in one file, checked on load."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import CheckpointError, ConfigError
from ..masks import follows_mask, masked_params, param_of
from ..ops import prune_
from .files import PathLike, atomic_save, read_file, why

__all__ = [
    "FORMAT",
    "VERSION",
    "SPARSE_HINT",
    "save_checkpoint",
    "load_checkpoint",
    "validate",
    "describe",
    "check_state_dict",
    "check_optimizer_state",
    "check_fits",
    "check_optimizer_fits",
    "names",
    "param_index",
    "load_model",
    "load_optimizer",
]

FORMAT = "sparsefx-checkpoint"
VERSION = 1
_KEYS = ("format", "version", "model", "optimizer", "sparsity", "extra")
_PARAM_SHAPED = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "sum"}
SPARSE_HINT = "compile the model with a config that makes them sparse, or `sparsefx finalize` the checkpoint"


def save_checkpoint(
    path: PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    sparsity_state: dict | None = None,
    extra: dict | None = None,
) -> None:
    """Write model (masks included), optimizer and sparsity-algorithm state to ``path`` atomically."""
    for name, value in (("sparsity_state", sparsity_state), ("extra", extra)):
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{name} must be a dict or None; got {type(value).__name__}")
    atomic_save(
        {
            "format": FORMAT,
            "version": VERSION,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "sparsity": sparsity_state,
            "extra": extra,
        },
        path,
    )


def load_checkpoint(
    path: PathLike,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    sparsity: Any = None,
    map_location: Any = "cpu",
) -> dict[str, Any]:
    """Read and validate a checkpoint; load it into ``model``, ``optimizer`` and ``sparsity`` when given.

    Nothing is loaded unless everything fits. Pruned weights are re-zeroed after loading.
    ``sparsity`` (a SparsityAlgorithm) gets its step and generator state back, for a bit-identical resume.
    """
    ckpt = validate(read_file(path, map_location), path)
    if optimizer is not None and ckpt["optimizer"] is None:
        raise CheckpointError(f"{path}: holds no optimizer state")
    if model is not None:
        check_fits(model.state_dict(), ckpt["model"], path)
    if optimizer is not None:
        check_optimizer_fits(optimizer, ckpt["optimizer"], path)
    if model is not None:
        load_model(model, ckpt["model"], path)
        with torch.no_grad():
            for param, mask in masked_params(model).values():
                prune_(param, mask)
    if optimizer is not None:
        load_optimizer(optimizer, ckpt["optimizer"], path)
        if model is not None:  # masks re-levelled on load: their state follows (0 where pruned)
            _mask_state(model, optimizer)
    if sparsity is not None:
        if ckpt["sparsity"] is None:
            raise CheckpointError(f"{path}: holds no sparsity algorithm state")
        try:
            sparsity.load_state_dict(ckpt["sparsity"])
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path}: sparsity state does not fit {type(sparsity).__name__}: {exc}"
            ) from exc
    return ckpt


def _mask_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    with torch.no_grad():
        for param, mask in masked_params(model).values():
            for key, value in optimizer.state.get(param, {}).items():
                if follows_mask(key, value, param):
                    value.masked_fill_(~mask.to(value.device), 0.0)


def validate(obj: Any, path: PathLike) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a sparsefx checkpoint: it holds {describe(obj)}")
    version = obj.get("version")
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{path}: bad format version {version!r}")
    if version > VERSION:
        raise CheckpointError(
            f"{path}: format version {version} is newer than this sparsefx reads ({VERSION})"
        )
    missing = [key for key in _KEYS if key not in obj]
    unknown = [str(key) for key in obj if key not in _KEYS]
    if missing or unknown:
        raise CheckpointError(f"{path}: missing keys {missing}, unknown keys {unknown}")
    check_state_dict(obj["model"], f"{path}: model")
    if obj["optimizer"] is not None:
        check_optimizer_state(obj["optimizer"], f"{path}: optimizer")
    for key in ("sparsity", "extra"):
        if obj[key] is not None and not isinstance(obj[key], dict):
            raise CheckpointError(f"{path}: {key} must be a dict or None; got {type(obj[key]).__name__}")
    return obj


def describe(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return f"a bare tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, dict):
        keys = [str(key) for key in list(obj)[:5]]
        more = f" and {len(obj) - 5} more" if len(obj) > 5 else ""
        return f"a dict with keys {', '.join(keys)}{more}" if keys else "an empty dict"
    return f"a {type(obj).__name__}"


def check_state_dict(state: Any, where: str) -> None:
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} is a {type(state).__name__}, not a state dict")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise CheckpointError(f"{where}: entry {key!r} is a {type(value).__name__}, not a tensor")


def check_optimizer_state(state: Any, where: str) -> None:
    ok = isinstance(state, dict) and isinstance(state.get("state"), dict)
    groups = state.get("param_groups") if ok else None
    ok = ok and isinstance(groups, list)
    ok = ok and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    if not ok:
        raise CheckpointError(f"{where} is not an optimizer state dict (state, param_groups)")


def check_fits(
    own: Mapping[str, Tensor], state: Mapping[str, Tensor], path: PathLike, hints: bool = True
) -> None:
    missing = [key for key in own if key not in state]
    unexpected = [key for key in state if key not in own]
    shapes = [
        f"{key} {tuple(state[key].shape)} vs model {tuple(value.shape)}"
        for key, value in own.items()
        if key in state and state[key].shape != value.shape
    ]
    problems = []
    if missing:
        hint = " (the model is sparse and the checkpoint dense?)" if hints and _all_masks(missing) else ""
        problems.append(f"missing {names(missing)}{hint}")
    if unexpected:
        hint = f" (sparse checkpoint: {SPARSE_HINT})" if hints and _all_masks(unexpected) else ""
        problems.append(f"unexpected {names(unexpected)}{hint}")
    if shapes:
        problems.append(f"shape mismatch {names(shapes)}")
    if problems:
        raise CheckpointError(f"{path} does not fit the model: {'; '.join(problems)}")


def _all_masks(keys: list[str]) -> bool:
    return all(param_of(key) is not None for key in keys)


def names(items: list[str], limit: int = 5) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_optimizer_fits(optimizer: torch.optim.Optimizer, state: dict, path: PathLike) -> None:
    groups, saved = optimizer.param_groups, state["param_groups"]
    if len(groups) != len(saved):
        raise CheckpointError(f"{path}: optimizer has {len(groups)} param groups, checkpoint {len(saved)}")
    for i, (group, saved_group) in enumerate(zip(groups, saved)):
        if len(group["params"]) != len(saved_group["params"]):
            raise CheckpointError(
                f"{path}: optimizer group {i} has {len(group['params'])} params, "
                f"checkpoint {len(saved_group['params'])}"
            )
    for param, index in param_index(optimizer, state):
        entry = state["state"].get(index)
        for key, value in (entry or {}).items():
            if key in _PARAM_SHAPED and isinstance(value, Tensor) and value.shape != param.shape:
                raise CheckpointError(
                    f"{path}: optimizer state {key} of param {index} has shape {tuple(value.shape)}, "
                    f"the param {tuple(param.shape)}"
                )


def param_index(optimizer: torch.optim.Optimizer, state: dict) -> Iterator[tuple[Tensor, Any]]:
    """``(param, index in state["state"])`` for every param of ``optimizer``."""
    for group, saved in zip(optimizer.param_groups, state["param_groups"]):
        yield from zip(group["params"], saved["params"])


def load_model(model: nn.Module, state: Mapping[str, Tensor], path: PathLike, strict: bool = True) -> None:
    try:
        model.load_state_dict(state, strict=strict)
    except Exception as exc:
        raise CheckpointError(f"{path} does not fit the model: {why(exc)}") from exc


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict, path: PathLike) -> None:
    try:
        optimizer.load_state_dict(state)
    except Exception as exc:
        raise CheckpointError(f"{path}: optimizer state does not fit the optimizer: {why(exc)}") from exc
