"""The engine: what proved, refuted, unknown and vacuous mean, and how counterexamples read."""

import dataclasses
import os
import signal
import threading
import time

import pytest
import sympy
import z3

from attnformal import logic
from attnformal.logic import (CHECKED, INTERRUPTED, PROVED, REFUTED, UNKNOWN, VACUOUS, Axiom, Budget, Query,
                              bitblast_solver, check_exhaustively, check_identities, check_z3, patched)


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


def test_a_valid_lemma_is_left_out_of_the_vacuity_check_and_nothing_else_is():
    # valid=True is a promise that its instances hold in every model: the same false "lemma" x < 0 against
    # the hypothesis x > 0 is caught as vacuous when it is not marked valid, and trusted when it is
    x = z3.Int("x")
    query = Query(x == 1, (("x > 0", x > 0),))
    for valid, status in ((False, VACUOUS), (True, PROVED)):
        lemma = Axiom("x < 0", "x < 0", "test", lambda index: [x < 0], valid=valid)
        assert check_z3("x = 1", [query], budget=Budget(10), axioms=(lemma,)).status == status, valid


def _fermat_3():
    """x^3 + y^3 != w^3 in positive integers: beyond Z3."""
    x, y, w = z3.Ints("x y w")
    return Query(x * x * x + y * y * y != w * w * w, (("positive", z3.And(x > 0, y > 0, w > 0)),))


def test_a_spent_resource_budget_is_unknown_never_proved_and_the_units_are_charged():
    budget = Budget(600, rlimit=200_000)
    proof = check_z3("Fermat n = 3", [_fermat_3()], budget=budget)
    assert proof.status == UNKNOWN and "deterministic budget" in proof.detail
    assert 200_000 <= proof.rlimit == budget.used < 400_000  # stopped at the limit, not long after


def test_the_wall_clock_safety_net_interrupts_and_is_not_unknown():
    proof = check_z3("Fermat n = 3", [_fermat_3()], budget=Budget(0.001))
    assert proof.status == INTERRUPTED and "interrupted by time" in proof.detail


class _CanceledByItsClock:
    """A solver whose check runs out its wall time and says "canceled", as Z3 did in CI under load."""

    def __init__(self, units_per_check):
        self.units_per_check, self.count, self.timeout_ms = units_per_check, 0, None

    def set(self, key, value):
        if key == "timeout":
            self.timeout_ms = value

    def check(self, *assumptions):
        time.sleep(self.timeout_ms / 1000 * 1.05)
        self.count += self.units_per_check
        return z3.unknown

    def reason_unknown(self):
        return "canceled"


def test_a_check_canceled_by_its_own_clock_is_interrupted_and_by_its_units_is_unknown(monkeypatch):
    monkeypatch.setattr(logic, "rlimit_count", lambda solver: solver.count)
    by_the_clock, budget = _CanceledByItsClock(units_per_check=10), Budget(600, rlimit=1_000)
    budget.check(by_the_clock, seconds=0.01)
    assert budget.unknown_reason(by_the_clock)[0] == INTERRUPTED
    by_the_units, budget = _CanceledByItsClock(units_per_check=1_000), Budget(600, rlimit=1_000)
    budget.check(by_the_units, seconds=0.01)  # its whole budget used: the units, not the clock, stopped it
    assert budget.unknown_reason(by_the_units) == (UNKNOWN,
                                                   "the deterministic budget ran out (canceled; 0.001 M units)")


def test_a_ctrl_c_during_a_check_stops_the_run_when_the_query_ends():
    # with Z3's own ctrl_c handling (its default) the SIGINT was swallowed: the check ran on to its net and
    # returned interrupted-by-time, no KeyboardInterrupt (logic.py turns it off)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored when run as a background job
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            check_z3("Fermat n = 3", [_fermat_3()], budget=Budget(3))
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, inherited)


