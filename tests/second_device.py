"""A second device on a machine with only a CPU: what code asked to run on ``meta`` would do on a GPU.

Under ``SecondDevice()``, a tensor made for ``meta`` (a factory call given ``device="meta"``, or
under ``with torch.device("meta")``, or ``.to("meta")``) is made on the CPU, so it holds real values,
and is marked as living on the device. Every other tensor lives on the host. The mode then applies
the rules a CUDA device enforces and raises ``CrossDevice`` where a GPU run would fail:

- an op whose tensors live on both sides (a host tensor of no dimensions may join device tensors);
- a host tensor indexed by device indices (a device tensor indexed by host indices is allowed);
- ``.numpy()`` of a device tensor.

A device tensor's ``.device`` is ``meta``, so code that makes tensors beside another finds the side.

    >>> with SecondDevice():
    ...     a = torch.arange(3, device="meta")
    ...     (a + torch.tensor(1)).tolist()
    [1, 2, 3]
    >>> with SecondDevice():
    ...     torch.arange(3, device="meta") + torch.arange(3)
    Traceback (most recent call last):
    ...
    second_device.CrossDevice: add mixes host and device tensors
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

HOST, DEVICE = "host", "device"


class CrossDevice(AssertionError):
    """An op that a run on a real second device would refuse."""


def _side(device: Any) -> str | None:
    """Which side a ``device`` argument names, or None where it is not a device."""
    if isinstance(device, torch.device):
        return DEVICE if device.type == "meta" else HOST
    if isinstance(device, str) and device.split(":")[0] in ("meta", "cpu", "cuda"):
        return DEVICE if device.startswith("meta") else HOST
    return None


class SecondDevice(TorchFunctionMode):
    """The mode of the module docstring; ``sides`` counts the tensors it made on each side. Sides are
    kept for the tensors' lives, across uses of the mode: a result cached by one run is still on the
    device in the next."""

    _tags: dict[int, tuple[weakref.ref, str]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.sides = {HOST: 0, DEVICE: 0}

    def side(self, t: torch.Tensor) -> str:
        """Where ``t`` lives: the host unless this mode made it on the device."""
        entry = self._tags.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else HOST

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        if func == torch.Tensor.device.__get__:  # a device tensor says it is on the device
            return torch.device("meta") if self.side(args[0]) == DEVICE else func(*args)
        name = getattr(func, "__name__", str(func))
        target = _side(kwargs.get("device"))
        if target == DEVICE:
            kwargs["device"] = "cpu"
        if name in ("to", "cuda", "cpu"):
            args = list(args)
            for i, a in enumerate(args[1:], 1):
                if isinstance(a, torch.Tensor):
                    target = self.side(a)
                elif _side(a) is not None:
                    target = _side(a)
                    args[i] = "cpu"
            if name == "cpu":
                target, func, args = HOST, torch.Tensor.to, [args[0], "cpu"]
            if target is not None and target != self.side(args[0]):
                kwargs["copy"] = True  # a tensor moved across is a new tensor, never the one it came from
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        sides = [self.side(t) for t in tensors]
        if name == "numpy" and sides and sides[0] == DEVICE:
            raise CrossDevice("numpy() of a device tensor")
        if name == "__getitem__" and sides and sides[0] == HOST and DEVICE in sides[1:]:
            raise CrossDevice("a host tensor indexed by device indices")
        if name not in ("__getitem__", "copy_", "to", "cpu", "cuda"):
            joined = {s for t, s in zip(tensors, sides) if not (s == HOST and t.dim() == 0)}
            if len(joined) > 1:
                raise CrossDevice(f"{name} mixes host and device tensors")
        out = func(*args, **kwargs)
        if target is None:
            target = DEVICE if DEVICE in sides else HOST
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and self._tags.get(id(t), (lambda: None,))[0]() is not t:
                self._tags[id(t)] = (weakref.ref(t), target)
                self.sides[target] += 1
        return out
