"""Obligation 8 -- IEEE floating point: no NaN, no overflow in exp, a safe final division.

For float32, float16 and bfloat16 (Z3 ``Float32()``, ``FPSort(5, 11)``, ``FPSort(8, 8)``),
with the real IEEE encodings of ``-inf``, ``+-0`` and NaN, on the spec's own ``tile_scores``,
``block_state``, ``merge``, ``finalize`` and ``ops.maximum``. Let ``H = 2**(emax - 2)``
(float32: 2**125, float16: 8192, bfloat16: 2**125).

* **(a) maximum.** ``ops.maximum`` (IEEE 754-2019 maximum, spelled out because SMT-LIB
  ``fp.max`` leaves ``max(-0, +0)`` unspecified) of non-NaN ``a, b`` is not NaN, is ``>= a``
  and ``>= b``, equals one of them, is bit-for-bit symmetric, and ``maximum(-0, +0) = +0``.
* **(b) tile.** For two keys with finite raw scores, any mask, values ``|v| <= H``, the state
  ``block_state(tile_scores(...))`` has no NaN; every ``exp`` argument is ``<= 0`` (so exp
  cannot overflow); ``l >= 1`` and ``m`` finite if a key is allowed; the identity ``(-inf, 0, 0)``
  if none is (a fully masked row).
* **(c) merge.** For well-formed states -- ``(-inf, 0, 0)``, or ``m`` finite, ``1 <= l <= H``,
  ``|acc| <= H`` -- the merge has no NaN, every ``exp`` argument is ``<= 0``, and the result is
  well-formed: ``-inf`` with zeros, or ``m`` finite with ``l >= 1`` and ``l``, ``acc`` finite.
  (``l >= 1`` after the first nonempty tile: the state holding the max is rescaled by exactly
  ``exp(0) = 1``.)
* **(d) finalize.** For a well-formed state: ``out`` and ``lse`` are not NaN (no ``0/0``, no
  ``inf - inf``); the identity gives ``out = 0``, ``lse = -inf``.

The bounds ``l, |acc| <= H`` before each merge are the no-overflow hypothesis: ``l`` is at most
the number of keys, ``|acc|`` at most that times ``max |v|``; kernels accumulate in float32
(where H is 4e37), and a float16 accumulator would overflow ``l`` past 8192 keys.

**How it is proved.** Bit-blasting a whole merge in float32 is far too slow, so the proof is
compositional. Lemmas about single IEEE operations (round to nearest even) and about the spec's
``ops.maximum`` are proved bit-precisely for each format -- e.g.
``0 <= x <= 1, |y| <= H => |x*y| <= H``. Then (b)-(d) are proved on
:class:`attnformal.domains.AbstractFloats`: each float is described exactly by its class, real
value and sign bit, and ``+ - * /``, ``maximum`` are uninterpreted, constrained only by those
lemmas. Every real IEEE operation satisfies the lemmas, so the theorems hold for real IEEE
arithmetic (axiom ``float-description``: every float has such a description). A failure
there is re-decided bit-precisely, so a counterexample is always a real one. ``exp`` and ``log`` are uninterpreted with these axioms,
true of any faithfully rounded IEEE implementation (the true value is bracketed by the two
floats around it, and 0, 1 are floats):

* ``exp-nan``: ``exp(NaN) = NaN``; ``exp-neg-inf``: ``exp(-inf) = +0`` (IEEE 754 9.2);
  ``exp-zero``: ``exp(+-0) = 1``; ``exp-unit``: ``x <= 0 => +0 <= exp(x) <= 1``;
  ``exp-no-underflow``: ``x >= T => exp(x) > 0`` with ``T = ceil(ln(smallest subnormal))``
  (float32 -103, float16 -16, bfloat16 -92): below ``T`` exp may flush to zero, as it does;
* ``log-range``: ``1 <= x <= H => log(x)`` finite and ``>= 0``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import z3

from attnformal import merge as spec
from attnformal import ops, tile
from attnformal.domains import (FINITE, NEG_INF, POS_INF, AbstractFloats, Float, FloatFormat, NativeFloats,
                                abstract_operation)
from attnformal.logic import (REFUTED, Axiom, Budget, Control, Proof, Query, Settings, TermIndex, applications,
                              bitblast_solver, check_z3, patched, render_value)
from attnformal.merge import SoftmaxState

COST = 8  # rough seconds; the prover starts the longest obligations first
TITLE = "Floating point (float32, float16, bfloat16)"
FORMATS = (FloatFormat("float32", 8, 24), FloatFormat("float16", 5, 11), FloatFormat("bfloat16", 8, 8))


def bound_H(f: FloatFormat) -> float:
    """The no-overflow bound: 4H = 2**emax is below the largest float."""
    return 2.0 ** (f.emax - 2)


def underflow(f: FloatFormat) -> int:
    """ceil(ln(smallest subnormal)): at or above it a faithful exp is > 0."""
    return math.ceil(math.log(f.smallest_subnormal))


# ---- lemmas about single operations: proved on NativeFloats, assumed on AbstractFloats


@dataclass(frozen=True)
class Lemma:
    name: str
    operation: str  # add, sub, mul, div, or max (the spec's ops.maximum)
    statement: str
    formula: Callable  # (domain, x, y, result) -> Bool


def _lemmas():
    def sub_nonpositive(d, x, y, r):
        return z3.Implies(z3.And(z3.Not(d.is_nan(x)), d.is_finite(y), d.le(x, y)), d.le(r, 0.0))

    def sub_self(d, x, y, r):
        return z3.Implies(z3.And(d.is_finite(y), d.ieee_eq(x, y)), d.is_zero(r))

    def sub_neg_inf(d, x, y, r):
        return z3.Implies(z3.And(d.is_neg_inf(x), d.is_finite(y)), d.is_neg_inf(r))

    def mul_one(d, x, y, r):
        return z3.And(z3.Implies(d.identical(x, 1.0), d.identical(r, y)),
                      z3.Implies(d.identical(y, 1.0), d.identical(r, x)))

    def mul_zero(d, x, y, r):
        return z3.Implies(z3.And(d.is_zero(x), d.is_finite(y)), d.is_zero(r))

    def unit(d, x):
        return z3.And(d.le(0.0, x), d.le(x, 1.0))

    def mul_unit(d, x, y, r):
        H = bound_H(d.fmt)
        return z3.Implies(z3.And(unit(d, x), d.abs_le(y, H)), d.abs_le(r, H))

    def mul_nonnegative(d, x, y, r):
        return z3.Implies(z3.And(unit(d, x), d.le(0.0, y), d.abs_le(y, bound_H(d.fmt))), d.le(0.0, r))

    def add_bounded(d, x, y, r):
        H = bound_H(d.fmt)
        return z3.Implies(z3.And(d.abs_le(x, H), d.abs_le(y, H)), d.abs_le(r, 2 * H))

    def add_at_least_one(d, x, y, r):
        return z3.Implies(z3.Or(z3.And(d.le(1.0, x), d.le(0.0, y)), z3.And(d.le(1.0, y), d.le(0.0, x))),
                          d.le(1.0, r))

    def add_zeros(d, x, y, r):
        return z3.Implies(z3.And(d.is_zero(x), d.is_zero(y)), d.is_zero(r))

    def add_finite(d, x, y, r):
        return z3.Implies(z3.And(d.is_finite(x), d.is_finite(y)), z3.Not(d.is_nan(r)))

    def div_by_at_least_one(d, x, y, r):
        H = bound_H(d.fmt)
        return z3.Implies(z3.And(d.abs_le(x, H), d.le(1.0, y), d.abs_le(y, H)), d.is_finite(r))

    def maximum(d, x, y, r):
        return z3.Implies(z3.And(z3.Not(d.is_nan(x)), z3.Not(d.is_nan(y))),
                          z3.And(d.le(x, r), d.le(y, r), z3.Or(d.identical(r, x), d.identical(r, y))))

    return (
        Lemma("sub-nonpositive", "sub", "x not NaN, y finite, x <= y => x - y <= 0", sub_nonpositive),
        Lemma("sub-self", "sub", "y finite, x == y => x - y = +-0", sub_self),
        Lemma("sub-neg-inf", "sub", "x = -inf, y finite => x - y = -inf", sub_neg_inf),
        Lemma("mul-one", "mul", "1 * y = y and x * 1 = x (bit for bit)", mul_one),
        Lemma("mul-zero", "mul", "x = +-0, y finite => x * y = +-0", mul_zero),
        Lemma("mul-unit", "mul", "0 <= x <= 1, |y| <= H => |x * y| <= H", mul_unit),
        Lemma("mul-nonnegative", "mul", "0 <= x <= 1, 0 <= y <= H => x * y >= 0", mul_nonnegative),
        Lemma("add-bounded", "add", "|x|, |y| <= H => |x + y| <= 2H (finite)", add_bounded),
        Lemma("add-at-least-one", "add", "x >= 1, y >= 0 (or swapped) => x + y >= 1", add_at_least_one),
        Lemma("add-zeros", "add", "x = +-0, y = +-0 => x + y = +-0", add_zeros),
        Lemma("add-finite", "add", "x, y finite => x + y not NaN", add_finite),
        Lemma("div-by-at-least-one", "div", "|x| <= H, 1 <= y <= H => x / y finite", div_by_at_least_one),
        Lemma("maximum", "max", "x, y not NaN => maximum(x, y) >= x, y and is one of them (bit for bit)", maximum),
    )


LEMMAS = _lemmas()


def prove_lemmas(f: FloatFormat, budget: Budget):
    d = NativeFloats(f)
    x, y = d.var("x"), d.var("y")

    def queries():
        for lemma in LEMMAS:
            result = d.operation(lemma.operation)(x, y)
            yield Query(lemma.formula(d, x, y, result), show={"x": x, "y": y, "result": result}, case=lemma.name)

    return check_z3(f"{f.name}: lemmas about single IEEE operations and ops.maximum (bit-precise)", queries(),
                    budget=budget, solver=bitblast_solver)


def _each(decl, formula):
    return lambda terms: [formula(a) for a in applications(terms, decl)]


def lemma_axioms(d: AbstractFloats):
    def axiom(lemma):
        decl = abstract_operation(lemma.operation, d.fmt)
        return Axiom(f"{lemma.name}[{d.fmt.name}]", lemma.statement, f"proved bit-precisely for {d.fmt.name}",
                     _each(decl, lambda a: lemma.formula(d, a.arg(0), a.arg(1), a)))
    return tuple(axiom(lemma) for lemma in LEMMAS)


def description_axiom(d: AbstractFloats):
    def instances(index):
        return [d.well_formed(t) for t in index.subterms.values() if t.sort() == Float]

    return Axiom("float-description", "a float is its class, its real value and its sign bit",
                 "true of every IEEE value", instances)


def exp_log_axioms(d):
    """Axioms of exp and log of ``d.fmt``, on either domain (their function symbols differ)."""
    if d.abstract:
        exp, log = abstract_operation("exp", d.fmt), abstract_operation("log", d.fmt)
    else:
        exp, log = ops.z3_function("exp", d.fmt.sort), ops.z3_function("log", d.fmt.sort)
    H = bound_H(d.fmt)

    def of_exp(formula):
        return _each(exp, lambda e: formula(e.arg(0), e))

    return (
        Axiom("exp-nan", "exp(NaN) = NaN", "IEEE: NaN propagates",
              of_exp(lambda x, e: z3.Implies(d.is_nan(x), d.is_nan(e)))),
        Axiom("exp-neg-inf", "exp(-inf) = +0", "IEEE 754 9.2",
              of_exp(lambda x, e: z3.Implies(d.is_neg_inf(x), d.identical(e, 0.0)))),
        Axiom("exp-zero", "exp(+-0) = 1", "exact in every libm",
              of_exp(lambda x, e: z3.Implies(d.is_zero(x), d.identical(e, 1.0)))),
        Axiom("exp-unit", "x <= 0 => +0 <= exp(x) <= 1", "faithful rounding of a value in (0, 1]",
              of_exp(lambda x, e: z3.Implies(d.le(x, 0.0), z3.And(d.le(0.0, e), d.le(e, 1.0),
                                                                  z3.Not(d.is_negative(e)))))),
        Axiom("exp-no-underflow", f"x >= {underflow(d.fmt)} => exp(x) > 0",
              "faithful rounding of a value >= the smallest subnormal",
              of_exp(lambda x, e: z3.Implies(d.le(float(underflow(d.fmt)), x), d.lt(0.0, e)))),
        Axiom("log-range", "1 <= x <= H => log(x) finite and >= 0", "faithful rounding of log on [1, H]",
              _each(log, lambda y: z3.Implies(z3.And(d.le(1.0, y.arg(0)), d.abs_le(y.arg(0), H)),
                                              z3.And(d.is_finite(y), d.le(0.0, y))))),
    )


# ---- the theorems, built on either domain


def exp_arguments(d, terms):
    decl = abstract_operation("exp", d.fmt) if d.abstract else ops.z3_function("exp", d.fmt.sort)
    return [a.arg(0) for a in applications([d.raw(t) for t in terms], decl)]


def tile_state(q, k, v, allowed):
    """The spec's tile pipeline: scores masked by ``tile_scores``, then ``block_state``."""
    s, _ = tile.tile_scores(q, k, 1.0, allowed=allowed)
    return spec.block_state(s, v)


