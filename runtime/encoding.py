"""A sparse matmul's indices as one byte per nonzero: what a program stores and streams.

Placement gives each PE its nonzeros as CSC (``csc.py``): 16-bit row indices, 32-bit column offsets and
64-bit per-PE offsets, 8.3 bytes per nonzero with fp32 values on GPT-2 small at 90%. Streamed in from
off-mesh memory that way, the indices cost more than the values and cap the speedup (a weight load of
``b`` bytes per nonzero against 4 per dense weight caps it at ``4 / ((1 - s) b)``). A program stores
instead, per kernel:

- ``values``: the nonzeros as placed (the model's dtype, unchanged);
- ``index`` (uint8): each nonzero's gap from the one before it on its PE. A PE numbers its
  ``width x span`` slots column by column (slot ``column * span + row``, local to its input and output
  ranges); gap ``g`` (slots skipped) is written as ``g // 255`` bytes of 255, then ``g % 255``. Every
  nonzero therefore ends at a byte below 255, and a gap of 255 or more (rare above one nonzero in 255
  slots) costs one more byte per 255;
- ``pe_nnz``: nonzeros per PE, and ``out_lo``, ``out_hi``, ``in_lo``, ``in_hi``: each PE's ranges, all
  in the smallest integer type that holds them.

A PE decodes its gaps as they arrive, with one add and a compare per byte; the stream brings it a byte
every tens of cycles (150 GB/s over thousands of PEs), so decoding keeps pace and the cost rules charge
the load alone. Every reader takes the CSC form from ``sparse_arrays``, which decodes once per array set;
``decode(encode(a))`` is ``a``, dtypes included. Two nonzeros on one PE, ``W[0, 1] = 5`` and
``W[1, 2] = 7``, slots 2 and 5 of its 3 x 2:

    >>> csc = {"out_lo": torch.tensor([0], dtype=torch.int32), "out_hi": torch.tensor([2], dtype=torch.int32),
    ...        "in_lo": torch.tensor([0], dtype=torch.int32), "in_hi": torch.tensor([3], dtype=torch.int32),
    ...        "nz_ptr": torch.tensor([0, 2]), "col_ptr_off": torch.tensor([0, 4]),
    ...        "col_ptr": torch.tensor([0, 0, 1, 2], dtype=torch.int32),
    ...        "row_idx": torch.tensor([0, 1], dtype=torch.int16), "values": torch.tensor([5.0, 7.0])}
    >>> packed = encode(csc)
    >>> packed["index"].tolist(), packed["pe_nnz"].tolist(), packed["pe_nnz"].dtype
    ([2, 2], [2], torch.uint8)
    >>> all(torch.equal(decode(packed)[role], csc[role]) for role in csc)
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sparsefx.errors import ProgramFormatError

from . import compiled
from .memo import kept

if TYPE_CHECKING:
    from .program import Kernel, ProgramData

__all__ = [
    "int_bytes",
    "range_bytes",
    "CSC_ROLES",
    "PACKED_ROLES",
    "ESCAPE",
    "I16_SPAN",
    "row_index_dtype",
    "encode",
    "decode",
    "int32_if_fits",
    "is_packed",
    "sparse_arrays",
    "remember",
]

CSC_ROLES = ("out_lo", "out_hi", "in_lo", "in_hi", "nz_ptr", "col_ptr_off", "col_ptr", "row_idx", "values")
"""The roles of a sparse matmul's weight as placement gives it (``csc.py``)."""
PACKED_ROLES = ("out_lo", "out_hi", "in_lo", "in_hi", "pe_nnz", "index", "values")
"""The roles of the same weight as a program stores it."""
ESCAPE = 255
"""A gap byte that says: 255 more slots, and the gap goes on in the next byte."""
_RANGES = ("out_lo", "out_hi", "in_lo", "in_hi")
I16_SPAN = 2**15
"""Placement's rule for CSC row indices: 16-bit while every PE's output span is below this, else 32-bit."""


def row_index_dtype(spans: torch.Tensor) -> torch.dtype:
    """The dtype of CSC row indices for PEs whose output spans are ``spans`` (``I16_SPAN``).

    >>> row_index_dtype(torch.tensor([12, 48])), row_index_dtype(torch.tensor([2**15]))
    (torch.int16, torch.int32)
    """
    return torch.int32 if len(spans) and int(spans.max()) >= I16_SPAN else torch.int16


def int32_if_fits(values: torch.Tensor, bound: int) -> torch.Tensor:
    """``values`` as int32 when every one is below ``bound`` < 2**31, else as they are: int32 sort keys
    sort about twice as fast.

    >>> int32_if_fits(torch.tensor([3, 9]), 10).dtype, int32_if_fits(torch.tensor([3]), 2**31).dtype
    (torch.int32, torch.int64)
    """
    return values.to(torch.int32) if bound < 2**31 else values


def is_packed(roles: object) -> bool:
    """Whether a kernel's arrays (a mapping or collection of roles) hold the packed form.

    >>> is_packed({"index": None, "values": None}), is_packed(("row_idx", "values"))
    (True, False)
    """
    return "index" in roles  # type: ignore[operator]


