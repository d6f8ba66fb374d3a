"""Number domains the prover runs the spec's own functions on (through :mod:`attnformal.ops`).

* :class:`ExtendedReal` -- a real number, ``+inf``, ``-inf`` or NaN, as Z3 terms. Z3's reals
  have no infinities, but the merge starts from ``m = -inf`` and masked scores are ``-inf``;
  this class computes with them exactly as IEEE arithmetic does over the reals
  (``-inf - (-inf)`` is NaN, ``exp(-inf)`` is 0, ``0 * inf`` is NaN), so a missing guard shows.
  ``exp`` and ``log`` of finite values are the uninterpreted functions of :mod:`attnformal.ops`;
  the proofs state their axioms.
* IEEE floats of one format, two ways with one vocabulary: :class:`NativeFloats` (Z3 FP terms,
  bit-precise) and :class:`AbstractFloats`, whose arithmetic is uninterpreted. Obligation 8
  proves small lemmas about each real IEEE operation bit-precisely, then the theorems about the
  merge from those lemmas alone, on abstract floats; bit-blasting a whole float32 merge is far
  too slow, one operation at a time is not.

ExtendedReal and AbstractFloat carry ``__attn_ops__``, so ``ops.where(z3_condition, x, 0.0)``
and friends dispatch to them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import z3

from attnformal import ops
from attnformal.logic import render_value

FINITE, POS_INF, NEG_INF, NAN = 0, 1, 2, 3
_KIND_NAMES = {POS_INF: "+inf", NEG_INF: "-inf", NAN: "nan"}


def _simplified(term):
    return z3.simplify(term)


class ExtendedReal:
    """``kind`` (an Int: FINITE, POS_INF, NEG_INF, NAN) and ``value`` (a Real, used when finite)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind, value):
        self.kind = _simplified(z3.IntVal(kind) if isinstance(kind, int) else kind)
        self.value = _simplified(z3.RealVal(value) if isinstance(value, (int, float)) else value)

    @classmethod
    def finite(cls, value) -> ExtendedReal:
        return cls(FINITE, value)

    @classmethod
    def lift(cls, x) -> ExtendedReal:
        """An ExtendedReal from itself, a Python number (``-inf`` included) or a Z3 real term."""
        if isinstance(x, ExtendedReal):
            return x
        if isinstance(x, float) and x != x:
            return cls(NAN, 0)
        if isinstance(x, float) and abs(x) == float("inf"):
            return cls(POS_INF if x > 0 else NEG_INF, 0)
        return cls.finite(x)

    def _is(self, kind):
        return self.kind == kind

    @property
    def is_finite(self):
        return self._is(FINITE)

    @property
    def is_nan(self):
        return self._is(NAN)

    @property
    def is_infinite(self):
        return z3.Or(self._is(POS_INF), self._is(NEG_INF))

    def _sign(self):
        """-1, 0 or 1 (infinities included)."""
        return z3.If(self._is(POS_INF), 1, z3.If(self._is(NEG_INF), -1,
                     z3.If(self.value > 0, 1, z3.If(self.value < 0, -1, 0))))

    # ---- arithmetic, with the IEEE rules for infinities and NaN

    def __add__(self, other):
        a, b = self, ExtendedReal.lift(other)
        nan = z3.Or(a.is_nan, b.is_nan, z3.And(a._is(POS_INF), b._is(NEG_INF)),
                    z3.And(a._is(NEG_INF), b._is(POS_INF)))
        kind = z3.If(nan, NAN, z3.If(z3.Or(a._is(POS_INF), b._is(POS_INF)), POS_INF,
                     z3.If(z3.Or(a._is(NEG_INF), b._is(NEG_INF)), NEG_INF, FINITE)))
        return ExtendedReal(kind, a.value + b.value)

    __radd__ = __add__

    def __neg__(self):
        kind = z3.If(self._is(POS_INF), NEG_INF, z3.If(self._is(NEG_INF), POS_INF, self.kind))
        return ExtendedReal(kind, -self.value)

    def __sub__(self, other):
        return self + (-ExtendedReal.lift(other))

    def __rsub__(self, other):
        return ExtendedReal.lift(other) + (-self)

    def __mul__(self, other):
        a, b = self, ExtendedReal.lift(other)
        sign = a._sign() * b._sign()
        kind = z3.If(z3.Or(a.is_nan, b.is_nan), NAN,
                     z3.If(z3.Or(a.is_infinite, b.is_infinite),
                           z3.If(sign > 0, POS_INF, z3.If(sign < 0, NEG_INF, NAN)),  # 0 * inf is NaN
                           FINITE))
        return ExtendedReal(kind, a.value * b.value)

    __rmul__ = __mul__

    def __truediv__(self, other):
        a, b = self, ExtendedReal.lift(other)
        sign = a._sign() * z3.If(b.value < 0, -1, 1)  # x / 0 takes the sign of x (divisor +0)
        kind = z3.If(z3.Or(a.is_nan, b.is_nan, z3.And(a.is_infinite, b.is_infinite)), NAN,
                     z3.If(b.is_infinite, FINITE,
                           z3.If(z3.Or(a.is_infinite, b.value == 0),
                                 z3.If(sign > 0, POS_INF, z3.If(sign < 0, NEG_INF, NAN)),  # 0 / 0 is NaN
                                 FINITE)))
        return ExtendedReal(kind, z3.If(b.is_infinite, 0, a.value / b.value))

    def __rtruediv__(self, other):
        return ExtendedReal.lift(other) / self

    # ---- comparisons: false whenever NaN is involved

    def _compare(self, other, relation):
        a, b = self, ExtendedReal.lift(other)

        def rank(x):
            return z3.If(x._is(NEG_INF), -1, z3.If(x._is(POS_INF), 1, 0))

        both_finite = z3.And(a.is_finite, b.is_finite)
        ordered = z3.If(both_finite, relation(a.value, b.value), relation(rank(a), rank(b)))
        return _simplified(z3.And(z3.Not(a.is_nan), z3.Not(b.is_nan), ordered))

    def __lt__(self, other):
        return self._compare(other, lambda x, y: x < y)

    def __le__(self, other):
        return self._compare(other, lambda x, y: x <= y)

    def __gt__(self, other):
        return self._compare(other, lambda x, y: x > y)

    def __ge__(self, other):
        return self._compare(other, lambda x, y: x >= y)

    def same(self, other):
        """Z3 Bool: the same extended real, and not NaN (NaN equals nothing)."""
        b = ExtendedReal.lift(other)
        return _simplified(z3.And(self.kind == b.kind, z3.Not(self.is_nan),
                                  z3.Implies(self.is_finite, self.value == b.value)))

    def render(self, model) -> str:
        kind = model.eval(self.kind, model_completion=True).as_long()
        if kind != FINITE:
            return _KIND_NAMES[kind]
        return render_value(model, self.value)


