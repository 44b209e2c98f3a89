"""Schedules and update schedules: values at given steps against hand-computed numbers, parsing and errors."""

from __future__ import annotations

import math
import re

import pytest

from sparsefx.config.schedules import (
    SCHEDULE_TYPES,
    Constant,
    Cosine,
    Cycling,
    Exp,
    Lambda,
    Linear,
    Polynomial,
    Power,
    UpdateSchedule,
    parse_schedule,
    parse_update,
)
from sparsefx.errors import ConfigError


def _raises(fragment: str):
    return pytest.raises(ConfigError, match=re.escape(fragment))


# --- values ------------------------------------------------------------------------------------------------


def test_constant():
    s = Constant(0.5)
    assert s(0) == s(10_000) == 0.5
    assert s.is_constant


def test_linear():
    s = Linear(0.1, 0.01)
    assert s(0) == pytest.approx(0.1)
    assert s(10) == pytest.approx(0.2)
    assert s(50) == pytest.approx(0.6)
    assert not s.is_constant


def test_exp():
    s = Exp(0.0, -0.5, final=0.9)
    assert s(0) == pytest.approx(0.0)
    # 0.9 - 0.9 * e^-1 = 0.9 - 0.331091497 = 0.568908503
    assert s(2) == pytest.approx(0.568908503, abs=1e-8)
    assert s(1000) == pytest.approx(0.9)
    # default final = 1: 1 - 0.8 * e^-1 = 0.705696447
    assert Exp(0.2, -1.0)(1) == pytest.approx(0.705696447, abs=1e-8)


def test_exp_overflow_does_not_raise():
    assert Exp(0.1, 1.0, final=0.5)(10**6) == -math.inf


def test_power():
    s = Power(0.8, 0.5)
    assert s(0) == pytest.approx(0.8)
    assert s(3) == pytest.approx(0.1)
    assert Power(0.0, 10.0)(10**6) == 0.0


def test_cosine():
    s = Cosine(0.6, 100, minimum=0.1)
    assert s(0) == pytest.approx(0.6)
    assert s(50) == pytest.approx(0.35)  # 0.1 + 0.25 * (1 + cos(pi/2))
    assert s(100) == pytest.approx(0.1)
    assert s(200) == pytest.approx(0.6)
    assert Cosine(0.3, 100)(100) == pytest.approx(0.0)


def test_cycling():
    s = Cycling((0.1, 0.2, 0.3))
    assert [s(t) for t in range(7)] == [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.1]
    assert not s.is_constant
    assert Cycling((0.3, 0.3)).is_constant


def test_lambda():
    s = Lambda(lambda t: t / 100)
    assert s(25) == 0.25
    assert not s.is_constant


def test_lambda_failure_is_config_error():
    with _raises("failed at step 3"):
        Lambda(lambda t: 1 / 0)(3)


def test_polynomial_gmp_cubic():
    s = Polynomial(0.0, 0.9, begin=10, end=110)
    assert s(0) == 0.0
    assert s(10) == pytest.approx(0.0)
    # halfway: 0.9 + (0 - 0.9) * 0.5^3 = 0.7875
    assert s(60) == pytest.approx(0.7875)
    # a quarter in: 0.9 - 0.9 * 0.75^3 = 0.9 - 0.3796875 = 0.5203125
    assert s(35) == pytest.approx(0.5203125)
    assert s(110) == 0.9
    assert s(10_000) == 0.9


def test_polynomial_other_power():
    s = Polynomial(0.2, 0.6, begin=0, end=4, power=1)
    assert s(1) == pytest.approx(0.3)  # 0.6 - 0.4 * 0.75


def test_polynomial_is_monotone_between_begin_and_end():
    s = Polynomial(0.1, 0.95, begin=5, end=50)
    values = [s(t) for t in range(60)]
    assert values == sorted(values)


# --- parsing -----------------------------------------------------------------------------------------------


