"""The scalar checks of `workbench._checks`: what each accepts, what it returns, and the message
(argument, bad value, what is allowed); and a few library call sites that use them."""

import math

import numpy as np
import pytest

import workbench as wb
from workbench._checks import (
    boolean,
    finite_float,
    int_in_range,
    is_int,
    is_number,
    number_in_range,
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
        (
            0,
            {"owner": "Penalty", "hint": "e.g. 1e-4"},
            "Penalty: eps=0 must be a finite number > 0 (e.g. 1e-4).",
        ),
    ]
    for value, kwargs, message in cases:
        assert _message(positive_float, "eps", value, **kwargs) == message


def test_finite_float():
    assert finite_float("x", -3) == -3.0
    assert finite_float("x", np.int8(2), numpy_scalars=True) == 2.0
    for bad in (math.nan, math.inf, -math.inf, False, None):
        assert _message(finite_float, "x", bad) == f"x={bad!r} must be a finite number."
    assert finite_float("x", None, allow_none=True) is None
    assert _message(finite_float, "x", math.nan, allow_none=True) == (
        "x=nan must be None or a finite number."
    )


def test_arrays_accepts_concrete_zero_d_arrays():
    import jax
    import jax.numpy as jnp

    for value in (np.asarray(0.5), jnp.asarray(0.5), np.float32(0.5)):
        got = positive_float("dt", value, arrays=True)
        assert got == 0.5 and type(got) is float
    assert finite_float("beta", jnp.asarray(-2), arrays=True) == -2.0
    # A 0-d array is shown by value; larger arrays, bools and traced values are refused.
    assert _message(positive_float, "dt", jnp.asarray(-1.0), arrays=True) == (
        "dt=-1.0 must be a finite number > 0."
    )
    assert "must be a finite number > 0" in _message(positive_float, "dt", np.ones(2), arrays=True)
    assert _message(positive_float, "dt", np.asarray(True), arrays=True) == (
        "dt=True must be a finite number > 0."
    )
    assert _message(positive_float, "dt", np.asarray(0.5)) == (
        "dt=array(0.5) must be a finite number > 0."
    )  # without `arrays`

    def traced(x):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            positive_float("dt", x, arrays=True)
        return x

    jax.jit(traced)(1.0)


def test_number_in_range():
    assert number_in_range("p", 0.5, 0, 1) == 0.5
    assert number_in_range("delta", 2, 0, 2, include_high=True) == 2.0
    assert number_in_range("growth", math.inf, 1) == math.inf
    assert number_in_range("x", np.float32(0.25), 0, 1) == 0.25
    cases = [
        ((1.0, 0, 1), {}, "p=1.0 must be a number in (0, 1)."),
        ((0, 0, 2), {"include_high": True}, "p=0 must be a number in (0, 2]."),
        ((3, 0, 2), {"include_low": True, "include_high": True}, "p=3 must be a number in [0, 2]."),
        ((1.0, 1), {}, "p=1.0 must be a number > 1."),
        ((-1, 0), {"include_low": True}, "p=-1 must be a number >= 0."),
        ((2, None, 1), {}, "p=2 must be a number < 1."),
        ((math.nan, 0, 1), {}, "p=nan must be a number in (0, 1)."),
        ((True, 0, 2), {}, "p=True must be a number in (0, 2)."),
        ((np.float32(0.5), 0, 1), {"numpy_scalars": False}, "p=0.5 must be a number in (0, 1)."),
        ((5, 0, 2), {"owner": "f", "hint": "why"}, "f: p=5 must be a number in (0, 2) (why)."),
    ]
    for args, kwargs, message in cases:
        assert _message(number_in_range, "p", *args, **kwargs) == message


def test_boolean():
    assert boolean("flag", True) is True and boolean("flag", np.bool_(False)) is False
    for bad in (0, 1, None, "False"):
        assert _message(boolean, "flag", bad) == f"flag={bad!r} must be True or False."
    assert _message(boolean, "norm_first", 1, hint="True: pre-LN") == (
        "norm_first=1 must be True or False (True: pre-LN)."
    )


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
    # The former private re-implementations now give the same message shape.
    with pytest.raises(ValueError, match=r"^simulate: dt=0.0 must be a finite number > 0\.$"):
        wb.particles.simulate(wb.particles.SA(1.0), np.eye(2), t1=1.0, dt=0.0)
    with pytest.raises(ValueError, match=r"^piece_length=-1.0 must be a finite number > 0 \("):
        wb.PiecewiseConstant(np.zeros((2, 3)), -1.0)
    match = r"^fit_order: confidence=1.5 must be a number in \(0, 1\)\.$"
    with pytest.raises(ValueError, match=match):
        wb.analysis.fit_order([0.1, 0.05, 0.025], [1e-2, 2.5e-3, 6.25e-4], confidence=1.5)
    with pytest.raises(ValueError, match=r"^delta=0.0 must be a number in \(0, 2\] \(pairs"):
        wb.particles.fraction_clustered(np.eye(2), delta=0.0)
    with pytest.raises(ValueError, match=r"^PaperALiteral.num_linear=0 must be an integer >= 1\.$"):
        wb.schemes.PaperALiteral(num_linear=0)