class _ExtendedRealOps:
    """``ops`` on extended reals (see :mod:`attnformal.ops`)."""

    @staticmethod
    def where(cond, a, b):
        a, b = ExtendedReal.lift(a), ExtendedReal.lift(b)
        return ExtendedReal(z3.If(cond, a.kind, b.kind), z3.If(cond, a.value, b.value))

    @staticmethod
    def maximum(a, b):
        a, b = ExtendedReal.lift(a), ExtendedReal.lift(b)  # torch.maximum: NaN propagates
        return _ExtendedRealOps.where(z3.Or(a.is_nan, b.is_nan), ExtendedReal(NAN, 0),
                                      _ExtendedRealOps.where(a >= b, a, b))

    @staticmethod
    def minimum(a, b):
        a, b = ExtendedReal.lift(a), ExtendedReal.lift(b)
        return _ExtendedRealOps.where(z3.Or(a.is_nan, b.is_nan), ExtendedReal(NAN, 0),
                                      _ExtendedRealOps.where(a <= b, a, b))

    @staticmethod
    def exp(x):
        """``exp(-inf) = 0``, ``exp(+inf) = +inf``, NaN stays NaN; finite: the uninterpreted exp."""
        x = ExtendedReal.lift(x)
        return ExtendedReal(z3.If(x._is(NEG_INF), FINITE, x.kind),
                            z3.If(x._is(NEG_INF), 0, ops.exp(x.value)))

    @staticmethod
    def log(x):
        """``log(0) = -inf``, ``log(+inf) = +inf``, negative or NaN gives NaN; positive: the uninterpreted log."""
        x = ExtendedReal.lift(x)
        kind = z3.If(z3.Or(x.is_nan, x < 0), NAN,
                     z3.If(x.is_finite, z3.If(x.value == 0, NEG_INF, FINITE), x.kind))
        return ExtendedReal(kind, ops.log(x.value))

    @staticmethod
    def tanh(x):
        x = ExtendedReal.lift(x)
        limit = z3.If(x._is(POS_INF), 1, -1)
        return ExtendedReal(z3.If(x.is_nan, NAN, FINITE), z3.If(x.is_finite, ops.tanh(x.value), limit))

    @staticmethod
    def is_neg_inf(x):
        return ExtendedReal.lift(x)._is(NEG_INF)