def column(xs):
    return np.array([[x] for x in xs], dtype=object)


def build_tile(d):
    H = bound_H(d.fmt)
    scores, values = [d.var(f"s{j}") for j in range(2)], [d.var(f"v{j}") for j in range(2)]
    allowed = [z3.Bool(f"allowed{j}") for j in range(2)]
    one = d.var("one") if d.abstract else d.const(1.0)  # q = [[1]]: k's column are the raw scores
    state = tile_state(np.array([[one]], dtype=object), column(scores), column(values),
                       np.array([allowed], dtype=object))
    m, l, acc = (x[0, 0] for x in state)
    hypotheses = (("raw scores finite", z3.And(*(d.is_finite(s) for s in scores))),
                  ("|v| <= H", z3.And(*(d.abs_le(v, H) for v in values))))
    if d.abstract:
        hypotheses += (("q = [[1]]", d.identical(one, 1.0)),)
    show = {**{f"s{j}": s for j, s in enumerate(scores)}, **{f"allowed{j}": a for j, a in enumerate(allowed)},
            **{f"v{j}": v for j, v in enumerate(values)}, "m": m, "l": l, "acc": acc}
    claims = {
        "no NaN": z3.Not(z3.Or(d.is_nan(m), d.is_nan(l), d.is_nan(acc))),
        "exp arguments <= 0": z3.And(*(d.le(x, 0.0) for x in exp_arguments(d, [m, l, acc]))),
        "a key allowed => m finite, l >= 1": z3.Implies(z3.Or(*allowed), z3.And(d.is_finite(m), d.le(1.0, l))),
        "no key allowed => (-inf, 0, 0)": z3.Implies(z3.Not(z3.Or(*allowed)),
                                                     z3.And(d.is_neg_inf(m), d.is_zero(l), d.is_zero(acc))),
    }
    return [Query(c, hypotheses, show, case=name) for name, c in claims.items()]


