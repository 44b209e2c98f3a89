"""``run``: execute a dataflow program on inputs, and report what it cost on the emulated mesh.

The values come from the PEs' own data (``runtime/evaluate.py``: every sparse matmul from its per-PE
CSC slices, partial sums added across PEs); the cycles come from the clock (``runtime/fast.py``)
under the cost rules of ``runtime/cost.py``. Zeros are filtered at the sender: a message (one feature
of one block of rows) whose values the evaluation finds all zero is not sent. The dense baseline
(``runtime/baseline.py``) runs through the same executor, with the same zeros filtered (the reference
times it on the zero patterns alone, ``reference.time_patterns``: a program holds no all-ones weights)::

    >>> import sparsefx
    >>> torch.manual_seed(0) and None
    >>> sm = sparsefx.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), 0.9)
    >>> x = torch.randn(8, 64)
    >>> program = sparsefx.lower(sm, x, mesh=(8, 8))
    >>> result = run(program, x)
    >>> torch.allclose(result.outputs, sm.eval()(x), rtol=1e-4, atol=1e-5)
    True
    >>> result.stats.cycles > 0, result.stats.dense.ideal > 1
    (True, True)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function

from sparsefx.errors import EmulationError

from .baseline import dense_activity, dense_program, unavailable
from .evaluate import evaluate
from .fast import simulate
from .program import Kernel, ProgramData
from .reference import execute, time_patterns
from .stats import RunStats, collect, compare

__all__ = ["RunResult", "run", "EXECUTORS"]

EXECUTORS = ("fast", "reference")


@dataclass
class RunResult:
    """A run's outputs (the model's own structure) and its ``RunStats``."""

    outputs: Any
    stats: RunStats


class _Activity:
    """Which elements of every value are nonzero, ``[rows, features]`` bool: the clock's senders filter
    the messages that are all zero (``runtime/timeline.py``, ``Flow.live``).

    The flags are made where the values are and stay there while the program is evaluated; ``to_host``
    then brings them all to the CPU, where the clock runs, in one copy: one host sync per run, not one
    per value. The same holds for the NaN/inf check of each sparse matmul's input (``nonfinite``)."""

    def __init__(self, program: ProgramData) -> None:
        self.seen: dict[str, torch.Tensor] = {}
        self.nonfinite: list[str] = []  # sparse matmuls that read NaN or inf (once ``to_host`` has run)
        self.inputs = {s.name for s in program.inputs}
        self._finite: list[tuple[str, torch.Tensor]] = []  # (sparse matmul, its input is finite)

    def __call__(self, k: Kernel, inputs: list[torch.Tensor], result: torch.Tensor) -> None:
        for name, value in zip(k.inputs, inputs):
            if name in self.inputs and name not in self.seen:
                self.seen[name] = _nonzero(value)
        self.seen[k.name] = _nonzero(result)
        if k.op == "sparse_matmul":
            self._finite.append((k.name, torch.isfinite(inputs[0]).all()))

    def to_host(self) -> None:
        """Move the flags to the CPU (one copy from each device they are on) and read the NaN/inf checks."""
        names, flags = list(self.seen), list(self.seen.values())
        finite = [f for _, f in self._finite]
        for i, t in enumerate(_on_host(flags + finite)):
            if i < len(names):
                self.seen[names[i]] = t
            elif not bool(t):
                self.nonfinite.append(self._finite[i - len(names)][0])
        self._finite = []


def _nonzero(value: torch.Tensor) -> torch.Tensor:
    """``[rows, features]``: where ``value`` is nonzero, on its device (a scalar: one row, one feature)."""
    flags = value != 0
    if flags.dim() == 0:
        return flags.reshape(1, 1)
    return flags.reshape(math.prod(flags.shape[:-1]), flags.shape[-1])


def _on_host(flags: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flags`` (bool tensors) on the CPU, in order: those of each other device are concatenated there
    and copied in one transfer, then split into views of the one host buffer."""
    out = list(flags)
    devices = {t.device for t in flags if t.device.type != "cpu"}
    for dev in devices:
        at = [i for i, t in enumerate(flags) if t.device == dev]
        host = torch.cat([flags[i].reshape(-1) for i in at]).cpu()
        for i, piece in zip(at, host.split([flags[i].numel() for i in at])):
            out[i] = piece.view(flags[i].shape)
    return out


def run(
    program: ProgramData,
    inputs: Any,
    executor: str = "fast",
    device: str | torch.device | None = None,
) -> RunResult:
    """Run ``program`` on ``inputs`` (module docstring). ``device`` (CPU by default) holds the fast
    executor's values: the model's arithmetic runs there. Its clock always runs on the host (the CPU):
    it schedules small integers over many tiny, data-dependent tensors, so on a GPU it would be bound
    by kernel launches and host syncs, not by work. The zero patterns it reads come to the host in one
    copy after the evaluation (``_Activity.to_host``); the timeline and stats are the same, cycle for
    cycle, wherever the values ran. The reference executor runs on the CPU and moves only its outputs
    to ``device``."""
    if executor not in EXECUTORS:
        raise EmulationError(f"executor {executor!r} is not one of {', '.join(EXECUTORS)}")
    device = _device(device)
    activity = _Activity(program)
    if executor == "reference":
        outputs, timeline = execute(program, inputs, device, listener=activity)  # the PEs' own values
        activity.to_host()
    else:
        with record_function("sparsefx.run: evaluate"):
            outputs = evaluate(program, inputs, device, listener=activity)
            activity.to_host()
        with record_function("sparsefx.run: clock"):
            timeline = simulate(program, activity.seen)  # on the host, whatever ``device`` is
    _warn_nonfinite(activity.nonfinite)
    with record_function("sparsefx.run: stats"):
        stats = collect(program, timeline, executor)
    dense = dense_program(program)
    if dense is None:
        stats.dense_unavailable = unavailable(program)
    else:
        patterns = dense_activity(activity.seen, dense)
        # the reference times its own baseline: the dense values' zeros stand in for them
        with record_function("sparsefx.run: clock (dense baseline)"):
            timed = simulate(dense, patterns) if executor == "fast" else time_patterns(dense, patterns)
        with record_function("sparsefx.run: stats (dense baseline)"):
            baseline = collect(dense, timed, executor, mesh_detail=False)  # compare reads cycles and parts
            stats.dense = compare(program, stats, baseline)
    return RunResult(outputs, stats)


def _warn_nonfinite(kernels: list[str]) -> None:
    """Say that NaN or inf met a sparse matmul: there the mesh and the compiled model differ."""
    if not kernels:
        return
    names = ", ".join(dict.fromkeys(kernels))
    warnings.warn(
        f"sparse matmul {names} read NaN or inf: the mesh multiplies only kept weights, so those values "
        "reach fewer outputs than through the compiled model, whose masked dense product gives "
        "NaN * 0 = NaN at every pruned weight (README, 'NaN and inf')",
        stacklevel=3,
    )


def _device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device``, checked: an ``EmulationError`` names a bad or absent one."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        valid = "'cpu', 'cuda', 'cuda:1'..."
        raise EmulationError(f"device {device!r} is not a torch device (valid: {valid})") from exc
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, AttributeError) as exc:  # no such device here
        raise EmulationError(
            f"device {device!r} is not available here ({str(exc).splitlines()[0].split('. ')[0]}); "
            "'cpu' always is"
        ) from exc
    return dev
