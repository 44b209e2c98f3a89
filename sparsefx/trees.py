"""Tensors inside a model's outputs: nested tuples, lists, dicts and dataclasses.

>>> [t.shape for t in tensor_leaves({"a": (torch.ones(2), None), "b": [torch.zeros(1, 3)]})]
[torch.Size([2]), torch.Size([1, 3])]
>>> to_device({"a": (torch.ones(2), None)}, torch.device("cpu"))
{'a': (tensor([1., 1.]), None)}
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

__all__ = ["tensor_leaves", "to_device"]


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in field/key order; other leaves are skipped."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensor_leaves(getattr(obj, f.name))]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensor_leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensor_leaves(v)]
    return []


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor in it moved to ``device``: a dataclass rebuilt with its fields moved, a
    dict, list or tuple as a new one of its own type; other leaves as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **fields)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # its own type (an OrderedDict stays one)
        for k, v in obj.items():
            out[k] = to_device(v, device)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj
