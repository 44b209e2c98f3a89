"""Build a model and example inputs from a name: a built-in, or ``package.module:factory``.

>>> spec = build_model("mlp", input_shape=(2, 8))
>>> spec.name, spec.args[0].shape, spec.kwargs
('mlp', torch.Size([2, 8]), {})
>>> build_model("gpt2-small", device="meta").model.lm_head.weight.is_meta
True
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sparsefx.errors import ConfigError
from sparsefx.models import zoo
from sparsefx.models.cnn import Conv1dNet, SmallCNN
from sparsefx.models.gpt import GPT, gpt2_small, gpt_small_bench, gpt_tiny
from sparsefx.models.mlp import MLP
from sparsefx.models.names import BUILTIN_MODELS

__all__ = ["ModelSpec", "BUILTIN_MODELS", "build_model"]


@dataclass(frozen=True)
class ModelSpec:
    """A model with example inputs: call it as ``spec.model(*spec.args, **spec.kwargs)``."""

    name: str
    model: nn.Module
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


Shape = tuple[int, ...]
# A builder takes the requested example-input shape and batch (either may be None) and returns
# (model, args, kwargs).
_Builder = Callable[[Shape | None, int | None], tuple[nn.Module, tuple, dict]]


def _shape(name: str, shape: Shape | None, batch: int | None, default: Shape, dims: str) -> Shape:
    """``shape`` if it has the rank ``dims`` describes (e.g. ``"(batch, features)"``), else ``default``.

    ``batch`` replaces the first dimension of ``default`` (``shape`` already has it applied).
    """
    if shape is None:
        return default if batch is None else (batch, *default[1:])
    if len(shape) != len(default):
        raise ConfigError(f"input_shape {shape} does not fit model {name!r}: expected {dims}")
    return shape


def _mlp(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
    batch, features = _shape("mlp", shape, batch, (8, 64), "(batch, in_features)")
    model = MLP(in_features=features)
    return model, *model.example_inputs(batch)


def _gpt(name: str, factory: Callable[[], GPT]) -> _Builder:
    def build(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
        model = factory()
        batch, seq_len = _shape(
            name, shape, batch, (2, min(model.config.max_seq_len, 128)), "(batch, seq_len)"
        )
        if seq_len > model.config.max_seq_len:
            raise ConfigError(
                f"input_shape {shape} does not fit model {name!r}: seq_len {seq_len} > "
                f"max_seq_len {model.config.max_seq_len}"
            )
        return model, *model.example_inputs(batch, seq_len)

    return build


def _cnn(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
    batch, channels, height, width = _shape(
        "cnn", shape, batch, (4, 3, 32, 32), "(batch, channels, height, width)"
    )
    model = SmallCNN(in_channels=channels)
    return model, *model.example_inputs(batch, height, width)


def _conv1d(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
    batch, channels, length = _shape("conv1d", shape, batch, (4, 4, 128), "(batch, channels, length)")
    model = Conv1dNet(in_channels=channels)
    return model, *model.example_inputs(batch, length)


def _zoo_features(name: str, cls: type[nn.Module]) -> _Builder:
    """Zoo models taking ``[batch, in_features]``."""

    def build(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
        batch, features = _shape(name, shape, batch, (4, 16), "(batch, in_features)")
        model = cls(in_features=features)
        return model, *model.example_inputs(batch)

    return build


def _zoo_sequence(name: str, cls: type[nn.Module], default: Shape) -> _Builder:
    """Zoo models taking ``[batch, seq_len, features]``."""

    def build(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
        batch, seq_len, features = _shape(name, shape, batch, default, "(batch, seq_len, features)")
        model = cls(features=features)
        return model, *model.example_inputs(batch, seq_len)

    return build


def _zoo_gpt2(shape: Shape | None, batch: int | None) -> tuple[nn.Module, tuple, dict]:
    model = zoo.Conv1DGPT2()
    batch, seq_len = _shape("zoo-gpt2-conv1d", shape, batch, (2, 16), "(batch, seq_len)")
    if seq_len > model.config.n_positions:
        raise ConfigError(
            f"input_shape {shape} does not fit model 'zoo-gpt2-conv1d': seq_len {seq_len} > "
            f"n_positions {model.config.n_positions}"
        )
    return model, *model.example_inputs(batch, seq_len)


_BUILDERS: dict[str, _Builder] = {
    "mlp": _mlp,
    "gpt-tiny": _gpt("gpt-tiny", gpt_tiny),
    "gpt-small-bench": _gpt("gpt-small-bench", gpt_small_bench),
    "gpt2-small": _gpt("gpt2-small", gpt2_small),
    "cnn": _cnn,
    "conv1d": _conv1d,
    "zoo-data-dependent": _zoo_features("zoo-data-dependent", zoo.DataDependentMLP),
    "zoo-shape-branch": _zoo_sequence("zoo-shape-branch", zoo.ShapeBranchNet, (4, 24, 4)),
    "zoo-inplace": _zoo_features("zoo-inplace", zoo.InplaceAssignNet),
    "zoo-dataclass": _zoo_features("zoo-dataclass", zoo.DataclassOutputNet),
    "zoo-dict": _zoo_sequence("zoo-dict", zoo.DictOutputNet, (2, 8, 16)),
    "zoo-gpt2-conv1d": _zoo_gpt2,
}

_FACTORY_SYNTAX = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_EXPECTED = f"expected one of {sorted(BUILTIN_MODELS)} or 'package.module:factory'"


def _check_shape(input_shape: Any, batch: Any) -> Shape | None:
    """Validate ``input_shape`` and apply ``batch`` to its first dimension."""
    if input_shape is not None:
        if not isinstance(input_shape, (tuple, list)) or not input_shape:
            raise ConfigError(f"input_shape: {input_shape!r} is not a non-empty tuple of ints")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in input_shape):
            raise ConfigError(f"input_shape: {tuple(input_shape)!r} must hold positive ints")
        input_shape = tuple(input_shape)
    if batch is not None:
        if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
            raise ConfigError(f"batch: {batch!r} is not a positive int")
        if input_shape is not None:
            input_shape = (batch, *input_shape[1:])
    return input_shape


def _split_example(name: str, example: Any) -> tuple[tuple, dict]:
    """Normalize a factory's example inputs: a Tensor, an args tuple, a kwargs dict or ``(args, kwargs)``."""
    if isinstance(example, torch.Tensor):
        return (example,), {}
    if isinstance(example, dict):
        return (), dict(example)
    if (
        isinstance(example, (tuple, list))
        and len(example) == 2
        and isinstance(example[0], (tuple, list))
        and isinstance(example[1], dict)
    ):
        return tuple(example[0]), dict(example[1])
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    raise ConfigError(
        f"model {name!r}: factory returned example inputs of type {type(example).__name__}; "
        "expected a Tensor, an args tuple, a kwargs dict or (args, kwargs)"
    )


