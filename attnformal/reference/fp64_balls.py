"""Rigorous ball arithmetic on float64 torch tensors, in round-to-nearest, with no libm.

A ball is ``(mid, rad)``: the exact real value lies in ``[mid - rad, mid + rad]``. Every
operation below returns a ball that provably contains the exact result of the operation
on every point of its input balls. The proofs use only:

* IEEE-754 binary64 ``+ - * /`` correctly rounded to nearest (torch's CPU kernels are,
  vectorised or not), so for a result ``x`` in the normal range ``|fl(x) - x| <= u |fl(x)|``
  and ``fl(x) >= (1 - u) x`` for ``x >= 0``, with ``u = 2^-53``;
* a dot product of ``n`` terms computed in ANY order, blocked or not, with or without
  FMA (what a BLAS ``dgemm`` or a ``sum`` does) has error at most ``gamma_n sum |a_i b_i|``
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. (3.5) and §3.1).
  ASSUMPTION: the BLAS behind ``torch.matmul`` for float64 is a classical O(n^3) product in
  binary64 (no Strassen-like scheme, no reduced or extended precision). MKL and OpenBLAS are.

No ``exp``, ``tanh`` or ``log`` of the C library is trusted: :func:`exp64` below is built
from ``+ - *`` and exact power-of-two scaling, with its error bound proven in its docstring.

Underflow is kept out of the radius formulas instead of being modelled: every magnitude
``|x|`` that a radius formula multiplies is replaced by ``max(|x|, FLOOR)``, an upper
bound, and each product in a formula has at most one radius factor. Radii are then 0 or
at least ``2^-700``, every product in a formula is at least ``2^-1000`` (normal), the
relative model above holds for every rounding, and a midpoint's own underflow error
(at most ``2^-1022`` per rounding, even with flush-to-zero) is dominated by the
``u * max(|mid|, FLOOR)`` term each operation adds. Exact zeros stay exact.
Overflow shows up as an infinite or NaN radius, which callers treat as "not certified".
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

U = 2.0**-53  # unit roundoff of binary64, round to nearest
FLOOR = 2.0**-300  # see the module docstring: keeps radius formulas out of the subnormal range
MAX_OPS = 2**40  # up() needs ops * U <= 0.005


def gamma(n: int) -> float:
    """An upper bound of ``gamma_n = n u / (1 - n u)``: ``(n + 1) u``, valid for ``n (n + 1) u <= 1``."""
    if n * (n + 1) * U > 1:
        raise ValueError(f"gamma({n}): too many terms for the float64 tier")
    return (n + 1) * U


def up(x: torch.Tensor, ops: int) -> torch.Tensor:
    """An upper bound of the exact value of a nonnegative formula evaluated as ``x``.

    ``x`` was computed with at most ``ops`` roundings on any path, each losing at most a
    factor ``(1 - u)`` (no underflow, see the module docstring), so the exact value is at
    most ``x / (1 - gamma_ops) <= x (1 + 1.01 ops u)``. The product below rounds once more:
    ``fl(x (1 + 4 ops u)) >= x (1 + 4 ops u)(1 - u) >= x (1 + 1.01 ops u)`` for ``ops >= 1``.
    ``1 + 4 ops u`` is exact (an integer multiple of ``2^-52`` below 2).
    """
    assert 1 <= ops <= MAX_OPS
    return x * (1.0 + 4 * ops * U)


def up_(x: torch.Tensor, ops: int) -> torch.Tensor:
    """:func:`up` in place, for a temporary the caller owns (the same rounding, no new tensor)."""
    assert 1 <= ops <= MAX_OPS
    return x.mul_(1.0 + 4 * ops * U)


def mag(x: torch.Tensor) -> torch.Tensor:
    """``max(|x|, FLOOR)``: an upper bound of ``|x|`` that is never subnormal."""
    return x.abs().clamp_min_(FLOOR)


# The radius formulas below are evaluated in place on a fresh temporary, in the order the
# formulas are written (``fl(fl(x + y) + z)`` stays ``fl(fl(x + y) + z)``; ``x * y`` and ``y * x``
# are the same rounding): the bits are those of the out-of-place expressions, at fewer passes
# over memory and no allocation per step.


class Ball(NamedTuple):
    """Exact values lie in ``[mid - rad, mid + rad]`` (element-wise)."""

    mid: torch.Tensor
    rad: torch.Tensor


def exact(x: torch.Tensor) -> Ball:
    """A ball of radius 0 around float64 values that are exact by definition."""
    return Ball(x, torch.zeros_like(x))


# ---------------------------------------------------------------- products and sums


def dot(a: torch.Tensor, b: torch.Tensor, mag_a=None, mag_b=None) -> Ball:
    """``a @ b`` of exact float64 tensors: error ``<= gamma_n |a| |b|`` (``n`` = inner size).

    The bound's matmul adds ``n`` roundings and the scaling by gamma one more. ``mag_a``, ``mag_b``:
    ``mag(a)``, ``mag(b)`` when the caller has them already (here and below).
    """
    n = a.shape[-1]
    return Ball(a @ b, up_((_given(a, mag_a) @ _given(b, mag_b)).mul_(gamma(n)), n + 1))


def matmul(a: Ball, b: torch.Tensor, mag_a=None, mag_b=None, spread_a=None) -> Ball:
    """``a @ b`` for a ball ``a`` and an exact ``b``.

    ``|A b - fl(a.mid b)| <= a.rad |b| + gamma_n |a.mid| |b| = (gamma_n |a.mid| + a.rad) |b|``;
    the bound takes 2 roundings element-wise and ``n`` in its matmul. ``spread_a``: ``spread(a, n)``
    when the caller has it already.
    """
    n = a.mid.shape[-1]
    return Ball(a.mid @ b, up_(_given_spread(a, n, mag_a, spread_a) @ _given(b, mag_b), n + 2))


def sum_dim(a: Ball, dim: int, mag_a=None, spread_a=None) -> Ball:
    """Sum over ``dim`` (kept): error ``<= sum rad + gamma_n sum |mid|``, ``n + 2`` roundings."""
    n = a.mid.shape[dim]
    return Ball(a.mid.sum(dim, keepdim=True), up_(_given_spread(a, n, mag_a, spread_a).sum(dim, keepdim=True), n + 2))


def spread(a: Ball, n: int, mag_a=None) -> torch.Tensor:
    """``gamma_n mag(a.mid) + a.rad`` (2 roundings), what an ``n``-term sum or product of ``a`` charges
    each element: a tile's P is summed (``l``) and multiplied (``P V``) over the same ``n`` keys."""
    return _plus(_scaled_mag(a.mid, mag_a, gamma(n)), a.rad)