def test_an_exhausted_budget_leaves_the_remaining_queries_undecided():
    x = z3.Int("x")
    spent = check_z3("trivial", [Query(x == x)], budget=Budget(600, rlimit=0))
    assert spent.status == UNKNOWN and "deterministic budget" in spent.detail
    late = check_z3("trivial", [Query(x == x)], budget=Budget(0))
    assert late.status == INTERRUPTED and "safety net" in late.detail


def test_the_bitblasting_tactic_stops_at_its_resource_limit():
    # a 64-bit factoring problem: many millions of units; the tactic's solver must stop at 100 000
    a, b = z3.BitVecs("a b", 64)
    query = Query(a * b != 1000000007 * 998244353, (("a, b in (1, 2^32)", z3.And(
        z3.ULT(1, a), z3.ULT(a, 2 ** 32), z3.ULT(1, b), z3.ULT(b, 2 ** 32))),))
    budget = Budget(600, rlimit=100_000)
    proof = check_z3("no factors", [query], budget=budget, solver=bitblast_solver)
    assert proof.status == UNKNOWN and budget.used < 1_000_000, (proof.status, budget.used)


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


def test_a_symbol_that_cancels_in_the_difference_still_gets_a_value_in_the_counterexample():
    """lhs - rhs = -exp(b) has no ``a``, but evaluating lhs = a needs one: the search samples it too."""
    a, b = sympy.symbols("a b", real=True)
    refuted = check_identities("a = a + exp(b)", [("", a, a + sympy.exp(b))], budget=Budget(10))
    assert refuted.status == REFUTED and set(refuted.countermodel) >= {"a", "b"}


def test_patched_restores_the_definition():
    import attnformal.merge as spec

    original = spec.finite_shift
    with patched(spec, "finite_shift", lambda m: m):
        assert spec.finite_shift is not original
    assert spec.finite_shift is original


