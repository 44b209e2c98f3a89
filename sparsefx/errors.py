"""One hierarchy of errors for everything sparsefx rejects.

Every error names the bad value and says what would be valid::

    >>> raise ConfigError("sparsity.sparsity: 1.5 is not in [0, 1)")
    Traceback (most recent call last):
    ...
    sparsefx.errors.ConfigError: sparsity.sparsity: 1.5 is not in [0, 1)
"""

from __future__ import annotations

__all__ = [
    "SparseFXError",
    "ConfigError",
    "CaptureError",
    "PassError",
    "LoweringError",
    "VerifyError",
    "ProgramFormatError",
    "ProgramWriteError",
    "EmulationError",
    "CheckpointError",
    "FreezeError",
]


class SparseFXError(Exception):
    """Base class of every error sparsefx raises on bad input."""


class ConfigError(SparseFXError, ValueError):
    """A sparsity config is malformed, or does not fit the model it is applied to."""


class CaptureError(SparseFXError):
    """The model's graph could not be captured by any method."""


class PassError(SparseFXError):
    """A graph pass failed; the message names the pass, the node and the passes run so far."""


class LoweringError(SparseFXError):
    """A sparse graph could not be lowered to a dataflow program."""


class VerifyError(SparseFXError):
    """A graph or program broke one of its invariants."""


class ProgramFormatError(SparseFXError):
    """A program file is truncated, foreign or malformed."""


class ProgramWriteError(SparseFXError):
    """A program file could not be written (no space left, no permission); the old file is intact."""


class EmulationError(SparseFXError):
    """The emulator could not execute a program."""


class CheckpointError(SparseFXError):
    """A checkpoint is truncated, foreign or does not fit the model."""


class FreezeError(SparseFXError):
    """A model cannot be frozen, or a frozen model was asked to train (it is for inference only)."""
