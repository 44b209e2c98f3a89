"""Schedules: a value (sparsity, drop fraction) as a function of the training step, and update steps.

Every schedule is a frozen dataclass, callable on an integer step, and round-trips through ``to_dict``::

    >>> s = parse_schedule({"type": "polynomial", "init": 0.0, "final": 0.8, "begin": 0, "end": 10}, "s")
    >>> round(s(5), 4)
    0.7
    >>> parse_schedule(s.to_dict(), "sparsity") == s
    True
    >>> UpdateSchedule(freq=100)(200)
    True
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparsefx.errors import ConfigError

__all__ = [
    "Schedule",
    "Constant",
    "Linear",
    "Exp",
    "Power",
    "Cosine",
    "Cycling",
    "Lambda",
    "Polynomial",
    "SCHEDULE_TYPES",
    "parse_schedule",
    "UpdateSchedule",
    "parse_update",
    "short_repr",
    "key_path",
]

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 3


def short_repr(value: Any) -> str:
    """A bounded repr for error messages: ``short_repr("x" * 1000)`` stays short."""
    try:
        return _repr.repr(value)
    except Exception:  # a hostile __repr__ must not turn a ConfigError into something else
        return f"<{type(value).__name__}>"


def key_path(path: str, key: Any) -> str:
    """``key_path("sparsity", "seed") == "sparsity.seed"``; odd keys are quoted: ``sparsity['a b']``."""
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{short_repr(key)}]"


def _number(value: Any, path: str) -> float:
    """A finite real number (never a bool) as a float, or a ConfigError naming ``path``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " (YAML reads 1e-3 as a string; write 1.0e-3)" if isinstance(value, str) else ""
        raise ConfigError(f"{path}: expected a number, got {short_repr(value)}{hint}")
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        raise ConfigError(f"{path}: {short_repr(value)} is not a representable number") from None
    if not math.isfinite(number):
        raise ConfigError(f"{path}: {short_repr(value)} is not finite")
    return number


