"""Sparse-times-dense kernels for a frozen linear layer: ``y[T, out] = x[T, in] @ W.T`` with ``W`` in CSR.

Each kernel takes the packed weight (``PackedWeight``), a 2-D, contiguous float32 ``x`` and the bias
(or None) and returns ``[T, out]``. Which one is fastest depends on the tokens ``T`` (``choose.py`` measures):

* ``spmv`` (numba): one token, a gather dot product per output row.
* ``rows`` (numba): many tokens. ``x`` is transposed once so that each input feature's tokens are
  contiguous; each output row adds ``w * x[:, j]`` for its nonzeros, four at a time, the inner loop
  over tokens (one load and store of the row for four products: with one at a time the stores
  bound it). On more than one thread (``torch.get_num_threads()``) the output rows are shared out.
* ``torch`` (``torch.sparse.mm`` on the CSR tensor): torch's own kernel (MKL on x86), good at 8-32.
* ``dense``: ``F.linear`` on the masked dense weight, where no sparse kernel is faster.

The numba kernels take uint32 indices: with signed 32-bit ones the gather runs several times slower.
numba is the ``fast`` extra; without it only ``torch`` and ``dense`` are available (``NUMBA``)::

    >>> import torch
    >>> from sparsefx.frozen.packed import pack
    >>> w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    >>> p = pack(w, w != 0)
    >>> x = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 1.0]])
    >>> [KERNELS[name](p, x).tolist() for name in ("torch", "dense")]
    [[[3.0, 3.0], [4.0, 0.0]], [[3.0, 3.0], [4.0, 0.0]]]
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .packed import PackedWeight

__all__ = ["KERNELS", "NUMBA", "available_kernels", "Kernel"]

NUMBA = importlib.util.find_spec("numba") is not None and os.environ.get("SPARSEFX_NUMBA", "1") != "0"
"""Whether the numba kernels run: numba installed (the ``fast`` extra) and ``SPARSEFX_NUMBA`` not 0."""

NUMBA_KERNELS = ["spmv", "rows"]
"""The kernels that need numba."""

Kernel = Callable[..., torch.Tensor]

_compiled: dict[str, Callable] = {}


def _numba(name: str) -> Callable:
    """The numba loop ``name``, compiled on first use (numba caches the machine code on disk)."""
    if name not in _compiled:
        from numba import njit, prange

        opts = {"fastmath": True, "cache": True, "boundscheck": False, "nogil": True}

        def spmv(indptr, indices, values, bias, x, out):  # pragma: no cover - compiled
            for o in range(indptr.shape[0] - 1):
                p, hi = indptr[o], indptr[o + 1]
                s0 = s1 = s2 = s3 = np.float32(0.0)  # four sums: the adds do not wait on each other
                while p + 4 <= hi:
                    s0 += values[p] * x[indices[p]]
                    s1 += values[p + 1] * x[indices[p + 1]]
                    s2 += values[p + 2] * x[indices[p + 2]]
                    s3 += values[p + 3] * x[indices[p + 3]]
                    p += 4
                while p < hi:
                    s0 += values[p] * x[indices[p]]
                    p += 1
                out[o] = (s0 + s1) + (s2 + s3) + (bias[o] if bias.shape[0] else np.float32(0.0))

        def rows(indptr, indices, values, bias, xt, out_t):  # pragma: no cover - compiled
            tokens = xt.shape[1]
            for o in prange(indptr.shape[0] - 1):
                row = out_t[o]
                b = bias[o] if bias.shape[0] else np.float32(0.0)
                for t in range(tokens):
                    row[t] = b
                p, hi = indptr[o], indptr[o + 1]
                while p + 4 <= hi:  # four nonzeros a pass: a row's load and store serve four products
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

        _compiled.update(
            spmv=njit(**opts)(spmv),
            rows=njit(**opts)(rows),
            rows_parallel=njit(parallel=True, **opts)(rows),
        )
    return _compiled[name]


def _arrays(p: PackedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR arrays as numba reads them: uint32 row pointers and column indices (same bits)."""
    if "numpy" not in p._cache:
        p._cache["numpy"] = (
            p.indptr.numpy().view(np.uint32),
            p.indices.numpy().view(np.uint32),
            p.values.numpy(),
        )
    return p._cache["numpy"]


_NO_BIAS = np.zeros(0, dtype=np.float32)


def _bias(b: torch.Tensor | None) -> np.ndarray:
    return _NO_BIAS if b is None else b.numpy()


def _spmv(p: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = np.empty((x.shape[0], p.out_features), dtype=np.float32)
    indptr, indices, values = _arrays(p)
    xs, b, spmv = x.numpy(), _bias(bias), _numba("spmv")
    for t in range(x.shape[0]):
        spmv(indptr, indices, values, b, xs[t], out[t])
    return torch.from_numpy(out)


def _rows(p: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    xt = np.ascontiguousarray(x.numpy().T)
    out_t = np.empty((p.out_features, x.shape[0]), dtype=np.float32)
    threads = torch.get_num_threads()
    if threads > 1:  # as many as torch uses, so both sides of a comparison have the same
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    _numba("rows_parallel" if threads > 1 else "rows")(*_arrays(p), _bias(bias), xt, out_t)
    return torch.from_numpy(out_t).T


def _torch(p: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = torch.sparse.mm(p.csr(), x.T).T
    return y if bias is None else y + bias


def _dense(p: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, p.dense(), bias)


KERNELS: dict[str, Kernel] = {"spmv": _spmv, "rows": _rows, "torch": _torch, "dense": _dense}
"""Kernel name -> ``kernel(packed, x2d, bias=None)``."""


def available_kernels(backend: str = "auto") -> list[str]:
    """The kernels a backend may choose from: ``"auto"`` every one that runs here, ``"torch"`` torch's own."""
    if backend == "torch":
        return ["torch", "dense"]
    return (NUMBA_KERNELS if NUMBA else []) + ["torch", "dense"]
