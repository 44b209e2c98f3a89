"""Checkpoints of sparse models: save and load, the NaN-sentinel format, finalize.

A checkpoint is one ``torch.save`` zip holding ``{"format": "sparsefx-checkpoint", "version": 1,
"model": state_dict, "optimizer": state_dict | None, "sparsity": dict | None, "extra": dict | None}``.
Writes are atomic (temp file in the same folder, fsync, ``os.replace``), keep an overwritten file's
permission bits, and report a full disk as a CheckpointError that says "no space left"; reads use only
``torch.load(weights_only=True)``, so a hostile file cannot run code. A truncated, foreign or
mismatching file raises :class:`~sparsefx.errors.CheckpointError` naming the file and the problem::

    >>> import tempfile, pathlib
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 8)), 0.75)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     save_checkpoint(pathlib.Path(tmp) / "ckpt.pt", sm, sparsity_state={"step": 3})
    ...     load_checkpoint(pathlib.Path(tmp) / "ckpt.pt", sm)["sparsity"]
    {'step': 3}

In the NaN-sentinel format pruned positions hold NaN (weights and same-shape optimizer states) and
there are no mask entries, so a plain dense checkpoint carries the pattern::

    >>> sentinel = export_nan_sentinel(sm)
    >>> int(sentinel["model"]["0.weight"].isnan().sum()), sorted(sentinel["model"])
    (48, ['0.bias', '0.weight'])

Only ``torch.save`` zip files are read: files in the pre-1.6 legacy format are refused.
"""

from __future__ import annotations

from ..masks import follows_mask, mask_names, masked_params
from .files import atomic_save, read_file
from .finalize import FinalizeStats, finalize
from .sentinel import export_nan_sentinel, import_nan_sentinel, load_nan_sentinel, save_nan_sentinel
from .state import FORMAT, VERSION, load_checkpoint, save_checkpoint

__all__ = [
    "FORMAT",
    "VERSION",
    "FinalizeStats",
    "atomic_save",
    "export_nan_sentinel",
    "finalize",
    "follows_mask",
    "import_nan_sentinel",
    "load_checkpoint",
    "load_nan_sentinel",
    "mask_names",
    "masked_params",
    "read_file",
    "save_checkpoint",
    "save_nan_sentinel",
]
