"""How one sparsity target is spread over layers: ``uniform``, ``erk`` and ``er``, and global magnitude.

``layer_densities`` gives each layer a density so that the kept entries add up to ``(1 - s)`` of all
entries. ERK (RigL) scales ``(sum(dims) / prod(dims)) ** power``; ER scales ``(n_in + n_out) /
(n_in * n_out)`` with PyTorch's layout, ``n_out = dim 0`` and ``n_in = dim 1``. A layer whose density
would pass 1 is made dense and the rest solved again::

    >>> shapes = {"fc1": (300, 784), "fc2": (100, 300), "fc3": (10, 100)}
    >>> {k: round(v, 4) for k, v in layer_densities(shapes, 0.9, "erk").items()}
    {'fc1': 0.0796, 'fc2': 0.2302, 'fc3': 1.0}

``global_magnitude_masks`` keeps the ``keep_count(total, s)`` largest ``|w|`` over all tensors at once
(``floor((1 - s) * total)`` evaluated exactly, see ``config.counts``)::

    >>> masks = global_magnitude_masks({"a": torch.tensor([1.0, -5.0]), "b": torch.tensor([3.0, 0.5])}, 0.5)
    >>> masks["a"].tolist(), masks["b"].tolist()
    ([False, True], [True, False])
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch
from torch import Tensor

from ..errors import ConfigError
from .counts import exact_level, keep_count

__all__ = ["METHODS", "layer_densities", "global_magnitude_masks"]

METHODS: tuple[str, ...] = ("uniform", "erk", "er")

_SHIFT = 15  # float32 bits of |w| are < 2**31; >> 15 leaves 2**16 buckets (7 mantissa bits per octave)
_BUCKETS = 1 << 16


def layer_densities(
    shapes: Mapping[str, tuple[int, ...]], sparsity: float, method: str, *, power: float = 1.0
) -> dict[str, float]:
    """Density (kept share) of each layer, meeting ``(1 - sparsity)`` of the total entries.

    ``power`` is the ERK exponent (1 in RigL). Layers keep the order of ``shapes``.

    >>> layer_densities({"a": (4, 4), "b": (2, 8)}, 0.5, "uniform")
    {'a': 0.5, 'b': 0.5}
    """
    _check_level(sparsity)
    if method not in METHODS:
        raise ConfigError(f"distribution: unknown method {method!r}; valid: {', '.join(METHODS)}")
    if not isinstance(shapes, Mapping) or len(shapes) == 0:
        raise ConfigError("distribution: no layers to distribute the sparsity over")
    if isinstance(power, bool) or not isinstance(power, numbers.Real) or not math.isfinite(power):
        raise ConfigError(f"distribution: power must be a finite number, got {power!r}")
    sizes = {name: _numel(name, shape) for name, shape in shapes.items()}
    if method == "uniform":
        return {name: 1.0 - sparsity for name in shapes}
    raw = {name: _raw_density(name, tuple(shape), method, float(power)) for name, shape in shapes.items()}
    return _solve(raw, sizes, sparsity, method)


def _check_level(sparsity: float) -> None:
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= sparsity < 1.0:
        raise ConfigError(f"distribution: sparsity {sparsity!r} is not in [0, 1)")


def _numel(name: str, shape: tuple[int, ...]) -> int:
    dims = tuple(int(size) for size in shape)
    if len(dims) == 0 or any(size <= 0 for size in dims):
        raise ConfigError(
            f"distribution: layer {name!r} has shape {dims}; it needs ndim >= 1 and no empty dim"
        )
    return math.prod(dims)


def _raw_density(name: str, shape: tuple[int, ...], method: str, power: float) -> float:
    """Unscaled density: ER from dims 0 (out) and 1 (in); ERK from every dim, kernel dims included."""
    if method == "er":
        if len(shape) < 2:
            raise ConfigError(f"distribution: er needs ndim >= 2, but layer {name!r} has shape {shape}")
        n_out, n_in = int(shape[0]), int(shape[1])
        return (n_in + n_out) / (n_in * n_out)
    dims = [int(size) for size in shape]
    return (sum(dims) / math.prod(dims)) ** power


def _solve(raw: dict[str, float], sizes: dict[str, int], sparsity: float, method: str) -> dict[str, float]:
    """Find eps with sum(min(1, eps * raw) * numel) = budget; saturated layers go dense, solve again.

    Raising eps only saturates more layers, so taking out every saturated layer at once is safe.
    """
    total = sum(sizes.values())
    budget = float((1 - exact_level(sparsity)) * total)
    dense: set[str] = set()
    eps = 0.0
    while len(dense) < len(raw):
        free = [name for name in raw if name not in dense]
        remaining = budget - math.fsum(sizes[name] for name in dense)
        weight = math.fsum(raw[name] * sizes[name] for name in free)
        if not (0.0 < weight < math.inf and remaining > 0.0):
            break
        eps = remaining / weight
        saturated = {name for name in free if eps * raw[name] > 1.0 - 1e-12}
        if not saturated:
            break
        dense |= saturated
    densities = {name: 1.0 if name in dense else eps * raw[name] for name in raw}
    kept = math.fsum(densities[name] * sizes[name] for name in raw)
    if not abs(kept - budget) <= 1e-9 * total or not all(0.0 < d <= 1.0 for d in densities.values()):
        raise ConfigError(
            f"distribution: {method} cannot meet the budget of {budget:g} kept entries at sparsity "
            f"{sparsity!r} (got {kept:g})"
        )
    return densities


def global_magnitude_masks(weights: Mapping[str, Tensor], sparsity: float) -> dict[str, Tensor]:
    """Bool masks keeping the ``keep_count(total, s)`` largest ``|w|`` across all of ``weights``.

    Ties keep the earlier tensor (in ``weights``' order), then the lower flat index. NaN and inf
    rank as 0, as in ``init.make_mask``. Works in two streaming passes: a 65536-bucket histogram of
    the float bits of ``|w|``, then the masks, with one small sort inside the edge bucket.
    """
    _check_level(sparsity)
    if not isinstance(weights, Mapping) or len(weights) == 0:
        raise ConfigError("distribution: global magnitude needs at least one weight")
    if any(w.device.type == "meta" for w in weights.values()):
        return {name: torch.empty(w.shape, dtype=torch.bool, device=w.device) for name, w in weights.items()}
    total = sum(w.numel() for w in weights.values())
    k = keep_count(total, sparsity)
    if k <= 0 or k >= total:
        return {
            name: torch.full(w.shape, k > 0, dtype=torch.bool, device=w.device) for name, w in weights.items()
        }
    hist = torch.zeros(_BUCKETS, dtype=torch.int64)
    for w in weights.values():
        hist += torch.bincount(_key(w).bitwise_right_shift_(_SHIFT), minlength=_BUCKETS).cpu()
    at_or_above = hist.flip(0).cumsum(0)
    i = int(torch.searchsorted(at_or_above, k))
    edge = _BUCKETS - 1 - i
    need = k - (int(at_or_above[i - 1]) if i > 0 else 0)

    masks: dict[str, Tensor] = {}
    edge_idx: list[Tensor] = []
    edge_keys: list[Tensor] = []
    for name, w in weights.items():
        key = _key(w)
        bucket = key >> _SHIFT
        masks[name] = bucket > edge
        idx = (bucket == edge).nonzero().squeeze(1)
        edge_idx.append(idx)
        edge_keys.append(key[idx].cpu())
    keys = torch.cat(edge_keys)
    picked = torch.zeros(len(keys), dtype=torch.bool)
    picked[torch.sort(keys, descending=True, stable=True).indices[:need]] = True
    for name, idx, sel in zip(masks, edge_idx, picked.split([len(t) for t in edge_idx])):
        masks[name][idx[sel.to(idx.device)]] = True
    return {name: masks[name].reshape(w.shape) for name, w in weights.items()}


def _key(weight: Tensor) -> Tensor:
    """Flat non-negative int32 keys that order like ``|w|`` (float32 bits; NaN and inf as 0)."""
    magnitude = weight.detach().float().abs().nan_to_num_(nan=0.0, posinf=0.0)
    return magnitude.reshape(-1).view(torch.int32)