def int_bytes(most: int) -> int:
    """Bytes of the narrowest integer type ``encode`` stores a range in whose entries reach ``most`` (>= 0).

    >>> int_bytes(255), int_bytes(768), int_bytes(50257)
    (1, 2, 4)
    """
    return 1 if most < 2**8 else 2 if most < 2**15 else 4 if most < 2**31 else 8


def range_bytes(in_features: int, out_features: int) -> int:
    """Bytes of one PE's ranges (``in_lo``, ``in_hi``, ``out_lo``, ``out_hi``) packed, for a layout whose
    ranges stay inside the features (a dense layout's).

    >>> range_bytes(768, 3072), range_bytes(128, 64)
    (8, 4)
    """
    return 2 * int_bytes(in_features) + 2 * int_bytes(out_features)


def _smallest(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the narrowest of uint8, int16, int32 and int64 that holds every entry."""
    lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 0)
    if lo >= 0 and hi < 2**8:
        return t.to(torch.uint8)
    for dtype, bits in ((torch.int16, 15), (torch.int32, 31)):
        if -(2**bits) <= lo and hi < 2**bits:
            return t.to(dtype)
    return t.to(torch.int64)


def _columns(col_off: torch.Tensor, col_ptr: torch.Tensor, nnz: int) -> torch.Tensor:
    """The local column of each nonzero (int64, in storage order) from the CSC column offsets."""
    pes = len(col_off) - 1
    entries = col_off.diff()
    pe_of_entry = torch.repeat_interleave(torch.arange(pes, device=col_off.device), entries)
    local = torch.arange(len(col_ptr), device=col_off.device) - col_off[:-1][pe_of_entry]
    opens = local < entries[pe_of_entry] - 1  # each PE's last entry closes its last column
    counts = col_ptr.diff()[opens[:-1]] if len(col_ptr) else col_ptr
    return torch.repeat_interleave(local[opens], counts, output_size=nnz)


def encode(arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The packed form of placed CSC ``arrays`` (module docstring); None where it would not be smaller
    (gaps of thousands of slots, as at 99.9%), or cannot be made: without per-PE input ranges, or with
    rows out of order in a column (placement keeps them in order)."""
    if any(role not in arrays for role in CSC_ROLES):
        return None
    nz_ptr = arrays["nz_ptr"].to(torch.int64)
    nnz = nz_ptr.diff()
    span = arrays["out_hi"].to(torch.int64) - arrays["out_lo"].to(torch.int64)
    n = int(nz_ptr[-1])
    parts = (nz_ptr, arrays["col_ptr_off"], arrays["col_ptr"], arrays["row_idx"], span)
    gap = compiled.gaps(*parts) if compiled.available(*parts) else _gaps(*parts)
    if gap is None:
        return None
    if not n or int(gap.max()) < ESCAPE:  # no escapes: a byte a nonzero
        index = gap.to(torch.uint8)
    else:
        escapes, last = gap // ESCAPE, gap % ESCAPE
        ends = torch.cumsum(escapes + 1, 0) - 1
        index = torch.full((int(ends[-1]) + 1,), ESCAPE, dtype=torch.uint8, device=gap.device)
        index[ends] = last.to(torch.uint8)
    packed = {role: _smallest(arrays[role].to(torch.int64)) for role in _RANGES}
    packed |= {"pe_nnz": _smallest(nnz), "index": index, "values": arrays["values"]}
    if _nbytes(packed) >= _nbytes({role: arrays[role] for role in CSC_ROLES}):
        return None
    return packed


def _gaps(
    nz_ptr: torch.Tensor,
    col_off: torch.Tensor,
    col_ptr: torch.Tensor,
    row_idx: torch.Tensor,
    span: torch.Tensor,
) -> torch.Tensor | None:
    """Each nonzero's slots skipped since the one before it on its PE (tensor form of
    ``compiled.gaps``); None where a row leaves its span or goes back within a column."""
    nnz, n = nz_ptr.diff(), int(nz_ptr[-1])
    pe = torch.repeat_interleave(torch.arange(len(nnz), device=nnz.device), nnz, output_size=n)
    row = row_idx.to(torch.int64)
    slot = _columns(col_off.to(torch.int64), col_ptr.to(torch.int64), n) * span[pe] + row
    before = torch.full_like(slot, -1)
    before[1:] = slot[:-1]
    before[nz_ptr[:-1][nnz > 0]] = -1  # each PE's first gap counts from before its slot 0
    gap = slot - before - 1
    if n and (bool((gap < 0).any()) or bool((row >= span[pe]).any()) or bool((row < 0).any())):
        return None
    return gap


def _nbytes(arrays: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in arrays.values())


def decode(arrays: dict[str, torch.Tensor], where: str = "sparse matmul") -> dict[str, torch.Tensor]:
    """The CSC form (``CSC_ROLES``, with placement's dtypes) of packed ``arrays``; other roles (the
    bias) pass through, and arrays already in CSC form come back as they are. ``ProgramFormatError``
    names what is inconsistent: a byte stream that does not end a nonzero, more or fewer nonzeros than
    ``pe_nnz`` counts, a slot outside its PE's ranges."""
    if not is_packed(arrays):
        return dict(arrays)
    missing = [role for role in PACKED_ROLES if role not in arrays]
    if missing:
        raise ProgramFormatError(f"{where}: packed arrays name {', '.join(PACKED_ROLES)}; {missing} missing")
    index, counts = arrays["index"], arrays["pe_nnz"].to(torch.int64)
    dev = index.device
    lo, hi = (arrays[r].to(torch.int64) for r in ("out_lo", "out_hi"))
    in_lo, in_hi = (arrays[r].to(torch.int64) for r in ("in_lo", "in_hi"))
    pes = len(counts)
    if index.dtype != torch.uint8 or any(len(arrays[r]) != pes for r in _RANGES):
        raise ProgramFormatError(
            f"{where}: index has dtype {index.dtype} (uint8 expected) or the ranges do not number "
            f"{pes} PEs as pe_nnz does"
        )
    span, width = hi - lo, in_hi - in_lo
    if bool((counts < 0).any() | (span < 0).any() | (width < 0).any()):
        raise ProgramFormatError(f"{where}: pe_nnz or a PE's range is negative")
    nz_ptr = torch.zeros(pes + 1, dtype=torch.int64, device=dev)
    torch.cumsum(counts, 0, out=nz_ptr[1:])
    n = int(nz_ptr[-1])
    ends = (index != ESCAPE).nonzero().view(-1)
    if len(ends) != n or len(arrays["values"]) != n or (n and int(ends[-1]) != len(index) - 1):
        raise ProgramFormatError(
            f"{where}: index ends {len(ends)} nonzeros in {len(index)} bytes"
            f"{' (its last byte is an escape)' if len(index) and int(index[-1]) == ESCAPE else ''}; "
            f"pe_nnz counts {n} and values holds {len(arrays['values'])}"
        )
    starts = torch.zeros_like(ends)
    starts[1:] = ends[:-1] + 1
    step = (ends - starts) * ESCAPE + index[ends].to(torch.int64) + 1
    run = torch.cumsum(step, 0)
    pe = torch.repeat_interleave(torch.arange(pes, device=dev), counts, output_size=n)
    base = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), run])[nz_ptr[:-1]]
    slot = run - base[pe] - 1
    if n and bool((slot >= (span * width)[pe]).any()):
        bad = int(pe[int((slot >= (span * width)[pe]).nonzero()[0])])
        raise ProgramFormatError(
            f"{where}: PE {bad}'s gaps pass its last slot "
            f"({int(width[bad])} inputs x {int(span[bad])} outputs)"
        )
    column = slot // span.clamp(min=1)[pe]
    row = slot - column * span[pe]
    col_off = torch.zeros(pes + 1, dtype=torch.int64, device=dev)
    torch.cumsum(width + 1, 0, out=col_off[1:])
    hits = torch.bincount(col_off[:-1][pe] + column + 1, minlength=int(col_off[-1]))
    ran = torch.cumsum(hits, 0)
    entries = torch.repeat_interleave(torch.arange(pes, device=dev), width + 1, output_size=len(hits))
    col_ptr = ran - ran[col_off[:-1]][entries]
    csc = {r: arrays[r].to(torch.int32) for r in _RANGES}
    csc |= {"nz_ptr": nz_ptr, "col_ptr_off": col_off, "col_ptr": col_ptr.to(torch.int32)}
    csc |= {"row_idx": row.to(row_index_dtype(span)), "values": arrays["values"]}
    rest = {role: t for role, t in arrays.items() if role not in PACKED_ROLES}
    return csc | rest


