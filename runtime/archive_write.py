"""Writing program files (``.sfxp``; ``runtime/archive.py`` describes the format and loads them).

Only the writer: it sits below ``DataflowProgram`` (``runtime/dataflow.py``), whose ``save()`` it is, and
takes any ``ProgramData``. The format's names and limits are here, and ``archive.py`` re-exports them::

    >>> MEMBERS, FORMAT, FORMAT_VERSION, READS_VERSIONS
    (('manifest.json', 'program.txt', 'tensors.safetensors'), 'sparsefx-program', 5, (1, 2, 3, 4, 5))
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import zipfile
from pathlib import Path
from typing import IO, BinaryIO

import torch

from sparsefx import __version__
from sparsefx.atomic import atomic_write, temp_path
from sparsefx.errors import ProgramWriteError, VerifyError

from .program import DTYPES, ProgramData
from .textprint import print_program

__all__ = [
    "save_program",
    "program_counts",
    "file_sha256",
    "FORMAT",
    "FORMAT_VERSION",
    "READS_VERSIONS",
    "MANIFEST",
    "TEXT",
    "TENSORS",
    "MEMBERS",
    "COUNTS",
    "MAX_MANIFEST_BYTES",
    "MAX_TEXT_BYTES",
]

FORMAT = "sparsefx-program"
FORMAT_VERSION = 5
"""The manifest's ``format_version`` this sparsefx writes. 2: the hardware line has
``vector_start_cycles``. 3: the hardware line has ``sram_bytes_per_cycle`` and the output tree may
have ``cat`` nodes (``runtime/outputs.py``). 4: a sparse matmul may store its weight packed
(``runtime/encoding.py``: ``index``, ``pe_nnz``). 5: a kernel may run in row tiles
(``attrs["row_tiles"]``, ``runtime/tiles.py``), a streaming embedding may take its rows from the host
(``attrs["gather"]``) and a layout kernel may apply a chain of layout steps (``fn: chain``): an older
sparsefx would time or run such a program differently, so it refuses the file. Files of
``READS_VERSIONS`` load (a field an older file lacks takes its default); any other version is
refused, naming both."""

READS_VERSIONS = (1, 2, 3, 4, 5)

MANIFEST, TEXT, TENSORS = "manifest.json", "program.txt", "tensors.safetensors"
MEMBERS = (MANIFEST, TEXT, TENSORS)
"""The members of a program file, in the order they are written (sorted)."""

MAX_MANIFEST_BYTES = 2**20
MAX_TEXT_BYTES = 64 * 2**20
"""Largest manifest and text form read (and written)."""

COUNTS = ("arrays", "inputs", "kernels", "outputs", "payload_bytes", "routes")
"""The keys of the manifest's ``counts`` (``program_counts``)."""

_ALIGN = 64  # the tensors member's data starts at a multiple of this in the file
_ALIGN_TAG = 0xD935  # the zip extra field that pads a local header for alignment (as zipalign writes)
_ZIP64_FROM = 2**31  # members this large get zip64 headers
_DATE = (1980, 1, 1, 0, 0, 0)  # the zip epoch: fixed, so that the same program gives the same bytes
_CHUNK = 8 * 2**20


def save_program(program: ProgramData, path: str | os.PathLike[str]) -> None:
    """Write ``program`` (structure and payloads) to the program file ``path``, atomically.

    Every array of ``program.specs`` must have its payload in ``program.arrays``, of the spec's dtype
    and shape, and there must be no other (``VerifyError`` otherwise). A failed write (no space left,
    no permission) is a ``ProgramWriteError``; the old file, if any, is left intact.
    """
    path = Path(path)
    arrays = _payloads(program)
    text = print_program(program).encode("utf-8")
    if len(text) > MAX_TEXT_BYTES:
        raise VerifyError(
            f"the program's text form is {len(text)} bytes; program files hold at most {MAX_TEXT_BYTES}"
        )
    counts = program_counts(program)
    atomic_write(
        path, lambda file: _write(file, path, text, arrays, counts), ProgramWriteError, "program file"
    )


