"""The engine: what proved, refuted, unknown and vacuous mean, and how counterexamples read."""

import sympy
import z3

from attnformal.logic import (PROVED, REFUTED, UNKNOWN, VACUOUS, Axiom, Budget, Query, check_identities,
                              check_z3, patched)


def test_a_valid_claim_is_proved_and_names_the_axioms_it_was_given():
    x = z3.Real("x")
    f = z3.Function("f", z3.RealSort(), z3.RealSort())
    positive = Axiom("f-positive", "f(x) > 0", "test", lambda index: [t > 0 for t in index.applications(f)])
    proof = check_z3("f(x) + 1 > 1", [Query(f(x) + 1 > 1)], budget=Budget(10), axioms=(positive,))
    assert proof.status == PROVED and proof.queries == 1
    assert proof.axioms == ("f-positive: f(x) > 0 (test)",)


def test_a_false_claim_is_refuted_with_a_readable_counterexample():
    x, y = z3.Ints("x y")
    proof = check_z3("x < y", [Query(x < y, (("x >= 0", x >= 0),), {"x": x, "y": y}, case="one case")],
                     budget=Budget(10))
    assert proof.status == REFUTED and proof.case == "one case"
    assert int(proof.countermodel["x"]) >= int(proof.countermodel["y"]) and int(proof.countermodel["x"]) >= 0


def test_unsatisfiable_hypotheses_make_a_check_vacuous_not_proved():
    x = z3.Int("x")
    proof = check_z3("anything", [Query(x == 42, (("x > 0", x > 0), ("x < 0", x < 0)))], budget=Budget(10))
    assert proof.status == VACUOUS
    assert "x > 0" in proof.detail and "x < 0" in proof.detail


def test_inconsistent_axioms_are_caught_by_the_same_check():
    x = z3.Int("x")
    absurd = Axiom("absurd", "false", "test", lambda index: [z3.BoolVal(False)])
    assert check_z3("x = x", [Query(x == x)], budget=Budget(10), axioms=(absurd,)).status == VACUOUS


def test_a_solver_timeout_is_unknown_never_proved():
    # x^3 + y^3 = z^3 in positive integers: Z3 cannot decide it in a millisecond.
    x, y, w = z3.Ints("x y w")
    hard = Query(x * x * x + y * y * y != w * w * w, (("positive", z3.And(x > 0, y > 0, w > 0)),))
    proof = check_z3("Fermat n = 3", [hard], budget=Budget(0.001))
    assert proof.status == UNKNOWN


def test_an_exhausted_budget_leaves_the_remaining_queries_unknown():
    x = z3.Int("x")
    proof = check_z3("trivial", [Query(x == x)], budget=Budget(0))
    assert proof.status == UNKNOWN and "timeout" in proof.detail


def test_all_cases_must_hold_and_the_failing_case_is_named():
    x = z3.Int("x")
    cases = [Query(x * 0 == 0, case="zero"), Query(x + 1 > x, case="successor"), Query(x > 0, case="positive")]
    proof = check_z3("three facts", cases, budget=Budget(10))
    assert proof.status == REFUTED and proof.case == "positive" and proof.queries == 3


def test_sympy_identities_prove_refute_and_treat_nan_as_unequal():
    a, b = sympy.symbols("a b", real=True)
    assert check_identities("expansion", [("", (a + b) ** 2, a * a + 2 * a * b + b * b)], budget=Budget(10)).ok
    refuted = check_identities("wrong", [("", (a + b) ** 2, a * a + b * b)], budget=Budget(10))
    assert refuted.status == REFUTED and set(refuted.countermodel) >= {"a", "b", "lhs", "rhs"}
    nan = check_identities("nan", [("", sympy.nan, sympy.nan)], budget=Budget(10))
    assert nan.status == REFUTED
    assert check_identities("-oo", [("", -sympy.oo, -sympy.oo)], budget=Budget(10)).ok


def test_patched_restores_the_definition():
    import attnformal.merge as spec

    original = spec.finite_shift
    with patched(spec, "finite_shift", lambda m: m):
        assert spec.finite_shift is not original
    assert spec.finite_shift is original
