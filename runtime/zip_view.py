"""A strict reader of stored (uncompressed) zip files, over a buffer such as an ``mmap``.

``members(buf)`` reads the end record and the central directory, checks each member's local header
against it, and returns where each member's bytes lie in ``buf``; nothing is decompressed or copied,
so a member can be viewed in place. It refuses, with a ``ProgramFormatError``: a truncated or foreign
file, compressed, encrypted or split members, sizes or offsets outside the file, members that
overlap, more than ``max_members`` members, duplicate names, and names that are absolute or climb
out with ``..``::

    >>> import io, zipfile
    >>> raw = io.BytesIO()
    >>> with zipfile.ZipFile(raw, "w") as z:
    ...     z.writestr("a.txt", b"hello")
    >>> [(m.name, m.size, bytes(raw.getbuffer()[m.offset : m.end])) for m in members(raw.getbuffer())]
    [('a.txt', 5, b'hello')]
    >>> members(raw.getvalue()[:-3])
    Traceback (most recent call last):
    ...
    sparsefx.errors.ProgramFormatError: no zip end record (a truncated file, or not a zip file)

Messages do not name the file; the caller adds it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparsefx.errors import ProgramFormatError

__all__ = ["Member", "members", "MAX_MEMBERS"]

MAX_MEMBERS = 64
"""Most members a file may declare (program files have three)."""

_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_LOC64 = struct.Struct("<4sLQL")  # zip64 end of central directory locator
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # central directory file header
_LOCAL = struct.Struct("<4s2B4HL2L2H")  # local file header
_MAX_COMMENT = 0xFFFF
_UTF8_FLAG = 0x800  # the only general-purpose flag a member may have: its name is UTF-8
_METHODS = {0: "stored", 8: "deflate", 9: "deflate64", 12: "bzip2", 14: "lzma", 93: "zstd", 95: "xz"}


@dataclass(frozen=True)
class Member:
    """One member: its name, where its bytes lie in the buffer (``[offset, offset + size)``), its CRC-32
    and the offset of its local header."""

    name: str
    offset: int
    size: int
    crc: int
    header: int

    @property
    def end(self) -> int:
        """One past the member's last byte."""
        return self.offset + self.size


def members(
    buf: Any, max_members: int = MAX_MEMBERS, check_name: Callable[[str], None] | None = None
) -> list[Member]:
    """The members of the stored zip in ``buf`` (bytes-like), in central-directory order.

    ``check_name(name)``, if given, is called on each name before anything else about the member is
    checked (to refuse a foreign member by its name first).
    """
    view = memoryview(buf).cast("B")
    try:
        eocd = _end_record(view)
        count, cd_size, cd_offset = _directory_bounds(view, eocd)
        if count > max_members:
            raise ProgramFormatError(f"the zip declares {count} members; at most {max_members} are read")
        found = _central_entries(view, count, cd_offset, cd_offset + cd_size, check_name)
    finally:
        view.release()
    names = [m.name for m in found]
    for name in names:
        if names.count(name) > 1:
            raise ProgramFormatError(f"member {name!r} appears twice in the zip")
    previous = None
    for member in sorted(found, key=lambda m: m.header):
        if previous is not None and member.header < previous.end:
            raise ProgramFormatError(f"members {previous.name!r} and {member.name!r} overlap")
        previous = member
    if previous is not None and previous.end > cd_offset:
        raise ProgramFormatError(f"member {previous.name!r} runs into the zip's central directory")
    return found


def _end_record(view: memoryview) -> int:
    """Offset of the end-of-central-directory record, which must end the file exactly."""
    size = len(view)
    lo = max(0, size - _EOCD.size - _MAX_COMMENT)
    tail = bytes(view[lo:])
    pos = len(tail) - _EOCD.size
    while pos >= 0:
        pos = tail.rfind(b"PK\x05\x06", 0, pos + 4)
        if pos < 0:
            break
        if pos + _EOCD.size <= len(tail):
            comment = _EOCD.unpack_from(tail, pos)[-1]
            if pos + _EOCD.size + comment == len(tail):
                return lo + pos
        pos -= 1
    raise ProgramFormatError("no zip end record (a truncated file, or not a zip file)")


def _directory_bounds(view: memoryview, eocd: int) -> tuple[int, int, int]:
    """``(members, central directory size, its offset)``, from the zip64 record where there is one."""
    _, disk, cd_disk, on_disk, count, cd_size, cd_offset, _ = _EOCD.unpack_from(view, eocd)
    limit = eocd
    if 0xFFFF in (disk, cd_disk, on_disk, count) or 0xFFFFFFFF in (cd_size, cd_offset):
        loc = eocd - _LOC64.size
        if loc < 0 or bytes(view[loc : loc + 4]) != b"PK\x06\x07":
            raise ProgramFormatError("the zip's end record asks for a zip64 record that is not there")
        _, z_disk, z_offset, disks = _LOC64.unpack_from(view, loc)
        if z_offset + _EOCD64.size > loc or bytes(view[z_offset : z_offset + 4]) != b"PK\x06\x06":
            raise ProgramFormatError(f"the zip64 end record at offset {z_offset} is missing or out of range")
        if z_disk != 0 or disks != 1:
            raise ProgramFormatError("the zip spans several disks; program files are one file")
        _, _, _, _, disk, cd_disk, on_disk, count, cd_size, cd_offset = _EOCD64.unpack_from(view, z_offset)
        limit = z_offset
    if disk != 0 or cd_disk != 0 or on_disk != count:
        raise ProgramFormatError("the zip spans several disks; program files are one file")
    if cd_offset + cd_size > limit:
        raise ProgramFormatError(
            f"the zip's central directory ({cd_size} bytes at offset {cd_offset}) runs past its end "
            f"record at offset {limit} (a truncated file?)"
        )
    return count, cd_size, cd_offset


