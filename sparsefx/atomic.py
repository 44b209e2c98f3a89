"""Atomic file writes: a temp file next to the target, fsync, then ``os.replace``.

A crash or an error leaves the old file (or none) intact, and no temp file behind. Checkpoints
(``checkpoint/files.py``) and program files (``runtime/archive.py``) are written this way::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from sparsefx.errors import SparseFXError
    >>> folder = Path(tempfile.mkdtemp())
    >>> atomic_write(folder / "a.bin", lambda file: file.write(b"data"), SparseFXError, "file")
    >>> (folder / "a.bin").read_bytes(), [p.name for p in folder.iterdir()]
    (b'data', ['a.bin'])

Plain Python: no torch, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "temp_path", "write_error"]

_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # a full disk, or a full quota


def temp_path(path: Path) -> Path:
    """A fresh temp name next to ``path``: ``.<name>.<pid>.<random>.tmp``.

    Temp files of this form whose process is gone are removed by the next ``atomic_write`` of ``path``.
    """
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def atomic_write(
    path: Path, write: Callable[[BinaryIO], object], error: Callable[[str], Exception], what: str
) -> None:
    """Call ``write(file)`` on a temp file next to ``path``, fsync it and move it onto ``path``.

    The temp file is removed on any error (``KeyboardInterrupt`` too); the temp files of a killed
    earlier write of ``path`` are removed first. Overwriting keeps the file's permission bits. An
    ``OSError`` anywhere in the chain of the exception raised is reported as ``error(message)``
    (``what`` names the kind of file in the "write the <what> elsewhere" hint of a full disk); any
    other exception is re-raised as it is.
    """
    remove_stale_temps(path)
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise write_error(path, exc, error, what) or error(f"cannot write {path}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        _keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        failure = write_error(path, exc, error, what)
        if failure is None:
            raise
        raise failure from exc
    _fsync_dir(path.parent)


def write_error(
    path: Path, exc: BaseException, error: Callable[[str], Exception], what: str
) -> Exception | None:
    """``error(message)`` for a failed write of ``path`` (None: not an I/O failure, re-raise ``exc``).

    Some writers (torch's zip writer) report a failed write as a RuntimeError whose context is the
    OSError, so the whole chain is searched.
    """
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, OSError):
            if seen.errno in _FULL:
                return error(
                    f"cannot write {path}: no space left on the device ({seen.strerror or seen}); "
                    f"free some space or write the {what} elsewhere"
                )
            return error(f"cannot write {path}: {seen.strerror or seen}")
        seen = seen.__cause__ or seen.__context__
    return None


def _temp_pattern(path: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")


def remove_stale_temps(path: Path) -> None:
    """Remove the temp files that writes of ``path`` by processes no longer running left behind."""
    pattern = _temp_pattern(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or _running(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path.with_name(name))


def _running(pid: int) -> bool:
    """Is process ``pid`` alive (on this machine)? This process's own temps are never stale."""
    if pid == os.getpid() or os.name != "posix":  # os.kill would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # exists (another user's), or cannot tell: leave it
    return True


def _keep_mode(path: Path, tmp: Path) -> None:
    """Give ``tmp`` the permission bits of the file it replaces, if there is one."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    with contextlib.suppress(OSError):  # a file system without permission bits
        os.chmod(tmp, mode)


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