def test_parse_shorthands():
    assert parse_schedule(0.5, "s") == Constant(0.5)
    assert parse_schedule(0, "s") == Constant(0.0)
    assert parse_schedule([0.1, 0.2], "s") == Cycling((0.1, 0.2))
    fn = lambda t: 0.5  # noqa: E731
    assert parse_schedule(fn, "s") == Lambda(fn)
    assert parse_schedule(Linear(0.1, 0.0), "s") == Linear(0.1, 0.0)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"type": "constant", "value": 0.4}, Constant(0.4)),
        ({"type": "linear", "init": 0.1, "slope": 0.001}, Linear(0.1, 0.001)),
        ({"type": "exp", "init": 0.0, "gamma": -0.1}, Exp(0.0, -0.1, 1.0)),
        ({"type": "exp", "init": 0.0, "gamma": -0.1, "final": 0.8}, Exp(0.0, -0.1, 0.8)),
        ({"type": "power", "init": 0.5, "beta": 0.9}, Power(0.5, 0.9)),
        ({"type": "cosine", "init": 0.3, "half_period": 1000}, Cosine(0.3, 1000.0, 0.0)),
        ({"type": "COSINE", "init": 0.3, "half_period": 10, "minimum": 0.1}, Cosine(0.3, 10.0, 0.1)),
        ({"type": "cycling", "values": [0.1, 0.2]}, Cycling((0.1, 0.2))),
        (
            {"type": "polynomial", "init": 0.0, "final": 0.9, "begin": 0, "end": 100},
            Polynomial(0.0, 0.9, 0, 100, 3.0),
        ),
    ],
)
def test_parse_dicts_and_round_trip(data, expected):
    schedule = parse_schedule(data, "sparsity.sparsity")
    assert schedule == expected
    assert parse_schedule(schedule.to_dict(), "s") == schedule


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (
            {"type": "cosin", "init": 0.3},
            "s.type: unknown schedule type 'cosin'; valid: constant, linear, exp, power, cosine, cycling, "
            "polynomial",
        ),
        ({"init": 0.3}, "s.type: missing"),
        ({"type": 3}, "s.type: unknown schedule type 3"),
        ({"type": "linear", "init": 0.1}, "s.slope: missing required key"),
        (
            {"type": "linear", "init": 0.1, "slope": 0.1, "gama": 1},
            "s.gama: unknown key; valid keys: type, init",
        ),
        ({"type": "linear", "init": "0.1", "slope": 0.1}, "s.init: expected a number, got '0.1'"),
        ({"type": "linear", "init": True, "slope": 0.1}, "s.init: expected a number, got True"),
        ({"type": "linear", "init": float("nan"), "slope": 0.1}, "s.init: nan is not finite"),
        ({"type": "linear", "init": 0.1, "slope": float("inf")}, "s.slope: inf is not finite"),
        ({"type": "cosine", "init": 0.3, "half_period": 0}, "s.half_period: 0.0 must be > 0"),
        ({"type": "cycling", "values": []}, "s.values: expected a non-empty list"),
        ({"type": "cycling", "values": "abc"}, "s.values: expected a non-empty list"),
        ({"type": "cycling", "values": [0.1, None]}, "s.values[1]: expected a number, got None"),
        (
            {"type": "polynomial", "init": 0, "final": 0.9, "begin": 5, "end": 5},
            "s.end: 5 must be > begin (5)",
        ),
        ({"type": "polynomial", "init": 0, "final": 0.9, "begin": -1, "end": 5}, "s.begin: -1 must be >= 0"),
        (
            {"type": "polynomial", "init": 0, "final": 0.9, "begin": 0.5, "end": 5},
            "s.begin: expected an integer",
        ),
        (
            {"type": "polynomial", "init": 0, "final": 0.9, "begin": 0, "end": 5, "power": 0},
            "s.power: 0.0 must",
        ),
        ({1: 2}, "s.type: missing"),
        (True, "s: expected a number or a schedule, got True"),
        ("0.5", "s: expected a number, a list, a callable or a schedule dict"),
        (None, "s: expected a number"),
        ([], "s: expected a non-empty list"),
        (10**400, "is not a representable number"),
    ],
)
def test_parse_errors(data, fragment):
    with _raises(fragment):
        parse_schedule(data, "s")


def test_schedule_types_listed():
    assert SCHEDULE_TYPES == ("constant", "linear", "exp", "power", "cosine", "cycling", "polynomial")


# --- update schedules --------------------------------------------------------------------------------------


def test_update_freq():
    u = UpdateSchedule(freq=100)
    assert [t for t in range(0, 401, 50) if u(t)] == [0, 100, 200, 300, 400]


def test_update_start_stop():
    u = parse_update({"freq": 5, "start": 10, "stop": 30}, "sparsity.update")
    assert u == UpdateSchedule(freq=5, start=10, stop=30)
    assert [t for t in range(40) if u(t)] == [10, 15, 20, 25]


def test_update_steps_sorted_unique():
    u = parse_update({"steps": [30, 10, 10, 0]}, "sparsity.update")
    assert u.steps == (0, 10, 30)
    assert [t for t in range(40) if u(t)] == [0, 10, 30]


def test_update_round_trip():
    for u in (UpdateSchedule(freq=3, start=1, stop=9), UpdateSchedule(steps=(1, 4))):
        assert parse_update(u.to_dict(), "u") == u
    assert parse_update(UpdateSchedule(freq=2), "u") == UpdateSchedule(freq=2)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"freq": 0}, "sparsity.update.freq: 0 must be >= 1"),
        ({"freq": True}, "sparsity.update.freq: expected an integer, got True"),
        ({"freq": 1.5}, "sparsity.update.freq: expected an integer, got 1.5"),
        ({"freq": 10, "start": -1}, "sparsity.update.start: -1 must be >= 0"),
        ({"freq": 10, "start": 5, "stop": 5}, "sparsity.update.stop: 5 must be > start (5)"),
        ({"freq": 10, "steps": [1]}, "sparsity.update: steps and freq/start/stop are mutually exclusive"),
        ({"steps": []}, "sparsity.update.steps: expected a non-empty list"),
        ({"steps": [1, -2]}, "sparsity.update.steps[1]: -2 must be >= 0"),
        ({"steps": None}, "sparsity.update.steps: expected a non-empty list"),
        ({"start": 3}, "sparsity.update.freq: missing"),
        ({"frequency": 3}, "sparsity.update.frequency: unknown key; valid keys: freq, start, stop, steps"),
        (100, "sparsity.update: expected a dict"),
    ],
)
def test_update_errors(data, fragment):
    with _raises(fragment):
        parse_update(data, "sparsity.update")


def test_update_direct_construction_is_checked():
    with _raises("update: give either freq"):
        UpdateSchedule()
    with _raises("update.freq: 0 must be >= 1"):
        UpdateSchedule(freq=0)
