"""Tensors in a safetensors buffer, without copying: a strict header check, then ``torch.frombuffer``.

A safetensors buffer is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``)
and the data, whose byte ranges the header lists. ``read_header`` checks the header strictly:
its length bounded, valid UTF-8 JSON without repeated keys, known dtypes only (no pickled objects),
shapes of non-negative ints, and ranges that are ``numel * itemsize`` long and tile the data exactly
(in order, no gap, no overlap, nothing past the end). ``tensors`` then views each range in place::

    >>> from safetensors.torch import save
    >>> raw = bytearray(save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}))
    >>> header, start = read_header(raw)
    >>> header["w"]
    Entry(dtype='float32', shape=(2, 3), begin=0, end=24)
    >>> tensors(raw)["w"].sum().item()
    15.0
    >>> read_header(raw[:20])
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: the safetensors header says 64 bytes, but only 12 follow

Views keep the buffer alive (through a ``memoryview`` export, so an ``mmap`` under them cannot be
closed); a writable buffer gives writable tensors. Messages do not name the file; the caller adds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from sparsefx.errors import ProgramFormatError

from .program import DTYPES
from .strict_json import loads

__all__ = ["Entry", "read_header", "tensors", "SAFETENSORS_DTYPES", "MAX_HEADER_BYTES", "MAX_DIMS"]

SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
"""safetensors dtype codes -> the program dtype names (``runtime.program.DTYPES``) they read as."""

MAX_HEADER_BYTES = 100 * 2**20
"""Largest header read (the limit the safetensors library itself uses)."""

MAX_DIMS = 64
"""Most dims a tensor may have."""

_ITEMSIZE = {name: torch.empty((), dtype=DTYPES[name]).element_size() for name in SAFETENSORS_DTYPES.values()}
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


@dataclass(frozen=True)
class Entry:
    """One tensor of the header: its dtype (a program dtype name), shape and byte range in the data."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(buf: Any, offset: int = 0, size: int | None = None) -> tuple[dict[str, Entry], int]:
    """``({name: Entry}, data start)`` of the safetensors bytes ``buf[offset : offset + size]``.

    The data start is an offset in ``buf``; entries' ranges are relative to it. ``__metadata__``
    (a string -> string table) is checked and left out.
    """
    view = memoryview(buf).cast("B")
    size = len(view) - offset if size is None else size
    if offset < 0 or size < 0 or offset + size > len(view):
        raise ProgramFormatError(f"safetensors range [{offset}, {offset + size}) is outside the buffer")
    if size < 8:
        raise ProgramFormatError(f"the safetensors data is {size} bytes; it needs an 8-byte header length")
    length = int.from_bytes(view[offset : offset + 8], "little")
    if length > MAX_HEADER_BYTES:
        raise ProgramFormatError(
            f"the safetensors header says {length} bytes; at most {MAX_HEADER_BYTES} are read"
        )
    if length > size - 8:
        raise ProgramFormatError(f"the safetensors header says {length} bytes, but only {size - 8} follow")
    raw = bytes(view[offset + 8 : offset + 8 + length])
    view.release()
    header = _parse_json(raw)
    data_size = size - 8 - length
    entries = {name: _entry(name, value) for name, value in header.items() if name != "__metadata__"}
    if "__metadata__" in header:
        _check_metadata(header["__metadata__"])
    _check_tiling(entries, data_size)
    return entries, offset + 8 + length


def tensors(buf: Any, offset: int = 0, size: int | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors bytes ``buf[offset : offset + size]``, viewed in place.

    A tensor whose data is not aligned to its item size is copied instead (safetensors writers align
    them; a foreign file may not). ``bool`` tensors must hold only 0 and 1.
    """
    entries, start = read_header(buf, offset, size)
    view = memoryview(buf).cast("B")
    out: dict[str, torch.Tensor] = {}
    for name, e in entries.items():
        dtype = DTYPES[e.dtype]
        if e.begin == e.end:
            out[name] = _empty(name, e.shape, dtype)
            continue
        chunk = view[start + e.begin : start + e.end]
        if (start + e.begin) % _ITEMSIZE[e.dtype] or chunk.readonly:
            chunk = bytearray(chunk)
        flat = torch.frombuffer(chunk, dtype=dtype)
        if e.dtype == "bool" and bool((flat.view(torch.uint8) > 1).any()):
            raise ProgramFormatError(
                f"safetensors tensor {name!r} is bool but holds bytes other than 0 and 1"
            )
        out[name] = flat.view(e.shape)
    return out


def _empty(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    try:
        return torch.empty(shape, dtype=dtype)
    except (RuntimeError, ValueError, OverflowError) as exc:
        raise ProgramFormatError(
            f"safetensors tensor {name!r}: shape {_short(shape)} is not valid ({exc})"
        ) from None


def _parse_json(raw: bytes) -> dict[str, Any]:
    if not raw.startswith(b"{"):
        raise ProgramFormatError(f"the safetensors header does not start with '{{' (it starts {raw[:16]!r})")
    header = loads(raw, "the safetensors header")
    if not isinstance(header, dict):
        raise ProgramFormatError("the safetensors header is not a JSON object")
    return header


def _entry(name: str, value: Any) -> Entry:
    where = f"safetensors tensor {name!r}"
    if not isinstance(value, dict) or set(value) != _ENTRY_KEYS:
        raise ProgramFormatError(f"{where}: expected an object with keys dtype, shape and data_offsets")
    code = value["dtype"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        raise ProgramFormatError(
            f"{where}: dtype {code!r} is not one programs store ({', '.join(SAFETENSORS_DTYPES)})"
        )
    shape = value["shape"]
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_count(d) for d in shape):
        raise ProgramFormatError(
            f"{where}: shape {_short(shape)} is not a list of at most {MAX_DIMS} non-negative ints"
        )
    offsets = value["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(v) for v in offsets):
        raise ProgramFormatError(f"{where}: data_offsets {_short(offsets)} is not [begin, end] of ints >= 0")
    begin, end = offsets
    dtype = SAFETENSORS_DTYPES[code]
    nbytes = math.prod(shape) * _ITEMSIZE[dtype]
    if end - begin != nbytes:
        raise ProgramFormatError(
            f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but shape {shape} of {code} "
            f"needs {nbytes}"
        )
    return Entry(dtype, tuple(shape), begin, end)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_metadata(meta: Any) -> None:
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ProgramFormatError("the safetensors __metadata__ is not a table of strings")


def _check_tiling(entries: dict[str, Entry], data_size: int) -> None:
    """The ranges must cover the data exactly: in order, no gap, no overlap, nothing past the end."""
    at = 0
    for name, e in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if e.begin != at:
            what = "overlaps the tensor before it" if e.begin < at else f"leaves a gap after byte {at}"
            raise ProgramFormatError(
                f"safetensors tensor {name!r}: data_offsets [{e.begin}, {e.end}] {what}; "
                "tensors must tile the data exactly"
            )
        at = e.end
    if at != data_size:
        raise ProgramFormatError(
            f"the safetensors tensors cover {at} bytes of data, but the data is {data_size} bytes"
        )