def _central_entries(
    view: memoryview, count: int, start: int, stop: int, check_name: Callable[[str], None] | None
) -> list[Member]:
    found: list[Member] = []
    pos = start
    for _ in range(count):
        if pos + _CENTRAL.size > stop or bytes(view[pos : pos + 4]) != b"PK\x01\x02":
            raise ProgramFormatError(f"zip directory entry {len(found)} at offset {pos} is malformed")
        fields = _CENTRAL.unpack_from(view, pos)
        flags, method, _, _, crc, csize, size, n_name, n_extra, n_comment, disk = fields[5:16]
        header = fields[18]
        end = pos + _CENTRAL.size + n_name + n_extra + n_comment
        if end > stop:
            raise ProgramFormatError(f"zip directory entry {len(found)} runs past the directory")
        raw_name = bytes(view[pos + _CENTRAL.size : pos + _CENTRAL.size + n_name])
        name = _decode_name(raw_name, flags)
        if check_name is not None:
            check_name(name)
        extra = bytes(view[pos + _CENTRAL.size + n_name : pos + _CENTRAL.size + n_name + n_extra])
        size, csize, header = _zip64_fields(extra, name, size, csize, header)
        _check_entry(name, flags, method, size, csize, disk)
        offset = _local_header(view, name, raw_name, flags, header, size, crc)
        if offset + size > len(view):
            raise ProgramFormatError(
                f"member {name!r} declares {size} bytes at offset {offset}, past the end of the "
                f"{len(view)}-byte file (a truncated file?)"
            )
        found.append(Member(name, offset, size, crc, header))
        pos = end
    if pos != stop:
        raise ProgramFormatError(f"the zip's central directory has {stop - pos} bytes after its last entry")
    return found


def _decode_name(raw: bytes, flags: int) -> str:
    try:
        name = raw.decode("utf-8" if flags & _UTF8_FLAG else "cp437")
    except UnicodeDecodeError:
        raise ProgramFormatError(f"member name {raw!r} is not valid UTF-8") from None
    parts = name.replace("\\", "/").split("/")
    if (
        not name
        or "\x00" in name
        or "\\" in name
        or name.startswith("/")
        or (len(name) > 1 and name[1] == ":")
        or ".." in parts
    ):
        raise ProgramFormatError(
            f"member name {name!r} is not a plain relative path (absolute paths, drive letters, "
            "backslashes and '..' are refused)"
        )
    return name


def _zip64_fields(extra: bytes, name: str, size: int, csize: int, header: int) -> tuple[int, int, int]:
    """Replace the 0xFFFFFFFF fields by the values of the zip64 extra field, in the order zip gives."""
    wanted = [size == 0xFFFFFFFF, csize == 0xFFFFFFFF, header == 0xFFFFFFFF]
    if not any(wanted):
        return size, csize, header
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        if len(body) != length:
            break
        if tag == 1:
            values = [size, csize, header]
            at = 0
            for i, want in enumerate(wanted):
                if want:
                    if at + 8 > length:
                        raise ProgramFormatError(f"member {name!r}: its zip64 extra field is too short")
                    values[i] = struct.unpack_from("<Q", body, at)[0]
                    at += 8
            return values[0], values[1], values[2]
        pos += 4 + length
    raise ProgramFormatError(f"member {name!r} has 32-bit overflow sizes but no zip64 extra field")


def _check_entry(name: str, flags: int, method: int, size: int, csize: int, disk: int) -> None:
    if flags & 1:
        raise ProgramFormatError(f"member {name!r} is encrypted; program files are not")
    if flags & ~_UTF8_FLAG:
        raise ProgramFormatError(
            f"member {name!r} has zip flags {flags:#06x}; program files use none but UTF-8 names (0x0800)"
        )
    if method != 0:
        kind = _METHODS.get(method, "unknown")
        raise ProgramFormatError(
            f"member {name!r} is compressed (method {method}, {kind}); program files store every "
            "member uncompressed (ZIP_STORED)"
        )
    if size != csize:
        raise ProgramFormatError(
            f"member {name!r} is stored but declares {csize} stored bytes for {size} bytes of data"
        )
    if disk != 0:
        raise ProgramFormatError(f"member {name!r} starts on disk {disk}; program files are one file")


def _local_header(
    view: memoryview, name: str, raw_name: bytes, flags: int, at: int, size: int, crc: int
) -> int:
    """Check the local header at ``at`` against the directory entry; the offset of the member's data."""
    if at + _LOCAL.size > len(view) or bytes(view[at : at + 4]) != b"PK\x03\x04":
        raise ProgramFormatError(f"member {name!r}: no local header at offset {at} (a corrupt directory?)")
    _, _, _, l_flags, l_method, _, _, l_crc, l_csize, l_size, n_name, n_extra = _LOCAL.unpack_from(view, at)
    data = at + _LOCAL.size + n_name + n_extra
    if data > len(view):
        raise ProgramFormatError(f"member {name!r}: its local header runs past the end of the file")
    if bytes(view[at + _LOCAL.size : at + _LOCAL.size + n_name]) != raw_name:
        raise ProgramFormatError(f"member {name!r}: its local header names another file")
    if l_flags != flags or l_method != 0 or l_crc != crc:
        raise ProgramFormatError(f"member {name!r}: its local header disagrees with the zip directory")
    extra = bytes(view[at + _LOCAL.size + n_name : data])
    l_size, l_csize, _ = _zip64_fields(extra, name, l_size, l_csize, 0)
    if (l_size, l_csize) != (size, size):
        raise ProgramFormatError(
            f"member {name!r}: its local header says {l_size} bytes, the zip directory {size}"
        )
    return data
