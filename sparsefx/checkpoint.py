"""Checkpoints of sparse models: save and load, the NaN-sentinel format, finalize.

A checkpoint is one ``torch.save`` zip holding ``{"format": "sparsefx-checkpoint", "version": 1,
"model": state_dict, "optimizer": state_dict | None, "sparsity": dict | None, "extra": dict | None}``.
Writes are atomic (temp file in the same folder, fsync, ``os.replace``); reads use only
``torch.load(weights_only=True)``, so a hostile file cannot run code. A truncated, foreign or
mismatching file raises :class:`~sparsefx.errors.CheckpointError` naming the file and the problem::

    >>> import tempfile, pathlib
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 8)), 0.75)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     save_checkpoint(pathlib.Path(tmp) / "ckpt.pt", sm, sparsity_state={"step": 3})
    ...     load_checkpoint(pathlib.Path(tmp) / "ckpt.pt", sm)["sparsity"]
    {'step': 3}

In the NaN-sentinel format pruned positions hold NaN (weights and same-shape optimizer states) and
there are no mask entries, so a plain dense checkpoint carries the pattern::

    >>> sentinel = export_nan_sentinel(sm)
    >>> int(sentinel["model"]["0.weight"].isnan().sum()), sorted(sentinel["model"])
    (48, ['0.bias', '0.weight'])

Only ``torch.save`` zip files are read: files in the pre-1.6 legacy format are refused.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import re
import secrets
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .errors import CheckpointError, ConfigError
from .ops import prune_

__all__ = [
    "FORMAT",
    "VERSION",
    "FinalizeStats",
    "atomic_save",
    "export_nan_sentinel",
    "finalize",
    "follows_mask",
    "import_nan_sentinel",
    "load_checkpoint",
    "load_nan_sentinel",
    "mask_names",
    "masked_params",
    "read_file",
    "save_checkpoint",
    "save_nan_sentinel",
]

FORMAT = "sparsefx-checkpoint"
VERSION = 1
PathLike = str | os.PathLike

_KEYS = ("format", "version", "model", "optimizer", "sparsity", "extra")
_ZIP_MAGIC = b"PK\x03\x04"
_NAN = float("nan")
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device)
_PARAM_SHAPED = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "sum"}
_SPARSE_HINT = "compile the model with a config that makes them sparse, or `sparsefx finalize` the checkpoint"


# ---------------------------------------------------------------------------------------------------------
# Masks


def masked_params(module: nn.Module) -> dict[str, tuple[nn.Parameter, Tensor]]:
    """``{param fqn: (param, mask buffer)}`` for every parameter with a same-shape bool ``<name>_mask``.

    >>> m = torch.nn.Linear(2, 2)
    >>> m.register_buffer("weight_mask", torch.ones(2, 2, dtype=torch.bool))
    >>> list(masked_params(m))
    ['weight']
    """
    found = {}
    for prefix, mod in module.named_modules():
        for name, param in mod._parameters.items():
            mask = mod._buffers.get(f"{name}_mask")
            if param is not None and mask is not None and _is_mask_of(mask, param):
                found[f"{prefix}.{name}" if prefix else name] = (param, mask)
    return found


def mask_names(module: nn.Module) -> dict[str, str]:
    """``{param fqn: mask buffer fqn}`` for every sparse parameter of ``module``.

    >>> mask_names(sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(4, 4)), 0.5))
    {'0.weight': '0.weight_mask'}
    """
    return {name: f"{name}_mask" for name in masked_params(module)}


def follows_mask(key: str, value: Any, param: Tensor) -> bool:
    """Whether optimizer state ``key: value`` of ``param`` is masked with it: a floating tensor of the
    param's shape, not ``step``, not marked ``requires_dense``."""
    return (
        isinstance(value, Tensor)
        and key != "step"
        and value.shape == param.shape
        and value.is_floating_point()
        and not getattr(value, "requires_dense", False)
    )


def _is_mask_of(mask: Tensor, tensor: Tensor) -> bool:
    return isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.shape == tensor.shape


# ---------------------------------------------------------------------------------------------------------
# Files: atomic write, weights-only read


