"""Change the sparsity of existing masks, e.g. after loading a checkpoint into a new config.

Lower sparsity regrows pruned positions at random (seeded per parameter, weights start at 0);
higher sparsity keeps the pruned positions pruned and prunes the smallest kept ``|w|`` too.
Either way exactly ``keep_count(numel, s)`` entries stay (``floor((1 - s) * numel)``, exact)::

    >>> w = torch.tensor([[0.5, -3.0, 0.0, 2.0]])
    >>> mask = torch.tensor([[True, True, False, True]])
    >>> retarget_mask(w, mask, 0.5, seed=0)
    tensor([[False,  True, False,  True]])
    >>> int(retarget_mask(w, mask, 0.0, seed=0).sum())
    4
    >>> int(retarget_mask(torch.ones(10, 10), torch.ones(10, 10, dtype=torch.bool), 0.9, seed=0).sum())
    10
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ..config import param_seed
from ..config.counts import keep_count
from ..errors import ConfigError
from ..masks import follows_mask, is_mask_of, masked_params
from ..ops import prune_

__all__ = ["retarget_mask", "retarget_"]


def retarget_mask(weight: Tensor, mask: Tensor, sparsity: float, *, seed: int) -> Tensor:
    """A new bool mask with ``keep_count(numel, sparsity)`` entries, derived from ``mask`` (unchanged)."""
    _check_level(sparsity, "sparsity")
    if not is_mask_of(mask, weight):
        raise ConfigError(
            f"mask must be a bool tensor shaped like the weight {tuple(weight.shape)}; "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    flat = mask.reshape(-1)
    k, nnz = keep_count(flat.numel(), sparsity), int(flat.sum())
    new = flat.clone()
    if k > nnz:
        pruned = (~flat).nonzero().squeeze(1)
        gen = torch.Generator().manual_seed(seed)
        pick = torch.randperm(pruned.numel(), generator=gen)[: k - nnz].to(pruned.device)
        new[pruned[pick]] = True
    elif k < nnz:
        kept = flat.nonzero().squeeze(1)
        magnitude = weight.detach().reshape(-1)[kept].float().abs().nan_to_num(nan=0.0)
        smallest = torch.sort(magnitude, stable=True).indices[: nnz - k]
        new[kept[smallest]] = False
    return new.view(mask.shape)


def retarget_(
    model: nn.Module,
    sparsity: float | Mapping[str, float],
    *,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, tuple[int, int]]:
    """Retarget every mask of ``model`` (or those named in a ``{param: sparsity}`` mapping) in place.

    Regrown weights and the changed positions of same-shape optimizer states are set to 0. Returns
    ``{param: (nnz before, nnz after)}``. Parameter ``name`` draws from ``param_seed(seed, name)``.
    After loading a checkpoint into a model compiled for new targets, reach them with
    ``retarget_(sm, {name: d.sparsity for name, d in sm.plan.sparse.items()})``.

        >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 8)), 0.75)
        >>> retarget_(sm, 0.5)
        {'0.weight': (16, 32)}
    """
    masked = masked_params(model)
    if isinstance(sparsity, Mapping):
        unknown = [name for name in sparsity if name not in masked]
        if unknown:
            raise ConfigError(
                f"retarget: {', '.join(map(str, unknown))} not sparse parameters; "
                f"valid: {', '.join(masked) or 'none (the model has no masks)'}"
            )
        levels = dict(sparsity)
    else:
        levels = dict.fromkeys(masked, sparsity)
    for name, level in levels.items():
        _check_level(level, f"retarget {name}")
    changes = {}
    for name, level in levels.items():
        param, mask = masked[name]
        new = retarget_mask(param, mask, level, seed=param_seed(seed, name))
        changed = new != mask
        with torch.no_grad():
            prune_(param, new)
            param.masked_fill_(changed, 0.0)
            for key, value in (optimizer.state.get(param, {}) if optimizer is not None else {}).items():
                if follows_mask(key, value, param):
                    value.masked_fill_(changed.to(value.device) | ~new.to(value.device), 0.0)
        changes[name] = (int(mask.sum()), int(new.sum()))
        mask.copy_(new)
    return changes


def _check_level(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"{where}: {value!r} is not in [0, 1)")
