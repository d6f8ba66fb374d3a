"""Nonlinear integer queries decided in linear arithmetic (proofs/integers.py's linear_abstraction):
its lemmas are proved, the division it reads is floor division, and it never decides what it cannot."""

import math
from fractions import Fraction

import z3

from attnformal import ops
from attnformal.logic import PROVED, REFUTED, VACUOUS, Budget, Query, _genuine_counterexample, check_z3
from attnformal.proofs.integers import _linearizing_symbols, linear_abstraction, linear_lemmas

LEMMAS = ("floor-division bounds", "floor-division monotone", "product sign", "product monotone")


def test_every_lemma_the_abstraction_instantiates_is_proved():
    axioms = linear_lemmas(Budget())
    assert [a.name for a in axioms] == list(LEMMAS)
    assert all(len(a.by) == 1 and a.by[0].status == PROVED for a in axioms)


def test_the_division_it_reads_is_floor_division_also_for_negative_dividends():
    # The spec divides with Python's // (floor); SMT-LIB's div is Euclidean, equal to floor for n >= 1.
    for x in range(-30, 31):
        for n in range(1, 8):
            q = z3.simplify(ops.floordiv(z3.IntVal(x), z3.IntVal(n))).as_long()
            assert q == math.floor(Fraction(x, n)) and n * q <= x < n * q + n, (x, n, q)


def _check(claim, hypotheses):
    return check_z3("test", [Query(claim, hypotheses, {})], budget=Budget(), abstraction=linear_abstraction(Budget()))


def test_a_nonlinear_theorem_is_proved_in_linear_arithmetic_from_the_lemmas():
    x1, x2, n = z3.Ints("x1 x2 n")
    claim = z3.Implies(x1 <= x2, ops.floordiv(x1, n) * n <= ops.floordiv(x2, n) * n)
    proof = _check(claim, (("n >= 1", n >= 1),))
    assert proof.status == PROVED
    used = {axiom.split(":")[0] for axiom in proof.axioms}
    assert {"floor-division monotone", "product monotone"} <= used, proof.axioms
    assert all(lemma.status == PROVED for lemma in proof.by)


def test_what_the_lemmas_cannot_show_is_decided_by_the_query_itself():
    k = z3.Int("k")
    proof = _check(k * k >= 0, ())  # true, but no lemma speaks of k * k for k <= -1
    assert proof.status == PROVED and not proof.axioms  # the abstraction's lemmas were not what proved it


def test_a_false_nonlinear_claim_is_refuted_with_a_real_counterexample():
    k, n = z3.Ints("k n")
    proof = check_z3("k n >= 2 k", [Query(k * n >= 2 * k, (("n >= 1", n >= 1),), {"k": k, "n": n})],
                     budget=Budget(), abstraction=linear_abstraction(Budget()))
    assert proof.status == REFUTED
    k_value, n_value = int(proof.countermodel["k"]), int(proof.countermodel["n"])
    assert n_value >= 1 and k_value * n_value < 2 * k_value


def test_impossible_nonlinear_hypotheses_are_still_vacuous():
    k, n = z3.Ints("k n")
    proof = _check(k >= 0, (("n, k >= 1", z3.And(n >= 1, k >= 1)), ("k n < 1", k * n < 1)))
    assert proof.status == VACUOUS


def test_a_spurious_model_is_repaired_with_its_linearizing_symbols_fixed():
    # The abstraction's model (x = 9, n = 2, y = 2) reads x = n y as a fresh product: false in the query.
    # With n fixed to its value the query is linear, and its model is a real counterexample to x != n y.
    x, n, y = z3.Ints("x n y")
    formulas = [x == n * y, n >= 2, y >= 2, x <= 20]
    spurious = z3.Solver()
    spurious.add(x == 9, n == 2, y == 2)
    assert spurious.check() == z3.sat
    query = Query(x != n * y, (), {"x": x, "n": n, "y": y})
    assert set(map(str, _linearizing_symbols(formulas))) in ({"n"}, {"y"})
    proof, _, _ = _genuine_counterexample(spurious, formulas, query, Budget(), linearizing=lambda fs: [n])
    values = {name: int(value) for name, value in proof.countermodel.items()}
    assert proof.status == REFUTED and values["n"] == 2 and values["x"] == values["n"] * values["y"] <= 20
    # control: without the repair the spurious model is not taken for a counterexample
    assert _genuine_counterexample(spurious, formulas, query, Budget()) is None