def _given_spread(a: Ball, n: int, mag_a, spread_a) -> torch.Tensor:
    return spread(a, n, mag_a) if spread_a is None else spread_a


def add(a: Ball, b: Ball) -> Ball:
    """``a + b``: rounding ``u |c|`` plus both radii (3 roundings in the bound)."""
    c = a.mid + b.mid
    return Ball(c, up_(_plus(_rounding_plus(c, a.rad), b.rad), 3))


def add_into(total: Ball, b: Ball) -> None:
    """``total = add(total, b)`` written into ``total``'s tensors (views of an accumulator, ``b`` of
    their shape): the same roundings in the same order, without the three temporaries."""
    total.mid.add_(b.mid)
    up_(torch.add(total.rad, mag(total.mid), alpha=U, out=total.rad).add_(b.rad), 3)  # as _rounding_plus


def sub(a: Ball, b: Ball) -> Ball:
    """``a - b``, as :func:`add`."""
    c = a.mid - b.mid
    return Ball(c, up_(_plus(_rounding_plus(c, a.rad), b.rad), 3))


def sub_exact(a: Ball, t) -> Ball:
    """``a - t`` for exact ``t`` (a tensor that broadcasts, or a float)."""
    c = a.mid - t
    return Ball(c, up_(_rounding_plus(c, a.rad), 2))


def rsub_exact(t, a: Ball) -> Ball:
    """``t - a`` for exact ``t``."""
    c = t - a.mid
    return Ball(c, up_(_rounding_plus(c, a.rad), 2))


def mul(a: Ball, b: Ball, mag_a=None, mag_b=None) -> Ball:
    """``a * b``: ``|ab - fl(a.mid b.mid)| <= u|c| + |a.mid| b.rad + a.rad (|b.mid| + b.rad)``."""
    c = a.mid * b.mid
    rad = _plus(_rounding_plus(c, _given(a.mid, mag_a) * b.rad), _times(_scaled_mag(b.mid, mag_b, 1.0, b.rad), a.rad))
    return Ball(c, up_(rad, 5))


