"""The float64 ball operations: each returned ball contains the exact result, checked in Arb.

Inputs are seeded random balls; exact results are computed by Arb at 600 bits from points
inside the input balls (both ends and the middle), so every check is a true enclosure test.
Negative controls show the same checks fail when a radius is too small.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from flint import arb, arb_mat, ctx

from attnformal.reference import fp64_balls as fb

U = 2.0**-53


@pytest.fixture(autouse=True)
def high_precision():
    old = ctx.prec
    ctx.prec = 600
    yield
    ctx.prec = old


def gen(seed):
    return torch.Generator().manual_seed(seed)


def random_ball(shape, seed, spread=1.0, radius=1e-12):
    g = gen(seed)
    mid = torch.randn(shape, generator=g, dtype=torch.float64) * spread
    rad = torch.rand(shape, generator=g, dtype=torch.float64) * radius * mid.abs()
    return fb.Ball(mid, rad)


def points(ball: fb.Ball):
    """Exact Arb points inside each ball: the two ends and the midpoint."""
    mids, rads = ball.mid.numpy(), ball.rad.numpy()
    return [np.frompyfunc(lambda m, r, t=t: arb(m) + t * arb(r), 2, 1)(mids, rads) for t in (-1, 0, 1)]


def encloses(ball: fb.Ball, exact_values) -> np.ndarray:
    """Bool array: each exact Arb value lies within the float64 ball."""
    lo = np.frompyfunc(lambda m, r: arb(m) - arb(r), 2, 1)(ball.mid.numpy(), ball.rad.numpy())
    hi = np.frompyfunc(lambda m, r: arb(m) + arb(r), 2, 1)(ball.mid.numpy(), ball.rad.numpy())
    return np.frompyfunc(lambda x, a, b: bool(a <= x <= b), 3, 1)(exact_values, lo, hi).astype(bool)


ELEMENTWISE = {
    "add": (lambda a, b: fb.add(a, b), lambda x, y: x + y),
    "sub": (lambda a, b: fb.sub(a, b), lambda x, y: x - y),
    "mul": (lambda a, b: fb.mul(a, b), lambda x, y: x * y),
    "div": (lambda a, b: fb.div(a, b), lambda x, y: x / y),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_ops_enclose_the_exact_result(name):
    ball_op, exact_op = ELEMENTWISE[name]
    a, b = random_ball((64,), 1, spread=3.0), random_ball((64,), 2, spread=1e-3, radius=1e-9)
    if name == "div":
        b = fb.Ball(b.mid.abs() + 1, b.rad)  # a positive divisor, as the softmax denominator
    result = ball_op(a, b)
    for x in points(a):
        for y in points(b):
            exact = np.frompyfunc(exact_op, 2, 1)(x, y)
            assert encloses(result, exact).all()


def test_matmul_and_dot_and_sum_enclose_the_exact_result():
    a = random_ball((3, 40), 3, spread=2.0)
    b = torch.randn(40, 5, generator=gen(4), dtype=torch.float64)
    result = fb.matmul(a, b)
    for x in points(a):
        exact = np.array((arb_mat(x.tolist()) * arb_mat(b.tolist())).tolist(), dtype=object)
        assert encloses(result, exact).all()
    exact_inputs = fb.dot(a.mid, b)
    exact = np.array((arb_mat(a.mid.tolist()) * arb_mat(b.tolist())).tolist(), dtype=object)
    assert encloses(exact_inputs, exact).all()
    total = fb.sum_dim(a, -1)
    for x in points(a):
        assert encloses(total, np.sum(x, axis=-1, keepdims=True)).all()


def test_exact_scalars_shifts_and_masks():
    a = random_ball((50,), 5, spread=10.0)
    t = torch.randn(50, generator=gen(6), dtype=torch.float64)
    for x in points(a):
        assert encloses(fb.mul_exact(a, 0.1), x * arb(0.1)).all()
        assert encloses(fb.mul_exact(a, t), x * np.frompyfunc(arb, 1, 1)(t.numpy())).all()
        assert encloses(fb.div_exact(a, 3.0), x / 3).all()
        assert encloses(fb.sub_exact(a, t), x - np.frompyfunc(arb, 1, 1)(t.numpy())).all()
        assert encloses(fb.rsub_exact(1.0, a), 1 - x).all()
    masked = fb.where(t > 0, a)
    assert bool((masked.mid[t <= 0] == 0).all()) and bool((masked.rad[t <= 0] == 0).all())


def test_exp_and_tanh_balls_enclose_the_exact_result():
    g = gen(7)
    mid = torch.cat([torch.rand(200, generator=g, dtype=torch.float64) * -750,
                     torch.rand(200, generator=g, dtype=torch.float64) * 4 - 2])
    a = fb.Ball(mid, torch.rand(400, generator=g, dtype=torch.float64) * 1e-6)
    for x in points(a):
        assert encloses(fb.exp(a), np.frompyfunc(arb.exp, 1, 1)(x)).all()
        assert encloses(fb.tanh(a), np.frompyfunc(arb.tanh, 1, 1)(x)).all()


def test_negative_control_a_shrunk_radius_is_caught():
    """The enclosure checks above can fail: the same check rejects radii scaled down."""
    a = random_ball((3, 40), 3, spread=2.0)
    b = torch.randn(40, 5, generator=gen(4), dtype=torch.float64)
    honest = fb.matmul(a, b)
    shrunk = fb.Ball(honest.mid, honest.rad * 1e-3)
    caught = False
    for x in points(a):
        exact = np.array((arb_mat(x.tolist()) * arb_mat(b.tolist())).tolist(), dtype=object)
        caught |= not encloses(shrunk, exact).all()
    assert caught


def test_uncertifiable_operations_give_infinite_radii():
    assert math.isinf(float(fb.div(fb.exact(torch.ones(1, dtype=torch.float64)),
                                   fb.Ball(torch.ones(1, dtype=torch.float64), torch.full((1,), 2.0))).rad))
    assert math.isinf(float(fb.exp(fb.Ball(torch.zeros(1, dtype=torch.float64), torch.full((1,), 1.5))).rad))
    assert math.isinf(fb.enclosure_radius(fb.Ball(torch.zeros(1), torch.tensor([math.nan]))))
    with pytest.raises(fb.OutOfRange):
        fb.div_exact(fb.exact(torch.ones(1, dtype=torch.float64)), 1e-40)


# ---------------------------------------------------------------- exp64 and tanh64


def exp_points():
    g = gen(8)
    edges = [0.0, -0.0, 1e-300, -1e-310, 0.34657359027997264, -0.34657359027997264, -700.0, -699.9999, 709.0,
             1.0, -1.0, -745.0, 2.0**-30]
    return torch.cat([torch.rand(4000, generator=g, dtype=torch.float64) * -700,
                      torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1,
                      torch.rand(500, generator=g, dtype=torch.float64) * 709,
                      torch.tensor(edges, dtype=torch.float64)])


def worst_relative_error(fn, xs) -> float:
    worst = mpmath.mpf(0)
    with mpmath.workprec(200):
        for x, y in zip(xs.tolist(), fn(xs).tolist()):
            exact = mpmath.exp(x)
            if x >= fb.EXP_MIN:
                worst = max(worst, abs((mpmath.mpf(y) - exact) / exact))
            else:
                assert y == 0.0 and exact < fb.FLOOR * fb.EPS_EXP
    return float(worst)


def test_exp64_meets_its_proven_bound():
    worst = worst_relative_error(fb.exp64, exp_points())
    assert worst <= fb.EPS_EXP
    assert worst > 0.3 * U  # the sample exercises rounding (a bound met by luck would be vacuous)


def test_negative_control_the_exp_check_catches_a_2_ulp_error():
    assert worst_relative_error(lambda x: fb.exp64(x) * (1 + 16 * U), exp_points()) > fb.EPS_EXP


def test_tanh64_meets_its_proven_bound():
    xs = torch.cat([exp_points()[4000:8000] * 5, torch.tensor([0.0, 1e-300, 400.0, -400.0], dtype=torch.float64)])
    with mpmath.workprec(200):
        worst = max(abs(mpmath.mpf(t) - mpmath.tanh(x)) for x, t in zip(xs.tolist(), fb.tanh64(xs).tolist()))
    assert float(worst) <= fb.EPS_TANH


def test_exp64_constants_are_what_the_proof_assumes():
    significant_bits = Fraction(fb.LN2_HI).numerator.bit_length()  # LN2_HI = odd / 2^e
    assert significant_bits <= 32, "k * LN2_HI must be exact for |k| < 2^21"
    error = abs(arb.const_log2() - arb(fb.LN2_HI) - arb(fb.LN2_LO))
    assert error < arb(2) ** -86
    for i, c in enumerate(fb.TAYLOR):
        exact = Fraction(1, math.factorial(i))
        assert abs(Fraction(c) - exact) <= Fraction(U) * exact  # correctly rounded
