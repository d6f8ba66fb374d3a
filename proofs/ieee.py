"""Compositional IEEE proofs for obligation 8: lemmas proved per operation, then used as axioms.

* **Lemmas** about one IEEE operation of one format (round to nearest even), or about the spec's
  ``ops.maximum``: stated once as a formula over a domain's vocabulary, proved bit-precisely on
  :class:`~attnformal.domains.NativeFloats`, then instantiated as axioms on every application of
  the matching uninterpreted operation of :class:`~attnformal.domains.AbstractFloats`.
* **Axioms of exp and log**, true of any faithfully rounded libm (the true value is bracketed by
  the two floats around it; 0, 1 and the bounds used are floats).
* :func:`fp_theorem` proves each case of a theorem on abstract floats; a case the lemmas do not
  prove is decided in real IEEE arithmetic: the abstract counterexample is replayed with real
  floats (inputs rounded to the format, exp and log computed in double then rounded -- a faithful
  libm), and if the claim does not fail there a bit-precise solver decides. A counterexample
  reported is therefore always a real one.

Why a proof on abstract floats holds for real ones: describe each float by its class, exact
value and sign bit (axiom ``float-description``: one description per float), interpret each
abstract operation as the real IEEE one and ``exp``, ``log`` as the libm's. Every real run is
then a model of the abstract query -- the lemmas were proved for all floats, the axioms hold for
a faithful libm -- so if the abstract query has no model violating the claim, no real run does.

``H = 2**(emax - 2)`` bounds ``l`` and ``|acc|``: ``4H = 2**emax`` is below the largest float,
so sums of two values of size ``2H`` cannot overflow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import z3

from attnformal import ops
from attnformal.domains import (FINITE, NEG_INF, POS_INF, AbstractFloats, Float, FloatFormat, NativeFloats,
                                abstract_operation)
from attnformal.logic import (PROVED, REFUTED, UNKNOWN, Axiom, Budget, Proof, Query, TermIndex, applications,
                              bitblast_solver, check_z3, minimal_core_solver, render_value)


def bound_H(f: FloatFormat) -> float:
    """The no-overflow bound: 4H = 2**emax is below the largest float."""
    return 2.0 ** (f.emax - 2)


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
        Lemma("maximum", "max", "x, y not NaN => maximum(x, y) >= x, y and is one of them, bit for bit "
              "(either zero for max(-0, +0))", maximum),
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
    instance = _built_once(formula)
    return lambda terms: [instance(a) for a in applications(terms, decl)]


def _built_once(formula):
    """``formula(term)``, built once per term: a theorem's cases share most terms (63 % of the instances
    were built again), and building them was half of the theorems' time."""
    built = {}

    def instance(term):
        if term.get_id() not in built:
            built[term.get_id()] = term, formula(term)  # the term kept alive, so that its id stays its own
        return built[term.get_id()][1]
    return instance


def lemma_axioms(d: AbstractFloats, proof: Proof | None = None):
    """The lemmas as axiom schemas on abstract floats; ``proof``: their bit-precise proof, named by
    every theorem that uses one (None for a negative control, which must only be refuted)."""
    def axiom(lemma):
        decl = abstract_operation(lemma.operation, d.fmt)
        return Axiom(f"{lemma.name}[{d.fmt.name}]", lemma.statement, f"proved bit-precisely for {d.fmt.name}",
                     _each(decl, lambda a: lemma.formula(d, a.arg(0), a.arg(1), a)),
                     by=(proof,) if proof is not None else ())
    return tuple(axiom(lemma) for lemma in LEMMAS)


def description_axiom(d: AbstractFloats):
    well_formed = _built_once(d.well_formed)

    def instances(index):
        return [well_formed(t) for t in index.subterms.values() if t.sort() == Float]

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
        Axiom("log-range", "1 <= x <= H => log(x) finite and >= 0", "faithful rounding of log on [1, H]",
              _each(log, lambda y: z3.Implies(z3.And(d.le(1.0, y.arg(0)), d.abs_le(y.arg(0), H)),
                                              z3.And(d.is_finite(y), d.le(0.0, y))))),
    )


def fp_theorem(claim: str, build, f: FloatFormat, budget: Budget, lemmas: Proof | None = None):
    """Prove each case from the lemmas; a case they do not prove is decided in real IEEE arithmetic.

    The abstract counterexample is replayed with real floats (its inputs rounded to the format,
    exp and log computed in double and rounded: a faithful libm); if the claim fails there, that
    is the counterexample. Otherwise a bit-precise solver decides the case.
    """
    abstract, native = AbstractFloats(f), NativeFloats(f)
    axioms = lemma_axioms(abstract, lemmas) + exp_log_axioms(abstract) + (description_axiom(abstract),)
    proofs = []
    for query, exact_query in zip(build(abstract), build(native)):
        proof = check_z3(claim, [query], budget=budget, axioms=axioms, keep_model=True, solver=minimal_core_solver)
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
        return failed.but(claim=claim)
    hypotheses = tuple(dict.fromkeys(h for p in proofs for h in p.hypotheses))
    lemmas = {id(lemma): lemma for p in proofs for lemma in p.by}
    return Proof(claim, "z3", PROVED if proofs else UNKNOWN, hypotheses,
                 tuple(sorted({a for p in proofs for a in p.axioms})), tuple(lemmas.values()),
                 queries=sum(p.queries for p in proofs), seconds=sum(p.seconds for p in proofs))