def atomic_save(obj: Any, path: PathLike) -> None:
    """``torch.save(obj)`` to ``path`` atomically: a crash or error leaves the old file (or none) intact.

    ``obj`` may hold only what ``torch.load(weights_only=True)`` reads back (tensors, numbers,
    strings, dtypes, devices and dicts/lists/tuples/sets of them); anything else is refused here.
    """
    path = Path(path)
    _check_loadable(obj, "checkpoint")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
    _fsync_dir(path.parent)


def read_file(path: PathLike, map_location: Any = "cpu", *, verify: bool = True) -> Any:
    """What ``torch.load(path, weights_only=True)`` returns; every failure is a CheckpointError.

    ``verify`` first checks every zip member's CRC (torch does not), so flipped bits are caught;
    it reads the file once more.
    """
    path = Path(path)
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not head:
        raise CheckpointError(f"{path}: empty file (an interrupted write?)")
    if head != _ZIP_MAGIC:
        raise CheckpointError(f"{path}: not a PyTorch zip checkpoint (starts with {head!r})")
    if verify:
        _verify_zip(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused to unpickle it (only tensors and plain data load): {_why(exc)}"
        ) from None
    except Exception as exc:
        raise CheckpointError(
            f"{path}: truncated, corrupt or not a PyTorch checkpoint ({_why(exc)})"
        ) from None


def _verify_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as exc:
        raise CheckpointError(
            f"{path}: truncated, corrupt or not a PyTorch checkpoint ({_why(exc)})"
        ) from None
    if bad is not None:
        raise CheckpointError(f"{path}: corrupt: {bad} fails its CRC check")


def _why(exc: BaseException) -> str:
    text = re.sub(r"^\[enforce fail at [^\]]*\][\s.]*", "", str(exc))
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split(" Please use", 1)[0]
    first = " ".join(text.strip().splitlines()[:1]).split(". ", 1)[0].strip()
    return first[:200] or type(exc).__name__


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _check_loadable(obj: Any, where: str, depth: int = 0) -> None:
    if depth > 100:
        raise CheckpointError(f"{where}: nested too deeply to save")
    if type(obj) in (Tensor, nn.Parameter) or type(obj) in _LEAVES or type(obj) is torch.Size:
        return
    if type(obj) in (dict, collections.OrderedDict):
        for key, value in obj.items():
            _check_loadable(key, f"{where} key {key!r}", depth + 1)
            _check_loadable(value, f"{where}[{key!r}]", depth + 1)
    elif type(obj) in (list, tuple, set):
        for i, value in enumerate(obj):
            _check_loadable(value, f"{where}[{i}]", depth + 1)
    else:
        raise CheckpointError(
            f"{where} has type {type(obj).__qualname__}; checkpoints hold only tensors, numbers, strings, "
            "dtypes, devices and dicts/lists/tuples/sets of them (so that they load with weights_only)"
        )


# ---------------------------------------------------------------------------------------------------------
# sparsefx checkpoints


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
    ckpt = _validate(read_file(path, map_location), path)
    if optimizer is not None and ckpt["optimizer"] is None:
        raise CheckpointError(f"{path}: holds no optimizer state")
    if model is not None:
        _check_fits(model.state_dict(), ckpt["model"], path)
    if optimizer is not None:
        _check_optimizer_fits(optimizer, ckpt["optimizer"], path)
    if model is not None:
        _load_model(model, ckpt["model"], path)
        with torch.no_grad():
            for param, mask in masked_params(model).values():
                prune_(param, mask)
    if optimizer is not None:
        _load_optimizer(optimizer, ckpt["optimizer"], path)
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


def _validate(obj: Any, path: PathLike) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a sparsefx checkpoint: it holds {_describe(obj)}")
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
    _check_state_dict(obj["model"], f"{path}: model")
    if obj["optimizer"] is not None:
        _check_optimizer_state(obj["optimizer"], f"{path}: optimizer")
    for key in ("sparsity", "extra"):
        if obj[key] is not None and not isinstance(obj[key], dict):
            raise CheckpointError(f"{path}: {key} must be a dict or None; got {type(obj[key]).__name__}")
    return obj


