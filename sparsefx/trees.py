"""Tensors inside a model's outputs: nested tuples, lists, dicts and dataclasses.

>>> [t.shape for t in tensor_leaves({"a": (torch.ones(2), None), "b": [torch.zeros(1, 3)]})]
[torch.Size([2]), torch.Size([1, 3])]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["tensor_leaves"]


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
