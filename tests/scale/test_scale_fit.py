"""Exponent fitting on synthetic data whose exponent is known, and the fit's refusals."""

import math

import numpy as np
import pytest

from attnformal.scale.fit import FitRefused, fit_exponent, least_squares, local_exponents

XS = [512, 724, 1024, 1448, 2048, 2896, 4096, 5793, 8192]


def noisy_power_law(exponent, *, noise=0.03, repeats=7, seed=0, constant=0.0):
    """Medians and repeat samples of ``constant + 1e-9 x^exponent`` with multiplicative noise."""
    rng = np.random.default_rng(seed)
    samples = [(constant + 1e-9 * x ** exponent) * np.exp(rng.normal(0, noise, repeats)) for x in XS]
    return [float(np.median(s)) for s in samples], [tuple(s) for s in samples]


@pytest.mark.parametrize("exponent", [0.5, 1.0, 1.5, 2.0, 3.0])
def test_recovers_a_known_exponent_with_honest_uncertainty(exponent):
    ys, samples = noisy_power_law(exponent, seed=int(exponent * 10))
    fit = fit_exponent(XS, ys, samples=samples, seed=1)
    assert abs(fit.slope - exponent) < 0.05, fit
    assert abs(fit.slope - exponent) <= 3 * fit.stderr + 1e-3, fit  # the standard error covers the truth
    low, high = fit.bootstrap_ci
    assert low <= exponent <= high, fit.bootstrap_ci
    assert fit.stable and fit.used == tuple(range(len(XS)))


def test_exact_power_law_is_exact_and_a_wrong_exponent_is_told_apart():
    ys = [3.0 * x ** 2 for x in XS]
    slope, intercept, stderr = least_squares(XS, ys)
    assert slope == pytest.approx(2.0, abs=1e-12)
    assert math.exp(intercept) == pytest.approx(3.0, rel=1e-9)
    assert stderr < 1e-9
    # negative control: linear data does not come out quadratic
    assert least_squares(XS, [3.0 * x for x in XS])[0] == pytest.approx(1.0, abs=1e-12)


def test_local_exponents_are_point_to_point_slopes():
    ys = [x ** 1 if x <= 2048 else 2048 * (x / 2048) ** 2 for x in XS]
    local = local_exponents(XS, ys)
    assert math.isnan(local[0])
    assert local[1:5] == pytest.approx([1.0] * 4)
    assert local[5:] == pytest.approx([2.0] * 4)


def test_refuses_fewer_than_four_points():
    with pytest.raises(FitRefused, match="3 point.*at least 4"):
        fit_exponent(XS[:3], [x ** 2 for x in XS[:3]])
    fit_exponent(XS[:4], [x ** 2 for x in XS[:4]])  # four is enough


def test_refuses_an_overhead_dominated_range():
    # t = c + b x^2 with the fixed cost c over a tenth of every point: nothing is fit-worthy.
    floor = 1e-3
    ys, samples = noisy_power_law(2.0, constant=floor, seed=3)
    ys = [floor + (y - floor) * 1e-3 for y in ys]
    with pytest.raises(FitRefused, match="dominated by launch/Python overhead"):
        fit_exponent(XS, ys, floor=floor)


def test_overhead_points_are_flagged_and_left_out():
    floor = 2e-4  # 1e-9 x^2 passes 10x this from x = 1448 on
    ys, samples = noisy_power_law(2.0, constant=floor, noise=0.01, seed=4)
    fit = fit_exponent(XS, ys, floor=floor, samples=samples)
    assert fit.flagged and all(ys[i] < 10 * floor for i in fit.flagged)
    assert not set(fit.flagged) & set(fit.used)
    assert abs(fit.slope - 2.0) < 0.1, fit.slope
    # negative control: fitting every point lets the fixed cost drag the exponent down
    assert least_squares(XS, ys)[0] < fit.slope - 0.1


def test_reports_the_range_where_the_exponent_is_stable():
    # linear up to 1448, quadratic above: the longest stable run is the quadratic one
    ys = [x if x <= 1448 else 1448 * (x / 1448) ** 2 for x in XS]
    fit = fit_exponent(XS, ys)
    assert fit.stable
    assert fit.x_range() == (1448, 8192)
    assert fit.slope == pytest.approx(2.0)


def test_drifting_exponent_is_not_called_stable():
    ys = [x ** (0.5 + 0.4 * i) for i, x in enumerate(XS)]  # the local exponent keeps growing
    fit = fit_exponent(XS, ys)
    assert not fit.stable and "drifts" in fit.notes[0]
    assert fit.used == tuple(range(len(XS)))


def test_refuses_a_narrow_span_and_non_positive_values():
    narrow = [1000, 1100, 1200, 1300, 1400]
    with pytest.raises(FitRefused, match="span"):
        fit_exponent(narrow, [x ** 2 for x in narrow])
    with pytest.raises(FitRefused, match="finite positive"):
        fit_exponent(XS[:4], [1.0, 2.0, 0.0, 4.0])
    with pytest.raises(ValueError, match="xs must increase"):
        fit_exponent([4, 3, 2, 1], [1, 2, 3, 4])


def test_tile_cost_model_recovers_known_costs_and_declines_when_it_cannot():
    from attnformal.scale.analysis import tile_costs

    full = [12, 30, 56, 110, 240, 506]  # causal: full tiles grow ~N^2, partial ones ~N
    partial = [8, 12, 16, 22, 32, 46]
    times = [4e-4 + 1.6e-4 * f + 5.7e-4 * p for f, p in zip(full, partial)]
    costs = tile_costs(full, partial, times)
    assert (costs.per_call, costs.per_tile, costs.per_partial) == pytest.approx((4e-4, 1.6e-4, 5.7e-4), rel=1e-6)
    # partial tiles in step with full ones (a fixed window): only a cost per visited tile
    window = tile_costs([6, 10, 14, 20], [12, 20, 28, 40], [1e-3 + 2e-4 * 3 * f for f in (6, 10, 14, 20)])
    assert window.per_partial is None and window.per_tile == pytest.approx(2e-4, rel=1e-6)
    # negative control: times that fall as the tiles grow are not explained by them
    assert tile_costs(full, partial, times[::-1]) is None
    # tile counts that do not move (a head-dim sweep) cannot price a tile
    assert tile_costs([8] * 5, [4] * 5, [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]) is None
