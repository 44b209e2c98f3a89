"""The numba loops behind the frozen kernels (``kernels.py`` binds them; importing this needs numba).

Every loop reads a CSR weight (``indptr``, ``indices`` unsigned, ``values``) and a bias (empty for
none), and writes ``W @ x + b`` into an output it is given. ``fastmath`` lets LLVM vectorize the
token loops (AVX2 or AVX-512, as the machine has); numba caches the machine code on disk, so a
process compiles each loop once per machine. The loops are JIT-compiled, so they cannot be doctested
here; ``tests/test_freeze.py`` runs each against the dense product.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np
from numba import njit, prange

from .simd import (
    add8,
    add16,
    fmuladd8,
    fmuladd16,
    fmuladd_lanes16,
    gather16,
    load8,
    load16,
    lookup32,
    scatter8,
    scatter16,
    splat8,
    splat16,
    store8,
    store16,
    total16,
)
from .tiling import BLOCKED, COLUMNS, TILE, TILE8, TOKENS

__all__ = [
    "spmv",
    "spmv_parallel",
    "lookup",
    "lookup_parallel",
    "rows",
    "rows_parallel",
    "rows_tokens",
    "rows_tokens_parallel",
    "tiles",
    "tiles_parallel",
    "tiles8",
    "tiles8_parallel",
]

_OPTS = {"fastmath": True, "cache": True, "boundscheck": False, "nogil": True}

BLOCK = 16
"""Output rows ``rows_tokens`` accumulates before it writes them to the token-major output: one
64-byte line a token for float32 (one row at a time would write a line per token per row, and with an
output stride of a multiple of 4 KiB those lines fall in one cache set)."""


ROWS = 64
"""Output rows a parallel work item of ``tiles`` takes."""


def _spmv(indptr, indices, values, bias, x, out):  # pragma: no cover - compiled
    """``out[t] = W @ x[t] + b`` for each token: a gather dot product per output row, 16 nonzeros a
    step in two vector sums (values loaded as a vector, inputs gathered), the rest one at a time."""
    for t in range(x.shape[0]):
        xt, yt = x[t], out[t]
        for o in prange(indptr.shape[0] - 1):
            p, hi = np.int64(indptr[o]), np.int64(indptr[o + 1])
            s0, s1 = splat16(np.float32(0.0)), splat16(np.float32(0.0))
            while p + 32 <= hi:
                s0 = fmuladd_lanes16(s0, load16(values, p), gather16(xt, indices, p))
                s1 = fmuladd_lanes16(s1, load16(values, p + 16), gather16(xt, indices, p + 16))
                p += 32
            if p + 16 <= hi:
                s0 = fmuladd_lanes16(s0, load16(values, p), gather16(xt, indices, p))
                p += 16
            s = total16(add16(s0, s1)) + (bias[o] if bias.shape[0] else np.float32(0.0))
            while p < hi:
                s += values[p] * xt[indices[p]]
                p += 1
            yt[o] = s


def _lookup(ptr, positions, values, bias, x, out):  # pragma: no cover - compiled
    """``out[t] = W @ x[t] + b`` for each token, ``W`` in ``lookup.py``'s layout: for each group of
    16 output rows (a vector of sums) and block of 32 inputs (two vectors, looked up in registers by
    ``lookup32``), that block's steps, each a 16-lane vector of weights and their inputs' positions in
    the block. Four sums a group, a step each in turn (a multiply-add waits on the one before it)."""
    n_in, n_out = x.shape[1], out.shape[1]
    n_blocks = (n_in + 31) // 32
    n_groups = ptr.shape[0] // (n_blocks + 1)
    tail = np.zeros(32, dtype=np.float32)
    last = n_in - (n_blocks - 1) * 32
    for t in range(x.shape[0]):
        xt, yt = x[t], out[t]
        for i in range(last):  # the last block, padded with zeros to 32 inputs
            tail[i] = xt[(n_blocks - 1) * 32 + i]
        for g in prange(n_groups):
            zero = splat16(np.float32(0.0))
            a0, a1, a2, a3 = zero, zero, zero, zero
            at = g * (n_blocks + 1)
            for block in range(n_blocks):
                s, e = np.int64(ptr[at + block]) * 16, np.int64(ptr[at + block + 1]) * 16
                if s == e:
                    continue
                if block == n_blocks - 1:
                    low, high = load16(tail, 0), load16(tail, 16)
                else:
                    low, high = load16(xt, block * 32), load16(xt, block * 32 + 16)
                while s + 64 <= e:
                    a0 = fmuladd_lanes16(a0, load16(values, s), lookup32(low, positions, s, high))
                    a1 = fmuladd_lanes16(a1, load16(values, s + 16), lookup32(low, positions, s + 16, high))
                    a2 = fmuladd_lanes16(a2, load16(values, s + 32), lookup32(low, positions, s + 32, high))
                    a3 = fmuladd_lanes16(a3, load16(values, s + 48), lookup32(low, positions, s + 48, high))
                    s += 64
                if s < e:
                    a0 = fmuladd_lanes16(a0, load16(values, s), lookup32(low, positions, s, high))
                if s + 16 < e:
                    a1 = fmuladd_lanes16(a1, load16(values, s + 16), lookup32(low, positions, s + 16, high))
                if s + 32 < e:
                    a2 = fmuladd_lanes16(a2, load16(values, s + 32), lookup32(low, positions, s + 32, high))
            sums = add16(add16(a0, a1), add16(a2, a3))
            o = g * 16
            if o + 16 <= n_out:
                store16(yt, o, add16(sums, load16(bias, o)))
            else:  # the last group's rows past the layer's are not written
                spill = np.empty(16, dtype=np.float32)
                store16(spill, 0, add16(sums, load16(bias, o)))
                for i in range(n_out - o):
                    yt[o + i] = spill[i]


@njit(**_OPTS)
def _row(indptr, indices, values, bias, o, xt, row):  # pragma: no cover - compiled
    """``row[:] = b[o] + sum of w * xt[j]`` over output ``o``'s nonzeros ``(j, w)``, tokens inner.
    Four nonzeros a pass: one load and store of ``row`` serve four products."""
    tokens = xt.shape[1]
    b = bias[o] if bias.shape[0] else np.float32(0.0)
    for t in range(tokens):
        row[t] = b
    p, hi = indptr[o], indptr[o + 1]
    while p + 4 <= hi:
        w0, w1, w2, w3 = values[p], values[p + 1], values[p + 2], values[p + 3]
        x0, x1 = xt[indices[p]], xt[indices[p + 1]]
        x2, x3 = xt[indices[p + 2]], xt[indices[p + 3]]
        for t in range(tokens):
            row[t] += (w0 * x0[t] + w1 * x1[t]) + (w2 * x2[t] + w3 * x3[t])
        p += 4
    while p < hi:
        w, xr = values[p], xt[indices[p]]
        for t in range(tokens):
            row[t] += w * xr[t]
        p += 1


def _rows(indptr, indices, values, bias, xt, out_t):  # pragma: no cover - compiled
    """``out_t[o] = W[o] @ xt + b[o]``: tokens as columns in, and out (a convolution's layout)."""
    for o in prange(indptr.shape[0] - 1):
        _row(indptr, indices, values, bias, o, xt, out_t[o])


def _rows_tokens(indptr, indices, values, bias, xt, out):  # pragma: no cover - compiled
    """``out[t] = W @ xt[:, t] + b``: tokens as columns in, token-major out (a linear layer's), the
    rows accumulated ``BLOCK`` at a time and written a line a token."""
    tokens, n_out = xt.shape[1], indptr.shape[0] - 1
    for block in prange((n_out + BLOCK - 1) // BLOCK):
        o0 = block * BLOCK
        o1 = min(o0 + BLOCK, n_out)
        scratch = np.empty((BLOCK, tokens), dtype=np.float32)
        for o in range(o0, o1):
            _row(indptr, indices, values, bias, o, xt, scratch[o - o0])
        for t in range(tokens):
            yt = out[t]
            for i in range(o1 - o0):
                yt[o0 + i] = scratch[i, t]


@njit(**_OPTS)
def _write_block(block, out, t0, tokens, o0, o1, n_out):  # pragma: no cover - compiled
    """Copy a work item's sums, ``block[t, o - o0]`` (``[tokens, ROWS]``), into the token-major
    ``out`` (flat ``[*, n_out]``): a run of contiguous rows a token. Scattering each row's sums straight
    into ``out`` touches a line per token, and with ``n_out`` a multiple of 1024 (GPT-2's 3072) those
    lines fall in one cache set: 768x3072 at 32 tokens went from 3.5x to 6.6x dense this way. Where the
    lines spread (768, 2304) the block's extra copy cost more than it saved (4.2x against 5.2x at 128
    tokens), so ``kernels.py`` picks the layout by the output's stride."""
    for t in range(tokens):
        at, src = (t0 + t) * n_out, t * ROWS
        for i in range(o1 - o0):
            out[at + o0 + i] = block[src + i]


def _tiles(indptr, indices, values, bias, x3, out, n_in, layout, chunk):  # pragma: no cover - compiled
    """``W @ x3 + b`` tile by tile, ``x3`` being ``[tiles, n_in, TILE]`` (flat). ``out`` (flat) is
    ``[n_out, tiles * TILE]`` for ``layout`` ``COLUMNS``, else ``[tiles * TILE, n_out]`` (a linear
    layer's output): each sum scattered to its token's row (``TOKENS``) or through a block
    (``BLOCKED``, ``_write_block``). An output row's sums for a tile stay in four vectors (two nonzeros
    a pass, two 16-token vectors each) across all its nonzeros: one load of 32 tokens and one
    multiply-add a vector per nonzero, the row written once. A work item is a block of ``ROWS``
    output rows over a chunk of ``chunk`` tiles: the chunk's inputs stay in L2 across the blocks,
    the block's weights in L1 across the chunk (``tiling.chunk``)."""
    n_out = indptr.shape[0] - 1
    n_tiles = x3.shape[0] // (n_in * TILE)
    n_blocks, n_chunks = (n_out + ROWS - 1) // ROWS, (n_tiles + chunk - 1) // chunk
    width = np.int64(n_tiles) * TILE  # the padded tokens
    for item in prange(n_chunks * n_blocks):  # chunk-major: a chunk's inputs stay in cache
        c, o0 = item // n_blocks, (item % n_blocks) * ROWS
        block = np.empty(TILE * ROWS if layout == BLOCKED else 0, dtype=np.float32)
        for tile in range(c * chunk, min(c * chunk + chunk, n_tiles)):  # a block's weights stay too
            _tile(indptr, indices, values, bias, x3, out, n_in, layout, tile, o0, block, width)


@njit(**_OPTS)
def _tile(indptr, indices, values, bias, x3, out, n_in, layout, tile, o0, block, width):  # pragma: no cover
    """One 32-token tile of ``_tiles`` for output rows ``o0`` to ``o0 + ROWS``."""
    n_out = indptr.shape[0] - 1
    x_at, t0 = np.int64(tile) * n_in * TILE, np.int64(tile) * TILE
    for o in range(o0, min(o0 + ROWS, n_out)):
        b = bias[o] if bias.shape[0] else np.float32(0.0)
        a0, a1 = splat16(b), splat16(b)
        c0, c1 = splat16(np.float32(0.0)), splat16(np.float32(0.0))
        p, hi = indptr[o], indptr[o + 1]
        while p + 2 <= hi:
            j0 = x_at + np.int64(indices[p]) * TILE
            j1 = x_at + np.int64(indices[p + 1]) * TILE
            w0, w1 = values[p], values[p + 1]
            a0, a1 = fmuladd16(a0, w0, load16(x3, j0)), fmuladd16(a1, w0, load16(x3, j0 + 16))
            c0, c1 = fmuladd16(c0, w1, load16(x3, j1)), fmuladd16(c1, w1, load16(x3, j1 + 16))
            p += 2
        if p < hi:
            j0, w0 = x_at + np.int64(indices[p]) * TILE, values[p]
            a0, a1 = fmuladd16(a0, w0, load16(x3, j0)), fmuladd16(a1, w0, load16(x3, j0 + 16))
        s0, s1 = add16(a0, c0), add16(a1, c1)
        if layout == COLUMNS:
            store16(out, np.int64(o) * width + t0, s0)
            store16(out, np.int64(o) * width + t0 + 16, s1)
        elif layout == TOKENS:
            scatter16(out, t0 * n_out + o, np.int64(n_out), s0)
            scatter16(out, (t0 + 16) * n_out + o, np.int64(n_out), s1)
        else:
            scatter16(block, np.int64(o - o0), np.int64(ROWS), s0)
            scatter16(block, np.int64(16 * ROWS + o - o0), np.int64(ROWS), s1)
    if layout == BLOCKED:
        _write_block(block, out, t0, TILE, o0, min(o0 + ROWS, n_out), n_out)


def _tiles8(indptr, indices, values, bias, x3, out, n_in, layout):  # pragma: no cover - compiled
    """``_tiles`` for tiles of 8 tokens: one 8-lane vector an output row, four nonzeros a pass in four
    sums (a multiply-add waits on the one before it in its sum)."""
    n_out = indptr.shape[0] - 1
    n_tiles = x3.shape[0] // (n_in * TILE8)
    n_blocks = (n_out + ROWS - 1) // ROWS
    width = np.int64(n_tiles) * TILE8
    for item in prange(n_tiles * n_blocks):
        tile, o0 = item // n_blocks, (item % n_blocks) * ROWS
        x_at, t0 = np.int64(tile) * n_in * TILE8, np.int64(tile) * TILE8
        block = np.empty(TILE8 * ROWS if layout == BLOCKED else 0, dtype=np.float32)
        for o in range(o0, min(o0 + ROWS, n_out)):
            b = bias[o] if bias.shape[0] else np.float32(0.0)
            zero = splat8(np.float32(0.0))
            a, c, d, e = splat8(b), zero, zero, zero
            p, hi = indptr[o], indptr[o + 1]
            while p + 4 <= hi:
                a = fmuladd8(a, values[p], load8(x3, x_at + np.int64(indices[p]) * TILE8))
                c = fmuladd8(c, values[p + 1], load8(x3, x_at + np.int64(indices[p + 1]) * TILE8))
                d = fmuladd8(d, values[p + 2], load8(x3, x_at + np.int64(indices[p + 2]) * TILE8))
                e = fmuladd8(e, values[p + 3], load8(x3, x_at + np.int64(indices[p + 3]) * TILE8))
                p += 4
            while p < hi:
                a = fmuladd8(a, values[p], load8(x3, x_at + np.int64(indices[p]) * TILE8))
                p += 1
            total = add8(add8(a, c), add8(d, e))
            if layout == COLUMNS:
                store8(out, np.int64(o) * width + t0, total)
            elif layout == TOKENS:
                scatter8(out, t0 * n_out + o, np.int64(n_out), total)
            else:
                scatter8(block, np.int64(o - o0), np.int64(ROWS), total)
        if layout == BLOCKED:
            _write_block(block, out, t0, TILE8, o0, min(o0 + ROWS, n_out), n_out)


def _parallel(fn: Callable) -> Callable:
    """``fn`` compiled with ``prange`` running in parallel. It is compiled from a copy under its own
    name: numba keys its disk cache by the function's name and line, not by ``parallel``, so the serial
    and parallel forms of one function would load each other's code (the parallel one ran serial)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_parallel", fn.__defaults__)
    copy.__qualname__ = f"{fn.__qualname__}_parallel"
    return njit(parallel=True, **_OPTS)(copy)


spmv, spmv_parallel = njit(**_OPTS)(_spmv), _parallel(_spmv)
lookup, lookup_parallel = njit(**_OPTS)(_lookup), _parallel(_lookup)
rows, rows_parallel = njit(**_OPTS)(_rows), _parallel(_rows)
rows_tokens, rows_tokens_parallel = njit(**_OPTS)(_rows_tokens), _parallel(_rows_tokens)
tiles, tiles_parallel = njit(**_OPTS)(_tiles), _parallel(_tiles)
tiles8, tiles8_parallel = njit(**_OPTS)(_tiles8), _parallel(_tiles8)
