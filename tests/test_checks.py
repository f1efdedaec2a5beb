"""The scalar checks of `workbench._checks`: what each accepts, what it returns, and the message
(argument, bad value, what is allowed); and a few library call sites that use them."""

import math

import numpy as np
import pytest

import workbench as wb
from workbench._checks import (
    finite_float,
    int_in_range,
    is_int,
    is_number,
    positive_float,
    positive_int,
)
from workbench.particles._starts import uniform_sphere


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_predicates():
    assert [is_int(v) for v in (0, -3, np.int64(2), np.uint8(1))] == [True] * 4
    assert [is_int(v) for v in (True, np.bool_(True), 2.0, "2", None)] == [False] * 5
    assert not is_int(np.int64(2), numpy_ints=False) and is_int(2, numpy_ints=False)
    assert [is_number(v) for v in (0, 2.5, np.float64(1.0), math.inf, math.nan)] == [True] * 5
    assert [is_number(v) for v in (True, 1j, "1", np.float32(1.0), np.int64(1))] == [False] * 5
    assert is_number(np.float32(1.0), numpy_scalars=True)
    assert is_number(np.int64(1), numpy_scalars=True)
    assert not is_number(np.bool_(True), numpy_scalars=True)


def test_positive_int_accepts_and_converts():
    assert positive_int("n", 3) == 3
    got = positive_int("n", np.int32(7))
    assert got == 7 and type(got) is int
    assert positive_int("n", 0, allow_zero=True) == 0
    assert positive_int("n", None, allow_none=True) is None


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        (0, {}, "n=0 must be a positive integer."),
        (True, {}, "n=True must be a positive integer."),
        (2.0, {}, "n=2.0 must be a positive integer."),
        (None, {}, "n=None must be a positive integer."),
        (np.int64(0), {}, "n=0 must be a positive integer."),  # shown by value
        (np.int64(3), {"numpy_ints": False}, "n=3 must be a positive integer."),
        (-1, {"allow_zero": True}, "n=-1 must be a nonnegative integer."),
        (False, {"allow_zero": True}, "n=False must be a nonnegative integer."),
        (0, {"allow_none": True}, "n=0 must be None or a positive integer."),
        (0, {"owner": "simulate"}, "simulate: n=0 must be a positive integer."),
        (-2, {"hint": "the step is T/n"}, "n=-2 must be a positive integer (the step is T/n)."),
    ],
)
def test_positive_int_refuses(value, kwargs, message):
    assert _message(positive_int, "n", value, **kwargs) == message


def test_int_in_range():
    assert int_in_range("k", 2, 2) == 2
    assert int_in_range("k", np.int16(0), 0, 3) == 0
    assert int_in_range("k", 2, 0, 3) == 2
    assert _message(int_in_range, "k", 1, 2) == "k=1 must be an integer >= 2."
    assert _message(int_in_range, "k", 3, 0, 3) == "k=3 must be an integer in [0, 3)."
    assert _message(int_in_range, "k", True, 0, 3) == "k=True must be an integer in [0, 3)."
    assert _message(int_in_range, "k", 1.0, 1) == "k=1.0 must be an integer >= 1."
    assert _message(int_in_range, "keep", np.int64(5), 2, numpy_ints=False) == (
        "keep=5 must be an integer >= 2."
    )
    assert _message(int_in_range, "k", 0, 1, owner="f", hint="why") == (
        "f: k=0 must be an integer >= 1 (why)."
    )


def test_positive_float():
    got = positive_float("eps", 1)
    assert got == 1.0 and type(got) is float
    assert positive_float("eps", np.float64(0.5)) == 0.5
    assert positive_float("eps", 0.0, allow_zero=True) == 0.0
    assert positive_float("eps", math.inf, finite=False) == math.inf
    assert positive_float("eps", np.float32(0.25), numpy_scalars=True) == 0.25
    cases = [
        (0.0, {}, "eps=0.0 must be a finite number > 0."),
        (-1, {"allow_zero": True}, "eps=-1 must be a finite number >= 0."),
        (math.inf, {}, "eps=inf must be a finite number > 0."),
        (math.nan, {}, "eps=nan must be a finite number > 0."),
        (math.nan, {"finite": False}, "eps=nan must be a number > 0."),
        (-math.inf, {"finite": False, "allow_zero": True}, "eps=-inf must be a number >= 0."),
        (True, {}, "eps=True must be a finite number > 0."),
        ("1", {}, "eps='1' must be a finite number > 0."),
        (np.float32(0.5), {}, "eps=0.5 must be a finite number > 0."),
        (0, {"owner": "Penalty", "hint": "e.g. 1e-4"}, "Penalty: eps=0 must be a finite number > 0 (e.g. 1e-4)."),
    ]  # fmt: skip
    for value, kwargs, message in cases:
        assert _message(positive_float, "eps", value, **kwargs) == message


def test_finite_float():
    assert finite_float("x", -3) == -3.0
    assert finite_float("x", np.int8(2), numpy_scalars=True) == 2.0
    for bad in (math.nan, math.inf, -math.inf, False, None):
        assert _message(finite_float, "x", bad) == f"x={bad!r} must be a finite number."


# ----------------------------------------------------------------------------------------------
# Call sites keep their rules and messages


def test_call_sites():
    with pytest.raises(ValueError, match=r"^CheckpointEvery.every=0 must be a positive integer\.$"):
        wb.CheckpointEvery(0)
    match = r"^BinomialCheckpointing.checkpoints=True must be None or a positive integer\.$"
    with pytest.raises(ValueError, match=match):
        wb.BinomialCheckpointing(True)
    with pytest.raises(ValueError, match=r"^Penalty.epsilon=0 must be a number > 0 \(e.g. 1e-4\)"):
        wb.Penalty(0)
    assert wb.Penalty(math.inf).epsilon == math.inf  # unchanged: only > 0 is asked for
    with pytest.raises(ValueError, match=r"^uniform_sphere: n=0 must be an integer >= 1\.$"):
        uniform_sphere(np.random.default_rng(0), 1, 0, 3)
    with pytest.raises(ValueError, match=r"^simulate: num_steps=-1 must be a nonnegative integer"):
        wb.particles._simulate._check_num_steps(-1)
    match = r"^num=1 must be an integer >= 2 \(the number of nodes of a quadrature grid\)\.$"
    with pytest.raises(ValueError, match=match):
        wb.analysis.MidpointRule().nodes_weights(1)
    with pytest.raises(ValueError, match=r"^KineticEnergy.weight=nan must be a finite number >= 0"):
        wb.control.KineticEnergy(math.nan)