def _from_factory(spec: str, shape: Shape | None) -> tuple[nn.Module, tuple, dict]:
    """Import ``package.module:factory``, call it and normalize what it returns."""
    if not _FACTORY_SYNTAX.match(spec):
        raise ConfigError(f"model {spec!r}: not valid 'package.module:factory' syntax; {_EXPECTED}")
    module_name, attr_path = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        hint = _where(exc) if isinstance(exc, ModuleNotFoundError) else ""
        raise ConfigError(f"model {spec!r}: cannot import module {module_name!r}: {exc}{hint}") from exc
    factory: Any = module
    for attr in attr_path.split("."):
        if not hasattr(factory, attr):
            raise ConfigError(f"model {spec!r}: module {module_name!r} has no attribute {attr_path!r}")
        factory = getattr(factory, attr)
    if not callable(factory):
        raise ConfigError(
            f"model {spec!r}: {attr_path!r} is a {type(factory).__name__}, not a callable factory"
        )
    try:
        result = factory()
    except Exception as exc:
        raise ConfigError(
            f"model {spec!r}: factory {attr_path!r} raised {type(exc).__name__}: {exc}"
        ) from exc

    example: Any = None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        result, example = result
    if not isinstance(result, nn.Module):
        raise ConfigError(
            f"model {spec!r}: factory {attr_path!r} returned {type(result).__name__}; "
            "expected an nn.Module or an (nn.Module, example_inputs) pair"
        )
    if example is not None:
        return result, *_split_example(spec, example)
    if shape is not None:
        return result, (torch.randn(shape),), {}
    return result, (), {}


def _where(exc: ModuleNotFoundError) -> str:
    """Where Python looked for the missing module, and how to make it find it."""
    missing = exc.name or ""
    if not missing or "." in missing:  # the package was found; a module inside it is missing
        return ""
    folders = [os.path.abspath(p or os.curdir) for p in sys.path if os.path.isdir(p or os.curdir)]
    shown = ", ".join(folders[:4]) + (f" and {len(folders) - 4} more" if len(folders) > 4 else "")
    return (
        f" (looked for {missing}/ or {missing}.py in {shown}); run from the folder that holds "
        f"{missing}/ or {missing}.py, or add that folder to PYTHONPATH"
    )


def _fork_devices(device: torch.device) -> tuple[list[int], str]:
    """Accelerator devices whose RNG state ``fork_rng`` must save besides the CPU's."""
    if device.type == "cuda" and torch.cuda.is_available():
        return list(range(torch.cuda.device_count())), "cuda"
    return [], "cuda"


def build_model(
    spec: str,
    *,
    input_shape: tuple[int, ...] | None = None,
    batch: int | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> ModelSpec:
    """Build ``spec`` (a :data:`BUILTIN_MODELS` name or ``package.module:factory``) with example inputs.

    ``input_shape`` is the full shape of the first example input, batch included; built-ins
    adapt their input width to it where that makes sense, and a factory that returns no example
    inputs gets ``torch.randn(input_shape)`` (else no inputs at all). ``batch`` replaces the
    first dimension. Weights and inputs are created under ``torch.device(device)`` (``"meta"``
    allocates nothing) from ``seed``, without disturbing the global RNG. Every bad value raises
    :class:`~sparsefx.errors.ConfigError`.

        >>> build_model("cnn", batch=1).args[0].shape
        torch.Size([1, 3, 32, 32])
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"model {spec!r}: not a model name; {_EXPECTED}")
    try:
        torch_device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device: {device!r} is not a torch device: {exc}") from exc
    shape = _check_shape(input_shape, batch)

    devices, device_type = _fork_devices(torch_device)
    with torch.random.fork_rng(devices=devices, device_type=device_type), torch_device:
        torch.manual_seed(seed)
        if spec in _BUILDERS:
            model, args, kwargs = _BUILDERS[spec](shape, batch)
        elif ":" in spec:
            model, args, kwargs = _from_factory(spec, shape)
        else:
            raise ConfigError(f"model {spec!r}: unknown model; {_EXPECTED}")
    return ModelSpec(name=spec, model=model, args=args, kwargs=kwargs)
