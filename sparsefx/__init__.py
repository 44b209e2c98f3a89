"""sparsefx: unstructured weight sparsity for PyTorch.

>>> import torch, sparsefx
>>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4)), 0.5)
>>> sm.sparsity_report()[0].nnz
16

The public names load on first use, so ``import sparsefx`` (and ``sparsefx --version``) does not
import torch; the error classes are plain Python and load at once.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import (
    CaptureError,
    CheckpointError,
    ConfigError,
    EmulationError,
    FreezeError,
    LoweringError,
    PassError,
    ProgramFormatError,
    ProgramWriteError,
    SparseFXError,
    VerifyError,
)

if TYPE_CHECKING:
    from . import sparse
    from .accounting import FlopReport, flops
    from .compiler import compile
    from .config import SparsityConfig, load_config
    from .frozen import FrozenModel, freeze
    from .lowering import lower
    from .model import SparseModel
    from .runtime.archive import load_program
    from .runtime.dataflow import DataflowProgram
    from .runtime.mesh import HardwareSpec, MeshSpec
    from .runtime.run import RunResult, run
    from .runtime.text import parse_program

__version__ = "0.1.0"

__all__ = [
    "compile",
    "flops",
    "FlopReport",
    "load_config",
    "SparsityConfig",
    "SparseModel",
    "parse_program",
    "lower",
    "run",
    "RunResult",
    "DataflowProgram",
    "MeshSpec",
    "HardwareSpec",
    "load_program",
    "errors",
    "sparse",
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
    "freeze",
    "FrozenModel",
]

# public name -> (module relative to this package, attribute; None: the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "compile": (".compiler", "compile"),
    "flops": (".accounting", "flops"),
    "FlopReport": (".accounting", "FlopReport"),
    "load_config": (".config", "load_config"),
    "SparsityConfig": (".config", "SparsityConfig"),
    "SparseModel": (".model", "SparseModel"),
    "parse_program": (".runtime.text", "parse_program"),
    "lower": (".lowering", "lower"),
    "run": (".runtime.run", "run"),
    "RunResult": (".runtime.run", "RunResult"),
    "DataflowProgram": (".runtime.dataflow", "DataflowProgram"),
    "MeshSpec": (".runtime.mesh", "MeshSpec"),
    "HardwareSpec": (".runtime.mesh", "HardwareSpec"),
    "load_program": (".runtime.archive", "load_program"),
    "sparse": (".sparse", None),
    "freeze": (".frozen", "freeze"),
    "FrozenModel": (".frozen", "FrozenModel"),
}


def __getattr__(name: str) -> Any:
    """Import a public name on first access and keep it, so later lookups are plain attributes."""
    if name not in _LAZY:
        if importlib.util.find_spec(f"{__name__}.{name}") is None:  # a submodule: import it, as Python would
            raise AttributeError(f"module 'sparsefx' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name, __name__)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
