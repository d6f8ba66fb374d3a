"""Shared by the real-number obligations: the key-set abstraction and the axioms of exp.

**Key sets.** A query row's allowed keys ``K`` (scores ``s_j``, values ``v_j``) are summarised by

    M = max_{j in K} s_j,      E = sum_{j in K} exp(s_j),      A = sum_{j in K} exp(s_j) * v_j

-- the *unshifted* sums, which exist over the reals whatever their size. The facts used about
them hold for finite sums of any length, which is what makes the proofs independent of the
block length: for disjoint ``K1, K2``, ``M`` of the union is the larger ``M``, and ``E``, ``A``
add; and ``E >= exp(M) > 0`` (``E`` contains the max's own term, the others are positive). The
state the online softmax must hold for ``K`` is

    state(K) = (M, E * exp(-M), A * exp(-M)),           state({}) = (-inf, 0, 0).

One value column stands for all of ``v``: every column goes through the same scalar steps.

**Axioms of exp** (``exp`` is Z3's uninterpreted function of :mod:`attnformal.ops`, so a proof
holds for every function satisfying them, not only for the one we mean):

* ``exp-positive``: ``exp(x) > 0`` -- true of the real exponential; excludes a zero weight for
  an allowed key and makes ``E * exp(-M)`` determine ``E``.
* ``exp-add``: ``exp(a) * exp(b) = exp(a + b)`` -- the defining homomorphism; it is the whole
  content of the rescaling step ``exp(s - m_new) = exp(s - m_old) * exp(m_old - m_new)``.
  Instantiated for the pairs of exp terms whose arguments add up to another one's (or to 0).
* ``exp-zero``: ``exp(0) = 1`` -- follows from the two above; stated so that a proof needing it
  names it.

Each is a schema instantiated on the ``exp`` terms of a query, so every query stays
quantifier-free; the engine checks each query's instances satisfiable together with its
hypotheses.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy
import z3

from attnformal import ops
from attnformal.domains import ExtendedReal
from attnformal.logic import Axiom, applications
from attnformal.merge import SoftmaxState

NEG_INF = float("-inf")


def real_exp():
    return ops.z3_function("exp", z3.RealSort())


def _exp_terms(terms):
    return applications(terms, real_exp())


EXP_POSITIVE = Axiom(
    "exp-positive", "exp(x) > 0", "true of the real exponential",
    lambda terms: [t > 0 for t in _exp_terms(terms)])
def _closing_products(terms):
    """``exp(a) * exp(b) = exp(c)`` for the exp terms present with ``a + b = c`` (or ``= 0``).

    These are the instances a rescaling uses (``exp(m - m_new) * exp(-m) = exp(-m_new)``); the
    others only add products that make counterexamples slow to find.
    """
    present = _exp_terms(terms)
    targets = [t.arg(0) for t in present] + [z3.RealVal(0)]
    return [a * b == real_exp()(a.arg(0) + b.arg(0))
            for a, b in itertools.combinations_with_replacement(present, 2)
            if any(z3.is_rational_value(d) and d.as_fraction() == 0
                   for d in (z3.simplify(a.arg(0) + b.arg(0) - c) for c in targets))]


EXP_ADD = Axiom("exp-add", "exp(a) * exp(b) = exp(a + b)", "the defining property of the exponential",
                _closing_products)
EXP_ZERO = Axiom(
    "exp-zero", "exp(0) = 1", "follows from exp-add and exp-positive",
    lambda terms: [real_exp()(z3.RealVal(0)) == 1])
EXP_AXIOMS = (EXP_POSITIVE, EXP_ADD, EXP_ZERO)


@dataclass(frozen=True)
class KeySet:
    """A key set: empty, or summarised by symbolic ``M``, ``E``, ``A`` (see the module docstring)."""

    name: str
    empty: bool

    @property
    def M(self):
        return z3.Real(f"M_{self.name}")

    @property
    def E(self):
        return z3.Real(f"E_{self.name}")

    @property
    def A(self):
        return z3.Real(f"A_{self.name}")

    def state(self) -> SoftmaxState:
        """state(K) as extended reals."""
        if self.empty:
            return empty_state()
        shift = real_exp()(-self.M)
        return SoftmaxState(*(ExtendedReal.finite(x) for x in (self.M, self.E * shift, self.A * shift)))

    def facts(self):
        """Hypotheses true of every key set: ``E >= exp(M)`` (so ``E > 0``) when nonempty."""
        if self.empty:
            return ()
        return ((f"E_{self.name} >= exp(M_{self.name})", self.E >= real_exp()(self.M)),)

    def show(self):
        return {} if self.empty else {f"M_{self.name}": self.M, f"E_{self.name}": self.E,
                                      f"A_{self.name}": self.A}


def empty_state() -> SoftmaxState:
    """state({}) = (-inf, 0, 0), the identity of the merge."""
    return SoftmaxState(ExtendedReal.lift(NEG_INF), ExtendedReal.finite(0), ExtendedReal.finite(0))


def identity_state() -> SoftmaxState:
    """The merge's identity ``(-oo, 0, 0)`` in SymPy (what a kernel's fold starts from)."""
    return SoftmaxState(sympy.sympify(NEG_INF), sympy.Integer(0), sympy.Integer(0))


def union_state(*sets: KeySet) -> SoftmaxState:
    """state(K1 u K2 u ...) of disjoint key sets: the larger M, and E, A added."""
    present = [k for k in sets if not k.empty]
    if not present:
        return empty_state()
    M = present[0].M
    for k in present[1:]:
        M = z3.If(M >= k.M, M, k.M)
    shift = real_exp()(-M)
    E, A = sum(k.E for k in present), sum(k.A for k in present)
    return SoftmaxState(*(ExtendedReal.finite(x) for x in (M, E * shift, A * shift)))


def key_set_cases(*names: str):
    """Every combination of empty / nonempty key sets named ``names``."""
    for empties in itertools.product((False, True), repeat=len(names)):
        yield tuple(KeySet(n, e) for n, e in zip(names, empties))


def describe(sets) -> str:
    return ", ".join(f"{k.name} {'empty' if k.empty else 'nonempty'}" for k in sets)


def same_state(x: SoftmaxState, y: SoftmaxState):
    """The two states are equal component by component (as extended reals; NaN equals nothing)."""
    return z3.And(*(ExtendedReal.lift(a).same(b) for a, b in zip(x, y)))


def show_state(prefix: str, state: SoftmaxState) -> dict:
    return {f"{prefix}.{field}": ExtendedReal.lift(value) for field, value in zip(state._fields, state)}
