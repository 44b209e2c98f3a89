"""Sparse-times-dense kernels for a frozen linear layer: ``y[T, out] = x[T, in] @ W.T`` with ``W`` in CSR.

``bind(name, packed, bias)`` gives the kernel as a function of a 2-D, contiguous float32 ``x``
returning ``[T, out]`` (contiguous, as the layer returns it), its arrays looked up once (a one-token
call costs microseconds, so the lookups would show). ``KERNELS[name](packed, x, bias)`` binds and
calls at once. Which kernel is fastest depends on the tokens ``T`` (``choose.py`` measures):

* ``spmv`` (numba): few tokens, a gather dot product per output row and token.
* ``lookup`` (numba, AVX-512): few tokens, the weight in blocks whose inputs are looked up in
  registers instead of gathered (``lookup.py``).
* ``rows`` (numba): many tokens. ``x`` is transposed once so that each input feature's tokens are
  contiguous; each output row adds ``w * x[:, j]`` for its nonzeros, four at a time, the inner loop
  over tokens (one load and store of the row for four products: with one at a time the stores
  bound it). Rows are written to the token-major output 16 at a time (``loops.BLOCK``). On more
  than one thread (``torch.get_num_threads()``) the output rows are shared out.
* ``tiles`` (numba): tokens in tiles of 32 (``tiling.TILE``; of 8 for 8 tokens or fewer), each
  tile's inputs contiguous (``[in, 32]``). An output row's sums for a tile stay in vector registers
  across its nonzeros (``simd.py``): one 32-token load and two multiply-adds a nonzero, the row
  stored once.
* ``torch`` (``torch.sparse.mm`` on the CSR tensor): torch's own kernel (MKL on x86), good at 8-32.
* ``dense``: ``F.linear`` on the masked dense weight, where no sparse kernel is faster.

The numba kernels read the indices unsigned (uint16 or uint32, as packed): with signed ones the
gather runs several times slower. A kernel's output of more than a few tokens is a ``torch.empty``
tensor, as a torch op's is: numpy asks the kernel for huge pages for an array past 4 MB, and where
memory is fragmented (after a dense product of the same size) the kernel stalls to compact it:
GPT-2's LM head at 1024 tokens and 99% ran 356 ms on ``rows`` into ``np.empty`` and 147 ms into
``torch.empty`` (60 ms with no dense product run before).
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

from . import tiling
from .packed import PackedWeight

__all__ = [
    "KERNELS",
    "NUMBA",
    "FEW_TOKENS",
    "runs_here",
    "stand_in",
    "available_kernels",
    "bind",
    "bind_one",
    "bind_columns",
    "Kernel",
    "ColumnKernel",
]

NUMBA = importlib.util.find_spec("numba") is not None and os.environ.get("SPARSEFX_NUMBA", "1") != "0"
"""Whether the numba kernels run: numba installed (the ``fast`` extra) and ``SPARSEFX_NUMBA`` not 0."""

NUMBA_KERNELS = ["spmv", "rows", "tiles", "lookup"]
"""The kernels that need numba (``lookup`` AVX-512 too: ``lookup.supported``)."""

FEW_TOKENS = ("spmv", "lookup")
"""The kernels that take one token at a time: timed and chosen up to 8 tokens."""

Kernel = Callable[[torch.Tensor], torch.Tensor]
"""A kernel bound to its weight and bias: ``x[T, in]`` (2-D, contiguous) to ``y[T, out]``."""


def _numba(name: str) -> Callable:
    """The numba loop ``name`` of ``loops.py`` (imported on first use: it needs numba)."""
    from . import loops

    return getattr(loops, name)


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
    arrays, b, out_features = _arrays(p), _bias(bias), p.out_features

    def run(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty((x.shape[0], out_features))
        _parallel("spmv")(*arrays, b, x.numpy(), out.numpy())
        return out

    return run


def _lookup_arrays(p: PackedWeight, bias: torch.Tensor | None) -> tuple[np.ndarray, ...]:
    """``p`` in ``lookup.py``'s layout (made once) and ``bias`` as it reads it."""
    from . import lookup

    if "lookup" not in p._cache:
        p._cache["lookup"] = lookup.build(p)
    return (*p._cache["lookup"], lookup.padded_bias(bias, p.out_features))


