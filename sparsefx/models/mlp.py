"""A plain multi-layer perceptron: the smallest model every pass must handle.

>>> import torch
>>> model = MLP(in_features=8, hidden=(16,), out_features=3)
>>> args, kwargs = model.example_inputs(batch=2)
>>> model(*args, **kwargs).shape
torch.Size([2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from sparsefx.errors import ConfigError

__all__ = ["ACTIVATIONS", "MLP"]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
}


class MLP(nn.Module):
    """Linear layers of widths ``hidden`` with ``activation`` between them, held in ``self.net``.

    Parameter names are ``net.0.weight``, ``net.2.weight``, ... (activations sit at odd indices).

        >>> [n for n, _ in MLP(4, (8,), 2).named_parameters()]
        ['net.0.weight', 'net.0.bias', 'net.2.weight', 'net.2.bias']
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden: Sequence[int] = (256, 256),
        out_features: int = 10,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"MLP activation: {activation!r} is not one of {sorted(ACTIVATIONS)}")
        widths = [in_features, *hidden, out_features]
        if any(int(w) <= 0 for w in widths):
            raise ConfigError(f"MLP widths: {widths} must all be positive")
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            if i:
                layers.append(ACTIVATIONS[activation]())
            layers.append(nn.Linear(int(fan_in), int(fan_out)))
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[..., in_features]`` to ``[..., out_features]``."""
        return self.net(x)

    def example_inputs(self, batch: int = 8) -> tuple[tuple[torch.Tensor, ...], dict]:
        """``((x,), {})`` with ``x ~ randn(batch, in_features)`` on the model's device."""
        device = self.net[0].weight.device
        return (torch.randn(batch, self.in_features, device=device),), {}