def _describe(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return f"a bare tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, dict):
        keys = [str(key) for key in list(obj)[:5]]
        more = f" and {len(obj) - 5} more" if len(obj) > 5 else ""
        return f"a dict with keys {', '.join(keys)}{more}" if keys else "an empty dict"
    return f"a {type(obj).__name__}"


def _check_state_dict(state: Any, where: str) -> None:
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} is a {type(state).__name__}, not a state dict")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise CheckpointError(f"{where}: entry {key!r} is a {type(value).__name__}, not a tensor")


def _check_optimizer_state(state: Any, where: str) -> None:
    ok = isinstance(state, dict) and isinstance(state.get("state"), dict)
    groups = state.get("param_groups") if ok else None
    ok = ok and isinstance(groups, list)
    ok = ok and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    if not ok:
        raise CheckpointError(f"{where} is not an optimizer state dict (state, param_groups)")


def _check_fits(
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
        problems.append(f"missing {_names(missing)}{hint}")
    if unexpected:
        hint = f" (sparse checkpoint: {_SPARSE_HINT})" if hints and _all_masks(unexpected) else ""
        problems.append(f"unexpected {_names(unexpected)}{hint}")
    if shapes:
        problems.append(f"shape mismatch {_names(shapes)}")
    if problems:
        raise CheckpointError(f"{path} does not fit the model: {'; '.join(problems)}")


def _all_masks(keys: list[str]) -> bool:
    return all(key.endswith("_mask") for key in keys)


def _names(items: list[str], limit: int = 5) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _check_optimizer_fits(optimizer: torch.optim.Optimizer, state: dict, path: PathLike) -> None:
    groups, saved = optimizer.param_groups, state["param_groups"]
    if len(groups) != len(saved):
        raise CheckpointError(f"{path}: optimizer has {len(groups)} param groups, checkpoint {len(saved)}")
    for i, (group, saved_group) in enumerate(zip(groups, saved)):
        if len(group["params"]) != len(saved_group["params"]):
            raise CheckpointError(
                f"{path}: optimizer group {i} has {len(group['params'])} params, "
                f"checkpoint {len(saved_group['params'])}"
            )
    for param, index in _param_index(optimizer, state):
        entry = state["state"].get(index)
        for key, value in (entry or {}).items():
            if key in _PARAM_SHAPED and isinstance(value, Tensor) and value.shape != param.shape:
                raise CheckpointError(
                    f"{path}: optimizer state {key} of param {index} has shape {tuple(value.shape)}, "
                    f"the param {tuple(param.shape)}"
                )


def _param_index(optimizer: torch.optim.Optimizer, state: dict) -> Iterator[tuple[Tensor, Any]]:
    """``(param, index in state["state"])`` for every param of ``optimizer``."""
    for group, saved in zip(optimizer.param_groups, state["param_groups"]):
        yield from zip(group["params"], saved["params"])


def _load_model(model: nn.Module, state: Mapping[str, Tensor], path: PathLike, strict: bool = True) -> None:
    try:
        model.load_state_dict(state, strict=strict)
    except Exception as exc:
        raise CheckpointError(f"{path} does not fit the model: {_why(exc)}") from exc


def _load_optimizer(optimizer: torch.optim.Optimizer, state: dict, path: PathLike) -> None:
    try:
        optimizer.load_state_dict(state)
    except Exception as exc:
        raise CheckpointError(f"{path}: optimizer state does not fit the optimizer: {_why(exc)}") from exc


# ---------------------------------------------------------------------------------------------------------
# NaN-sentinel format


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
    for param, index in _param_index(optimizer, opt_state):
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
    _check_fits(own, state, source, hints=False)  # the NaN-sentinel format has no mask entries
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
            f"{source}: {_names(stray)} hold NaN but the model has no mask for them; {_SPARSE_HINT}"
        )
    if optimizer is not None:
        if opt_state is None:
            raise CheckpointError(f"{source}: holds no optimizer state")
        _check_optimizer_state(opt_state, f"{source}: optimizer")
        _check_optimizer_fits(optimizer, opt_state, source)
        masks = {id(masked[name][0]): keep for name, keep in keeps.items()}
        zeroed = _map_states(optimizer, opt_state, masks, _zero_pruned_nan)
        opt_state = {**opt_state, "state": zeroed}
    _load_model(model, dense, source, strict=False)
    with torch.no_grad():
        for name, keep in keeps.items():
            param, mask = masked[name]
            mask.copy_(keep)
            prune_(param, mask)
    if optimizer is not None:
        _load_optimizer(optimizer, opt_state, source)


