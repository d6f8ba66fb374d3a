"""The prover's engine: a proof is a value.

A check states its theorem in plain words, gives the solver the hypotheses and the
instances of the axioms it may use, and asserts the negation of the claim:

* ``unsat``  -- **proved**; the solver's unsat core names the hypotheses and axioms the proof
  actually used, and only those are recorded (an axiom that was offered but not needed is not);
* a model    -- **refuted**; the model is rendered as a readable counterexample;
* anything else -- **unknown**, never proved (the deterministic budget ran out, or Z3 gave up);
  the query is kept in SMT-LIB form so it can be replayed;
* the wall-clock safety net ran out first -- **interrupted** (by time): no verdict was reached,
  which fails the run like unknown but says the machine, not the budget, ended it.

Budgets are deterministic (:class:`Budget`): every query draws on its obligation's Z3 resource
count (``rlimit``, as Dafny's ``--resource-limit``, F*'s ``rlimit`` and Lean's ``maxHeartbeats``),
so a verdict and the resources it used are the same on every machine and under any load.

Before the negation goes in, the solver must find a model of the hypotheses together with
the axiom instances and, for a claim ``premise => conclusion``, the premise. That shows the
axioms are consistent (they hold somewhere) and the theorem is not vacuously true in that
case; if there is no such model the check is **vacuous**, a failure.

Proofs are immutable. A proof that rests on proven lemmas names them in ``by`` (as in
knuckledragger's ``kdrag/kernel.py``), so the dependency graph is data; a lemma enters a query
as an axiom schema that carries its proof, and only a lemma the unsat core shows was used is
named. A check run exhaustively on a bounded domain is **checked** on that domain, never
proved.

Axioms are few, named and justified; they are quantifier-free *schemas*, instantiated on the
terms of each query (``exp(a) * exp(b) = exp(a + b)`` for the ``exp`` terms present), which
keeps every query decidable and small. SymPy checks work on exact expressions: an identity
is proved when the difference normalises to 0, refuted when it is nonzero at a reproducible
random point (at 50 and at 100 digits), unknown otherwise; their hypotheses are assumptions
on the symbols (real, positive...), which those points satisfy, so they are never vacuous.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import random
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import z3

PROVED, CHECKED, REFUTED, UNKNOWN, VACUOUS = "proved", "checked", "refuted", "unknown", "vacuous"
INTERRUPTED = "interrupted"  # by the wall-clock safety net: no verdict (see Budget)


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Proof:
    """The outcome of one check: what was claimed, how it was decided, and the evidence.

    Immutable; :meth:`but` gives a changed copy. ``hypotheses`` and ``axioms`` are the ones the
    proof used (from the unsat cores), ``by`` the proven lemmas it was built from.
    """

    claim: str
    tool: str
    status: str
    hypotheses: tuple[str, ...] = ()
    axioms: tuple[str, ...] = ()
    by: tuple[Proof, ...] = ()
    countermodel: Mapping[str, str] | None = None
    case: str = ""  # the case that failed, when a check splits into cases
    queries: int = 0
    seconds: float = 0.0
    rlimit: int = 0  # Z3 resource units the check used (deterministic: the same on every machine)
    detail: str = ""  # why unknown or vacuous; for a checked proof, the domain it was checked on
    query: str = ""  # SMT-LIB of an unknown query, for replay
    model: Any = field(default=None, repr=False, compare=False)  # the raw countermodel, when asked for

    @property
    def ok(self) -> bool:
        return self.status in (PROVED, CHECKED)

    def but(self, **changes) -> Proof:
        return dataclasses.replace(self, **changes)

    def portable(self) -> Proof:
        """Without Z3 models, which do not cross process boundaries (nor do those of its lemmas)."""
        return self.but(model=None, by=tuple(lemma.portable() for lemma in self.by))

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "by")}
        out["countermodel"] = dict(self.countermodel) if self.countermodel is not None else None
        out["by"] = [lemma.claim for lemma in self.by]
        return out


@dataclass(frozen=True)
class Axiom:
    """A named axiom schema: ``instances(index)`` gives its ground instances for a query's terms.

    A schema that is a proven lemma (not a true axiom) carries its proof in ``by``. ``valid``: each
    instance holds for every value of its symbols (a lemma proved for all values of the query's own
    sorts), so it can never make a premise vacuous and the vacuity check leaves it out. Not so for a
    lemma proved of IEEE floats and instantiated on their abstract descriptions.
    """

    name: str
    statement: str
    justification: str
    instances: Callable[["TermIndex"], list]
    by: tuple[Proof, ...] = ()
    valid: bool = False

    def describe(self) -> str:
        return f"{self.name}: {self.statement} ({self.justification})"


@dataclass(frozen=True)
class Query:
    """One solver query: ``hypotheses => claim``; ``show`` names the terms a counterexample prints.

    A claim ``Implies(premise, conclusion)`` is a conditional theorem: its premise must have a
    model together with the hypotheses, or the case is vacuous.
    """

    claim: Any
    hypotheses: tuple[tuple[str, Any], ...] = ()
    show: Mapping[str, Any] = field(default_factory=dict)
    case: str = ""

    def premise_and_conclusion(self):
        if z3.is_implies(self.claim):
            return self.claim.arg(0), self.claim.arg(1)
        return None, self.claim


RLIMIT_UNIT = 10 ** 6  # --budget counts millions of Z3 resource units
DEFAULT_BUDGET = 300  # millions of units per obligation: over 30x what the costliest (obligation 14) needs (docs/measured.md)
DEFAULT_WALL_S = 3600.0  # the wall-clock safety net per obligation: above what the whole budget takes (~500 s quiet)


class Budget:
    """What one obligation may spend; all of its queries draw on it.

    ``rlimit`` -- Z3 resource units (its deterministic ``rlimit`` count): the budget a verdict rests
    on, the same on every machine and under any load; running out of it leaves a query *unknown*.
    ``seconds`` -- a wall-clock safety net far above what ``rlimit`` takes; running out of it
    (or SymPy's or an exhaustive check's time, which Z3 does not count) is *interrupted by time*.
    """

    def __init__(self, seconds: float = DEFAULT_WALL_S, rlimit: int = DEFAULT_BUDGET * RLIMIT_UNIT):
        self.seconds, self.rlimit, self.used = seconds, rlimit, 0
        self.end = time.monotonic() + seconds
        self._last_check = None  # (solver, units given, units used, seconds given, seconds taken)

    def left(self) -> float:
        """Wall seconds left before the safety net."""
        return max(0.0, self.end - time.monotonic())

    def units_left(self) -> int:
        return max(0, self.rlimit - self.used)

    def spent(self) -> str:
        """Why nothing more may be tried ("" while both limits have some left)."""
        if self.left() <= 0:
            return f"interrupted by time: the wall-clock safety net ({self.seconds:g} s) ran out"
        if self.units_left() <= 0:
            return f"the deterministic budget ({self.rlimit / RLIMIT_UNIT:g} M resource units) is spent"
        return ""

    def check(self, solver, *assumptions, share: float = 1.0, limit: int | None = None,
              seconds: float | None = None):
        """``solver.check()`` within ``share`` of the units left (and at most ``limit``, a query's
        own calibrated budget) and the wall time left (at most ``seconds``, a search's own net); the
        units it used are charged. Returns ``(verdict, units used)``."""
        units = max(1, int(self.units_left() * share))
        units = units if limit is None else min(units, limit)
        solver.set("rlimit", units)
        milliseconds = max(1, int(1000 * (self.left() if seconds is None else min(self.left(), seconds))))
        solver.set("timeout", milliseconds)
        # Z3 takes SIGINT during a check by default: Python never saw the Ctrl-C and the run went on (a plain
        # solver's query ended unknown, a tactic's kept running). Off, Python's handler keeps it, and a Ctrl-C
        # stops the run when this check ends (its budget bounds that); the process's other Z3 users keep Z3's.
        solver.set("ctrl_c", False)
        before, started = rlimit_count(solver), time.monotonic()
        verdict = solver.check(*assumptions)
        used = rlimit_count(solver) - before
        self.used += used
        self._last_check = (solver, units, used, milliseconds / 1000, time.monotonic() - started)
        return verdict, used

    def unknown_reason(self, solver) -> tuple[str, str]:
        """``(status, detail)`` of a check that came back unknown: interrupted if the wall clock
        ended it, else unknown (the units ran out, or Z3 gave up)."""
        reason = solver.reason_unknown()
        if reason == "timeout" or self.left() <= 0 or self._stopped_by_the_clock(solver):
            return INTERRUPTED, f"interrupted by time: the wall-clock safety net ({self.seconds:g} s) ran out"
        if reason in ("canceled", "max. resource limit exceeded") or self.units_left() <= 0:
            return UNKNOWN, f"the deterministic budget ran out ({reason}; {self.rlimit / RLIMIT_UNIT:g} M units)"
        return UNKNOWN, reason

    def _stopped_by_the_clock(self, solver) -> bool:
        """Whether this solver's last check ran its whole wall time with units to spare: Z3 may then say
        "canceled" rather than "timeout" (seen in CI under load), the word it also uses for spent units."""
        if self._last_check is None or self._last_check[0] is not solver:
            return False
        _, units_given, units_used, seconds_given, seconds_taken = self._last_check
        return units_used < units_given and seconds_taken >= seconds_given


def rlimit_count(solver) -> int:
    """Z3's resource count of the solver's context so far (it only grows; differences are a check's use)."""
    statistics = solver.statistics()
    return int(statistics.get_key_value("rlimit count")) if "rlimit count" in statistics.keys() else 0


# ---------------------------------------------------------------------------- Z3


# The solvers take their limits from the Budget at each check (Budget.check): rlimit and the wall net.


def plain_solver() -> z3.Solver:
    return z3.Solver()


def minimal_core_solver() -> z3.Solver:
    """:func:`plain_solver` whose unsat cores are minimal: no axiom in one can be dropped. Cheap
    where many axiom schemas are offered (the IEEE theorems); on nonlinear integer queries Z3's
    minimisation can use up the budget, so they keep the plain core (which may name more)."""
    solver = plain_solver()
    solver.set("core.minimize", True)
    return solver


def bitblast_solver() -> z3.Solver:
    """A solver for quantifier-free IEEE queries: to bit-vectors, uninterpreted functions
    (exp, log) eliminated by Ackermann's reduction, then SAT -- several times faster than
    Z3's default on these queries. It gives no unsat cores (see :func:`_decide`). A tactic's
    solver honours ``rlimit`` as any solver does (tested: it stops at the limit)."""
    tactic = z3.Then("simplify", "fpa2bv", "simplify", "propagate-values", "ackermannize_bv", "bit-blast", "sat")
    return tactic.solver()


bitblast_solver.gives_cores = False


@dataclass(frozen=True)
class Abstraction:
    """A sound over-approximation of a query, tried before the query itself.

    ``apply(formulas)`` maps a query's formulas (labelled ones, then the negated claim) to formulas
    with fewer constraints on them -- e.g. each nonlinear term read as a fresh variable -- in the same
    order, and adds instances of proven lemmas about what was abstracted: ``(formulas, [(Axiom,
    instances), ...])``. Every model of the query extends to one of the abstraction, so when the
    abstraction has none the query has none: **proved**. When it has one, that model may be spurious:
    if the query's own formulas are true in it, it is a counterexample (**refuted**); else the query
    itself is decided as usual.
    """

    name: str
    apply: Callable[[list], tuple[list, list]]
    axioms: tuple[Axiom, ...] = ()  # the lemma schemas ``apply`` instantiates (their proofs become ``by``)
    # ``linearizing(formulas)``: symbols that, each fixed to a number, make the formulas easy to decide (linear);
    # a model found with them fixed is a model of the formulas (the premise check, the repair of a spurious model).
    linearizing: Callable[[list], list] = lambda formulas: []


ABSTRACTION_SHARE = 0.25  # of the units left: an abstraction that does not decide quickly is not worth more


def check_z3(claim: str, queries: Iterable[Query], *, budget: Budget, axioms: Sequence[Axiom] = (),
             by: Sequence[Proof] = (), solver: Callable[[], z3.Solver] = plain_solver,
             keep_model: bool = False, abstraction: Abstraction | None = None) -> Proof:
    """Decide every query (the cases of one theorem); the theorem is proved iff all are.

    ``by``: proven lemmas the theorem rests on outside the solver; with the lemmas behind the
    axioms the cores show were used, they become the proof's ``by``. A lemma that is not
    proved leaves the theorem unknown. ``abstraction``: tried first on each query (see
    :class:`Abstraction`).
    """
    start, units = time.perf_counter(), budget.used
    axioms = (*axioms, *(abstraction.axioms if abstraction is not None else ()))
    unproved = [p.claim for p in (*by, *(p for a in axioms for p in a.by)) if not p.ok]
    if unproved:
        return Proof(claim, "z3", UNKNOWN, detail="rests on lemmas that were not proved: " + "; ".join(unproved))
    hypotheses: dict[str, None] = {}
    used: dict[str, None] = {}
    notes: dict[str, None] = {}
    count = 0
    for query in queries:
        count += 1
        outcome, used_hypotheses, used_axioms = _decide(query, axioms, budget, solver, keep_model, abstraction)
        if outcome.status != PROVED:
            return outcome.but(claim=claim, queries=count, seconds=time.perf_counter() - start,
                               rlimit=budget.used - units, hypotheses=tuple(text for text, _ in query.hypotheses))
        hypotheses.update(dict.fromkeys(used_hypotheses))
        used.update(dict.fromkeys(used_axioms))
        notes.update(dict.fromkeys(filter(None, [outcome.detail and f"{query.case}: {outcome.detail}"])))
    lemmas = (*by, *(p for a in axioms if a.name in used for p in a.by))
    return Proof(claim, "z3", PROVED if count else UNKNOWN, tuple(hypotheses),
                 tuple(sorted(a.describe() for a in axioms if a.name in used)), tuple(lemmas),
                 queries=count, seconds=time.perf_counter() - start, rlimit=budget.used - units,
                 detail="; ".join(notes) if count else "no query was generated")


_TRACK = "track:"  # prefix of the Boolean names that label tracked assertions


def _decide(query: Query, axioms: Sequence[Axiom], budget: Budget, solver_for, keep_model=False,
            abstraction: Abstraction | None = None):
    """``(proof, hypotheses used, axioms used)``: one solver finds a model of the hypotheses, the
    axiom instances and the premise; another refutes the negation, tracking what it uses
    (first in the ``abstraction``, when one is given and it decides).

    Each makes a single ``check``: Z3 then picks its best strategy for the logic (nonlinear
    integer queries are orders of magnitude faster than in incremental mode).
    """
    own = [a for a in axioms if abstraction is None or a not in abstraction.axioms]
    spent = budget.spent()
    if spent:
        status = INTERRUPTED if budget.left() <= 0 else UNKNOWN
        return Proof("", "z3", status, case=query.case, detail=spent + " before this query"), (), ()
    premise, conclusion = query.premise_and_conclusion()
    terms = TermIndex([query.claim, *(formula for _, formula in query.hypotheses)]) if own else None
    instances = {axiom.name: axiom.instances(terms) for axiom in own}
    labelled = [*((("axiom", n), z3.And(*f)) for n, f in instances.items() if f),
                *((("hypothesis", t), f) for t, f in query.hypotheses)]
    valid = {axiom.name for axiom in own if axiom.valid}
    premises = [(label, f) for label, f in labelled if label[0] != "axiom" or label[1] not in valid]
    premises += [(("premise", "the premise of the claim"), premise)] if premise is not None else []
    not_vacuous = _satisfiable(premises, query, budget, abstraction.linearizing if abstraction is not None else None)
    if not_vacuous is not None:
        return not_vacuous, (), ()

    negation = [*([premise] if premise is not None else []), z3.Not(conclusion)]
    if abstraction is not None:
        decided = _decide_abstracted(abstraction, labelled, negation, query, budget, keep_model)
        if decided is not None:
            return decided
    solver = solver_for()
    for index, (_, formula) in enumerate(labelled):
        solver.assert_and_track(formula, z3.Bool(f"{_TRACK}{index}"))
    solver.add(*negation)
    verdict, detail = budget.check(solver, share=0.5 if labelled else 1.0)[0], ""  # half: see the retry below
    core = {int(str(label).removeprefix(_TRACK)) for label in solver.unsat_core()} if verdict == z3.unsat else None
    if verdict == z3.unknown and labelled and not budget.spent():
        # Tracked assertions turn off some of Z3's preprocessing; decide without them, and
        # then everything the solver was given counts as used.
        solver = solver_for()
        solver.add(*(formula for _, formula in labelled), *negation)
        verdict = budget.check(solver)[0]
        detail = "no unsat core (undecided with tracked assertions): all given are listed"
    if verdict == z3.unsat:
        if core is None or not getattr(solver_for, "gives_cores", True):  # no core: all counts as used
            core = set(range(len(labelled)))
        used = [labelled[index][0] for index in sorted(core)]
        return (Proof("", "z3", PROVED, case=query.case, detail=detail),
                [name for kind, name in used if kind == "hypothesis"], [name for kind, name in used if kind == "axiom"])
    if verdict == z3.sat:
        model = solver.model()  # before the readability attempt, which may end without one
        model = _readable_model(solver, query.show, budget) or model
        return Proof("", "z3", REFUTED, case=query.case, countermodel=render(model, query.show),
                     model=model if keep_model else None), (), ()
    return _unknown(solver, query, budget), (), ()


def _decide_abstracted(abstraction: Abstraction, labelled, negation, query: Query, budget: Budget,
                       keep_model=False):
    """The proof from the abstraction's unsat core, the refutation by one of its models that is a model
    of the query too, or None (then the query itself must be decided)."""
    formulas, lemmas = abstraction.apply([formula for _, formula in labelled] + [z3.And(*negation)])
    tracked = [(label, formula) for (label, _), formula in zip(labelled, formulas)]
    tracked += [(("axiom", axiom.name), z3.And(*instances)) for axiom, instances in lemmas if instances]
    solver = plain_solver()
    for index, (_, formula) in enumerate(tracked):
        solver.assert_and_track(formula, z3.Bool(f"{_TRACK}{index}"))
    solver.add(formulas[-1])
    verdict = budget.check(solver, share=ABSTRACTION_SHARE)[0]
    if verdict == z3.sat:
        return _genuine_counterexample(solver, [f for _, f in labelled] + negation, query, budget, keep_model,
                                       abstraction.linearizing)
    if verdict != z3.unsat:
        return None
    core = sorted(int(str(label).removeprefix(_TRACK)) for label in solver.unsat_core())
    used = [tracked[index][0] for index in core]
    return (Proof("", "z3", PROVED, case=query.case),
            [name for kind, name in used if kind == "hypothesis"], [name for kind, name in used if kind == "axiom"])


_SATISFIABLE: dict[tuple[int, ...], list] = {}  # premises already shown satisfiable: their AST ids -> them


def _genuine_counterexample(solver, formulas, query: Query, budget: Budget, keep_model=False,
                            linearizing=lambda formulas: []):
    """The refutation by the abstraction's model (a readable one where there is one) if every formula of
    the query is true in it, or by a model of the query with the ``linearizing`` symbols fixed to their
    values in it (a spurious model often has the right block sizes and the wrong quotients); None if
    neither is found. Deciding a nonlinear query again cost some controls seconds, and the nonlinear
    solver's luck varies with the terms created before it."""
    def genuine(model):
        return model is not None and all(z3.is_true(model.eval(f, model_completion=True)) for f in formulas)

    found = solver.model()
    readable = _readable_model(solver, query.show, budget)
    model = readable if genuine(readable) else found if genuine(found) else None
    symbols = linearizing(formulas) if model is None else []
    for spurious in filter(None, [readable, found] if symbols else []):
        fixed = plain_solver()
        fixed.add(*formulas, *(s == spurious.eval(s, model_completion=True) for s in symbols))
        if budget.check(fixed, share=ABSTRACTION_SHARE)[0] == z3.sat and genuine(fixed.model()):
            model = fixed.model()
            break
    if model is None:
        return None
    return (Proof("", "z3", REFUTED, case=query.case, countermodel=render(model, query.show),
                  model=model if keep_model else None), (), ())


def _satisfiable(labelled, query: Query, budget: Budget, linearizing=None) -> Proof | None:
    """None if the premises have a model; else the vacuous or unknown outcome.

    The properties of one obligation share their hypotheses (every tile query of a mask family has
    the same), so premises shown satisfiable once are not checked again. Z3 shares equal terms, so the
    formulas' AST ids name them; the cache holds the formulas, so that no id is reused for another term.
    ``linearizing``: see :attr:`Abstraction.linearizing`; models with those symbols fixed are tried first.
    """
    formulas = [formula for _, formula in labelled]
    key = tuple(sorted(formula.get_id() for formula in formulas))
    if key in _SATISFIABLE:
        return None
    if linearizing is not None and _satisfiable_in_a_trial(formulas, linearizing(formulas), budget):
        _SATISFIABLE[key] = formulas
        return None
    solver = plain_solver()  # finding a model is easy; the tactics need not return one
    for index, ((kind, text), formula) in enumerate(labelled):
        solver.assert_and_track(formula, z3.Bool(f"[{index}] {kind} {text}"))
    verdict = budget.check(solver)[0]
    if verdict == z3.sat:
        _SATISFIABLE[key] = formulas
        return None
    if verdict == z3.unsat:
        core = sorted(str(label) for label in solver.unsat_core())
        return Proof("", "z3", VACUOUS, case=query.case,
                     detail="no model of the hypotheses, axiom instances and premise; conflicting: " + "; ".join(core))
    return _unknown(solver, query, budget, "satisfiability of the hypotheses and premise: ")


TRIAL_VALUES = (1, 2, 4)  # what each linearizing symbol is fixed to, in every combination, smallest sum first


def _satisfiable_in_a_trial(formulas, symbols, budget: Budget) -> bool:
    """Whether the formulas have a model with the ``symbols`` fixed to some combination of
    :data:`TRIAL_VALUES` (then they have one; a chunk may need to hold three rows of one-row blocks)."""
    if not symbols:
        return False
    for values in sorted(itertools.product(TRIAL_VALUES, repeat=len(symbols)), key=lambda v: (sum(v), v)):
        solver = plain_solver()
        solver.add(*(z3.substitute(formula, *zip(symbols, map(z3.IntVal, values))) for formula in formulas))
        if budget.check(solver, share=ABSTRACTION_SHARE)[0] == z3.sat:
            return True
    return False


READABLE_MODEL_SHARE = 0.05  # of the units left: a readable counterexample is a nicety, not a verdict


def _readable_model(solver, show, budget: Budget):
    """A counterexample with small whole numbers where one exists (quick try, else None)."""
    wishes = [wish for wish in map(_small_whole_number, show.values()) if wish is not None]
    if not wishes:
        return None
    solver.push()
    solver.add(*wishes)
    model = solver.model() if budget.check(solver, share=READABLE_MODEL_SHARE)[0] == z3.sat else None
    solver.pop()
    return model


def _small_whole_number(term):
    own = getattr(term, "small_whole_number", None)
    if own is not None:  # the prover's number domains say what "small" means for them
        return own()
    term = getattr(term, "value", term)
    if not (z3.is_const(term) and term.decl().kind() == z3.Z3_OP_UNINTERPRETED):
        return None
    if isinstance(term, z3.ArithRef):
        return z3.And(-16 <= term, term <= 16, z3.IsInt(term) if term.is_real() else True)
    if isinstance(term, z3.FPRef):  # infinities and NaN stay allowed: counterexamples may need them
        whole = z3.And(z3.fpRoundToIntegral(z3.RNE(), term) == term, z3.fpLEQ(z3.fpAbs(term), 16))
        return z3.Or(z3.fpIsInf(term), z3.fpIsNaN(term), whole)
    return None


def _unknown(solver, query: Query, budget: Budget, about: str = "") -> Proof:
    status, reason = budget.unknown_reason(solver)
    return Proof("", "z3", status, case=query.case, detail=about + reason, query=solver.sexpr())


def _unchecked(name: str):
    """Z3's C function behind the z3py wrapper ``name``, without the error check after each call: the
    walk's getters cannot fail on the handles of a live term, and the checks were half of its time. A z3py
    that does not keep it as its wrapper's last default (z3-solver is not pinned) gets the wrapper itself."""
    wrapper = getattr(z3, name)
    return getattr((wrapper.__defaults__ or (None,))[-1], "f", wrapper)


_ast_kind, _ast_id, _app_decl, _decl_ast, _decl_kind, _app_num_args, _app_arg, _quantifier_body = map(_unchecked, (
    "Z3_get_ast_kind", "Z3_get_ast_id", "Z3_get_app_decl", "Z3_func_decl_to_ast", "Z3_get_decl_kind",
    "Z3_get_app_num_args", "Z3_get_app_arg", "Z3_get_quantifier_body"))


class TermIndex:
    """Every distinct subterm of a query, found in one DAG walk, inner terms before the terms that
    contain them; axioms instantiate from it.

    The walk reads Z3's own AST handles and wraps a subterm only when it is asked for: queries share
    thousands of subterms, and a Python wrapper per node was most of the tile obligations' time. The
    handles stay valid because ``roots`` holds the terms they are part of. ``quantified``: walk into
    quantifier bodies too (their subterms may hold bound variables: no place to instantiate axioms, but
    where the TTIR prover finds every read of a memory).
    """

    def __init__(self, roots: Iterable[z3.ExprRef], quantified: bool = False):
        self.roots = list(roots)
        self._nodes = []  # (handle, context, decl id, decl kind), post-order
        seen, decls, apps = set(), {}, (z3.Z3_APP_AST, z3.Z3_NUMERAL_AST)
        for root in self.roots:
            context, ref = root.ctx, root.ctx_ref()
            stack = [(root.as_ast(), False)]
            while stack:
                ast, expanded = stack.pop()
                if expanded:
                    decl = _app_decl(ref, ast)
                    known = decls.get(decl.value)  # a few dozen declarations in thousands of nodes
                    if known is None:
                        known = decls[decl.value] = (_ast_id(ref, _decl_ast(ref, decl)), _decl_kind(ref, decl))
                    self._nodes.append((ast, context, *known))
                    continue
                kind = _ast_kind(ref, ast)
                if (kind not in apps and not (quantified and kind == z3.Z3_QUANTIFIER_AST)) \
                        or (number := _ast_id(ref, ast)) in seen:
                    continue
                if kind == z3.Z3_QUANTIFIER_AST:
                    seen.add(number)
                    stack.append((_quantifier_body(ref, ast), False))
                    continue
                seen.add(number)
                stack.append((ast, True))
                stack += [(_app_arg(ref, ast, i), False) for i in reversed(range(_app_num_args(ref, ast)))]

    @functools.cached_property
    def subterms(self) -> dict[int, z3.ExprRef]:
        """``{id: term}`` of every distinct subterm."""
        return {term.get_id(): term for term in self._wrapped(lambda decl, kind: True)}

    def applications(self, decl: z3.FuncDeclRef) -> list[z3.ExprRef]:
        number = decl.get_id()
        return self._wrapped(lambda declared, kind: declared == number)

    def of_kind(self, operator: int) -> list[z3.ExprRef]:
        """The applications of a built-in Z3 operator (``z3.Z3_OP_IDIV``, ``z3.Z3_OP_MUL``, ...)."""
        return self._wrapped(lambda decl, kind: kind == operator)

    def _wrapped(self, keep):
        return [z3.z3._to_expr_ref(ast, context) for ast, context, decl, kind in self._nodes if keep(decl, kind)]


def applications(terms: Iterable[z3.ExprRef], decl: z3.FuncDeclRef) -> list[z3.ExprRef]:
    """The distinct applications of ``decl`` inside ``terms`` (or inside a :class:`TermIndex`)."""
    index = terms if isinstance(terms, TermIndex) else TermIndex(terms)
    return index.applications(decl)


# ---------------------------------------------------------------------------- counterexamples


@dataclass(frozen=True)
class Labeled:
    """A Z3 Int shown through a table of names (e.g. tile classes)."""

    term: Any
    labels: Mapping[int, str]

    def render(self, model) -> str:
        value = model.eval(self.term, model_completion=True).as_long()
        return self.labels.get(value, str(value))


def render(model: z3.ModelRef, show: Mapping[str, Any]) -> dict[str, str]:
    """The named terms' values in ``model``, as short strings (``-inf``, ``+0``, ``3/4``...)."""
    return {name: render_value(model, term) for name, term in show.items()}


def render_value(model, term) -> str:
    own = getattr(term, "render", None)
    if own is not None:  # the prover's own number domains know how to print themselves
        return own(model)
    if isinstance(term, (bool, int, float, str)):
        return str(term)
    value = model.eval(term, model_completion=True)
    if isinstance(value, z3.FPNumRef):
        return render_float(value)
    if z3.is_int_value(value):
        return str(value.as_long())
    if z3.is_rational_value(value):
        return _short_fraction(value.as_fraction())
    if z3.is_algebraic_value(value):
        return value.as_decimal(12)
    return str(value)


def render_float(value: z3.FPNumRef) -> str:
    """An IEEE value as text: ``nan``, ``-inf``, ``-0``, or its exact decimal expansion."""
    if value.isNaN():
        return "nan"
    if value.isInf():
        return "-inf" if value.isNegative() else "+inf"
    if value.isZero():
        return "-0" if value.isNegative() else "+0"
    return repr(float(z3.simplify(z3.fpToReal(value)).as_fraction()))


def _short_fraction(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x} (~{float(x):.6g})"


# ---------------------------------------------------------------------------- SymPy


def check_identities(claim: str, pairs: Iterable[tuple[str, Any, Any]], *, budget: Budget,
                     hypotheses: Sequence[str] = (), seed: int = 0) -> Proof:
    """Prove ``lhs == rhs`` for every ``(case, lhs, rhs)``, exactly, with SymPy.

    ``-oo`` is a value; NaN is never equal to anything (SymPy itself would say ``nan == nan``).
    A difference that does not normalise to 0 is evaluated at random rational points
    (``random.Random(seed)``); a nonzero value there refutes the identity.
    """
    start = time.perf_counter()
    count = 0
    for case, lhs, rhs in pairs:
        count += 1
        try:
            with _alarm(budget.left()):
                status, countermodel, detail = _decide_identity(lhs, rhs, random.Random(seed))
        except TimeoutError:  # SymPy has no deterministic count: its time is the safety net's
            status, countermodel, detail = INTERRUPTED, None, budget.spent() or "interrupted by time"
        if status != PROVED:
            return Proof(claim, "sympy", status, tuple(hypotheses), countermodel=countermodel, case=case,
                         queries=count, seconds=time.perf_counter() - start, detail=detail)
    return Proof(claim, "sympy", PROVED if count else UNKNOWN, tuple(hypotheses), queries=count,
                 seconds=time.perf_counter() - start, detail="" if count else "no identity was generated")


def _decide_identity(lhs, rhs, rng: random.Random):
    import sympy

    lhs, rhs = sympy.sympify(lhs), sympy.sympify(rhs)
    special = [x for x in (lhs, rhs) if x.has(sympy.nan, sympy.zoo) or x in (sympy.oo, -sympy.oo)]
    if special:
        if lhs == rhs and not lhs.has(sympy.nan, sympy.zoo):
            return PROVED, None, ""
        return REFUTED, {"lhs": str(lhs), "rhs": str(rhs)}, ""
    difference = lhs - rhs
    if sympy.expand(difference) == 0:
        return PROVED, None, ""
    countermodel = _search_counterexample(lhs, rhs, rng)
    if countermodel:
        return REFUTED, countermodel, ""
    if sympy.simplify(difference) == 0:
        return PROVED, None, ""
    return UNKNOWN, None, "lhs - rhs does not simplify to 0, and no point was found where it is not 0"


def _search_counterexample(lhs, rhs, rng: random.Random, tries: int = 20):
    """A point where lhs and rhs differ by a relative gap that survives doubling the precision."""
    # Both sides' symbols: one that cancels in lhs - rhs must still get a value to evaluate either side.
    symbols = sorted(lhs.free_symbols | rhs.free_symbols, key=str)
    for attempt in range(tries):
        point = {s: _sample(s, rng, magnitude=10 ** (3 * (attempt // 7))) for s in symbols}
        if all(_differ(lhs, rhs, point, digits) for digits in (50, 100)):
            countermodel = {str(s): str(v) for s, v in point.items()}
            countermodel.update(lhs=str(lhs.subs(point).evalf(8)), rhs=str(rhs.subs(point).evalf(8)))
            return countermodel
    return None


def _differ(lhs, rhs, point, digits: int) -> bool:
    a, b = lhs.subs(point).evalf(digits), rhs.subs(point).evalf(digits)
    if not (a.is_number and b.is_number and a.is_finite and b.is_finite):
        return False
    return abs(a - b) > 10 ** (10 - digits) * max(1, abs(a), abs(b))


def _sample(symbol, rng: random.Random, magnitude: int):
    """A random rational of about ``magnitude`` (small first; a finite sentinel such as -1e4 only
    shows below it), positive for a nonnegative symbol."""
    import sympy

    value = sympy.Rational(rng.randint(1, 40) * magnitude, rng.randint(1, 9))
    if symbol.is_nonnegative or symbol.is_positive:
        return value
    return value if rng.random() < 0.5 else -value


@contextlib.contextmanager
def _alarm(seconds: float):
    """Interrupt a long SymPy computation after ``seconds`` (main thread only; elsewhere no limit)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if seconds <= 0:
        raise TimeoutError

    def expire(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------- bounded domains


def check_exhaustively(claim: str, cases: Iterable[tuple[str, bool, Mapping[str, Any]]], *, domain: str,
                       budget: Budget) -> Proof:
    """Check every case of a finite domain: **checked** for ``domain`` when all hold -- never proved.

    ``cases`` yields ``(case, holds, shown)``; the first case that does not hold refutes the
    claim, with ``shown`` (names to values) as its counterexample.
    """
    start = time.perf_counter()
    count = 0
    for case, holds, shown in cases:
        count += 1
        if not holds:
            return Proof(claim, "exhaustive", REFUTED, countermodel={k: str(v) for k, v in shown.items()},
                         case=case, queries=count, seconds=time.perf_counter() - start, detail=f"checked for {domain}")
        if budget.left() <= 0:  # a finite domain always ends; the safety net only bounds a runaway
            return Proof(claim, "exhaustive", INTERRUPTED, case=case, queries=count,
                         seconds=time.perf_counter() - start, detail=f"{budget.spent()} after {count} cases of {domain}")
    return Proof(claim, "exhaustive", CHECKED if count else UNKNOWN, queries=count,
                 seconds=time.perf_counter() - start,
                 detail=f"checked for {domain}" if count else "no case was generated")


# ---------------------------------------------------------------------------- obligations


@dataclass(frozen=True)
class Settings:
    """What a run proves for: the per-obligation budget and safety net, and the schedules it names."""

    timeout: float = DEFAULT_WALL_S  # the wall-clock safety net per obligation (--timeout)
    budget: int = DEFAULT_BUDGET  # millions of Z3 resource units per obligation (--budget)
    schedules: tuple = ()  # ((label, TileSchedule), ...): the kernels' and the user's, loaded before proving
    notes: tuple = ()  # what was not loaded, and why (a kernel whose optional dependency is missing)


@dataclass(frozen=True)
class Control:
    """A negative control: one definition replaced by a broken one, and the check it must fail.

    The prover must come back *refuted*, with a counterexample: that shows the check can fail.
    A control that breaks a conditional theorem by making its premise impossible (a tile class
    that is never FULL) must come back *vacuous* instead: ``expect``.
    """

    name: str
    breaks: str  # what is wrong, in words
    target: Any  # the module (or class) that holds the definition; or a module's name, imported when run
    attribute: str
    replacement: Any  # the broken definition; with ``wraps``, a function of the original that builds it
    check: Callable[[Budget], Proof]
    expect: str = REFUTED
    wraps: bool = False

    @property
    def replaces(self) -> str:
        target = self.target
        owner = target if isinstance(target, str) else target.__name__ if inspect.ismodule(target) else \
            f"{target.__module__}.{target.__qualname__}"
        return f"{owner}.{self.attribute}"

    def run(self, settings: Settings, budget: Budget) -> Proof:
        import importlib

        target = importlib.import_module(self.target) if isinstance(self.target, str) else self.target
        broken = self.replacement(getattr(target, self.attribute)) if self.wraps else self.replacement
        with patched(target, self.attribute, broken):
            return self.check(budget)


# ---------------------------------------------------------------------------- negative controls


@contextlib.contextmanager
def patched(target, name: str, value):
    """Temporarily replace ``target.name`` (a spec function, method or constant) by a broken ``value``."""
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)