def _integer(value: Any, path: str, minimum: int | None = None) -> int:
    """An integer (never a bool), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{path}: expected an integer, got {short_repr(value)}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ConfigError(f"{path}: {number} must be >= {minimum}")
    return number


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


class Schedule:
    """Base of all schedules: ``sched(step) -> float``, ``to_dict()``, ``is_constant``."""

    def __call__(self, step: int) -> float:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def is_constant(self) -> bool:
        return False

    @property
    def kind(self) -> str:
        """The ``type`` name used in configs, e.g. ``"polynomial"``."""
        return type(self).__name__.lower()


@dataclass(frozen=True)
class Constant(Schedule):
    """Always ``value``: ``Constant(0.5)(1000) == 0.5``."""

    value: float

    def __call__(self, step: int) -> float:
        return float(self.value)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "constant", "value": self.value}

    @property
    def is_constant(self) -> bool:
        return True


@dataclass(frozen=True)
class Linear(Schedule):
    """``init + slope * step``: ``Linear(0.1, 0.01)(10) == 0.2``."""

    init: float
    slope: float

    def __call__(self, step: int) -> float:
        return self.init + self.slope * step

    def to_dict(self) -> dict[str, Any]:
        return {"type": "linear", "init": self.init, "slope": self.slope}


@dataclass(frozen=True)
class Exp(Schedule):
    """``final - (final - init) * e^(gamma * step)``: ``Exp(0.0, -1.0, 0.9)(0) == 0.0``, tends to 0.9."""

    init: float
    gamma: float
    final: float = 1.0

    def __call__(self, step: int) -> float:
        delta = self.final - self.init
        if delta == 0.0:
            return self.final
        return self.final - delta * _exp(self.gamma * step)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "exp", "init": self.init, "gamma": self.gamma, "final": self.final}


@dataclass(frozen=True)
class Power(Schedule):
    """``init * beta^step``: ``Power(0.5, 0.5)(2) == 0.125``."""

    init: float
    beta: float

    def __call__(self, step: int) -> float:
        try:
            factor = self.beta**step
        except OverflowError:
            factor = math.inf
        except ZeroDivisionError:  # 0.0 ** negative step
            factor = math.inf
        if self.init == 0.0:
            return 0.0
        return self.init * factor

    def to_dict(self) -> dict[str, Any]:
        return {"type": "power", "init": self.init, "beta": self.beta}


@dataclass(frozen=True)
class Cosine(Schedule):
    """Half a cosine from ``init`` down to ``minimum`` over ``half_period`` steps, then back up.

    ``minimum + (init - minimum)/2 * (1 + cos(pi * step / half_period))``: ``Cosine(0.3, 100)(100) == 0``.
    """

    init: float
    half_period: float
    minimum: float = 0.0

    def __call__(self, step: int) -> float:
        amplitude = (self.init - self.minimum) / 2.0
        return self.minimum + amplitude * (1.0 + math.cos(math.pi * step / self.half_period))

    def to_dict(self) -> dict[str, Any]:
        return {"type": "cosine", "init": self.init, "half_period": self.half_period, "minimum": self.minimum}


@dataclass(frozen=True)
class Cycling(Schedule):
    """``values[step % len(values)]``: ``Cycling((0.1, 0.2))(3) == 0.2``."""

    values: tuple[float, ...]

    def __call__(self, step: int) -> float:
        return float(self.values[step % len(self.values)])

    def to_dict(self) -> dict[str, Any]:
        return {"type": "cycling", "values": list(self.values)}

    @property
    def is_constant(self) -> bool:
        return len(set(self.values)) == 1


@dataclass(frozen=True)
class Lambda(Schedule):
    """A user function of the step: ``Lambda(lambda t: 0.5)(7) == 0.5``. Not serialisable to YAML."""

    fn: Callable[[int], float]

    def __call__(self, step: int) -> float:
        try:
            return float(self.fn(step))
        except Exception as exc:
            raise ConfigError(
                f"schedule function {short_repr(self.fn)} failed at step {step}: {exc}"
            ) from exc

    def to_dict(self) -> dict[str, Any]:
        return {"type": "lambda", "fn": self.fn}


@dataclass(frozen=True)
class Polynomial(Schedule):
    """Zhu-Gupta gradual pruning: ``init`` before ``begin``, ``final`` from ``end``, and in between
    ``final + (init - final) * (1 - (t - begin)/(end - begin))^power``.

    >>> round(Polynomial(0.0, 0.8, 0, 10)(5), 4)
    0.7
    """

    init: float
    final: float
    begin: int
    end: int
    power: float = 3.0

    def __call__(self, step: int) -> float:
        if step <= self.begin:
            return self.init
        if step >= self.end:
            return self.final
        remaining = 1.0 - (step - self.begin) / (self.end - self.begin)
        return self.final + (self.init - self.final) * remaining**self.power

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "polynomial",
            "init": self.init,
            "final": self.final,
            "begin": self.begin,
            "end": self.end,
            "power": self.power,
        }


# type name -> (class, required keys, optional keys with defaults)
_SPECS: dict[str, tuple[type[Schedule], tuple[str, ...], dict[str, Any]]] = {
    "constant": (Constant, ("value",), {}),
    "linear": (Linear, ("init", "slope"), {}),
    "exp": (Exp, ("init", "gamma"), {"final": 1.0}),
    "power": (Power, ("init", "beta"), {}),
    "cosine": (Cosine, ("init", "half_period"), {"minimum": 0.0}),
    "cycling": (Cycling, ("values",), {}),
    "polynomial": (Polynomial, ("init", "final", "begin", "end"), {"power": 3.0}),
}
SCHEDULE_TYPES: tuple[str, ...] = tuple(_SPECS)
_INT_KEYS = frozenset({"begin", "end"})


def _values(value: Any, path: str) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{path}: expected a non-empty list of numbers, got {short_repr(value)}")
    if len(value) == 0:
        raise ConfigError(f"{path}: expected a non-empty list of numbers, got an empty list")
    return tuple(_number(item, f"{path}[{i}]") for i, item in enumerate(value))


def _check_keys(mapping: Mapping[Any, Any], valid: Sequence[str], path: str) -> None:
    """Every key of ``mapping`` is one of ``valid``, else a ConfigError naming the key and the valid ones."""
    for key in mapping:
        if not isinstance(key, str) or key not in valid:
            raise ConfigError(f"{key_path(path, key)}: unknown key; valid keys: {', '.join(valid)}")


def _from_dict(value: Mapping[Any, Any], path: str) -> Schedule:
    if "type" not in value:
        raise ConfigError(
            f"{path}.type: missing; a schedule dict needs a type, one of {', '.join(SCHEDULE_TYPES)}"
        )
    kind = value["type"]
    if not isinstance(kind, str) or kind.lower() not in _SPECS:
        raise ConfigError(
            f"{path}.type: unknown schedule type {short_repr(kind)}; valid: {', '.join(SCHEDULE_TYPES)}"
        )
    cls, required, optional = _SPECS[kind.lower()]
    valid = ("type", *required, *optional)
    _check_keys(value, valid, path)
    for key in required:
        if key not in value:
            raise ConfigError(
                f"{path}.{key}: missing required key for a {kind.lower()} schedule; keys: {', '.join(valid)}"
            )
    args: dict[str, Any] = {}
    for key in (*required, *optional):
        raw = value.get(key, optional.get(key))
        if key == "values":
            args[key] = _values(raw, f"{path}.{key}")
        elif key in _INT_KEYS:
            args[key] = _integer(raw, f"{path}.{key}", minimum=0)
        else:
            args[key] = _number(raw, f"{path}.{key}")
    return _checked(cls(**args), path)


def _checked(schedule: Schedule, path: str) -> Schedule:
    """Constraints between a schedule's own fields."""
    if isinstance(schedule, Cosine) and schedule.half_period <= 0:
        raise ConfigError(f"{path}.half_period: {schedule.half_period} must be > 0")
    if isinstance(schedule, Polynomial):
        if schedule.end <= schedule.begin:
            raise ConfigError(f"{path}.end: {schedule.end} must be > begin ({schedule.begin})")
        if schedule.power <= 0:
            raise ConfigError(f"{path}.power: {schedule.power} must be > 0")
    return schedule


