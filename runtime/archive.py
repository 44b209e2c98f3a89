"""Program files (``.sfxp``): a program's text form and payloads in one zip, loaded memory-mapped.

``load_program`` is here and builds the public ``DataflowProgram``; ``save_program`` (re-exported) is in
``runtime/archive_write.py``, below ``DataflowProgram``, whose ``save()`` it is.

A program file is a zip of exactly three members, all stored uncompressed (``ZIP_STORED``):

- ``manifest.json``: ``{"format": "sparsefx-program", "format_version": 5, "sparsefx_version": ...,
  "counts": {kernels, routes, inputs, outputs, arrays, payload_bytes}, "members": {name: {size, sha256}}}``
  (the sha256 of each other member);
- ``program.txt``: the text form (``runtime/text.py``);
- ``tensors.safetensors``: every array of ``program.arrays``, by its name.

Saving is deterministic (fixed timestamps, sorted names, no random metadata) and atomic (a temp
file next to the target, fsync, ``os.replace``; on any error the old file is intact). Loading checks
the manifest, its version and the hashes, parses the text, then views the payloads in place:
``torch.frombuffer`` over a private (copy-on-write) ``mmap`` of the file, so loading reads no payload
into memory and the tensors are writable without changing the file. Nothing is ever unpickled. Any
flaw in a file is a ``ProgramFormatError`` saying what is wrong and what was expected::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> from sparsefx.runtime.dataflow import DataflowProgram
    >>> p = DataflowProgram(MeshSpec(2, 2), HardwareSpec(), "pipelined", "block")
    >>> p.add_array("k.values", torch.arange(4, dtype=torch.float32))
    'k.values'
    >>> path = Path(tempfile.mkdtemp()) / "p.sfxp"
    >>> save_program(p, path)
    >>> load_program(path).arrays["k.values"].tolist()
    [0.0, 1.0, 2.0, 3.0]
    >>> path.write_bytes(b"not a zip")
    9
    >>> load_program(path)
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: .../p.sfxp: not a sparsefx program file (it starts with b'not ')

Keep in mind with memory-mapped tensors: a program file truncated in place while its tensors are in
use would fault on access (``save_program`` never does that: it replaces the file), and on Windows a
mapped file cannot be replaced until its tensors are freed.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import stat
import zlib
from pathlib import Path
from typing import IO, Any

import torch

from sparsefx import __version__
from sparsefx.errors import ProgramFormatError, SparseFXError

from . import safetensors_view, zip_view
from .archive_write import (
    COUNTS,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_TEXT_BYTES,
    MEMBERS,
    READS_VERSIONS,
    TENSORS,
    TEXT,
    file_sha256,
    program_counts,
    save_program,
)
from .dataflow import DataflowProgram
from .program import DTYPES
from .strict_json import loads
from .text import parse_program

__all__ = [
    "save_program",
    "load_program",
    "FORMAT",
    "FORMAT_VERSION",
    "MEMBERS",
    "MAX_MANIFEST_BYTES",
    "MAX_TEXT_BYTES",
]

_MANIFEST_KEYS = {"format", "format_version", "sparsefx_version", "counts", "members"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


# -- loading ----------------------------------------------------------------------------------------
def load_program(path: str | os.PathLike[str], *, check_payload_hash: bool = True) -> DataflowProgram:
    """The program in the program file ``path``, its payloads memory-mapped; see the module docstring.

    ``check_payload_hash=False`` skips hashing the payloads (which reads the whole file once) for a
    faster load of a large trusted file; the structure is still checked. The program is not verified
    (call ``program.verify()``). Any flaw is a ``ProgramFormatError`` naming ``path``.
    """
    path = Path(path)
    file = _open(path)
    with file:
        try:
            size = os.fstat(file.fileno()).st_size
            head = file.read(4)
            if size == 0:
                raise ProgramFormatError("empty file (an interrupted write?)")
            if head != b"PK\x03\x04" or size < 22:
                raise ProgramFormatError(f"not a sparsefx program file (it starts with {head!r})")
            try:
                buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as exc:
                raise ProgramFormatError(f"cannot map it into memory: {exc}") from None
            try:
                return _load(file, buffer, check_payload_hash)
            except BaseException:
                with contextlib.suppress(BufferError):  # tensors made so far still view it: GC frees it
                    buffer.close()
                raise
        except ProgramFormatError as exc:
            raise ProgramFormatError(f"{path}: {exc}") from None
        except OSError as exc:
            raise ProgramFormatError(f"cannot read {path}: {exc.strerror or exc}") from None


def _open(path: Path) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a FIFO is refused, not waited on)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ProgramFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ProgramFormatError(f"{path}: is a directory, not a program file") from None
    except OSError as exc:
        raise ProgramFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ProgramFormatError(f"{path}: is {kind}, not a program file")
    return open(fd, "rb", buffering=0)


def _load(file: IO[bytes], buffer: mmap.mmap, check_payload_hash: bool) -> DataflowProgram:
    members = {m.name: m for m in zip_view.members(buffer, check_name=_check_member_name)}
    for name in MEMBERS:
        if name not in members:
            raise ProgramFormatError(f"member {name!r} is missing; a program file holds {', '.join(MEMBERS)}")
    manifest = _manifest(buffer, members[MANIFEST])
    for name in (TEXT, TENSORS):
        declared = manifest["members"][name]["size"]
        if declared != members[name].size:
            raise ProgramFormatError(
                f"{MANIFEST} says {name} is {declared} bytes; the zip holds {members[name].size}"
            )
    text = _text(buffer, members[TEXT], manifest["members"][TEXT]["sha256"])
    tensors = members[TENSORS]
    if check_payload_hash:
        digest = file_sha256(file, tensors.offset, tensors.size)
        if digest != manifest["members"][TENSORS]["sha256"]:
            raise ProgramFormatError(f"{TENSORS} does not match its sha256 in {MANIFEST} (a corrupt file)")
    program = _parse(text)
    _check_counts(program, manifest["counts"])
    arrays = safetensors_view.tensors(buffer, tensors.offset, tensors.size)
    _attach(program, arrays)
    return program


def _check_member_name(name: str) -> None:
    if name not in MEMBERS:
        pickled = name.endswith((".pkl", ".pickle", ".pt", ".pth", ".bin"))
        raise ProgramFormatError(
            f"unexpected member {name!r}: a program file holds only {', '.join(MEMBERS)}"
            + ("; pickled data is never loaded" if pickled else "")
        )


def _manifest(buffer: mmap.mmap, member: zip_view.Member) -> dict[str, Any]:
    if member.size > MAX_MANIFEST_BYTES:
        raise ProgramFormatError(f"{MANIFEST} is {member.size} bytes; at most {MAX_MANIFEST_BYTES} are read")
    raw = buffer[member.offset : member.end]
    if zlib.crc32(raw) != member.crc:
        raise ProgramFormatError(f"{MANIFEST} fails its CRC check (a corrupt file)")
    data = loads(raw, MANIFEST)
    if not isinstance(data, dict):
        raise ProgramFormatError(f"{MANIFEST} is not a JSON object")
    if data.get("format") != FORMAT:
        raise ProgramFormatError(f"{MANIFEST}: format is {_short(data.get('format'))}; expected {FORMAT!r}")
    version = data.get("format_version")
    if version not in READS_VERSIONS or type(version) is not int:
        newer = type(version) is int and version > FORMAT_VERSION
        reads = ", ".join(str(v) for v in READS_VERSIONS[:-1]) + f" and {READS_VERSIONS[-1]}"
        raise ProgramFormatError(
            f"{MANIFEST}: format_version {_short(version)} is "
            + ("newer than this sparsefx reads" if newer else "unknown")
            + f"; this sparsefx ({__version__}) reads format_version {reads}"
            + (" (upgrade sparsefx to load it)" if newer else "")
        )
    if set(data) != _MANIFEST_KEYS:
        raise ProgramFormatError(f"{MANIFEST} has keys {sorted(data)}; expected {sorted(_MANIFEST_KEYS)}")
    if not isinstance(data["sparsefx_version"], str):
        raise ProgramFormatError(f"{MANIFEST}: sparsefx_version is not a string")
    _check_table(data["counts"], "counts", COUNTS, lambda v: type(v) is int and v >= 0, "an int >= 0")
    members = data["members"]
    _check_table(members, "members", (TEXT, TENSORS), lambda v: isinstance(v, dict), "an object")
    for name, entry in members.items():
        _check_table(entry, f"members.{name}", ("sha256", "size"), lambda v: True, "")
        if not isinstance(entry["sha256"], str) or not _SHA256.fullmatch(entry["sha256"]):
            raise ProgramFormatError(f"{MANIFEST}: members.{name}.sha256 is not 64 lowercase hex digits")
        if type(entry["size"]) is not int or entry["size"] < 0:
            raise ProgramFormatError(f"{MANIFEST}: members.{name}.size is not an int >= 0")
    return data


def _check_table(table: Any, where: str, keys: tuple[str, ...], ok: Any, what: str) -> None:
    if not isinstance(table, dict) or set(table) != set(keys):
        found = sorted(table) if isinstance(table, dict) else type(table).__name__
        raise ProgramFormatError(
            f"{MANIFEST}: {where} is {_short(found)}; expected the keys {', '.join(keys)}"
        )
    for key, value in table.items():
        if not ok(value):
            raise ProgramFormatError(f"{MANIFEST}: {where}.{key} is {_short(value)}; expected {what}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _text(buffer: mmap.mmap, member: zip_view.Member, sha256: str) -> str:
    if member.size > MAX_TEXT_BYTES:
        raise ProgramFormatError(f"{TEXT} is {member.size} bytes; at most {MAX_TEXT_BYTES} are read")
    raw = buffer[member.offset : member.end]
    if zlib.crc32(raw) != member.crc or hashlib.sha256(raw).hexdigest() != sha256:
        raise ProgramFormatError(
            f"{TEXT} does not match its CRC and its sha256 in {MANIFEST} (a corrupt file)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProgramFormatError(f"{TEXT} is not UTF-8 ({exc})") from None


def _parse(text: str) -> DataflowProgram:
    try:
        return parse_program(text)
    except ProgramFormatError as exc:
        raise ProgramFormatError(f"{TEXT}: {exc}") from None
    except (SparseFXError, ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError) as exc:
        raise ProgramFormatError(f"{TEXT} does not describe a valid program: {exc}") from None


def _check_counts(program: DataflowProgram, counts: dict[str, int]) -> None:
    for name, spec in program.specs.items():
        if spec.dtype not in DTYPES:
            raise ProgramFormatError(
                f"{TEXT}: array {name!r} has dtype {spec.dtype!r}, which programs do not store"
            )
    found = program_counts(program)
    for key in COUNTS:
        if found[key] != counts[key]:
            raise ProgramFormatError(f"{MANIFEST} counts {counts[key]} {key}; {TEXT} has {found[key]}")


def _attach(program: DataflowProgram, arrays: dict[str, torch.Tensor]) -> None:
    for name, spec in program.specs.items():
        tensor = arrays.get(name)
        if tensor is None:
            raise ProgramFormatError(f"array {name!r} of {TEXT} has no payload in {TENSORS}")
        found = (_dtype_name(tensor.dtype), tuple(tensor.shape))
        if found != (spec.dtype, tuple(spec.shape)):
            raise ProgramFormatError(
                f"array {name!r} is {found[0]}{list(found[1])} in {TENSORS} but "
                f"{spec.dtype}{list(spec.shape)} in {TEXT}"
            )
    extra = sorted(set(arrays) - set(program.specs))
    if extra:
        raise ProgramFormatError(f"{TENSORS} holds {extra[0]!r}, which {TEXT} does not list as an array")
    program.arrays = {name: arrays[name] for name in program.specs}


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)