def _state(d, name):
    m, l, acc = d.var(f"{name}.m"), d.var(f"{name}.l"), d.var(f"{name}.acc")
    H = bound_H(d.fmt)
    well_formed = z3.If(d.is_neg_inf(m), z3.And(d.is_zero(l), d.is_zero(acc)),
                        z3.And(d.is_finite(m), d.le(1.0, l), d.abs_le(l, H), d.abs_le(acc, H)))
    return SoftmaxState(m, l, acc), (f"{name} well-formed, l and |acc| <= H", well_formed)


def build_merge(d):
    (a, a_ok), (b, b_ok) = _state(d, "a"), _state(d, "b")
    merged = spec.merge(a, b)
    m, l, acc = merged
    show = {**dict(zip(("a.m", "a.l", "a.acc"), a)), **dict(zip(("b.m", "b.l", "b.acc"), b)),
            "merge.m": m, "merge.l": l, "merge.acc": acc}
    claims = {
        "no NaN": z3.Not(z3.Or(d.is_nan(m), d.is_nan(l), d.is_nan(acc))),
        "exp arguments <= 0": z3.And(*(d.le(x, 0.0) for x in exp_arguments(d, merged))),
        "result well-formed": z3.If(d.is_neg_inf(m), z3.And(d.is_zero(l), d.is_zero(acc)),
                                    z3.And(d.is_finite(m), d.is_finite(l), d.is_finite(acc), d.le(1.0, l))),
    }
    return [Query(c, (a_ok, b_ok), show, case=name) for name, c in claims.items()]


