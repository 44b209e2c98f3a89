"""A sparse weight packed for inference: its kept values in compressed rows (CSR).

``pack(weight, mask)`` keeps the entries the mask keeps, row by row (an output feature a row), with
int32 column indices and row pointers (the kernels read them as uint32, the same bits). Values keep
the weight's dtype. The three tensors are what a frozen layer stores (``state_dict``), so a frozen
model's size is its nonzeros' values and indices, not the dense weight::

    >>> import torch
    >>> w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    >>> p = pack(w, w != 0)
    >>> p.indptr.tolist(), p.indices.tolist(), p.values.tolist(), p.nbytes
    ([0, 2, 3], [0, 2, 1], [1.0, 2.0, 3.0], 36)
    >>> torch.equal(p.dense(), w)
    True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from sparsefx.errors import FreezeError

__all__ = ["PackedWeight", "pack"]

_MAX_INDEX = 2**31 - 1


@dataclass
class PackedWeight:
    """A ``[out_features, in_features]`` weight's kept entries in CSR form."""

    values: torch.Tensor  # [nnz], the weight's dtype
    indices: torch.Tensor  # [nnz] int32: each value's input feature
    indptr: torch.Tensor  # [out_features + 1] int32: where each output feature's values start
    in_features: int
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def out_features(self) -> int:
        return self.indptr.numel() - 1

    @property
    def nnz(self) -> int:
        return self.values.numel()

    @property
    def density(self) -> float:
        return self.nnz / max(self.out_features * self.in_features, 1)

    @property
    def nbytes(self) -> int:
        """Bytes the packed form stores: values, indices and row pointers."""
        return sum(t.numel() * t.element_size() for t in (self.values, self.indices, self.indptr))

    def csr(self) -> torch.Tensor:
        """The weight as a torch sparse CSR tensor (made once)."""
        if "csr" not in self._cache:
            size = (self.out_features, self.in_features)
            with warnings.catch_warnings():  # torch's "beta" notice, once per process otherwise
                warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
                self._cache["csr"] = torch.sparse_csr_tensor(
                    self.indptr, self.indices, self.values, size, check_invariants=False
                )
        return self._cache["csr"]

    def dense(self) -> torch.Tensor:
        """The masked weight, dense (made once: the ``dense`` kernel's operand)."""
        if "dense" not in self._cache:
            self._cache["dense"] = self.csr().to_dense()
        return self._cache["dense"]


def pack(weight: torch.Tensor, mask: torch.Tensor) -> PackedWeight:
    """``weight`` (``[out, in]``) where ``mask`` keeps it, in CSR form; a pruned NaN does not survive."""
    if weight.dim() != 2 or tuple(mask.shape) != tuple(weight.shape):
        raise FreezeError(
            f"a packed weight is 2-D with a mask of its shape; got weight {list(weight.shape)}, "
            f"mask {list(mask.shape)}"
        )
    if max(weight.shape) > _MAX_INDEX:
        raise FreezeError(f"weight {list(weight.shape)} has a dim over {_MAX_INDEX}, past int32 indices")
    w = weight.detach().to("cpu")
    keep = mask.to("cpu", torch.bool)
    rows, cols = keep.nonzero(as_tuple=True)  # row-major order: each row's columns ascending
    counts = torch.bincount(rows, minlength=w.shape[0])
    indptr = torch.zeros(w.shape[0] + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(counts, 0)
    return PackedWeight(
        values=w[rows, cols].contiguous(),
        indices=cols.to(torch.int32),
        indptr=indptr.to(torch.int32),
        in_features=int(w.shape[1]),
    )