def _bind_lookup(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    arrays, out_features = _lookup_arrays(p, bias), p.out_features

    def kernel(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty((x.shape[0], out_features))
        _parallel("lookup")(*arrays, x.numpy(), out.numpy())
        return out

    return kernel


def _parallel(name: str) -> Callable:
    """Loop ``name``, or on more than one torch thread its parallel form over as many numba threads
    (so both sides of a comparison have the same)."""
    threads = torch.get_num_threads()
    if threads > 1:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        return _numba(f"{name}_parallel")
    return _numba(name)


def _bind_rows(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    arrays, b, out_features = _arrays(p), _bias(bias), p.out_features

    def run(x: torch.Tensor) -> torch.Tensor:
        xt = x.t().contiguous()  # each input feature's tokens contiguous (torch's copy beats numpy's)
        out = torch.empty((x.shape[0], out_features))  # not np.empty: see the module docstring
        _parallel("rows_tokens")(*arrays, b, xt.numpy(), out.numpy())
        return out

    return run


def _run_tiles(arrays: tuple, b: np.ndarray, x: torch.Tensor, out_features: int, layout: int) -> torch.Tensor:
    """``x @ W.T + b`` for ``x[T, in]``: ``[out, T']`` for ``tiling.COLUMNS``, else ``[T', out]``
    (``T'``: the tokens padded to whole tiles)."""
    width, loop = tiling.tile_for(x.shape[0])
    x3 = tiling.to_tiles(x, width)
    padded = x3.shape[0] * width
    out = torch.empty((out_features, padded) if layout == tiling.COLUMNS else (padded, out_features))
    chunk = (tiling.chunk(x.shape[1], width),) if loop == "tiles" else ()
    _parallel(loop)(*arrays, b, x3.numpy().reshape(-1), out.numpy().reshape(-1), x.shape[1], layout, *chunk)
    return out


def _bind_tiles(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    arrays, b, out_features = _arrays(p), _bias(bias), p.out_features
    layout = tiling.token_layout(out_features)
    return lambda x: _run_tiles(arrays, b, x, out_features, layout)[: x.shape[0]]


def _bind_torch(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    csr = p.csr()

    def run(x: torch.Tensor) -> torch.Tensor:
        y = torch.sparse.mm(csr, x.T).T  # [T, out], laid out [out, T]: written token-major below, in
        out = torch.empty(y.shape)  # the kernel, so that choose times the copy the layer would make
        return out.copy_(y) if bias is None else torch.add(y, bias, out=out)

    return run


def _bind_dense(p: PackedWeight, bias: torch.Tensor | None) -> Kernel:
    weight = p.dense()
    return lambda x: F.linear(x, weight, bias)


BINDERS: dict[str, Callable[[PackedWeight, torch.Tensor | None], Kernel]] = {
    "spmv": _bind_spmv,
    "rows": _bind_rows,
    "torch": _bind_torch,
    "dense": _bind_dense,
    "tiles": _bind_tiles,
    "lookup": _bind_lookup,  # new ones go last: kernel_choice stores kernels by their place here
}
"""Kernel name -> ``binder(packed, bias)`` giving the bound kernel."""


def bind(name: str, p: PackedWeight, bias: torch.Tensor | None = None) -> Kernel:
    """Kernel ``name`` for weight ``p`` and ``bias``: a function of ``x[T, in]``."""
    return BINDERS[name](p, bias)


def bind_one(name: str, p: PackedWeight, bias: torch.Tensor | None = None) -> Kernel:
    """Kernel ``name`` for a call of one token, ``x[..., in]`` of any leading shape to ``y[..., out]``
    (a decoding step). A one-token call is tens of microseconds, so its few tensor reshapes cost
    several percent: dense takes ``x`` as it comes, ``spmv`` and ``lookup`` reshape numpy views, not
    tensors."""
    if name == "dense":
        weight = p.dense()
        return lambda x: F.linear(x, weight, bias)
    if name in ("spmv", "lookup"):
        arrays = (*_arrays(p), _bias(bias)) if name == "spmv" else _lookup_arrays(p, bias)
        n_in, n_out, serial = p.in_features, p.out_features, _numba(name)

        def run(x: torch.Tensor) -> torch.Tensor:  # one token's output: too small for huge pages
            out = np.empty((*x.shape[:-1], n_out), dtype=np.float32)
            loop = serial if torch.get_num_threads() == 1 else _parallel(name)
            loop(*arrays, x.contiguous().numpy().reshape(1, n_in), out.reshape(1, n_out))
            return torch.from_numpy(out)

        return run
    kernel, n_in, n_out = bind(name, p, bias), p.in_features, p.out_features
    return lambda x: kernel(x.reshape(1, n_in).contiguous()).reshape(*x.shape[:-1], n_out)


def _call(name: str) -> Callable[..., torch.Tensor]:
    return lambda p, x, bias=None: BINDERS[name](p, bias)(x)


KERNELS: dict[str, Callable[..., torch.Tensor]] = {name: _call(name) for name in BINDERS}
"""Kernel name -> ``kernel(packed, x2d, bias=None)`` (binds, then calls)."""


ColumnKernel = Callable[[torch.Tensor, torch.Tensor], None]
"""A kernel on tokens as columns: writes ``W @ xt + b`` (``[out, T]``) into ``out_t`` from ``xt``
(``[in, T]``), both contiguous. A convolution's unfolded patches come this way round."""


def _columns_rows(p: PackedWeight, bias: torch.Tensor | None) -> ColumnKernel:
    arrays, b = _arrays(p), _bias(bias)
    return lambda xt, out_t: _parallel("rows")(*arrays, b, xt.numpy(), out_t.numpy())


def _columns_torch(p: PackedWeight, bias: torch.Tensor | None) -> ColumnKernel:
    csr, b = p.csr(), None if bias is None else bias.detach()[:, None]

    def run(xt: torch.Tensor, out_t: torch.Tensor) -> None:
        y = torch.sparse.mm(csr, xt)
        out_t.copy_(y) if b is None else torch.add(y, b, out=out_t)

    return run


def _columns_tiles(p: PackedWeight, bias: torch.Tensor | None) -> ColumnKernel:
    arrays, b, out_features = _arrays(p), _bias(bias), p.out_features

    def run(xt: torch.Tensor, out_t: torch.Tensor) -> None:
        out_t.copy_(_run_tiles(arrays, b, xt.T, out_features, tiling.COLUMNS)[:, : xt.shape[1]])

    return run


COLUMN_BINDERS: dict[str, Callable[[PackedWeight, torch.Tensor | None], ColumnKernel]] = {
    "rows": _columns_rows,
    "torch": _columns_torch,
    "tiles": _columns_tiles,
}
"""The sparse kernels that take tokens as columns (``spmv`` gathers one token at a time: it has none)."""


def bind_columns(name: str, p: PackedWeight, bias: torch.Tensor | None = None) -> ColumnKernel:
    """Kernel ``name`` for ``p`` and ``bias`` on tokens as columns (``ColumnKernel``)."""
    return COLUMN_BINDERS[name](p, bias)


def available_kernels(backend: str = "auto") -> list[str]:
    """The kernels a backend may choose from: ``"auto"`` every one that runs here, ``"torch"`` torch's own."""
    if backend == "torch":
        return ["torch", "dense"]
    return [k for k in NUMBA_KERNELS if runs_here(k)] + ["torch", "dense"]


def runs_here(name: str) -> bool:
    """Whether kernel ``name`` runs on this machine (numba's need numba; ``lookup``, AVX-512)."""
    from . import lookup

    if name == "lookup":
        return NUMBA and lookup.supported()
    return NUMBA or name not in NUMBA_KERNELS


def stand_in(name: str) -> str:
    """The kernel that runs for ``name`` where ``name`` does not (a model frozen on another machine):
    ``spmv`` for ``lookup``, ``torch`` for the other numba kernels without numba."""
    if runs_here(name):
        return name
    return "spmv" if name == "lookup" and NUMBA else "torch"