def _zero_pruned_nan(state: Tensor, keep: Tensor) -> Tensor:
    """NaN -> 0 at pruned positions: the inverse of export, so a state exported dense stays as it was."""
    return state.masked_fill(~keep & torch.isnan(state), 0.0)


def _sentinel_parts(checkpoint: Any, source: str) -> tuple[dict[str, Tensor], Any]:
    if isinstance(checkpoint, Mapping) and isinstance(checkpoint.get("model"), Mapping):
        state, opt_state = dict(checkpoint["model"]), checkpoint.get("optimizer")
    elif isinstance(checkpoint, Mapping) and all(isinstance(v, Tensor) for v in checkpoint.values()):
        state, opt_state = dict(checkpoint), None
    else:
        raise CheckpointError(f"{source}: not a NaN-sentinel checkpoint: it holds {_describe(checkpoint)}")
    _check_state_dict(state, f"{source}: model")
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


# ---------------------------------------------------------------------------------------------------------
# Finalize


@dataclass(frozen=True)
class FinalizeStats:
    """What ``finalize`` changed; ``layout``: ``sparsefx``, ``wrapped`` ({"model": ...}) or ``state_dict``."""

    layout: str
    tensors_cleaned: int
    nan_replaced: int
    masks_dropped: int

    def summary(self) -> str:
        return (
            f"{self.tensors_cleaned} tensors cleaned, {self.nan_replaced:,} NaN replaced by 0, "
            f"{self.masks_dropped} masks dropped"
        )


def finalize(input_path: PathLike, output_path: PathLike) -> FinalizeStats:
    """Write ``input_path`` as a plain dense checkpoint: NaN -> 0, masks applied and dropped.

    Reads a sparsefx checkpoint (its ``sparsity`` state becomes None), a NaN-sentinel or other
    ``{"model": state_dict, ...}`` dict, or a plain state dict, and keeps the same layout otherwise.
    ``output_path`` may equal ``input_path``: the input is read whole first and the write is atomic.
    """
    obj = read_file(input_path)
    counts = [0, 0, 0]
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        layout, out = "sparsefx", dict(_validate(obj, input_path))
        out["sparsity"] = None
    elif isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        layout, out = "wrapped", dict(obj)
        _check_state_dict(obj["model"], f"{input_path}: model")
    elif isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        layout, out = "state_dict", {}
    else:
        raise CheckpointError(
            f"{input_path}: not a checkpoint finalize understands: it holds {_describe(obj)}"
        )
    if layout == "state_dict":
        out = _dense_state(obj, counts)
    else:
        out["model"] = _dense_state(obj["model"], counts)
        if obj.get("optimizer") is not None:
            out["optimizer"] = _map_tree(obj["optimizer"], lambda t: _zero_nan(t, counts))
    atomic_save(out, output_path)
    return FinalizeStats(layout, *counts)


def _dense_state(state: dict[str, Tensor], counts: list[int]) -> dict[str, Tensor]:
    masks = {
        key: value
        for key, value in state.items()
        if key.endswith("_mask") and key[: -len("_mask")] in state and _is_mask_of(value, state[key[:-5]])
    }
    counts[2] += len(masks)
    dense = {}
    for key, value in state.items():
        if key in masks:
            continue
        cleaned = _zero_nan(value, counts, count_tensor=False)
        mask = masks.get(f"{key}_mask")
        if mask is not None and bool(((cleaned != 0) & ~mask).any()):
            cleaned = cleaned.masked_fill(~mask, 0.0)
        counts[0] += cleaned is not value
        dense[key] = cleaned
    return dense


def _zero_nan(tensor: Tensor, counts: list[int], count_tensor: bool = True) -> Tensor:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return tensor
    nans = torch.isnan(tensor)
    found = int(nans.sum())
    if not found:
        return tensor
    counts[1] += found
    counts[0] += count_tensor
    return tensor.masked_fill(nans, 0.0)


def _map_tree(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if type(obj) in (dict, collections.OrderedDict):
        return type(obj)((key, _map_tree(value, fn)) for key, value in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_map_tree(value, fn) for value in obj)
    return obj