def sparse_arrays(program: ProgramData, k: Kernel, where: str = "") -> dict[str, torch.Tensor]:
    """Kernel ``k``'s arrays by role, its weight in CSC form (decoded once per set of arrays, then kept);
    ``decode``'s errors start with ``where`` (default: the kernel's name)."""
    arrays = {role: program.arrays[name] for role, name in k.arrays.items()}
    if not is_packed(arrays):
        return arrays
    return kept(arrays["index"], _key(arrays), lambda: decode(arrays, where or f"kernel {k.name!r}"))


def remember(program: ProgramData, k: Kernel, csc: dict[str, torch.Tensor]) -> None:
    """Keep ``csc`` (placed CSC arrays) as the decoded form of ``k``'s packed arrays, so that a lowering
    that packs what it has just placed does not decode it again. The program's own ``values`` and bias
    stand in for ``csc``'s, as ``decode`` would give them."""
    arrays = {role: program.arrays[name] for role, name in k.arrays.items()}
    rest = {role: t for role, t in arrays.items() if role not in PACKED_ROLES}
    decoded = {role: csc[role] for role in CSC_ROLES} | rest | {"values": arrays["values"]}
    kept(arrays["index"], _key(arrays), lambda: decoded)


def _key(arrays: dict[str, torch.Tensor]) -> tuple:
    """What the decoded form of a kernel's ``arrays`` is kept under: each array's identity and version."""
    return ("csc",) + tuple((role, id(t), t._version) for role, t in sorted(arrays.items()))
