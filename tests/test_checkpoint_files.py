"""Checkpoint writes: a full disk, temp files of killed saves, and the mode of a file finalized in place.

A full disk cannot be made on demand, so the ENOSPC tests replace the low-level write
(``torch.save`` inside ``sparsefx.checkpoint.files``) by one that writes part of the data and
then fails the way a full disk does.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import sparsefx
from sparsefx.checkpoint import files, finalize, save_checkpoint
from sparsefx.cli import main
from sparsefx.errors import CheckpointError, SparseFXError
from sparsefx.models import build_model
from sparsefx.sparse import Static


def _sparse_model() -> torch.nn.Module:
    model = build_model("mlp").model
    model.apply(Static(sparsity=0.5))
    return model


def _full_disk(kind: str):  # type: ignore[no-untyped-def]
    """A ``torch.save`` that writes a little and then fails as on a full disk."""

    def save(obj: Any, file: Any) -> None:
        file.write(b"PK\x03\x04 partial")
        error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if kind == "oserror":
            raise error
        try:  # torch's zip writer reports the failed Python write as a RuntimeError in its context
            raise error
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
            ) from None

    return save


@pytest.mark.parametrize("kind", ["oserror", "runtimeerror"])
def test_full_disk_is_a_checkpoint_error_naming_the_path(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ckpt.pt"
    save_checkpoint(target, _sparse_model())
    before = target.read_bytes()
    monkeypatch.setattr(files.torch, "save", _full_disk(kind))
    with pytest.raises(CheckpointError, match=r"no space left") as info:
        save_checkpoint(target, _sparse_model())
    assert str(target) in str(info.value)
    assert isinstance(info.value, SparseFXError)
    assert target.read_bytes() == before  # the old checkpoint is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temp file left


def test_checkpoint_error_is_exported_at_top_level() -> None:
    assert sparsefx.CheckpointError is CheckpointError
    assert "CheckpointError" in sparsefx.__all__


def test_finalize_cli_on_a_full_disk_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "sparse.pt"
    save_checkpoint(source, _sparse_model())
    monkeypatch.setattr(files.torch, "save", _full_disk("oserror"))
    code = main(["finalize", "-i", str(source), "-o", str(tmp_path / "dense.pt")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("sparsefx: error: ")
    assert "no space left" in err and str(tmp_path / "dense.pt") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sparse.pt"]


def test_any_error_during_the_write_removes_the_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(obj: Any, file: Any) -> None:
        file.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(files.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "ckpt.pt", _sparse_model())
    assert list(tmp_path.iterdir()) == []


KILLED_SAVE = """
import os, signal, sys, torch
from sparsefx.checkpoint import files
def save(obj, file):
    file.write(b"PK\\x03\\x04 half of a checkpoint")
    file.flush()
    os.kill(os.getpid(), signal.SIGKILL)
files.torch.save = save
files.atomic_save({"w": torch.zeros(3)}, sys.argv[1])
"""


@pytest.mark.skipif(os.name != "posix", reason="kills a process with SIGKILL")
def test_the_next_save_removes_the_temp_file_a_killed_save_left(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(target)], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".ckpt.pt.") and left[0].endswith(".tmp")
    unrelated = tmp_path / ".other.pt.1.0123abcd.tmp"  # another target's temp is not ours to remove
    unrelated.write_bytes(b"x")
    files.atomic_save({"w": torch.ones(3)}, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [unrelated.name, "ckpt.pt"]
    assert torch.equal(files.read_file(target)["w"], torch.ones(3))


def test_a_running_process_temp_file_is_left_alone(tmp_path: Path) -> None:
    mine = tmp_path / f".ckpt.pt.{os.getpid()}.0123abcd.tmp"
    mine.write_bytes(b"in flight")
    files.atomic_save({"w": torch.ones(3)}, tmp_path / "ckpt.pt")
    assert mine.exists()


@pytest.mark.skipif(os.name != "posix", reason="permission bits")
def test_finalize_in_place_keeps_the_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _sparse_model())
    os.chmod(path, 0o640)
    finalize(path, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    os.chmod(path, 0o604)
    assert main(["finalize", "-i", str(path), "-o", str(path)]) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o604
