"""The numba loops behind the frozen kernels (``kernels.py`` binds them; importing this needs numba).

Every loop reads a CSR weight (``indptr``, ``indices`` unsigned, ``values``) and a bias (empty for
none), and writes ``W @ x + b`` into an output it is given. ``fastmath`` lets LLVM vectorize the
token loops (AVX2 or AVX-512, as the machine has); numba caches the machine code on disk, so a
process compiles each loop once per machine. The loops are JIT-compiled, so they cannot be doctested
here; ``tests/test_freeze.py`` runs each against the dense product.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["spmv", "rows", "rows_parallel", "rows_tokens", "rows_tokens_parallel", "BLOCK"]

_OPTS = {"fastmath": True, "cache": True, "boundscheck": False, "nogil": True}

BLOCK = 16
"""Output rows ``rows_tokens`` accumulates before it writes them to the token-major output: one
64-byte line a token for float32 (one row at a time would write a line per token per row, and with an
output stride of a multiple of 4 KiB those lines fall in one cache set)."""


@njit(**_OPTS)
def spmv(indptr, indices, values, bias, x, out):  # pragma: no cover - compiled
    """``out[t] = W @ x[t] + b`` for each token: a gather dot product per output row, four sums."""
    for t in range(x.shape[0]):
        xt, yt = x[t], out[t]
        for o in range(indptr.shape[0] - 1):
            p, hi = indptr[o], indptr[o + 1]
            s0 = s1 = s2 = s3 = np.float32(0.0)  # four sums: the adds do not wait on each other
            while p + 4 <= hi:
                s0 += values[p] * xt[indices[p]]
                s1 += values[p + 1] * xt[indices[p + 1]]
                s2 += values[p + 2] * xt[indices[p + 2]]
                s3 += values[p + 3] * xt[indices[p + 3]]
                p += 4
            while p < hi:
                s0 += values[p] * xt[indices[p]]
                p += 1
            yt[o] = (s0 + s1) + (s2 + s3) + (bias[o] if bias.shape[0] else np.float32(0.0))


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


rows = njit(**_OPTS)(_rows)
rows_parallel = njit(parallel=True, **_OPTS)(_rows)
rows_tokens = njit(**_OPTS)(_rows_tokens)
rows_tokens_parallel = njit(parallel=True, **_OPTS)(_rows_tokens)
