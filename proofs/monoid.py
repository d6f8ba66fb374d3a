"""Obligation 2 -- the merge is a commutative monoid on well-formed states.

A state ``(m, l, acc)`` is *well-formed* when ``m = -inf, l = 0, acc = 0`` (no key yet: the
identity ``e``, built from the spec's own ``NEG_INF``) or ``m`` is finite and ``l > 0``.

**Theorem 2a (SymPy, exact; ``-oo`` is a value, not a sentinel).** For well-formed ``a, b, c``:

    merge(e, a) = a = merge(a, e)
    merge(a, b) = merge(b, a)
    merge(merge(a, b), c) = merge(a, merge(b, c))

Cases: each state is the identity or finite (all ``2^k`` patterns), and the finite maxima are
in each possible order, written ``t, t - d_1, t - d_1 - d_2`` with ``d_i >= 0`` (ties
included), so the cases cover every tuple. In SymPy ``-oo - (-oo)`` is ``nan``: without the
``finite_shift`` guard the identity law fails -- that is the first negative control.

**Theorem 2b (Z3, extended reals).** Merging well-formed states gives a well-formed state
(axiom ``exp-positive``), so the laws compose over any number of merges.

Consequence: a kernel may fold tiles in any order, split the keys into ``num_splits`` ranges
and combine the partial states (``split_kv.combine``), or merge across devices -- the result is
the same state.
"""

from __future__ import annotations

import itertools

import sympy
import z3

from attnformal import merge as spec
from attnformal.domains import ExtendedReal
from attnformal.logic import Budget, Control, Query, Settings, check_identities, check_z3
from attnformal.merge import SoftmaxState
from attnformal.proofs.keysets import EXP_POSITIVE, describe, key_set_cases, show_state

TITLE = "Monoid laws of the merge"


def checks(settings: Settings, budget: Budget):
    yield identity_law(budget)
    yield commutativity(budget)
    yield associativity(budget)
    yield closure(budget)


def identity_state():
    """The state of no key, from the spec's own constant for "minus infinity"."""
    return SoftmaxState(sympy.sympify(spec.NEG_INF), sympy.Integer(0), sympy.Integer(0))


def state_cases(names: str):
    """``(label, states)``: each state the identity or finite, finite maxima in every order."""
    t = sympy.Symbol("t", real=True)
    gaps = sympy.symbols("d1:4", nonnegative=True)
    for empty in itertools.product((False, True), repeat=len(names)):
        finite = [i for i, e in enumerate(empty) if not e]
        for order in itertools.permutations(finite):
            states = [identity_state()] * len(names)
            for rank, i in enumerate(order):
                states[i] = SoftmaxState(t - sum(gaps[:rank]), sympy.Symbol(f"l_{names[i]}", positive=True),
                                         sympy.Symbol(f"acc_{names[i]}", real=True))
            label = ", ".join(f"{n}.m = {s.m}" for n, s in zip(names, states))
            yield label, states


def _law(budget, claim, names, sides):
    """Check ``left == right`` field by field, for ``(left, right) = sides(*states)`` in every case."""
    def pairs():
        for label, states in state_cases(names):
            for side, (left, right) in sides(*states).items():
                for field, x, y in zip(SoftmaxState._fields, left, right):
                    yield f"{label}: {side}.{field}", x, y

    return check_identities(claim, pairs(), budget=budget, hypotheses=("states well-formed",))


def identity_law(budget: Budget):
    e = identity_state()
    return _law(budget, "merge(e, a) = a = merge(a, e), e = (-inf, 0, 0)", "a",
                lambda a: {"merge(e, a)": (spec.merge(e, a), a), "merge(a, e)": (spec.merge(a, e), a)})


def commutativity(budget: Budget):
    return _law(budget, "merge(a, b) = merge(b, a)", "ab",
                lambda a, b: {"merge": (spec.merge(a, b), spec.merge(b, a))})


def associativity(budget: Budget):
    return _law(budget, "merge(merge(a, b), c) = merge(a, merge(b, c))", "abc",
                lambda a, b, c: {"merge": (spec.merge(spec.merge(a, b), c), spec.merge(a, spec.merge(b, c)))})


def closure(budget: Budget):
    def well_formed(s: SoftmaxState):
        m, l, acc = (ExtendedReal.lift(x) for x in s)
        empty = z3.And(m.same(spec.NEG_INF), l.same(0), acc.same(0))
        return z3.Or(empty, z3.And(m.is_finite, l.is_finite, acc.is_finite, l > 0))

    def queries():
        for k1, k2 in key_set_cases("a", "b"):
            a, b = (_z3_state(k) for k in (k1, k2))
            merged = spec.merge(a, b)
            hypotheses = tuple((f"l_{k.name} > 0", s.l > 0) for k, s in ((k1, a), (k2, b)) if not k.empty)
            yield Query(well_formed(merged), hypotheses, case=describe((k1, k2)),
                        show={**show_state("a", a), **show_state("b", b), **show_state("merge", merged)})

    return check_z3("merge of well-formed states is well-formed", queries(), budget=budget, axioms=(EXP_POSITIVE,))


def _z3_state(k) -> SoftmaxState:
    if k.empty:
        return SoftmaxState(ExtendedReal.lift(spec.NEG_INF), ExtendedReal.finite(0), ExtendedReal.finite(0))
    return SoftmaxState(*(ExtendedReal.finite(z3.Real(f"{f}_{k.name}")) for f in ("m", "l", "acc")))


# ---- negative controls


CONTROLS = (
    Control("unguarded m_old - m_new", "merge shifts by m itself, without the finite_shift guard: "
            "-inf - (-inf) = nan when both states are empty", spec, "finite_shift", lambda m: m, identity_law),
    Control("finite -1e4 sentinel", "the empty state uses m = -10000 instead of -inf", spec, "NEG_INF", -1e4,
            identity_law),
)