ExtendedReal.__attn_ops__ = _ExtendedRealOps


def extended_reals(names: str) -> list[ExtendedReal]:
    """Finite extended reals named like ``z3.Reals(names)``."""
    return [ExtendedReal.finite(v) for v in z3.Reals(names)]



# ---------------------------------------------------------------------------- IEEE floats, two ways


@dataclass(frozen=True)
class FloatFormat:
    """An IEEE binary format: ``ebits`` exponent bits, ``sbits`` significand bits (hidden bit included)."""

    name: str
    ebits: int
    sbits: int

    @property
    def sort(self) -> z3.FPSortRef:
        return z3.FPSort(self.ebits, self.sbits)

    @property
    def emax(self) -> int:
        return 2 ** (self.ebits - 1) - 1

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.emax - (self.sbits - 1))


class NativeFloats:
    """Z3 FP terms of ``fmt`` with Z3's bit-precise IEEE arithmetic (round to nearest even).

    Both this and :class:`AbstractFloats` offer the same vocabulary (``var``, ``const`` and the
    predicates), so a theorem is written once and built on either.
    """

    abstract = False

    def __init__(self, fmt: FloatFormat):
        self.fmt = fmt

    def var(self, name):
        return z3.FP(name, self.fmt.sort)

    def const(self, x: float):
        return z3.FPVal(x, self.fmt.sort)

    def number(self, x: float):
        """A constant the spec's code can compute with (``const`` may be a raw term)."""
        return self.const(x)

    def raw(self, x):
        return x if isinstance(x, z3.ExprRef) else self.const(x)

    def is_nan(self, x):
        return z3.fpIsNaN(self.raw(x))

    def is_finite(self, x):
        x = self.raw(x)
        return z3.Not(z3.Or(z3.fpIsNaN(x), z3.fpIsInf(x)))

    def is_neg_inf(self, x):
        x = self.raw(x)
        return z3.And(z3.fpIsInf(x), z3.fpIsNegative(x))

    def is_zero(self, x):
        return z3.fpIsZero(self.raw(x))

    def is_negative(self, x):
        return z3.fpIsNegative(self.raw(x))

    def le(self, x, y):
        return z3.fpLEQ(self.raw(x), self.raw(y))

    def lt(self, x, y):
        return z3.fpLT(self.raw(x), self.raw(y))

    def ieee_eq(self, x, y):
        """IEEE equality: ``-0 == +0``, NaN equals nothing."""
        return z3.fpEQ(self.raw(x), self.raw(y))

    def identical(self, x, y):
        """The same bits (for values that are not NaN)."""
        return self.raw(x) == self.raw(y)

    def abs_le(self, x, bound: float):
        return z3.fpLEQ(z3.fpAbs(self.raw(x)), self.const(bound))

    def operation(self, name):
        """The real IEEE ``add``/``sub``/``mul``/``div``, or the spec's own ``max``."""
        return {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
                "div": lambda x, y: x / y, "max": ops.maximum}[name]


Float = z3.Datatype("Float")
Float.declare("float", ("kind", z3.IntSort()), ("value", z3.RealSort()), ("negative", z3.BoolSort()))
Float = Float.create()


