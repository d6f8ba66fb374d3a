"""Float64 balls as values that the spec's own functions run on, unchanged.

:class:`Balls` is a tensor of :class:`~attnformal.reference.fp64_balls.Ball` with Python's
arithmetic operators and an ops family (``__attn_ops__``, see :func:`attnformal.ops.family`).
With it, ``merge.block_state``, ``merge.merge``, ``merge.finalize``, ``tile.tile_scores`` and
``tile.tile_grads`` -- the functions the kernels run and the prover proves -- evaluate in
rigorous ball arithmetic: one definition, one more interpretation. Every operation returns a
ball that contains the exact result for every point of its operands (the proofs are those of
:mod:`~attnformal.reference.fp64_balls`; the few facts added here are proved where they appear).

The softmax shift. ``rowmax`` returns the largest *midpoint* of a row as an exact float, not
an enclosure of the maximum: a state ``(m, l, acc)`` means ``l = sum exp(s - m)`` and
``acc = sum exp(s - m) w v`` for its exact ``m``, and ``merge`` and ``finalize`` are correct for
any exact shifts (they use only ``exp(s - m1) exp(m1 - m) = exp(s - m)``; the monoid proof's
axiom). The largest midpoint keeps every ``exp`` argument at most the scores' radius above 0.

Exact values. The float64 formulas would blur values that are exact by construction; three
facts, each true for every point of the operands, keep them exact:

* ``-inf`` (a masked score, the empty state's ``m``) minus a finite ball is exactly ``-inf``,
  and ``exp(-inf) = 0`` exactly;
* ``0 * b = 0`` and ``1 * b = b`` for any finite ball ``b`` (checked for per-row factors, such as
  the merge's rescalings); ``0 + b = b - 0 = b``; ``exp(0) = 1``;
* ``a - a = 0`` for bitwise-equal exact floats (the merge's ``m - shift`` when ``m`` is the max).

Looking for those values costs a pass over a tile per check, so a ball knows when it cannot hold
one: ``rounded`` balls, the results of the arithmetic of :mod:`~attnformal.reference.fp64_balls`,
have no radius 0 (every formula there adds at least ``u * FLOOR``, ``gamma * FLOOR^2`` for a product of
at least one term, or is infinite or NaN), and a radius-0 ball is where the facts above look first.

So a row without allowed keys keeps ``l = 0`` exactly and ``finalize``'s ``l > 0`` is decided;
a comparison that the balls cannot decide raises :class:`~attnformal.reference.fp64_balls.OutOfRange`
(the caller then moves to the Arb tier), never a guess.
"""

from __future__ import annotations

import math

import torch

from attnformal.reference import fp64_balls as fb

NEG_INF = -math.inf


