"""Storing a sparse matmul's placed weight in its program: packed (``runtime/encoding.py``) where that is
smaller, under the kernel's own array names, replacing any layout stored before.

    >>> import torch
    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.program import Kernel, ProgramData, Region
    >>> from sparsefx.passes.lower.place_sparse import place_sparse
    >>> p = ProgramData(MeshSpec(2, 2), HardwareSpec(), "streaming", "block")
    >>> k = Kernel("mm", "sparse_matmul", Region(0, 0, 2, 2), ("x",), (1, 8), "float32")
    >>> weight = torch.arange(64.0).view(8, 8)
    >>> placed = place_sparse(weight, weight % 3 == 0, 2, 2, "block")
    >>> install(p, k, placed)
    >>> sorted(k.arrays), torch.equal(p.array(k, "row_idx"), placed["row_idx"])
    (['in_hi', 'in_lo', 'index', 'out_hi', 'out_lo', 'pe_nnz', 'values'], True)
"""

from __future__ import annotations

import torch

from sparsefx.runtime.encoding import CSC_ROLES, PACKED_ROLES, encode, remember
from sparsefx.runtime.program import Kernel, ProgramData

__all__ = ["install"]


def install(program: ProgramData, k: Kernel, placed: dict[str, torch.Tensor]) -> None:
    """Store ``placed`` (``place_sparse``'s CSC arrays) as ``k``'s weight, packed when smaller; the
    arrays of the other form, from an earlier layout, are dropped. A bias already stored stays."""
    packed = encode(placed)
    stored = packed if packed is not None else placed
    for role in set(CSC_ROLES) | set(PACKED_ROLES):
        if role not in stored and role in k.arrays:
            name = k.arrays.pop(role)
            program.arrays.pop(name, None)
            program.specs.pop(name, None)
    for role, tensor in stored.items():
        k.arrays[role] = program.add_array(f"{k.name}.{role}", tensor)
    if packed is not None:
        remember(program, k, placed)
