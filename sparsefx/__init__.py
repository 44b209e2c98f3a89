"""sparsefx: unstructured weight sparsity for PyTorch.

>>> import torch, sparsefx
>>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5)
>>> sm.sparsity_report()[0].nnz
16
"""

from __future__ import annotations

from . import errors, sparse
from .accounting import FlopReport, flops
from .compiler import compile
from .config import SparsityConfig, load_config
from .errors import (
    CaptureError,
    CheckpointError,
    ConfigError,
    EmulationError,
    LoweringError,
    PassError,
    ProgramFormatError,
    SparseFXError,
    VerifyError,
)
from .model import SparseModel

__version__ = "0.1.0"

__all__ = [
    "compile",
    "flops",
    "FlopReport",
    "load_config",
    "SparsityConfig",
    "SparseModel",
    "errors",
    "sparse",
    "SparseFXError",
    "ConfigError",
    "CaptureError",
    "PassError",
    "LoweringError",
    "VerifyError",
    "ProgramFormatError",
    "EmulationError",
    "CheckpointError",
]
