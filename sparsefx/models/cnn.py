"""Small convolutional models, traceable by ``torch.fx``: a 2-D image CNN and a 1-D signal CNN.

>>> import torch
>>> SmallCNN()(torch.randn(2, 3, 32, 32)).shape
torch.Size([2, 10])
>>> Conv1dNet()(torch.randn(2, 4, 128)).shape
torch.Size([2, 5])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallCNN", "Conv1dNet"]


def _conv_bn_relu(conv: nn.Module, channels: int, bn: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(conv, bn(channels), nn.ReLU())


class SmallCNN(nn.Module):
    """Image classifier for ``[B, 3, 32, 32]`` (any ``H, W >= 8`` works thanks to global pooling).

    ``conv1`` 3x3, ``conv2`` 3x3 stride 2, ``conv3`` 3x3 grouped (4 groups), 2x2 max-pool,
    ``conv4`` 1x1, global average pool and a Linear ``fc`` head; each conv is followed by
    BatchNorm2d and ReLU. Conv weights are ``features.convN.0.weight``.

        >>> SmallCNN(num_classes=3, in_channels=1)(torch.randn(1, 1, 16, 16)).shape
        torch.Size([1, 3])
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 16) -> None:
        super().__init__()
        self.in_channels = in_channels
        w = width
        self.features = nn.Sequential()
        self.features.add_module(
            "conv1", _conv_bn_relu(nn.Conv2d(in_channels, w, 3, padding=1), w, nn.BatchNorm2d)
        )
        self.features.add_module(
            "conv2", _conv_bn_relu(nn.Conv2d(w, 2 * w, 3, stride=2, padding=1), 2 * w, nn.BatchNorm2d)
        )
        self.features.add_module(
            "conv3", _conv_bn_relu(nn.Conv2d(2 * w, 2 * w, 3, padding=1, groups=4), 2 * w, nn.BatchNorm2d)
        )
        self.features.add_module("pool", nn.MaxPool2d(2))
        self.features.add_module("conv4", _conv_bn_relu(nn.Conv2d(2 * w, 4 * w, 1), 4 * w, nn.BatchNorm2d))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, C, H, W]`` to class logits ``[B, num_classes]``."""
        return self.fc(torch.flatten(self.avgpool(self.features(x)), 1))

    def example_inputs(
        self, batch: int = 4, height: int = 32, width: int = 32
    ) -> tuple[tuple[torch.Tensor, ...], dict]:
        """``((x,), {})`` with ``x ~ randn(batch, in_channels, height, width)`` on the model's device."""
        device = self.fc.weight.device
        return (torch.randn(batch, self.in_channels, height, width, device=device),), {}


class Conv1dNet(nn.Module):
    """Signal classifier for ``[B, C, L]``: three Conv1d layers (the second strided, the third grouped).

    ``conv1`` k=5, ``conv2`` k=3 stride 2, ``conv3`` k=3 with 4 groups, each followed by
    BatchNorm1d and ReLU; global average pool and a Linear ``fc`` head.

        >>> Conv1dNet(in_channels=2, num_classes=3)(torch.randn(1, 2, 40)).shape
        torch.Size([1, 3])
    """

    def __init__(self, in_channels: int = 4, num_classes: int = 5, width: int = 32) -> None:
        super().__init__()
        self.in_channels = in_channels
        w = width
        self.features = nn.Sequential()
        self.features.add_module(
            "conv1", _conv_bn_relu(nn.Conv1d(in_channels, w, 5, padding=2), w, nn.BatchNorm1d)
        )
        self.features.add_module(
            "conv2", _conv_bn_relu(nn.Conv1d(w, 2 * w, 3, stride=2, padding=1), 2 * w, nn.BatchNorm1d)
        )
        self.features.add_module(
            "conv3", _conv_bn_relu(nn.Conv1d(2 * w, 2 * w, 3, padding=1, groups=4), 2 * w, nn.BatchNorm1d)
        )
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(2 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Signals ``[B, C, L]`` to class logits ``[B, num_classes]``."""
        return self.fc(torch.flatten(self.avgpool(self.features(x)), 1))

    def example_inputs(self, batch: int = 4, length: int = 128) -> tuple[tuple[torch.Tensor, ...], dict]:
        """``((x,), {})`` with ``x ~ randn(batch, in_channels, length)`` on the model's device."""
        device = self.fc.weight.device
        return (torch.randn(batch, self.in_channels, length, device=device),), {}
