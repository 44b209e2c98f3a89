"""Sparse-times-dense kernels for a frozen linear layer: ``y[T, out] = x[T, in] @ W.T`` with ``W`` in CSR.

``bind(name, packed, bias)`` gives the kernel as a function of a 2-D, contiguous float32 ``x``
returning ``[T, out]``, its arrays looked up once (a one-token call costs microseconds, so the
lookups would show). ``KERNELS[name](packed, x, bias)`` binds and calls at once. Which kernel is
fastest depends on the tokens ``T`` (``choose.py`` measures):

* ``spmv`` (numba): few tokens, a gather dot product per output row and token.
* ``rows`` (numba): many tokens. ``x`` is transposed once so that each input feature's tokens are
  contiguous; each output row adds ``w * x[:, j]`` for its nonzeros, four at a time, the inner loop
  over tokens (one load and store of the row for four products: with one at a time the stores
  bound it). On more than one thread (``torch.get_num_threads()``) the output rows are shared out.
* ``torch`` (``torch.sparse.mm`` on the CSR tensor): torch's own kernel (MKL on x86), good at 8-32.
* ``dense``: ``F.linear`` on the masked dense weight, where no sparse kernel is faster.

The numba kernels read the indices unsigned (uint16 or uint32, as packed): with signed ones the
gather runs several times slower.
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

__all__ = ["KERNELS", "NUMBA", "available_kernels", "bind", "Kernel"]

NUMBA = importlib.util.find_spec("numba") is not None and os.environ.get("SPARSEFX_NUMBA", "1") != "0"
"""Whether the numba kernels run: numba installed (the ``fast`` extra) and ``SPARSEFX_NUMBA`` not 0."""

NUMBA_KERNELS = ["spmv", "rows"]
"""The kernels that need numba."""

Kernel = Callable[[torch.Tensor], torch.Tensor]
"""A kernel bound to its weight and bias: ``x[T, in]`` (2-D, contiguous) to ``y[T, out]``."""

_compiled: dict[str, Callable] = {}


def _numba(name: str) -> Callable:
    """The numba loop ``name``, compiled on first use (numba caches the machine code on disk)."""
    if name not in _compiled:
        from numba import njit, prange

        opts = {"fastmath": True, "cache": True, "boundscheck": False, "nogil": True}

        def spmv(indptr, indices, values, bias, x, out):  # pragma: no cover - compiled
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
    """The CSR arrays as numba reads them: row pointers and column indices unsigned (same bits)."""
    if "numpy" not in p._cache:
        unsigned = np.uint16 if p.indices.dtype == torch.int16 else np.uint32
        p._cache["numpy"] = (
            p.indptr.numpy().view(np.uint32),
            p.indices.numpy().view(unsigned),
            p.values.numpy(),
        )
    return p._cache["numpy"]


_NO_BIAS = np.zeros(0, dtype=np.float32)


def _bias(b: torch.Tensor | None) -> np.ndarray:
    return _NO_BIAS if b is None else b.detach().numpy()


def _bind_spmv(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    indptr, indices, values = _arrays(p)
    b, spmv, out_features = _bias(bias), _numba("spmv"), p.out_features

    def run(x: torch.Tensor) -> torch.Tensor:
        out = np.empty((x.shape[0], out_features), dtype=np.float32)
        spmv(indptr, indices, values, b, x.numpy(), out)
        return torch.from_numpy(out)

    return run


def _bind_rows(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    arrays, b, out_features = _arrays(p), _bias(bias), p.out_features

    def run(x: torch.Tensor) -> torch.Tensor:
        xt = np.ascontiguousarray(x.numpy().T)
        out_t = np.empty((out_features, x.shape[0]), dtype=np.float32)
        threads = torch.get_num_threads()
        if threads > 1:  # as many as torch uses, so both sides of a comparison have the same
            import numba

            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        _numba("rows_parallel" if threads > 1 else "rows")(*arrays, b, xt, out_t)
        return torch.from_numpy(out_t).T

    return run


def _bind_torch(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    csr = p.csr()

    def run(x: torch.Tensor) -> torch.Tensor:
        y = torch.sparse.mm(csr, x.T).T
        return y if bias is None else y + bias

    return run


def _bind_dense(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    weight = p.dense()
    return lambda x: F.linear(x, weight, bias)


BINDERS: dict[str, Callable[[PackedWeight, torch.Tensor | None], Kernel]] = {
    "spmv": _bind_spmv,
    "rows": _bind_rows,
    "torch": _bind_torch,
    "dense": _bind_dense,
}
"""Kernel name -> ``binder(packed, bias)`` giving the bound kernel."""


def bind(name: str, p: PackedWeight, bias: torch.Tensor | None = None) -> Kernel:
    """Kernel ``name`` for weight ``p`` and ``bias``: a function of ``x[T, in]``."""
    return BINDERS[name](p, bias)


def _call(name: str) -> Callable[..., torch.Tensor]:
    return lambda p, x, bias=None: BINDERS[name](p, bias)(x)


KERNELS: dict[str, Callable[..., torch.Tensor]] = {name: _call(name) for name in BINDERS}
"""Kernel name -> ``kernel(packed, x2d, bias=None)`` (binds, then calls)."""


def available_kernels(backend: str = "auto") -> list[str]:
    """The kernels a backend may choose from: ``"auto"`` every one that runs here, ``"torch"`` torch's own."""
    if backend == "torch":
        return ["torch", "dense"]
    return (NUMBA_KERNELS if NUMBA else []) + ["torch", "dense"]
