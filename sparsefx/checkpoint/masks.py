"""Which parameters of a module are masked, and which state follows a mask."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["masked_params", "mask_names", "follows_mask", "is_mask_of"]


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
            if param is not None and mask is not None and is_mask_of(mask, param):
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


def is_mask_of(mask: Tensor, tensor: Tensor) -> bool:
    return isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.shape == tensor.shape
