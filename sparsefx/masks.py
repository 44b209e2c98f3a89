"""The ``<param>_mask`` conventions in one place: names, validity, and which state follows a mask.

A sparse parameter keeps its mask in a persistent bool buffer named ``<param>_mask`` on the module
that owns the parameter (True keeps), as in Cerebras and ``torch.nn.utils.prune``::

    >>> mask_name("blocks.0.fc.weight")
    'blocks.0.fc.weight_mask'
    >>> param_of("blocks.0.fc.weight_mask"), param_of("blocks.0.fc.bias")
    ('blocks.0.fc.weight', None)
    >>> owner_and_attr("blocks.0.fc.weight")
    ('blocks.0.fc', 'weight')
    >>> m = torch.nn.Linear(2, 2)
    >>> m.register_buffer(mask_name("weight"), torch.ones(2, 2, dtype=torch.bool))
    >>> list(masked_params(m)), has_mask(m, "weight"), has_mask(m, "bias")
    (['weight'], True, False)

This module knows neither graphs nor algorithms: ``sparse/``, ``checkpoint/`` and the passes all
read masks through it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "MASK_SUFFIX",
    "follows_mask",
    "has_mask",
    "is_mask_of",
    "mask_name",
    "mask_names",
    "mask_problem",
    "masked_params",
    "owner_and_attr",
    "param_of",
]

MASK_SUFFIX = "_mask"


def mask_name(param_fqn: str) -> str:
    """The name of ``param_fqn``'s mask buffer: ``"fc.weight"`` -> ``"fc.weight_mask"``."""
    return f"{param_fqn}{MASK_SUFFIX}"


def param_of(name: str) -> str | None:
    """The parameter a mask name belongs to, or None when ``name`` is not a mask name."""
    return name[: -len(MASK_SUFFIX)] if name.endswith(MASK_SUFFIX) else None


def owner_and_attr(fqn: str) -> tuple[str, str]:
    """``"blocks.0.fc.weight"`` -> ``("blocks.0.fc", "weight")``; the owner of a top-level name is ``""``."""
    owner, _, attr = fqn.rpartition(".")
    return owner, attr


def has_mask(root: nn.Module, param_fqn: str) -> bool:
    """Whether the module owning ``param_fqn`` (a name in ``root``) has its mask buffer."""
    owner, attr = owner_and_attr(param_fqn)
    return mask_name(attr) in root.get_submodule(owner)._buffers


def mask_problem(mask: Any, tensor: Tensor) -> str | None:
    """Why ``mask`` cannot mask ``tensor`` (not a bool tensor of its shape), or None when it can."""
    if not isinstance(mask, Tensor):
        return f"mask is a {type(mask).__name__}; expected a bool tensor"
    if mask.dtype != torch.bool:
        return f"mask dtype is {mask.dtype}; expected torch.bool"
    if mask.shape != tensor.shape:
        return f"mask shape {tuple(mask.shape)} != weight shape {tuple(tensor.shape)}"
    return None


def is_mask_of(mask: Any, tensor: Tensor) -> bool:
    """Whether ``mask`` is a bool tensor shaped like ``tensor``."""
    return mask_problem(mask, tensor) is None


def masked_params(module: nn.Module) -> dict[str, tuple[nn.Parameter, Tensor]]:
    """``{param fqn: (param, mask buffer)}`` for every parameter with a same-shape bool ``<name>_mask``."""
    found = {}
    for prefix, mod in module.named_modules():
        for name, param in mod._parameters.items():
            mask = mod._buffers.get(mask_name(name))
            if param is not None and mask is not None and is_mask_of(mask, param):
                found[f"{prefix}.{name}" if prefix else name] = (param, mask)
    return found


def mask_names(module: nn.Module) -> dict[str, str]:
    """``{param fqn: mask buffer fqn}`` for every sparse parameter of ``module``.

    >>> mask_names(sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(4, 4)), 0.5))
    {'0.weight': '0.weight_mask'}
    """
    return {name: mask_name(name) for name in masked_params(module)}


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