def _payloads(program: ProgramData) -> dict[str, torch.Tensor]:
    """The arrays to write, sorted by name, on the CPU, contiguous, none sharing memory with another."""
    missing = [name for name in program.specs if name not in program.arrays]
    if missing:
        raise VerifyError(
            f"array {missing[0]!r} has no payload ({len(missing)} of {len(program.specs)} missing; a program "
            "parsed from text has none): only a program with all its payloads can be saved"
        )
    extra = sorted(set(program.arrays) - set(program.specs))
    if extra:
        raise VerifyError(f"payload {extra[0]!r} has no array spec; every payload needs one in program.specs")
    out: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name in sorted(program.specs):
        spec, tensor = program.specs[name], program.arrays[name]
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != DTYPES.get(spec.dtype):
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise VerifyError(f"payload {name!r} is {kind}, but its spec says {spec.dtype}")
        if tuple(tensor.shape) != tuple(spec.shape):
            raise VerifyError(
                f"payload {name!r} has shape {tuple(tensor.shape)}, its spec {tuple(spec.shape)}"
            )
        tensor = tensor.detach().to("cpu").contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        if tensor.numel() and ptr in storages:  # safetensors refuses tensors that share memory
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def program_counts(program: ProgramData) -> dict[str, int]:
    """The manifest's ``counts`` of ``program`` (the keys of ``COUNTS``)."""
    return {
        "arrays": len(program.specs),
        "inputs": len(program.inputs),
        "kernels": len(program.kernels),
        "outputs": len(program.outputs),
        "payload_bytes": sum(spec.nbytes for spec in program.specs.values()),
        "routes": len(program.routes),
    }


def _write(
    file: BinaryIO, path: Path, text: bytes, arrays: dict[str, torch.Tensor], counts: dict[str, int]
) -> None:
    """The zip: safetensors writes the payloads to a scratch file next to ``path``, copied in aligned."""
    from safetensors.torch import save_file

    scratch = temp_path(path)
    try:
        save_file(arrays, str(scratch))
        with open(scratch, "rb", buffering=0) as src:
            size = os.fstat(src.fileno()).st_size
            digest = file_sha256(src, 0, size)
            manifest = {
                "counts": counts,
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "members": {
                    TEXT: {"sha256": hashlib.sha256(text).hexdigest(), "size": len(text)},
                    TENSORS: {"sha256": digest, "size": size},
                },
                "sparsefx_version": __version__,
            }
            with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                archive.writestr(
                    _info(MANIFEST), (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
                )
                archive.writestr(_info(TEXT), text)
                _copy_aligned(archive, file, src, size)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(scratch)


def _info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # unix, on every platform
    info.external_attr = 0o644 << 16
    return info


def _copy_aligned(archive: zipfile.ZipFile, file: BinaryIO, src: IO[bytes], size: int) -> None:
    """Copy ``src`` in as the tensors member, its data starting at a multiple of ``_ALIGN``.

    A local header is 30 bytes, the name, the extra fields (zip64's is 20 bytes); an alignment extra
    field (tag 0xD935: the alignment, then zeros) pads it.
    """
    info = _info(TENSORS)
    info.file_size = size
    zip64 = size >= _ZIP64_FROM
    header = file.tell() + 30 + len(TENSORS.encode()) + (20 if zip64 else 0) + 6
    pad = -header % _ALIGN
    info.extra = struct.pack("<3H", _ALIGN_TAG, 2 + pad, _ALIGN) + bytes(pad)
    src.seek(0)
    with archive.open(info, "w", force_zip64=zip64) as out:
        buffer = bytearray(min(_CHUNK, max(size, 1)))
        view = memoryview(buffer)
        while n := src.readinto(view):
            out.write(view[:n])


def file_sha256(file: IO[bytes], offset: int, size: int) -> str:
    """sha256 of the ``size`` bytes at ``offset``, read in chunks (not through the mapping, so that the
    process's resident memory does not grow); a file that ends early gives the digest of what is there."""
    digest = hashlib.sha256()
    buffer = bytearray(min(_CHUNK, max(size, 1)))
    view = memoryview(buffer)
    file.seek(offset)
    left = size
    while left and (n := file.readinto(view[: min(left, len(buffer))])):
        digest.update(view[:n])
        left -= n
    return digest.hexdigest()
