"""Finalize: a NaN-sentinel or masked checkpoint to a plain dense one with no trace of sparsity."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import CheckpointError
from ..masks import is_mask_of, mask_name, param_of
from .files import PathLike, atomic_save, read_file
from .state import FORMAT, check_state_dict, describe, validate

__all__ = ["FinalizeStats", "finalize"]


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
        layout, out = "sparsefx", dict(validate(obj, input_path))
        out["sparsity"] = None
    elif isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        layout, out = "wrapped", dict(obj)
        check_state_dict(obj["model"], f"{input_path}: model")
    elif isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        layout, out = "state_dict", {}
    else:
        raise CheckpointError(
            f"{input_path}: not a checkpoint finalize understands: it holds {describe(obj)}"
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
        if (param := param_of(key)) is not None and param in state and is_mask_of(value, state[param])
    }
    counts[2] += len(masks)
    dense = {}
    for key, value in state.items():
        if key in masks:
            continue
        cleaned = _zero_nan(value, counts, count_tensor=False)
        mask = masks.get(mask_name(key))
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
