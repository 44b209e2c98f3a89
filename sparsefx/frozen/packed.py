"""A sparse weight packed for inference: its kept values in compressed rows (CSR).

``pack(weight, mask)`` keeps the entries the mask keeps, row by row (an output feature a row). Column
indices take 16 bits where the weight has at most 65,536 input features (GPT-2's and LLaMA's layers
do), else 32; row pointers take 32. torch has no unsigned 16-bit kernels, so 16-bit indices are
stored as int16 and read as uint16 (``unsigned_indices``, the same bits). Values keep the weight's
dtype. The three tensors are what a frozen layer stores (``state_dict``), so a frozen model's size is
its nonzeros' values and indices, not the dense weight::

    >>> import torch
    >>> w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    >>> p = pack(w, w != 0)
    >>> p.indptr.tolist(), p.indices.tolist(), p.values.tolist(), p.indices.dtype, p.nbytes
    ([0, 2, 3], [0, 2, 1], [1.0, 2.0, 3.0], torch.int16, 30)
    >>> torch.equal(p.dense(), w)
    True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from sparsefx.errors import FreezeError

__all__ = ["PackedWeight", "pack", "SHORT"]

_MAX_INDEX = 2**31 - 1
SHORT = 2**16
"""Input features up to which column indices take 16 bits."""


@dataclass
class PackedWeight:
    """A ``[out_features, in_features]`` weight's kept entries in CSR form."""

    values: torch.Tensor  # [nnz], the weight's dtype
    indices: torch.Tensor  # [nnz] int16 (read unsigned) or int32: each value's input feature
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

    def unsigned_indices(self) -> torch.Tensor:
        """The column indices as int32 (16-bit ones read unsigned): what torch's CSR tensor takes."""
        if self.indices.dtype == torch.int16:
            return self.indices.to(torch.int32) & 0xFFFF
        return self.indices

    def csr(self) -> torch.Tensor:
        """The weight as a torch sparse CSR tensor (made once)."""
        if "csr" not in self._cache:
            size = (self.out_features, self.in_features)
            with warnings.catch_warnings():  # torch's "beta" notice, once per process otherwise
                warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
                self._cache["csr"] = torch.sparse_csr_tensor(
                    self.indptr, self.unsigned_indices(), self.values, size, check_invariants=False
                )
        return self._cache["csr"]

    def check(self, where: str) -> None:
        """Raise ``FreezeError`` unless the arrays are a valid CSR weight (the kernels do not bound-check:
        a loaded state is checked before they read it). ``where`` names it in the message."""
        fail = _invalid(self)
        if fail:
            raise FreezeError(f"{where}: {fail}; a frozen layer's state is what sparsefx.freeze wrote")

    def dense(self) -> torch.Tensor:
        """The masked weight, dense (made once: the ``dense`` kernel's operand)."""
        if "dense" not in self._cache:
            self._cache["dense"] = self.csr().to_dense()
        return self._cache["dense"]


def _invalid(p: PackedWeight) -> str:
    """What is wrong with ``p``'s arrays ("" when nothing is)."""
    if p.indices.dtype not in (torch.int16, torch.int32) or p.indptr.dtype != torch.int32:
        return f"indices are {p.indices.dtype} and row pointers {p.indptr.dtype} (int16 or int32, and int32)"
    if p.indices.dim() != 1 or p.values.shape != p.indices.shape or p.indptr.dim() != 1 or not len(p.indptr):
        return f"{p.values.numel()} values, {p.indices.numel()} indices: one index a value, and row pointers"
    ptr = p.indptr.to(torch.int64)
    if int(ptr[0]) != 0 or int(ptr[-1]) != p.nnz or bool((ptr[1:] < ptr[:-1]).any()):
        return f"row pointers run from {int(ptr[0])} to {int(ptr[-1])}, not rising from 0 to {p.nnz}"
    cols = p.unsigned_indices()
    if p.nnz and (int(cols.min()) < 0 or int(cols.max()) >= p.in_features):
        return f"column indices reach {int(cols.max())}; valid ones are 0 to {p.in_features - 1}"
    return ""


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
        indices=cols.to(torch.int16 if w.shape[1] <= SHORT else torch.int32),
        indptr=indptr.to(torch.int32),
        in_features=int(w.shape[1]),
    )
