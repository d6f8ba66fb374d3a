"""Fitting a log-log exponent honestly: how much, over which range, and when not at all.

A measured time ``t(x)`` is fitted as ``log t = a + p log x`` by least squares. The fit
refuses (:class:`FitRefused`) rather than report a number it cannot support:

* fewer than ``min_points`` points, or a range spanning less than ``min_span`` in x;
* points dominated by a fixed cost: with ``t = c + b x^p``, the local exponent is
  ``p (1 - c / t)``, so a point under ``overhead_factor * c`` biases the exponent by more
  than ``p / overhead_factor``. Such points are flagged and left out; if too few remain,
  the range is overhead-dominated and the fit refuses.

Where the exponent holds is part of the answer: the fit reports the longest run of points
whose local (point-to-point) exponents all stay within ``stability_tol`` of the run's
fitted slope. Uncertainty is the least-squares standard error, and -- when the repeat
samples of each point are given -- a bootstrap interval over those samples (seeded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MIN_POINTS = 4
OVERHEAD_FACTOR = 10.0
TOLERANCE = 0.15  # exponent difference still called consistent, beyond the fit's own 95 % interval
MIN_SPAN = 2.0
STABILITY_TOL = 0.25
BOOTSTRAP_DRAWS = 1000


class FitRefused(ValueError):
    """No exponent can be reported for these points; the message says why and what to change."""


@dataclass(frozen=True)
class ExponentFit:
    xs: tuple[float, ...]  # every x given; the indices below refer to it
    slope: float
    intercept: float  # natural log of y at x = 1
    stderr: float  # least-squares standard error of the slope (nan with two points)
    used: tuple[int, ...]  # indices of the points the fit is over
    stable: bool  # every local exponent in ``used`` within ``stability_tol`` of ``slope``
    local: tuple[float, ...]  # local exponent between point i-1 and i (nan for i = 0)
    flagged: tuple[int, ...]  # indices left out as overhead-dominated
    bootstrap_ci: tuple[float, float] | None = None  # 95 % interval over repeat samples
    notes: tuple[str, ...] = field(default=())

    def x_range(self) -> tuple[float, float]:
        return self.xs[self.used[0]], self.xs[self.used[-1]]

    def predict(self, x):
        return np.exp(self.intercept) * np.asarray(x, dtype=float) ** self.slope

    def half_width(self) -> float:
        """Half the 95 % interval: the bootstrap's when there is one, else 2 standard errors."""
        if self.bootstrap_ci is not None:
            return (self.bootstrap_ci[1] - self.bootstrap_ci[0]) / 2
        return 2 * self.stderr


def least_squares(xs, ys) -> tuple[float, float, float]:
    """``(slope, intercept, stderr)`` of ``log y`` against ``log x``."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    n = len(lx)
    sxx = float(((lx - lx.mean()) ** 2).sum())
    slope = float(((lx - lx.mean()) * (ly - ly.mean())).sum() / sxx)
    intercept = float(ly.mean() - slope * lx.mean())
    residuals = ly - (intercept + slope * lx)
    stderr = math.sqrt(float((residuals ** 2).sum()) / (n - 2) / sxx) if n > 2 else math.nan
    return slope, intercept, stderr


def local_exponents(xs, ys) -> tuple[float, ...]:
    """Slope of log y between consecutive points (nan before the first)."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return (math.nan,) + tuple(float(v) for v in np.diff(ly) / np.diff(lx))