class Balls:
    """Balls ``mid +- rad`` (float64 tensors); ``exact`` when every radius is 0 by construction."""

    __slots__ = ("mid", "_rad", "exact", "rounded", "_magnitude", "_spread")

    def __init__(self, mid: torch.Tensor, rad: torch.Tensor | None = None, rounded: bool = False,
                 magnitude: torch.Tensor | None = None):
        self.mid = mid
        self.exact = rad is None
        self._rad = rad  # an exact ball's zeros are made when asked for (products read only its mid)
        self.rounded = rounded  # no radius is 0 (see the module docstring): no exact value to look for
        self._magnitude = magnitude
        self._spread = None  # (n, fb.spread(ball, n)), made when first asked for

    @property
    def rad(self) -> torch.Tensor:
        if self._rad is None:
            self._rad = torch.zeros_like(self.mid)
        return self._rad

    @property
    def magnitude(self) -> torch.Tensor:
        """``fb.mag(mid)``, computed once: a tile's P or dS is the operand of several products.
        (Accumulators, whose ``mid`` is written in place, never ask for it: they are read by index.)"""
        if self._magnitude is None:
            self._magnitude = fb.mag(self.mid)
        return self._magnitude

    def spread(self, n: int) -> torch.Tensor:
        """``fb.spread(ball, n)``, computed once for the last ``n`` asked (a tile's P: its row sums and
        ``P V`` both sum over its keys)."""
        if self._spread is None or self._spread[0] != n:
            self._spread = (n, fb.spread(self.ball, n, self.magnitude))
        return self._spread[1]

    @classmethod
    def of(cls, ball: fb.Ball) -> Balls:
        return cls(ball.mid, ball.rad)

    @classmethod
    def result(cls, ball: fb.Ball, terms: int = 1) -> Balls:
        """The ball an fp64_balls operation returned; ``terms``: its sum's length (0 terms: exactly 0)."""
        return cls(ball.mid, ball.rad, rounded=terms > 0)

    @property
    def ball(self) -> fb.Ball:
        return fb.Ball(self.mid, self.rad)

    @property
    def shape(self):
        return self.mid.shape

    def __getitem__(self, index) -> Balls:
        return _like(self, self.mid[index], self.rad[index])

    def swapaxes(self, a: int, b: int) -> Balls:
        rad = None if self.exact else self.rad.swapaxes(a, b)  # an exact ball's zeros stay unmade
        swapped = _like(self, self.mid.swapaxes(a, b), rad)
        if self._magnitude is not None:
            swapped._magnitude = self._magnitude.swapaxes(a, b)
        return swapped

    # ------------------------------------------------------------ arithmetic

    def __add__(self, other) -> Balls:
        other = _lift(other)
        total = Balls.result(fb.add(self.ball, other.ball))
        total = _keep(total, _is(self, 0.0), other)  # 0 + b = b
        return _keep(total, _is(other, 0.0), self)

    __radd__ = __add__

    def __sub__(self, other) -> Balls:
        other = _lift(other)
        diff = _keep(_difference(self, other), _is(other, 0.0), self)  # a - 0 = a
        if self.exact and other.exact:  # bitwise-equal exact floats: exactly 0
            same = self.mid.view(torch.int64) == other.mid.view(torch.int64)
            diff = _keep(diff, same & torch.isfinite(self.mid), 0.0)
        masked = _is(self, NEG_INF)  # -inf minus a finite ball is exactly -inf
        if masked is not None:
            masked = masked & torch.isfinite(other.mid) & torch.isfinite(other.rad)
        return _keep(diff, masked, NEG_INF)

    def __rsub__(self, other) -> Balls:
        return _lift(other) - self

    def __neg__(self) -> Balls:
        return _like(self, -self.mid, self.rad)  # negation is exact

    def __mul__(self, other) -> Balls:
        if isinstance(other, (int, float)):
            return _scaled(self, float(other))
        other = _lift(other)
        product = Balls.result(fb.mul(self.ball, other.ball, self.magnitude, other.magnitude))
        for a, b in ((self, other), (other, self)):
            if a.mid.dim() and a.shape[-1] > 1:
                continue  # the facts matter for per-row factors (the merge's rescalings), not tile products
            product = _keep(product, _is(a, 1.0), b)  # 1 * b = b
            zero = _is(a, 0.0)
            if zero is not None:  # 0 * b = 0 for finite b
                zero = zero & torch.isfinite(b.mid) & torch.isfinite(b.rad)
            product = _keep(product, zero, 0.0)
        return product

    __rmul__ = __mul__

    def __truediv__(self, other) -> Balls:
        if isinstance(other, Balls):
            return Balls.result(fb.div(self.ball, other.ball))
        return Balls.result(fb.div_exact(self.ball, float(other)))

    def __matmul__(self, other) -> Balls:
        """``self @ other`` for an exact right operand (a float64 tensor, or exact balls)."""
        if not isinstance(other, Balls):
            other = Balls(other)
        elif not other.exact:
            raise TypeError("Balls @ Balls: the right operand must be exact (the inputs q, k, v, dO)")
        terms = other.shape[-2]
        if self.exact:
            return Balls.result(fb.dot(self.mid, other.mid, self.magnitude, other.magnitude), terms)
        return Balls.result(fb.matmul(self.ball, other.mid, self.magnitude, other.magnitude, self.spread(terms)),
                            terms)

    def __gt__(self, x) -> torch.Tensor:
        """Where the whole ball lies above ``x``; raises OutOfRange where the ball straddles ``x``.

        ``d = self - x`` is a rigorous ball; ``d.mid > d.rad`` and ``-d.mid >= d.rad`` are exact
        comparisons of floats, so True means every point is above ``x``, False every point at most ``x``.
        """
        d = self - x
        above, below = d.mid > d.rad, -d.mid >= d.rad
        if not bool((above | below).all()):
            raise fb.OutOfRange(f"a ball straddles {x}: the float64 tier cannot decide the comparison")
        return above


def _like(template: Balls, mid, rad) -> Balls:
    return Balls(mid) if template.exact else Balls(mid, rad, template.rounded)


def _difference(a: Balls, b: Balls) -> Balls:
    """``a - b`` by ``sub_exact`` when ``b`` is exact (the softmax shift): 2 roundings charged, not 3."""
    return Balls.result(fb.sub_exact(a.ball, b.mid) if b.exact else fb.sub(a.ball, b.ball))