def parse_schedule(value: Any, path: str) -> Schedule:
    """A number, list (cycling), callable (lambda), schedule dict or Schedule, as a Schedule.

    >>> parse_schedule(0.5, "sparsity")
    Constant(value=0.5)
    >>> parse_schedule([0.1, 0.2], "sparsity")
    Cycling(values=(0.1, 0.2))
    """
    if isinstance(value, Schedule):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"{path}: expected a number or a schedule, got {value!r}")
    if isinstance(value, numbers.Real):
        return Constant(_number(value, path))
    if isinstance(value, Mapping):
        return _from_dict(value, path)
    if isinstance(value, (list, tuple)):
        return Cycling(_values(value, path))
    if callable(value):
        return Lambda(value)
    raise ConfigError(
        f"{path}: expected a number, a list, a callable or a schedule dict with type "
        f"({', '.join(SCHEDULE_TYPES)}), got {short_repr(value)}"
    )


def _check_update(freq: Any, start: Any, stop: Any, steps: Any, path: str) -> None:
    if (freq is None) == (steps is None):
        raise ConfigError(
            f"{path}: give either freq (with optional start, stop) or steps, not both or neither"
        )
    if steps is not None:
        if start != 0 or stop is not None:
            raise ConfigError(f"{path}.steps: cannot be combined with start or stop")
        for i, step in enumerate(steps):
            _integer(step, f"{path}.steps[{i}]", minimum=0)
        return
    _integer(freq, f"{path}.freq", minimum=1)
    _integer(start, f"{path}.start", minimum=0)
    if stop is not None and _integer(stop, f"{path}.stop") <= start:
        raise ConfigError(f"{path}.stop: {stop} must be > start ({start})")


@dataclass(frozen=True)
class UpdateSchedule:
    """Which steps update a dynamic mask: every ``freq`` steps in ``[start, stop)``, or the listed ``steps``.

    >>> [s for s in range(10) if UpdateSchedule(freq=3, start=1, stop=8)(s)]
    [1, 4, 7]
    >>> UpdateSchedule(steps=(5, 9))(9)
    True
    """

    freq: int | None = None
    start: int = 0
    stop: int | None = None
    steps: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_update(self.freq, self.start, self.stop, self.steps, "update")

    def __call__(self, step: int) -> bool:
        if self.steps is not None:
            return step in self.steps
        if step < self.start or (self.stop is not None and step >= self.stop):
            return False
        return (step - self.start) % self.freq == 0

    def to_dict(self) -> dict[str, Any]:
        if self.steps is not None:
            return {"steps": list(self.steps)}
        return {"freq": self.freq, "start": self.start, "stop": self.stop}


_UPDATE_KEYS = ("freq", "start", "stop", "steps")


def parse_update(value: Any, path: str) -> UpdateSchedule:
    """``{freq, start, stop}`` or ``{steps: [...]}`` as an UpdateSchedule.

    >>> parse_update({"steps": [30, 10, 10]}, "sparsity.update")
    UpdateSchedule(freq=None, start=0, stop=None, steps=(10, 30))
    """
    if isinstance(value, UpdateSchedule):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{path}: expected a dict with freq/start/stop or with steps, got {short_repr(value)}"
        )
    _check_keys(value, _UPDATE_KEYS, path)
    steps = value.get("steps")
    if steps is not None:
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or len(steps) == 0:
            raise ConfigError(
                f"{path}.steps: expected a non-empty list of step numbers, got {short_repr(steps)}"
            )
        if "freq" in value or "start" in value or "stop" in value:
            raise ConfigError(f"{path}: steps and freq/start/stop are mutually exclusive")
        ints = [_integer(step, f"{path}.steps[{i}]", minimum=0) for i, step in enumerate(steps)]
        return UpdateSchedule(steps=tuple(sorted(set(ints))))
    if "steps" in value:
        raise ConfigError(f"{path}.steps: expected a non-empty list of step numbers, got None")
    if "freq" not in value:
        raise ConfigError(f"{path}.freq: missing; give freq (with optional start, stop) or steps")
    freq = _integer(value["freq"], f"{path}.freq", minimum=1)
    start = _integer(value.get("start", 0), f"{path}.start", minimum=0)
    stop = value.get("stop")
    if stop is not None:
        stop = _integer(stop, f"{path}.stop")
        if stop <= start:
            raise ConfigError(f"{path}.stop: {stop} must be > start ({start})")
    return UpdateSchedule(freq=freq, start=start, stop=stop)