def mul_exact(a: Ball, t) -> Ball:
    """``a * t`` for exact ``t`` (tensor or float): ``u |c| + a.rad |t|``."""
    c = a.mid * t
    return Ball(c, up_(_rounding_plus(c, a.rad * _mag_any(t)), 3))


def div_exact(a: Ball, t: float) -> Ball:
    """``a / t`` for an exact float ``t`` with ``2^-100 <= |t| <= 2^100`` (no underflow of the radius)."""
    _check_float_range(t)
    c = a.mid / t
    return Ball(c, up_(_rounding_plus(c, a.rad / abs(t)), 3))


def div(a: Ball, b: Ball) -> Ball:
    """``a / b`` for a ball ``b`` of positive reals with ``2^-100 <= b.mid <= 2^100``.

    With ``lo <= b`` a lower bound: ``|a/b - a.mid/b.mid| <= (a.rad + |a.mid| b.rad / b.mid) / lo``.
    ``lo = fl(fl(b.mid - b.rad)(1 - 2u)) <= (b.mid - b.rad)(1 + u)(1 - 2u)(1 + u) <= b.mid - b.rad``.
    A ball ``b`` that reaches 0 gives an infinite radius.
    """
    if not bool(((b.mid >= 2.0**-100) & (b.mid <= 2.0**100)).all()):
        raise OutOfRange("a divisor midpoint is outside [2^-100, 2^100]")
    c = a.mid / b.mid
    lo = (b.mid - b.rad) * (1.0 - 2 * U)
    rad = up(U * mag(c) + (a.rad + mag(a.mid) * b.rad / b.mid) / lo, 6)
    return Ball(c, torch.where(lo > 0, rad, math.inf))


def where(mask: torch.Tensor, a: Ball, other: float = 0.0) -> Ball:
    """``a`` where ``mask``, the exact value ``other`` elsewhere."""
    return Ball(torch.where(mask, a.mid, other), torch.where(mask, a.rad, 0.0))


def _given(x: torch.Tensor, magnitude) -> torch.Tensor:
    return mag(x) if magnitude is None else magnitude


def _scaled_mag(x: torch.Tensor, magnitude, factor: float, plus=None) -> torch.Tensor:
    """``factor * mag(x) [+ plus]`` as a fresh tensor: in place on ``mag(x)``, or from a given magnitude."""
    if magnitude is None:
        fresh = mag(x)
        if factor != 1.0:
            fresh.mul_(factor)
    elif factor != 1.0:
        fresh = magnitude * factor
    else:
        return magnitude if plus is None else magnitude + plus
    return fresh if plus is None else _plus(fresh, plus)


