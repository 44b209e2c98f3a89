"""Checkpoint files: atomic writes, and reads that use only ``torch.load(weights_only=True)``."""

from __future__ import annotations

import collections
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..atomic import atomic_write
from ..errors import CheckpointError

__all__ = ["PathLike", "atomic_save", "read_file", "why"]

PathLike = str | os.PathLike
_ZIP_MAGIC = b"PK\x03\x04"
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device)


def atomic_save(obj: Any, path: PathLike) -> None:
    """``torch.save(obj)`` to ``path`` atomically: a crash or error leaves the old file (or none) intact.

    ``obj`` may hold only what ``torch.load(weights_only=True)`` reads back (tensors, numbers,
    strings, dtypes, devices and dicts/lists/tuples/sets of them); anything else is refused here.
    The data goes to a temp file next to ``path`` (``.<name>.<pid>.<random>.tmp``), which is
    removed on any error; the temp files of a killed earlier save of ``path`` are removed by the
    next one. Overwriting keeps the file's permission bits. A full disk is a CheckpointError that
    says so. The temp-file mechanics live in ``sparsefx/atomic.py`` (program files use them too).
    """
    path = Path(path)
    _check_loadable(obj, "checkpoint")
    atomic_write(path, lambda file: torch.save(obj, file), CheckpointError, "checkpoint")


def read_file(path: PathLike, map_location: Any = "cpu", *, verify: bool = True) -> Any:
    """What ``torch.load(path, weights_only=True)`` returns; every failure is a CheckpointError.

    ``verify`` first checks every zip member's CRC (torch does not), so flipped bits are caught;
    it reads the file once more.
    """
    path = Path(path)
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not head:
        raise CheckpointError(f"{path}: empty file (an interrupted write?)")
    if head != _ZIP_MAGIC:
        raise CheckpointError(f"{path}: not a PyTorch zip checkpoint (starts with {head!r})")
    if verify:
        _verify_zip(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused to unpickle it (only tensors and plain data load): {why(exc)}"
        ) from None
    except Exception as exc:
        raise CheckpointError(
            f"{path}: truncated, corrupt or not a PyTorch checkpoint ({why(exc)})"
        ) from None


def _verify_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as exc:
        raise CheckpointError(
            f"{path}: truncated, corrupt or not a PyTorch checkpoint ({why(exc)})"
        ) from None
    if bad is not None:
        raise CheckpointError(f"{path}: corrupt: {bad} fails its CRC check")


def why(exc: BaseException) -> str:
    text = re.sub(r"^\[enforce fail at [^\]]*\][\s.]*", "", str(exc))
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split(" Please use", 1)[0]
    first = " ".join(text.strip().splitlines()[:1]).split(". ", 1)[0].strip()
    return first[:200] or type(exc).__name__


def _check_loadable(obj: Any, where: str, depth: int = 0) -> None:
    if depth > 100:
        raise CheckpointError(f"{where}: nested too deeply to save")
    if type(obj) in (Tensor, nn.Parameter) or type(obj) in _LEAVES or type(obj) is torch.Size:
        return
    if type(obj) in (dict, collections.OrderedDict):
        for key, value in obj.items():
            _check_loadable(key, f"{where} key {key!r}", depth + 1)
            _check_loadable(value, f"{where}[{key!r}]", depth + 1)
    elif type(obj) in (list, tuple, set):
        for i, value in enumerate(obj):
            _check_loadable(value, f"{where}[{i}]", depth + 1)
    else:
        raise CheckpointError(
            f"{where} has type {type(obj).__qualname__}; checkpoints hold only tensors, numbers, strings, "
            "dtypes, devices and dicts/lists/tuples/sets of them (so that they load with weights_only)"
        )
