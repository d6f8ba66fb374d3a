"""Balls: the spec's functions run on them unchanged, and the exactness facts hold only where they should."""

from __future__ import annotations

import math

import pytest
import torch
from flint import arb

from attnformal import ops
from attnformal.merge import SoftmaxState, finalize, merge
from attnformal.reference.balls import Balls, exact_state
from attnformal.reference.fp64_balls import OutOfRange

INF = math.inf


def balls(mid, rad=None):
    mid = torch.tensor(mid, dtype=torch.float64)
    return Balls(mid) if rad is None else Balls(mid, torch.tensor(rad, dtype=torch.float64))


def contains(b: Balls, exact: arb) -> bool:
    return bool(arb(float(b.mid), float(b.rad)).contains(exact))


def test_the_ops_family_is_the_balls_own():
    x = balls([0.5, -2.0], [1e-3, 0.0])
    assert isinstance(ops.exp(x), Balls) and isinstance(ops.where(torch.tensor([True, False]), x, 0.0), Balls)
    assert isinstance(ops.maximum(x, -INF), Balls) and isinstance(ops.rowsum(x), Balls)


def test_exact_values_stay_exact():
    masked = balls([-INF, 1.5]) - balls([0.25, 0.25], [1e-9, 1e-9])  # a masked score minus a finite shift
    assert masked.mid[0] == -INF and masked.rad[0] == 0 and masked.rad[1] > 0
    e = ops.exp(masked)
    assert e.mid[0] == 0 and e.rad[0] == 0
    same = balls([3.0]) - balls([3.0])  # m - shift when m is the max
    assert ops.exp(same).mid == 1 and ops.exp(same).rad == 0
    b = balls([2.0], [1e-3])
    assert float((balls([0.0]) * b).rad) == 0 and torch.equal((balls([1.0]) * b).rad, b.rad)
    assert torch.equal((balls([0.0]) + b).rad, b.rad) and torch.equal((b - 0.0).rad, b.rad)


def test_an_overflowed_minus_infinity_is_not_taken_for_an_exact_one():
    """Negative control of the -inf fact: -inf reached by rounding keeps an infinite radius."""
    d = balls([-1e308]) - balls([1e308])
    assert d.mid == -INF and d.rad == INF
    assert ops.exp(d).rad == INF


def test_rules_never_apply_to_inexact_zeros_and_ones():
    fuzzy_zero, fuzzy_one = balls([0.0], [1e-6]), balls([1.0], [1e-6])
    b = balls([2.0], [1e-3])
    assert contains(fuzzy_zero * b, arb(1e-6) * arb(2.001)) and (fuzzy_zero * b).rad > 0
    assert contains(fuzzy_one * b, arb(1 + 1e-6) * arb(2.001))
    assert ops.exp(fuzzy_zero).rad > 0


def test_maximum_encloses_every_pair_of_points():
    a, b = balls([1.0], [0.5]), balls([1.2], [0.1])
    m = ops.maximum(a, b)
    for x in (0.5, 1.0, 1.5):
        for y in (1.1, 1.2, 1.3):
            assert contains(m, arb(max(x, y)))


def test_a_comparison_is_decided_or_refused():
    assert balls([2.0, -1.0, 0.0], [1.0, 0.5, 0.0]).__gt__(0).tolist() == [True, False, False]
    with pytest.raises(OutOfRange, match="straddles"):
        balls([1e-20], [1e-19]) > 0


def test_the_spec_merge_on_balls_encloses_the_exact_merge():
    """merge and finalize of two exact states: the result's balls contain Arb's values."""
    a = SoftmaxState(balls([[1.5]]), balls([[2.0]], [[1e-15]]), balls([[0.5, -1.0]], [[1e-15, 1e-15]]))
    b = SoftmaxState(balls([[-3.0]]), balls([[1.25]]), balls([[2.0, 4.0]]))
    out, lse = finalize(merge(merge(exact_state((1,), 2), a), b))
    l_exact = arb(2.0) + (arb(-3.0) - arb(1.5)).exp() * arb(1.25)
    assert contains(lse[0, 0], arb(1.5) + l_exact.log())
    for j, (x, y) in enumerate(((0.5, 2.0), (-1.0, 4.0))):
        assert contains(out[0, j], (arb(x) + (arb(-3.0) - arb(1.5)).exp() * arb(y)) / l_exact)