def test_proofs_are_immutable_values():
    proof = check_z3("x = x", [Query(z3.Int("x") == z3.Int("x"))], budget=Budget(10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        proof.status = REFUTED
    assert proof.but(detail="note").detail == "note" and proof.detail == ""


def test_only_the_axioms_and_hypotheses_in_the_unsat_core_are_named():
    x = z3.Real("x")
    f = z3.Function("f", z3.RealSort(), z3.RealSort())
    needed = Axiom("f-positive", "f(x) > 0", "test", lambda index: [t > 0 for t in index.applications(f)])
    offered = Axiom("f-small", "f(x) < 100", "test", lambda index: [t < 100 for t in index.applications(f)])
    query = Query(f(x) + 1 > 1, (("x > 0", x > 0), ("x < 5", x < 5)))
    proof = check_z3("f(x) + 1 > 1", [query], budget=Budget(10), axioms=(offered, needed))
    assert proof.status == PROVED
    assert proof.axioms == ("f-positive: f(x) > 0 (test)",) and proof.hypotheses == ()


def test_a_lemma_behind_an_axiom_is_named_in_by_only_when_used_and_must_be_proved():
    x = z3.Int("x")
    f = z3.Function("f", z3.IntSort(), z3.IntSort())
    lemma = check_z3("a lemma", [Query(x * x >= 0)], budget=Budget(10))
    schema = Axiom("f-positive", "f(t) > 0", "the lemma", lambda index: [t > 0 for t in index.applications(f)],
                   by=(lemma,))
    used = check_z3("f(x) + 1 > 1", [Query(f(x) + 1 > 1)], budget=Budget(10), axioms=(schema,))
    unused = check_z3("f(x) + 1 > f(x)", [Query(f(x) + 1 > f(x))], budget=Budget(10), axioms=(schema,))
    assert used.ok and used.by == (lemma,)
    assert unused.ok and unused.by == ()
    wrong = check_z3("x * x < 0", [Query(x * x < 0)], budget=Budget(10))
    rests_on_wrong = Axiom("wrong", "t * t < 0", "a lemma that is false", lambda index: [], by=(wrong,))
    proof = check_z3("anything", [Query(x == x)], budget=Budget(10), axioms=(rests_on_wrong,))
    assert proof.status == UNKNOWN and "x * x < 0" in proof.detail


def test_a_conditional_claim_with_an_impossible_premise_is_vacuous():
    x = z3.Int("x")
    proof = check_z3("x > 0 and x < 0 => anything", [Query(z3.Implies(z3.And(x > 0, x < 0), x == 42))],
                     budget=Budget(10))
    assert proof.status == VACUOUS and "premise" in proof.detail
    assert check_z3("x > 0 => x >= 1", [Query(z3.Implies(x > 0, x >= 1))], budget=Budget(10)).ok


def test_a_solver_that_cannot_decide_with_tracking_still_decides_and_lists_everything():
    class GivesUpWhenTracking:
        def __init__(self):
            self.solver, self.tracked = z3.Solver(), False

        def set(self, *options):
            self.solver.set(*options)

        def statistics(self):
            return self.solver.statistics()

        def assert_and_track(self, formula, label):
            self.tracked = True
            self.solver.assert_and_track(formula, label)

        def add(self, *formulas):
            self.solver.add(*formulas)

        def check(self, *assumptions):
            return z3.unknown if self.tracked else self.solver.check(*assumptions)

        def unsat_core(self):
            return []

        def reason_unknown(self):
            return "gave up"

    x = z3.Int("x")
    proof = check_z3("x > 1 => x > 0", [Query(x > 0, (("x > 1", x > 1), ("x < 9", x < 9)))], budget=Budget(10),
                     solver=GivesUpWhenTracking)
    assert proof.status == PROVED and proof.hypotheses == ("x > 1", "x < 9")
    assert "no unsat core" in proof.detail


def test_an_exhaustive_check_is_checked_on_its_domain_never_proved():
    checked = check_exhaustively("n * n >= n", ((f"n={n}", n * n >= n, {"n": n}) for n in range(-5, 6)),
                                 domain="-5 <= n <= 5", budget=Budget(10))
    assert checked.status == CHECKED and checked.ok and checked.detail == "checked for -5 <= n <= 5"
    assert checked.queries == 11
    refuted = check_exhaustively("n * n > n", ((f"n={n}", n * n > n, {"n": n}) for n in range(-5, 6)),
                                 domain="-5 <= n <= 5", budget=Budget(10))
    assert refuted.status == REFUTED and refuted.case == "n=0" and refuted.countermodel == {"n": "0"}
    assert check_exhaustively("nothing", iter(()), domain="empty", budget=Budget(10)).status == UNKNOWN


def test_the_term_walk_is_the_same_through_z3pys_checked_wrappers(monkeypatch):
    # the unchecked C getters come from z3py's wrapper layout; a z3py without it falls back to the wrappers
    assert logic._unchecked("Z3_get_ast_kind") is not z3.Z3_get_ast_kind
    monkeypatch.setattr(z3, "Z3_get_ast_kind", lambda ctx, ast: 0)
    assert logic._unchecked("Z3_get_ast_kind") is z3.Z3_get_ast_kind  # no Elementaries default: itself
    monkeypatch.undo()
    x, n = z3.Ints("x n")
    terms = [z3.ForAll([x], x / n >= x * n), x / n + 1 > 0]
    fast = [(decl, kind) for _, _, decl, kind in logic.TermIndex(terms, quantified=True)._nodes]
    for name in ("ast_kind", "ast_id", "app_decl", "decl_ast", "decl_kind", "app_num_args", "app_arg",
                 "quantifier_body"):
        wrapper = {"decl_ast": "Z3_func_decl_to_ast"}.get(name, f"Z3_get_{name}")
        monkeypatch.setattr(logic, f"_{name}", getattr(z3, wrapper))
    assert [(decl, kind) for _, _, decl, kind in logic.TermIndex(terms, quantified=True)._nodes] == fast
    assert len(logic.TermIndex(terms).of_kind(z3.Z3_OP_IDIV)) == 1  # the quantified one only with quantified=True
    assert len(logic.TermIndex(terms, quantified=True).of_kind(z3.Z3_OP_IDIV)) == 2
