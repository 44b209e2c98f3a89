"""Tensors inside a model's outputs: nested tuples, lists, dicts, dataclasses and objects that hold them in
their attributes (a key/value cache).

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


def tensor_leaves(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in field/key order (an object's attributes by name); other
    leaves, modules and anything nested deeper than 32 levels are skipped.

    >>> class Cache:
    ...     def __init__(self): self.values, self.keys, self.size = torch.ones(1), torch.zeros(1), 1
    >>> tensor_leaves([Cache()])
    [tensor([0.]), tensor([1.])]
    """
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 32 or isinstance(obj, (type, torch.nn.Module)):
        return []
    if dataclasses.is_dataclass(obj):
        children: Any = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif isinstance(getattr(obj, "__dict__", None), dict):
        children = [v for _, v in sorted(vars(obj).items())]
    else:
        return []
    return [t for v in children for t in tensor_leaves(v, depth + 1)]


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
