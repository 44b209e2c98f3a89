"""Initial mask patterns: ``random``, ``topk``, ``from_zeros``, ``checkerboard`` or a user callable.

Every method but ``from_zeros`` keeps exactly ``keep_count(numel, s)`` entries, ``floor((1 - s) *
numel)`` evaluated exactly (per balance group when groups are asked for). Randomness comes from a
private generator seeded per parameter, so the same seed gives the same mask whatever else ran
before::

    >>> w = torch.randn(4, 8)
    >>> int(make_mask(w, 0.75, "random", seed=7).sum())
    8
    >>> torch.equal(make_mask(w, 0.75, "random", seed=7), make_mask(w, 0.75, "random", seed=7))
    True
    >>> int(make_mask(torch.randn(10, 10), 0.9, "topk").sum())  # float64 int((1 - 0.9) * 100) is 9
    10
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..config.counts import keep_count
from ..errors import ConfigError

__all__ = [
    "make_mask",
    "topk_mask",
    "keep_count",
    "select_largest",
    "to_groups",
    "from_groups",
    "INIT_METHODS",
]

INIT_METHODS: tuple[str, ...] = ("random", "topk", "from_zeros", "checkerboard")

InitFn = Callable[..., Tensor]


def topk_mask(
    score: Tensor,
    sparsity: float,
    *,
    balance_out_groups: int | None = None,
    balance_in_groups: int | None = None,
) -> Tensor:
    """Bool mask keeping the top ``keep_count(n, s)`` scores, globally or inside each balance group."""
    grouped = to_groups(score, balance_out_groups, balance_in_groups)
    k = keep_count(grouped.shape[1], sparsity)
    if grouped.shape[0] == 1 and not score.is_floating_point():
        return select_largest(grouped.reshape(-1), k).reshape(score.shape)
    mask = torch.zeros(grouped.shape, dtype=torch.bool, device=score.device)
    if k > 0:
        idx = torch.topk(grouped, k, dim=1, sorted=False).indices
        mask.scatter_(1, idx, True)
    return from_groups(mask, score.shape, balance_in_groups)


def select_largest(key: Tensor, k: int) -> Tensor:
    """Exactly ``k`` largest of non-negative integer ``key``: one bucket count, then top-k in one bucket.

    About twice as fast as ``torch.topk`` on the multi-million-entry weights of a GPT-2 layer.
    """
    n = key.numel()
    if k <= 0 or k >= n:
        return torch.full((n,), k >= n, dtype=torch.bool, device=key.device)
    shift = max(0, int(key.max()).bit_length() - 16)
    bucket = key >> shift
    at_or_above = torch.bincount(bucket).flip(0).cumsum(0)
    i = int(torch.searchsorted(at_or_above, k))
    edge = len(at_or_above) - 1 - i
    mask = bucket > edge
    in_edge = (bucket == edge).nonzero().squeeze(1)
    need = k - (int(at_or_above[i - 1]) if i > 0 else 0)
    mask[in_edge[torch.topk(key[in_edge], need, sorted=False).indices]] = True
    return mask


def make_mask(
    weight: Tensor,
    sparsity: float,
    method: str | InitFn = "random",
    *,
    seed: int = 0,
    balance_out_groups: int | None = None,
    balance_in_groups: int | None = None,
) -> Tensor:
    """Initial bool mask for ``weight`` (True keeps). On the meta device the mask stays on meta."""
    if weight.device.type == "meta":
        return torch.empty(weight.shape, dtype=torch.bool, device="meta")
    if callable(method):
        return _user_mask(method, weight, sparsity, balance_out_groups, balance_in_groups)
    if method == "from_zeros":
        return weight.detach() != 0
    score = _score(weight, method, seed, sparsity)
    mask = topk_mask(
        score, sparsity, balance_out_groups=balance_out_groups, balance_in_groups=balance_in_groups
    )
    return mask.to(weight.device)


def _score(weight: Tensor, method: str, seed: int, sparsity: float) -> Tensor:
    """Integer scores (larger keeps): random draws, |w| as ordered float bits, or the checkerboard rank."""
    if method == "random":
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, 2**31 - 1, weight.shape, generator=gen, dtype=torch.int32)
    if method == "topk":
        magnitude = weight.detach().float().abs().nan_to_num(nan=0.0, posinf=0.0)
        return magnitude.cpu().view(torch.int32)  # non-negative float32 bits order like the values
    if method == "checkerboard":
        return _checkerboard_score(weight.shape, sparsity)
    raise ConfigError(f"init_method: unknown method {method!r}; valid: {', '.join(INIT_METHODS)}")


def _checkerboard_score(shape: torch.Size, sparsity: float) -> Tensor:
    """Ranks diagonals ``(i + j) % period`` first, ``period = round(1 / density)``.

    At density ``1/period`` exactly the kept entries are whole diagonals, so every row and every
    column keeps the same share; other densities top up from the next band, spread out.
    """
    rows = shape[0] if len(shape) > 0 else 1
    cols = max(1, int(torch.Size(shape[1:]).numel())) if len(shape) > 1 else 1
    numel = rows * cols
    i = torch.arange(rows).unsqueeze(1)
    j = torch.arange(cols).unsqueeze(0)
    period = max(1, round(1.0 / max(1.0 - sparsity, 1e-9)))
    band = (i + j) % period
    flat = torch.arange(numel).view(rows, cols)
    spread = (flat * 7919) % numel  # unique tie-breaks that stride through the tensor
    return ((period - 1 - band) * numel + (numel - 1 - spread)).view(shape)


def _user_mask(
    fn: InitFn, weight: Tensor, sparsity: float, out_groups: int | None, in_groups: int | None
) -> Tensor:
    def score_shaper(score: Tensor) -> Tensor:
        return to_groups(score, out_groups, in_groups)

    mask = fn(weight, sparsity, score_shaper, weight.device)
    if not isinstance(mask, Tensor) or mask.shape != weight.shape:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ConfigError(
            f"init_method: callable returned {got}; expected a tensor shaped {tuple(weight.shape)}"
        )
    return mask.to(device=weight.device, dtype=torch.bool)


def to_groups(score: Tensor, out_groups: int | None, in_groups: int | None) -> Tensor:
    """``score`` as ``[groups, n]``: rows of output groups, or of input groups (dims 0 and 1 swapped).

    >>> to_groups(torch.arange(8).view(4, 2), None, 2).tolist()
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    if out_groups:
        return score.reshape(out_groups, -1)
    if in_groups:
        return score.transpose(0, 1).reshape(in_groups, -1)
    return score.reshape(1, -1)


def from_groups(mask: Tensor, shape: torch.Size, in_groups: int | None) -> Tensor:
    """The inverse of ``to_groups`` for a ``[groups, n]`` tensor and the original ``shape``."""
    if in_groups:
        swapped = (shape[1], shape[0], *shape[2:])
        return mask.reshape(swapped).transpose(0, 1).contiguous()
    return mask.reshape(shape)