def build_finalize(d):
    state, ok = _state(d, "state")
    out, lse = spec.finalize(state)
    show = {"m": state.m, "l": state.l, "acc": state.acc, "out": out, "lse": lse}
    claims = {
        "no NaN": z3.Not(z3.Or(d.is_nan(out), d.is_nan(lse))),
        "empty row => out = 0, lse = -inf": z3.Implies(d.is_neg_inf(state.m),
                                                       z3.And(d.is_zero(out), d.is_neg_inf(lse))),
    }
    return [Query(c, (ok,), show, case=name) for name, c in claims.items()]


def fp_theorem(claim: str, build, f: FloatFormat, budget: Budget):
    """Prove each case from the lemmas; a case they do not prove is decided in real IEEE arithmetic.

    The abstract counterexample is replayed with real floats (its inputs rounded to the format,
    exp and log computed in double and rounded: a faithful libm); if the claim fails there, that
    is the counterexample. Otherwise a bit-precise solver decides the case.
    """
    abstract, native = AbstractFloats(f), NativeFloats(f)
    axioms = lemma_axioms(abstract) + exp_log_axioms(abstract) + (description_axiom(abstract),)
    proofs = []
    for query, exact_query in zip(build(abstract), build(native)):
        proof = check_z3(claim, [query], budget=budget, axioms=axioms, keep_model=True)
        if proof.status == REFUTED:
            proof = replay(claim, exact_query, proof.model, f) or check_z3(
                claim, [exact_query], budget=budget, axioms=exp_log_axioms(native))
        proofs.append(proof)
    return combine(f"{f.name}: {claim}", proofs)


