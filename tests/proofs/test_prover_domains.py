"""The prover's number domains compute what IEEE arithmetic computes, on concrete values."""

import math
import operator

import numpy as np
import pytest
import z3

from attnformal import ops
from attnformal.domains import (FINITE, NAN, NEG_INF, POS_INF, AbstractFloats, ExtendedReal, FloatFormat,
                                NativeFloats)

VALUES = (-math.inf, -2.0, -0.5, 0.0, 1.0, 3.0, math.inf, math.nan)
FLOAT16 = FloatFormat("float16", 5, 11)


def evaluate(x: ExtendedReal) -> float:
    """The Python float an extended real with constant fields stands for."""
    kind = z3.simplify(x.kind).as_long()
    if kind != FINITE:
        return {POS_INF: math.inf, NEG_INF: -math.inf, NAN: math.nan}[kind]
    return float(z3.simplify(x.value).as_fraction())


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv])
def test_extended_real_arithmetic_matches_ieee(op):
    for a in VALUES:
        for b in VALUES:
            with np.errstate(all="ignore"):
                expected = float(op(np.float64(a), np.float64(b)))
            got = evaluate(op(ExtendedReal.lift(a), ExtendedReal.lift(b)))
            assert same_float(got, expected), (op.__name__, a, b, got, expected)


def test_extended_real_comparisons_maximum_and_exp_match_ieee():
    for a in VALUES:
        for b in VALUES:
            x, y = ExtendedReal.lift(a), ExtendedReal.lift(b)
            for name in ("lt", "le", "gt", "ge"):
                got = z3.is_true(z3.simplify(getattr(operator, name)(x, y)))
                assert got == getattr(operator, name)(a, b), (name, a, b)
            assert same_float(evaluate(ops.maximum(x, y)), float(np.maximum(a, b)))
    assert evaluate(ops.exp(ExtendedReal.lift(-math.inf))) == 0.0
    assert math.isnan(evaluate(ops.exp(ExtendedReal.lift(math.nan))))
    assert evaluate(ops.log(ExtendedReal.lift(0.0))) == -math.inf


def test_where_dispatches_to_the_extended_reals_despite_a_z3_condition():
    chosen = ops.where(z3.BoolVal(True), ExtendedReal.lift(-math.inf), 0.0)
    assert isinstance(chosen, ExtendedReal) and evaluate(chosen) == -math.inf


def test_abstract_and_native_floats_agree_on_every_predicate_for_constants():
    native, abstract = NativeFloats(FLOAT16), AbstractFloats(FLOAT16)
    constants = (-math.inf, -65504.0, -1.0, -0.0, 0.0, 2.0 ** -24, 1.0, 1e4, math.inf, math.nan)
    unary = ("is_nan", "is_finite", "is_neg_inf", "is_zero")
    for a in constants:
        for name in unary:
            assert z3.is_true(z3.simplify(getattr(native, name)(a))) == z3.is_true(
                z3.simplify(getattr(abstract, name)(a))), (name, a)
        for b in constants:
            for name in ("le", "lt", "ieee_eq"):
                assert z3.is_true(z3.simplify(getattr(native, name)(a, b))) == z3.is_true(
                    z3.simplify(getattr(abstract, name)(a, b))), (name, a, b)


def test_abstract_constants_are_rounded_to_the_format():
    value = z3.simplify(AbstractFloats(FloatFormat("bfloat16", 8, 8)).const(-1e4).arg(1))
    assert value.as_fraction() == -9984  # -1e4 is not a bfloat16; the nearest one is