def fit_exponent(xs, ys, *, floor=None, samples=None, overhead_factor=OVERHEAD_FACTOR,
                 min_points=MIN_POINTS, min_span=MIN_SPAN, stability_tol=STABILITY_TOL,
                 seed=0, what="time") -> ExponentFit:
    """Fit ``ys ~ xs^p`` over the stable, overhead-free part of a sweep (xs increasing).

    ``floor`` is the fixed cost of one call (same unit as ys); ``samples[i]`` are the repeat
    measurements whose median is ``ys[i]`` (enables the bootstrap interval).
    """
    xs, ys = _checked(xs, ys)
    if len(xs) < min_points:
        raise FitRefused(f"{what}: {len(xs)} point(s) in the sweep; an exponent needs at least "
                         f"{min_points} -- sweep more values")
    flagged = flag_overhead(ys, floor, overhead_factor)
    run = _longest_run([i for i in range(len(xs)) if i not in flagged])
    if len(run) < min_points:
        raise FitRefused(
            f"{what}: only {len(run)} consecutive point(s) of {len(xs)} exceed {overhead_factor:g}x the "
            f"fixed per-call cost ({floor:.3g}); the range is dominated by launch/Python overhead -- "
            f"sweep larger sizes")
    if xs[run[-1]] / xs[run[0]] < min_span:
        raise FitRefused(f"{what}: the usable points span only {xs[run[-1]] / xs[run[0]]:.2f}x in x; "
                         f"an exponent needs a span of at least {min_span:g}x")
    local = local_exponents(xs, ys)
    used, stable = _stable_range(xs, ys, run, local, min_points, stability_tol)
    slope, intercept, stderr = least_squares(xs[used], ys[used])
    notes = ()
    if not stable:
        span = [local[i] for i in run[1:]]
        notes = (f"local exponent drifts from {min(span):.2f} to {max(span):.2f}: no {min_points} "
                 f"consecutive points share one exponent within {stability_tol}; the fit averages regimes",)
    ci = None
    if samples is not None:
        ci = _bootstrap(xs[used], [samples[i] for i in used], seed)
    return ExponentFit(tuple(float(x) for x in xs), slope, intercept, stderr, tuple(int(i) for i in used), stable, local,
                       tuple(sorted(flagged)), ci, notes)


def flag_overhead(ys, floor, overhead_factor=OVERHEAD_FACTOR) -> set[int]:
    """Indices of points below ``overhead_factor`` times the fixed cost ``floor``."""
    if floor is None:
        return set()
    return {i for i, y in enumerate(ys) if y < overhead_factor * floor}


def _checked(xs, ys):
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"fit_exponent: xs and ys must be 1-D of one length, got {xs.shape} and {ys.shape}")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all() and (xs > 0).all() and (ys > 0).all()):
        raise FitRefused("fit_exponent: a log-log fit needs finite positive values, got "
                         f"xs={xs.tolist()} ys={ys.tolist()}")
    if (np.diff(xs) <= 0).any():
        raise ValueError(f"fit_exponent: xs must increase, got {xs.tolist()}")
    return xs, ys


def _longest_run(indices: list[int]) -> list[int]:
    """The longest run of consecutive indices (the one at larger x on a tie)."""
    best, current = [], []
    for i in indices:
        current = current + [i] if current and i == current[-1] + 1 else [i]
        if len(current) >= len(best):
            best = current
    return best


def _stable_range(xs, ys, run, local, min_points, tol):
    """The longest sub-run (larger x on a tie) whose local exponents stay within ``tol`` of its fit."""
    for length in range(len(run), min_points - 1, -1):
        for start in range(len(run) - length, -1, -1):
            sub = run[start:start + length]
            slope = least_squares(xs[sub], ys[sub])[0]
            if all(abs(local[i] - slope) <= tol for i in sub[1:]):
                return sub, True
    return run, False


def _bootstrap(xs, samples, seed):
    """95 % interval of the slope when each point's median is re-drawn from its own repeats."""
    rng = np.random.default_rng(seed)
    slopes = []
    for _ in range(BOOTSTRAP_DRAWS):
        medians = [np.median(rng.choice(np.asarray(s, float), size=len(s))) for s in samples]
        slopes.append(least_squares(xs, medians)[0])
    low, high = np.percentile(slopes, [2.5, 97.5])
    return float(low), float(high)