def replay(claim: str, query: Query, model, f: FloatFormat):
    """The query's claim evaluated on the abstract model's inputs, in real IEEE arithmetic."""
    native = NativeFloats(f)
    inputs = []
    for term in TermIndex([query.claim, *(h for _, h in query.hypotheses)]).subterms.values():
        if z3.is_const(term) and term.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            inputs.append((term, _input_value(model, term, native)))
    evaluate = functools.partial(_evaluate, inputs=inputs, f=f)
    if not all(z3.is_true(evaluate(h)) for _, h in query.hypotheses) or not z3.is_false(evaluate(query.claim)):
        return None
    countermodel = {name: render_value(z3.Model(), evaluate(term)) for name, term in query.show.items()}
    return Proof(claim, "z3", REFUTED, tuple(text for text, _ in query.hypotheses), countermodel=countermodel,
                 case=query.case, queries=1,
                 detail=f"replayed in real {f.name} arithmetic (exp, log: double, then rounded)")


def _input_value(model, term, native):
    if term.sort() == z3.BoolSort():
        return model.eval(z3.Bool(term.decl().name()), model_completion=True)
    description = model.eval(z3.Const(term.decl().name(), Float), model_completion=True)
    kind = model.eval(Float.kind(description), model_completion=True).as_long()
    value = model.eval(Float.value(description), model_completion=True)
    negative = z3.is_true(model.eval(Float.negative(description), model_completion=True))
    if kind != FINITE:
        return native.const({POS_INF: math.inf, NEG_INF: -math.inf}.get(kind, math.nan))
    number = float(value.as_fraction()) if z3.is_rational_value(value) else float(value.as_decimal(20).rstrip("?"))
    return native.const(math.copysign(number, -1.0) if negative and number == 0 else number)


def _evaluate(term, inputs, f: FloatFormat):
    """``term`` with the inputs substituted and every exp/log application computed."""
    functions = {ops.z3_function("exp", f.sort): math.exp, ops.z3_function("log", f.sort): _log}
    term = z3.simplify(z3.substitute(term, *inputs)) if inputs else z3.simplify(term)
    while True:
        pending = [(a, fn) for decl, fn in functions.items() for a in applications([term], decl)]
        if not pending:
            return term
        term = z3.simplify(z3.substitute(term, *((a, z3.FPVal(_apply(fn, a.arg(0)), f.sort)) for a, fn in pending)))


def _apply(fn, argument):
    x = float(render_value(z3.Model(), argument).replace("+0", "0").replace("+inf", "inf"))
    try:
        return fn(x)
    except OverflowError:
        return math.inf