def _scaled(a: Balls, t: float) -> Balls:
    """``a * t`` for an exact float ``t``: ``mul_exact`` (``u|c| + a.rad |t|``), and the facts
    ``1 * b = b`` and ``0 * b = 0`` (finite ``b``) that hold for any ball."""
    if t == 1.0:
        return a
    product = Balls.result(fb.mul_exact(a.ball, t))
    if t != 0.0:
        return product
    finite = torch.isfinite(a.mid) & torch.isfinite(a.rad)
    return _keep(product, finite, 0.0)


def _lift(x) -> Balls:
    """A Balls operand: balls as they are, a float or float64 tensor as an exact ball."""
    if isinstance(x, Balls):
        return x
    return Balls(torch.as_tensor(x, dtype=torch.float64))


def _is(a: Balls, value: float) -> torch.Tensor | None:
    """Where ``a`` is exactly ``value``; None when nowhere (checked cheaply first: no radius is 0)."""
    if a.exact:
        where = a.mid == value
    elif a.rounded:
        return None
    else:
        where = a.rad == 0
        if not bool(where.any()):
            return None
        where &= a.mid == value
    return where if bool(where.any()) else None


def _keep(result: Balls, where: torch.Tensor | None, exact: Balls | float) -> Balls:
    """``result``, replaced by the (tighter, equally rigorous) ``exact`` ball (or exact float) where ``where``
    holds."""
    if where is None:
        return result
    if isinstance(exact, float):
        mid = torch.where(where, exact, result.mid)
        return Balls(mid, torch.where(where, 0.0, result.rad).expand_as(mid))
    mid = torch.where(where, exact.mid, result.mid)
    return Balls(mid, torch.where(where, exact.rad, result.rad).expand_as(mid), result.rounded and exact.rounded)


def exact_state(rows: tuple[int, ...], head_dim_v: int):
    """The identity of ``merge`` as exact balls: ``m = -inf, l = 0, acc = 0``."""
    from attnformal.merge import SoftmaxState, empty_state

    return SoftmaxState(*(Balls(t) for t in empty_state(rows, head_dim_v, dtype=torch.float64)))


def cat(parts: list[Balls], dim: int) -> Balls:
    mid = torch.cat([p.mid for p in parts], dim)
    if all(p.exact for p in parts):
        return Balls(mid)
    return Balls(mid, torch.cat([p.rad for p in parts], dim), all(p.rounded for p in parts))


class _BallOps:
    """The ops family of :class:`Balls` (see :mod:`attnformal.ops`)."""

    @staticmethod
    def where(cond, a, b):
        a, b = _lift(a), _lift(b)
        mid = torch.where(cond, a.mid, b.mid)
        if a.exact and b.exact:
            return Balls(mid)
        return Balls(mid, torch.where(cond, a.rad, b.rad).expand_as(mid))

    @staticmethod
    def maximum(a, b):
        """``|max(x, y) - max(a.mid, b.mid)| <= max(a.rad, b.rad)`` for ``x in a, y in b``; max is exact."""
        a, b = _lift(a), _lift(b)
        mid = torch.maximum(a.mid, b.mid)
        return Balls(mid) if a.exact and b.exact else Balls(mid, torch.maximum(a.rad, b.rad).expand_as(mid))

    @staticmethod
    def exp(a):
        result = Balls.result(fb.exp(a.ball))
        result = _keep(result, _is(a, NEG_INF), 0.0)
        return _keep(result, _is(a, 0.0), 1.0)

    @staticmethod
    def log(a):
        """Natural log through Arb, element by element (used per row, by ``finalize``)."""
        import numpy as np

        from attnformal.reference.arb_balls import arb_to_float64

        logs = np.frompyfunc(lambda x: arb_to_float64(x.log()), 1, 2)(fb.to_arb(a.ball))
        return Balls(*(torch.from_numpy(np.asarray(t, dtype=np.float64)) for t in logs))

    @staticmethod
    def tanh(a):
        return Balls.result(fb.tanh(a.ball))

    @staticmethod
    def is_neg_inf(a):
        return (a.mid == NEG_INF) & (a.rad == 0)

    @staticmethod
    def rowmax(s):
        """The exact shift of each row: its largest midpoint (-inf for a row of no keys)."""
        if s.shape[-1] == 0:
            return Balls(s.mid.new_full((*s.shape[:-1], 1), NEG_INF))
        return Balls(s.mid.amax(dim=-1, keepdim=True))

    @staticmethod
    def rowsum(p):
        total = Balls.result(fb.sum_dim(p.ball, -1, p.magnitude, p.spread(p.shape[-1])), p.shape[-1])
        zeros = _is(p, 0.0)  # a sum of exact zeros is exactly 0
        if zeros is not None:
            zeros = zeros.all(dim=-1, keepdim=True)
        return _keep(total, zeros, 0.0)

    @staticmethod
    def matmul(p, v):
        return p @ v


Balls.__attn_ops__ = _BallOps