class AbstractFloats(NativeFloats):
    """IEEE values of ``fmt`` seen through what the proofs use about them, with abstract arithmetic.

    A value is described by its class (finite, +inf, -inf, NaN), its exact real value and its
    sign bit -- one description per float (Z3, like SMT-LIB, has a single NaN), so predicates
    (order, IEEE equality, zero, sign, bit identity) mean the same as on the float. ``+ - * /``, the spec's
    ``maximum``, ``exp`` and ``log`` are uninterpreted functions: only lemmas proved about the real
    operations (and the axioms of exp and log) constrain them. Reals that are not floats are
    allowed too, which only adds models: a proof here holds for the floats. The queries are
    linear real arithmetic, so they need no bit-blasting.
    """

    abstract = True

    def __init__(self, fmt: FloatFormat):
        super().__init__(fmt)
        self._parts = {}  # term id -> (term, kind, value, negative): accessors built once per term

    def var(self, name):
        return AbstractFloat(z3.Const(name, Float), self)

    def const(self, x: float):
        return _abstract_constant(repr(float(x)), self.fmt)

    def number(self, x: float):
        return AbstractFloat(self.const(x), self)

    def raw(self, x):
        if isinstance(x, AbstractFloat):
            return x.term
        return x if isinstance(x, z3.ExprRef) else self.const(x)

    def _describe(self, x):
        term = self.raw(x)
        parts = self._parts.get(term.get_id())
        if parts is None:
            parts = self._parts[term.get_id()] = (term, Float.kind(term), Float.value(term), Float.negative(term))
        return parts[1:]

    def _kind(self, x, kind):
        return self._describe(x)[0] == kind

    def is_nan(self, x):
        return self._kind(x, NAN)

    def is_finite(self, x):
        return self._kind(x, FINITE)

    def is_neg_inf(self, x):
        return self._kind(x, NEG_INF)

    def is_zero(self, x):
        kind, value, _ = self._describe(x)
        return z3.And(kind == FINITE, value == 0)

    def is_negative(self, x):
        return self._describe(x)[2]

    def _order(self, x, y, relation):
        (kx, vx, _), (ky, vy, _) = self._describe(x), self._describe(y)

        def rank(kind):
            return z3.If(kind == NEG_INF, -1, z3.If(kind == POS_INF, 1, 0))

        ordered = z3.If(z3.And(kx == FINITE, ky == FINITE), relation(vx, vy), relation(rank(kx), rank(ky)))
        return z3.And(kx != NAN, ky != NAN, ordered)

    def le(self, x, y):
        return self._order(x, y, lambda a, b: a <= b)

    def lt(self, x, y):
        return self._order(x, y, lambda a, b: a < b)

    def ieee_eq(self, x, y):
        return self._order(x, y, lambda a, b: a == b)

    def identical(self, x, y):
        return self.raw(x) == self.raw(y)

    def abs_le(self, x, bound: float):
        kind, value, _ = self._describe(x)
        return z3.And(kind == FINITE, value <= bound, -bound <= value)

    def operation(self, name):
        decl = abstract_operation(name, self.fmt)
        return lambda x, y: AbstractFloat(decl(self.raw(x), self.raw(y)), self)

    def well_formed(self, term):
        """The description of a real float: the class in range, the sign bit agreeing with the
        value, and one description for each non-finite float (value 0; NaN unsigned, as Z3's one NaN)."""
        kind, value, negative = self._describe(term)
        return z3.And(0 <= kind, kind <= NAN, z3.Implies(kind != FINITE, value == 0),
                      z3.Implies(z3.Or(kind == POS_INF, kind == NAN), z3.Not(negative)),
                      z3.Implies(kind == NEG_INF, negative),
                      z3.Implies(z3.And(kind == FINITE, value > 0), z3.Not(negative)),
                      z3.Implies(z3.And(kind == FINITE, value < 0), negative))