def _log(x):
    return -math.inf if x == 0 else (math.nan if x < 0 else math.log(x))


def combine(claim: str, proofs) -> Proof:
    """One proof from the proofs of a theorem's cases: the first failure, or all proved."""
    failed = next((p for p in proofs if not p.ok), None)
    if failed is not None:
        failed.claim = claim
        return failed
    return Proof(claim, "z3", "proved" if proofs else "unknown", tuple(dict.fromkeys(h for p in proofs for h in p.hypotheses)),
                 tuple(sorted({a for p in proofs for a in p.axioms})), queries=sum(p.queries for p in proofs),
                 seconds=sum(p.seconds for p in proofs))


def maximum_properties(f: FloatFormat, budget: Budget):
    d = NativeFloats(f)
    a, b = d.var("a"), d.var("b")
    r = ops.maximum(a, b)
    claims = {
        "not NaN, >= a and b, equal to one of them": z3.And(z3.Not(d.is_nan(r)), d.le(a, r), d.le(b, r),
                                                           z3.Or(d.ieee_eq(r, a), d.ieee_eq(r, b))),
        "symmetric bit for bit": d.identical(r, ops.maximum(b, a)),
        "maximum(-0, +0) = +0": d.identical(ops.maximum(d.const(-0.0), d.const(0.0)), 0.0),
    }
    hypotheses = (("a, b not NaN", z3.Not(z3.Or(d.is_nan(a), d.is_nan(b)))),)
    show = {"a": a, "b": b, "maximum(a, b)": r, "maximum(b, a)": ops.maximum(b, a)}
    return check_z3(f"{f.name}: maximum(a, b) >= a, b, is one of them, symmetric bit-for-bit, max(-0, +0) = +0",
                    [Query(c, hypotheses, show, case=name) for name, c in claims.items()],
                    budget=budget, solver=bitblast_solver)


THEOREMS = (("tile: no NaN, exp args <= 0, l >= 1 if a key is allowed, identity if none", build_tile),
            ("merge of well-formed states: no NaN, exp args <= 0, well-formed result", build_merge),
            ("finalize: no NaN; an empty row gives (0, -inf)", build_finalize))


def checks(settings: Settings, budget: Budget):
    for f in FORMATS:
        yield maximum_properties(f, budget)
        yield prove_lemmas(f, budget)
        for claim, build in THEOREMS:
            yield fp_theorem(claim, build, f, budget)


# ---- negative controls (on float16: the smallest, so the fastest to refute)

FLOAT16 = FORMATS[1]


def mask_after_max_state(q, k, v, allowed):
    """BROKEN: the max is taken over all scores, masked ones included; masking comes after."""
    s, _ = tile.tile_scores(q, k, 1.0)
    m = ops.rowmax(s)
    p = ops.where(allowed, ops.exp(s - spec.finite_shift(m)), 0.0)
    return SoftmaxState(m, ops.rowsum(p), ops.matmul(p, v))


def _theorem_with(target, name, broken, theorem):
    claim, build = THEOREMS[theorem]

    def run(settings, budget):
        with patched(target, name, broken):
            return fp_theorem(claim, build, FLOAT16, budget)
    return run


def _smt_fp_max(settings, budget):
    with patched(ops._Z3, "maximum", staticmethod(lambda a, b: z3.fpMax(a, b))):
        return maximum_properties(FLOAT16, budget)


CONTROLS = (
    Control("SMT fp.max for maximum", "ops.maximum calls SMT-LIB fp.max, which may return -0 for "
            "max(-0, +0)", _smt_fp_max),
    Control("unguarded m_old - m_new (float16)", "merge shifts by m itself: -inf - (-inf) = NaN",
            _theorem_with(spec, "finite_shift", lambda m: m, 1)),
    Control("mask applied after the max (float16)", "the tile's max includes masked scores: an allowed "
            "score far below it underflows, l = 0",
            _theorem_with(sys.modules[__name__], "tile_state", mask_after_max_state, 0)),
    Control("finite -1e4 mask sentinel (float16)", "tile_scores writes -10000 at masked keys",
            _theorem_with(tile, "NEG_INF", -1e4, 0)),
)