def _rounding_plus(c: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """``U * mag(c) + term`` (``U * mag(c)``: the rounding term of an operation's result ``c``) as a
    fresh tensor, in one pass after ``mag``: ``U * mag(c)`` is exact (a power of two times a float
    ``>= FLOOR``, no underflow), so ``term + U * mag(c)`` rounds once, fused (FMA) or not -- the
    bits of ``fl(fl(U * mag(c)) + term)``."""
    magnitude = mag(c)
    if not _broadcasts_to(term.shape, magnitude.shape):
        return magnitude.mul_(U) + term
    return torch.add(term, magnitude, alpha=U, out=magnitude)


def _plus(total: torch.Tensor, term) -> torch.Tensor:
    """``total + term`` in place when ``total`` (a fresh temporary) has the broadcast shape."""
    if isinstance(term, torch.Tensor) and not _broadcasts_to(term.shape, total.shape):
        return total + term
    return total.add_(term)


def _times(total: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``total * factor`` (``= factor * total``), in place as :func:`_plus`."""
    return total * factor if not _broadcasts_to(factor.shape, total.shape) else total.mul_(factor)


def _broadcasts_to(shape, target) -> bool:
    return len(shape) <= len(target) and all(n in (1, m) for n, m in zip(reversed(shape), reversed(target)))


def _mag_any(t):
    return mag(t) if isinstance(t, torch.Tensor) else max(abs(t), FLOOR)


def _check_float_range(t: float):
    if not 2.0**-100 <= abs(t) <= 2.0**100:
        raise OutOfRange(f"constant {t!r} is outside [2^-100, 2^100]")


class OutOfRange(ArithmeticError):
    """The float64 tier cannot certify this case (the caller moves to the Arb tier)."""


# ---------------------------------------------------------------- exp and tanh

# Cody-Waite split of ln 2 (fdlibm's): LN2_HI has 32 significant bits, so k * LN2_HI is
# exact for |k| < 2^21, and |ln 2 - LN2_HI - LN2_LO| < 2^-86 (tests check both with Arb).
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.4426950408889634  # 1/ln 2, rounded; only used to pick k
EXP_MIN = -700.0  # e^-700 ~ 2^-1010: below this exp64 returns 0 (the true value is < FLOOR * U)
EXP_MAX = 709.0  # e^709 < 2^1023
TAYLOR_DEGREE = 13
TAYLOR = [1.0 / math.factorial(i) for i in range(TAYLOR_DEGREE + 1)]  # correctly rounded (int division)
EPS_EXP = 8 * U  # proven relative error bound of exp64 on [EXP_MIN, EXP_MAX]
EPS_TANH = 8 * U  # proven absolute error bound of tanh64


def exp64(x: torch.Tensor) -> torch.Tensor:
    """``e^x`` in float64 with relative error at most ``EPS_EXP = 8u`` for ``-700 <= x <= 709``.

    Returns 0 below -700 (true value ``< 2^-1009``), inf above 709, NaN for NaN.

    Proof. ``k = round(x / ln 2)``, so ``|x - k ln 2| <= (1/2 + 2^-40) ln 2 < rho = 0.3467``;
    ``|k| <= 1023``. ``k LN2_HI`` is exact; ``r1 = fl(x - k LN2_HI)`` and ``r = fl(r1 - fl(k LN2_LO))``
    give ``r = x - k ln 2 + e_r`` with ``|e_r| <= u|r1| + u|k LN2_LO| + u|r| + |k| 2^-86 < 0.71 u``.
    ``p(r) = sum_{i<=13} c_i r^i`` by Horner (two roundings a step): with ``Y_i`` the exact tails,
    the computed value differs from ``p(r)`` by at most ``u sum_i rho^i (Y_i + rho Y_{i+1})
    <= u (e^rho (1 + rho) + rho e^rho) < 2.40 u`` (absolute); rounding the coefficients costs
    ``u (e^rho - 1 - rho) < 0.07 u``, the Taylor tail ``rho^14/14! e^rho < 0.06 u``. Relative to
    ``e^r >= e^-rho > 0.707`` that is ``< 3.56 u``; ``e_r`` adds ``< 0.72 u``: total ``< 4.3 u``.
    Scaling by ``2^k`` is exact (the result is normal: ``>= e^-700 > 2^-1022``). Underflow
    inside Horner (``|r|`` tiny) loses at most ``13 * 2^-1022`` absolutely, far below ``0.01 u``.
    """
    inside = _within(x, EXP_MIN, EXP_MAX)  # then the clamp and both replacements change nothing
    clamped = x if inside else x.clamp(EXP_MIN, EXP_MAX)
    # in place, the same roundings: k's buffer takes k * LN2_LO once 2^k is taken; x - k LN2_HI is one add of
    # an exact product (one rounding, fused or not)
    k = (clamped * INV_LN2).round_()
    r = torch.add(clamped, k, alpha=-LN2_HI)
    scale = _power_of_two(k)
    r.sub_(k.mul_(LN2_LO))
    p = r * TAYLOR[-1]  # Horner's first step c13 * r, then p = p * r + c
    p.add_(TAYLOR[-2])
    for c in reversed(TAYLOR[:-2]):
        p.mul_(r).add_(c)
    y = p.mul_(scale)  # exact: the result is a normal float
    if inside:
        return y
    y = torch.where(x < EXP_MIN, 0.0, y)
    return torch.where(x > EXP_MAX, math.inf, y)


def _within(x: torch.Tensor, low: float, high: float) -> bool:
    """Whether every element lies in ``[low, high]`` (False with a NaN): one pass, no mask tensors."""
    if x.numel() == 0:
        return True
    smallest, largest = torch.aminmax(x)
    return low <= float(smallest) and float(largest) <= high


def _power_of_two(k: torch.Tensor) -> torch.Tensor:
    """``2^k`` for integer-valued ``-1022 <= k <= 1023``, built from its bits (no ``pow``)."""
    bits = k.to(torch.int64).add_(1023)
    bits <<= 52
    return bits.view(torch.float64)


def tanh64(x: torch.Tensor) -> torch.Tensor:
    """``tanh x`` in float64 with absolute error at most ``EPS_TANH = 8u``.

    Proof. ``tanh x = sign(x) (1 - E)/(1 + E)`` with ``E = e^{-2|x|} in (0, 1]``. ``E`` has
    relative error ``<= 8u`` (:func:`exp64`; below ``e^-700`` it is 0, off by ``< 2^-1009``),
    and ``|d/dE (1-E)/(1+E)| E = 2E/(1+E)^2 <= 1/2``, so ``<= 4u`` from ``E``; the three roundings
    of ``1 - E``, ``1 + E`` and the quotient add ``< 3.01 u`` relative to a value ``<= 1``.
    """
    e = exp64(-2.0 * x.abs())
    return torch.copysign((1.0 - e) / (1.0 + e), x)


def exp(a: Ball) -> Ball:
    """``e^a`` for a ball with ``a.rad <= 1`` (larger radii give an infinite radius).

    ``|e^x - E| <= e^{a.mid}(e^{rad} - 1) + |e^{a.mid} - E| <= E (rad (1 + rad) + eps) / (1 - eps)``
    using ``e^t - 1 <= t + t^2`` for ``t <= 1``; ``1/(1 - eps) <= 1 + 16u`` is charged to
    :func:`up` as 16 extra roundings. Below ``a.mid = -700``, ``E = 0`` and the true value
    ``< 2^-1009`` is covered by ``FLOOR * eps``.
    """
    e = exp64(a.mid)
    magnitude = e.clamp_min(FLOOR)  # mag(e) in one pass: exp64 is never negative nor -0.0
    rad = up_(magnitude.mul_((1.0 + a.rad).mul_(a.rad).add_(EPS_EXP)), 4 + 16)
    if _within(a.rad, 0.0, 1.0):
        return Ball(e, rad)
    return Ball(e, torch.where(a.rad <= 1.0, rad, math.inf))


def tanh(a: Ball) -> Ball:
    """``tanh a``: tanh is 1-Lipschitz, so ``rad + EPS_TANH`` (one rounding)."""
    return Ball(tanh64(a.mid), up(a.rad + EPS_TANH, 1))


# ---------------------------------------------------------------- plumbing shared with arb_balls


def const(value) -> Ball:
    """A scalar ball from an Arb enclosure computed elsewhere (e.g. ``1/(1-p)``)."""
    from attnformal.reference.arb_balls import arb_to_float64

    mid, rad = arb_to_float64(value)
    return Ball(torch.tensor(mid, dtype=torch.float64), torch.tensor(rad, dtype=torch.float64))


def transpose(a: Ball) -> Ball:
    return Ball(a.mid.mT, a.rad.mT)


def select(a: Ball, dim: int, index: torch.Tensor) -> Ball:
    return Ball(a.mid.index_select(dim, index), a.rad.index_select(dim, index))


def cat(parts: list[Ball], dim: int) -> Ball:
    return Ball(torch.cat([p.mid for p in parts], dim), torch.cat([p.rad for p in parts], dim))


def reshape(a: Ball, shape) -> Ball:
    return Ball(a.mid.reshape(shape), a.rad.reshape(shape))


def mid(a: Ball) -> torch.Tensor:
    return a.mid


def to_arb(a: Ball):
    """The balls as an object array of ``flint.arb`` (Arb rounds the radius up)."""
    import numpy as np
    from flint import arb

    return np.frompyfunc(arb, 2, 1)(a.mid.numpy(), a.rad.numpy())


def enclosure_radius(a: Ball) -> float:
    """The largest radius (NaN counts as infinite)."""
    if a.rad.numel() == 0:
        return 0.0
    return float(torch.nan_to_num(a.rad, nan=math.inf).max())


def to_float64(a: Ball) -> tuple[torch.Tensor, torch.Tensor]:
    return a.mid, a.rad
