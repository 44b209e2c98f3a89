"""How a call's tokens are cut into tiles for the ``tiles`` kernel, and how its output is written.

``tiles`` takes the input as ``[tiles, in, width]``: 32 tokens a tile (8 for a call of 8 or fewer),
each tile's inputs contiguous, the last tile padded with zeros. A work item is a block of output rows
over a chunk of tiles (``chunk``), and a token-major output is written a sum at a time or through a
block (``token_layout``)::

    >>> import torch
    >>> tile_for(5), tile_for(9)
    ((8, 'tiles8'), (32, 'tiles'))
    >>> to_tiles(torch.arange(6.0).reshape(3, 2), 4).tolist()  # 3 tokens of 2 inputs, a tile of 4
    [[[0.0, 2.0, 4.0, 0.0], [1.0, 3.0, 5.0, 0.0]]]
    >>> chunk(768, 32), chunk(3072, 32)
    (5, 1)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "tile_for",
    "to_tiles",
    "token_layout",
    "chunk",
    "CHUNK_BYTES",
    "TILE",
    "TILE8",
    "COLUMNS",
    "TOKENS",
    "BLOCKED",
]

TILE = 32
"""Tokens a ``tiles`` tile: two 16-lane vectors of sums an output row."""

TILE8 = 8
"""Tokens a ``tiles8`` tile (a call of 8 tokens or fewer: one 8-lane vector an output row)."""

COLUMNS, TOKENS, BLOCKED = 0, 1, 2
"""How ``tiles`` writes its output (``layout``): ``[out, tokens]``; ``[tokens, out]`` a sum at a
time; ``[tokens, out]`` through a block of rows (``loops._write_block``)."""


def tile_for(tokens: int) -> tuple[int, str]:
    """Tokens a tile and the loop for a call of ``tokens``: 8 (``tiles8``) up to 8 tokens, else 32."""
    return (TILE8, "tiles8") if tokens <= TILE8 else (TILE, "tiles")


def to_tiles(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x[T, in]`` as ``[tiles, in, width]``, contiguous, tokens past ``T`` zero."""
    tokens, n_in = x.shape
    tiles = -(-tokens // width)
    if tiles * width != tokens:
        x = F.pad(x, (0, 0, 0, tiles * width - tokens))
    return x.reshape(tiles, width, n_in).transpose(1, 2).contiguous()


def token_layout(out_features: int) -> int:
    """``TOKENS``, or ``BLOCKED`` where a token-major output's rows are so far apart in
    multiples of 4 KiB that a tile's 32 token lines meet in fewer than 4 of L1's set groups (8 lines
    each in an 8-way cache): a scatter would evict its own lines."""
    spread = 4096 // math.gcd(out_features * 4, 4096)
    return BLOCKED if spread < 4 else TOKENS


CHUNK_BYTES = 2**19
"""The inputs a ``tiles`` chunk holds (half a typical 1 MiB L2): 5 tiles of 32 tokens at 768 inputs."""


def chunk(n_in: int, width: int) -> int:
    """Tiles a chunk of ``tiles`` takes: as many as ``CHUNK_BYTES`` of inputs hold, at least one. Each
    chunk reads the layer's weights once, so GPT-2's LM head (23 MB packed at 90%) at 128 tokens
    streams them once instead of once a tile."""
    return max(1, CHUNK_BYTES // (n_in * width * 4))