@functools.cache
def _abstract_constant(text: str, fmt: FloatFormat):
    """The description of the float nearest ``float(text)`` (text, so that -0.0 and 0.0 differ)."""
    x = float(text)
    if x != x:
        return Float.float(NAN, 0, False)
    if abs(x) == math.inf:
        return Float.float(POS_INF if x > 0 else NEG_INF, 0, x < 0)
    value = z3.simplify(z3.fpToReal(z3.FPVal(x, fmt.sort)))
    return Float.float(FINITE, value, math.copysign(1.0, x) < 0)


@functools.cache
def abstract_operation(name: str, fmt: FloatFormat) -> z3.FuncDeclRef:
    """The uninterpreted stand-in for an IEEE operation (or ``exp``, ``log``, ``max``) of ``fmt``."""
    arity = 1 if name in ("exp", "log") else 2
    return z3.Function(f"{name}[{fmt.name}]", *([Float] * arity), Float)


class AbstractFloat:
    """A value of :class:`AbstractFloats`; arithmetic builds uninterpreted applications."""

    __slots__ = ("term", "domain")

    def __init__(self, term, domain: AbstractFloats):
        self.term, self.domain = term, domain

    def _apply(self, name, x, y):
        return self.domain.operation(name)(x, y)

    def __add__(self, other):
        return self._apply("add", self, other)

    def __radd__(self, other):
        return self._apply("add", other, self)

    def __sub__(self, other):
        return self._apply("sub", self, other)

    def __rsub__(self, other):
        return self._apply("sub", other, self)

    def __mul__(self, other):
        return self._apply("mul", self, other)

    def __rmul__(self, other):
        return self._apply("mul", other, self)

    def __truediv__(self, other):
        return self._apply("div", self, other)

    def __rtruediv__(self, other):
        return self._apply("div", other, self)

    def __neg__(self):  # exact in IEEE: flips the sign bit (NaN stays the one NaN)
        t = self.term
        kind = z3.If(Float.kind(t) == POS_INF, NEG_INF, z3.If(Float.kind(t) == NEG_INF, POS_INF, Float.kind(t)))
        negative = z3.If(Float.kind(t) == NAN, False, z3.Not(Float.negative(t)))
        return AbstractFloat(Float.float(kind, -Float.value(t), negative), self.domain)

    def __lt__(self, other):
        return self.domain.lt(self, other)

    def __le__(self, other):
        return self.domain.le(self, other)

    def __gt__(self, other):
        return self.domain.lt(other, self)

    def __ge__(self, other):
        return self.domain.le(other, self)

    def small_whole_number(self):
        """For readable counterexamples: a finite input is a whole number in [-16, 16]."""
        if not (z3.is_const(self.term) and self.term.decl().kind() == z3.Z3_OP_UNINTERPRETED):
            return None
        value = Float.value(self.term)
        return z3.Implies(Float.kind(self.term) == FINITE, z3.And(z3.IsInt(value), -16 <= value, value <= 16))

    def render(self, model) -> str:
        t = model.eval(self.term, model_completion=True)
        kind = model.eval(Float.kind(t), model_completion=True).as_long()
        if kind != FINITE:
            return _KIND_NAMES.get(kind, "?")
        value = render_value(model, Float.value(t))
        negative = z3.is_true(model.eval(Float.negative(t), model_completion=True))
        return ("-0" if negative else "+0") if value == "0" else value


def _domain_of(*xs) -> AbstractFloats:
    return next(x.domain for x in xs if isinstance(x, AbstractFloat))


class _AbstractFloatOps:
    """``ops`` on AbstractFloat: exact selections, uninterpreted maximum, exp and log."""

    @staticmethod
    def where(cond, a, b):
        d = _domain_of(a, b)
        return AbstractFloat(z3.If(cond, d.raw(a), d.raw(b)), d)

    @staticmethod
    def maximum(a, b):
        return _domain_of(a, b).operation("max")(a, b)

    @staticmethod
    def exp(x):
        return AbstractFloat(abstract_operation("exp", x.domain.fmt)(x.term), x.domain)

    @staticmethod
    def log(x):
        return AbstractFloat(abstract_operation("log", x.domain.fmt)(x.term), x.domain)

    @staticmethod
    def is_neg_inf(x):
        return x.domain.is_neg_inf(x)


AbstractFloat.__attn_ops__ = _AbstractFloatOps
