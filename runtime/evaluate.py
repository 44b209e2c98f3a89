"""Run a ``DataflowProgram`` on inputs: the values its kernels compute, rebuilt as the model returns them.

``evaluate`` checks the inputs against the program's input streams (names, shapes, dtypes), runs the
kernels in program order through ``runtime.semantics.RULES`` (the sparse matmuls from their per-PE CSC
slices, ``runtime/sparse_eval.py``) and rebuilds the outputs from ``program.output_tree``. It is the
value semantics the cycle-level executors reuse; it never calls the model::

    >>> import sparsefx
    >>> torch.manual_seed(0) and None
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), 0.5)
    >>> x = torch.randn(2, 8)
    >>> program = sparsefx.lower(sm, x, mesh=(4, 4))
    >>> torch.allclose(evaluate(program, x), sm.eval()(x), rtol=1e-4, atol=1e-5)
    True
    >>> evaluate(program, torch.randn(3, 8))
    Traceback (most recent call last):
    ...
    sparsefx.errors.EmulationError: input 'input_1' has shape [3, 8]; the program was lowered for [2, 8]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from sparsefx.errors import EmulationError

from .call import KEY, check_constant, constant_at, is_constant
from .memo import kept
from .outputs import rebuild_outputs
from .program import DTYPES, Kernel, ProgramData, Stream
from .semantics import apply

__all__ = ["evaluate", "bind_inputs", "rebuild_outputs", "Listener"]


class _OnDevice(Mapping):
    """``program.arrays`` moved to ``device`` when first read. The copies are kept while the program's
    arrays live (``runtime/memo.py``, keyed by device), so a program run again on a device neither moves
    its payloads again nor derives again what is kept per payload (a sparse matmul's merged matrix)."""

    def __init__(self, arrays: Mapping[str, torch.Tensor], device: torch.device) -> None:
        self._arrays, self._device = arrays, device

    def __getitem__(self, name: str) -> torch.Tensor:
        array = self._arrays[name]
        if array.device == self._device:
            return array
        return kept(array, ("on device", self._device), lambda: array.to(self._device))

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __contains__(self, name: object) -> bool:
        return name in self._arrays


def bind_inputs(program: ProgramData, inputs: Any) -> dict[str, torch.Tensor]:
    """``{stream name: tensor}`` from a tensor, a tuple/list of positional args or a dict of kwargs.

    Positional args match the program's inputs in order, kwargs by name; ``None`` stands for an argument
    the model was called without (no stream). Non-tensor arguments (flags, sizes, strings) must be the
    ones the program was lowered with (``runtime/call.py``). A missing or extra input, a non-tensor, or a
    shape or dtype other than lowered for is an ``EmulationError`` naming the input, what it is and what
    was expected.
    """
    streams = program.inputs
    constants = program.meta.get(KEY)
    constants = constants if isinstance(constants, dict) else {}
    if inputs is None:
        given: dict[str, Any] = {}
    elif isinstance(inputs, Mapping):
        given = _by_name(streams, constants, inputs)
    else:
        args = _tensor_args(constants, inputs if isinstance(inputs, (tuple, list)) else (inputs,))
        if len(args) > len(streams):
            raise EmulationError(
                f"{len(args)} positional inputs given; the program takes {len(streams)}: "
                f"{[s.name for s in streams]}"
            )
        given = {s.name: a for s, a in zip(streams, args)}
    missing = [s.name for s in streams if s.name not in given]
    if missing:
        raise EmulationError(f"inputs {missing} are missing; the program takes {[s.name for s in streams]}")
    for s in streams:
        value = given[s.name]
        if not isinstance(value, torch.Tensor):
            raise EmulationError(f"input {s.name!r} is a {type(value).__name__}, not a tensor")
        if tuple(value.shape) != tuple(s.shape):
            raise EmulationError(
                f"input {s.name!r} has shape {list(value.shape)}; the program was lowered for {list(s.shape)}"
            )
        if DTYPES.get(s.dtype) != value.dtype:
            raise EmulationError(
                f"input {s.name!r} has dtype {str(value.dtype).removeprefix('torch.')}; "
                f"the program was lowered for {s.dtype}"
            )
    return {s.name: given[s.name] for s in streams}


def _by_name(streams: list[Stream], constants: dict[str, Any], inputs: Mapping) -> dict[str, Any]:
    """The stream values of a dict of kwargs; its non-tensor values are checked against ``constants``."""
    names = {s.name for s in streams}
    given, extra = {}, []
    for key, value in inputs.items():
        key = str(key)
        if key in names or not is_constant(value):
            if key not in names:
                extra.append(key)
            elif value is not None:
                given[key] = value
        elif value is not None or key in constants:
            check_constant(constants, key, value)
    if extra:
        raise EmulationError(
            f"inputs {extra} are not inputs of the program; it takes {[s.name for s in streams]}"
        )
    return given


def _tensor_args(constants: dict[str, Any], args: tuple | list) -> list[Any]:
    """The positional args that feed streams: the others are constants (checked) or ``None``."""
    out = []
    for i, value in enumerate(args):
        name = constant_at(constants, i) if is_constant(value) else None
        if name is not None:
            check_constant(constants, name, value)
        elif value is not None:
            out.append(value)
    return out


Listener = Callable[[Kernel, list[torch.Tensor], torch.Tensor], None]
"""Called after each kernel with the kernel, its input values and its result."""


def evaluate(
    program: ProgramData,
    inputs: Any,
    device: str | torch.device | None = None,
    listener: Listener | None = None,
) -> Any:
    """The program's outputs on ``inputs``, in the model's own output structure (module docstring).

    ``inputs`` takes the forms ``sparsefx.compile`` takes (``bind_inputs``). Kernels run in order on
    ``device`` (the CPU by default; payloads move there when first read). Outputs come back as the model
    returns them: tensors, tuples, lists, dicts, dataclasses and key/value caches, rebuilt by
    ``rebuild_outputs`` (``runtime/outputs.py`` says which classes a program loaded from a file
    rebuilds; any other comes back as a dict of its fields, with a warning). Any failure is an
    ``EmulationError`` naming the kernel. ``listener(kernel, inputs, result)``, when given, sees every
    kernel as it runs.
    """
    if not program.has_payloads:
        raise EmulationError("the program has no payloads (parsed from text?); load it from a program file")
    device = torch.device(device if device is not None else "cpu")
    values = {name: t.to(device) for name, t in bind_inputs(program, inputs).items()}
    view = dataclasses.replace(program, arrays=_OnDevice(program.arrays, device))
    last = {name: i for i, k in enumerate(program.kernels) for name in k.inputs}
    keep = set(program.outputs)
    with torch.no_grad():
        for i, k in enumerate(program.kernels):
            missing = [n for n in k.inputs if n not in values]
            if missing:
                raise EmulationError(f"kernel {k.name!r} ({k.op}): reads {missing}, not computed before it")
            args = [values[n] for n in k.inputs]
            values[k.name] = apply(view, k, args)
            if listener is not None:
                listener(k, args, values[k.name])
            for name in set(k.inputs):
                if last[name] == i and name not in keep:
                    del values[name]  # its last reader has run
    missing = [n for n in program.outputs if n not in values]
    if missing:
        raise EmulationError(f"outputs {missing} are computed by no kernel")
    return rebuild_outputs(program.output_tree, [values[n] for n in program.outputs], program.output_spec)
