"""The prover's engine: a proof is a value.

A check states its theorem in plain words, gives the solver the hypotheses and the
instances of the axioms it may use, and asserts the negation of the claim:

* ``unsat``  -- **proved**, from the hypotheses and the axiom instances it was given (named
  in the proof);
* a model    -- **refuted**; the model is rendered as a readable counterexample;
* anything else (``unknown``, a timeout) -- **unknown**, never proved; the query is kept
  in SMT-LIB form so it can be replayed.

Before the negation goes in, the solver must find a model of the hypotheses together with
the axiom instances. That shows the axioms are consistent (they hold somewhere) and the
theorem is not vacuously true; if there is no such model the check is **vacuous**, a failure.

Axioms are few, named and justified; they are quantifier-free *schemas*, instantiated on the
terms of each query (``exp(a) * exp(b) = exp(a + b)`` for the ``exp`` terms present), which
keeps every query decidable and small. SymPy checks work on exact expressions: an identity
is proved when the difference normalises to 0, refuted when it is nonzero at a reproducible
random point (at 50 and at 100 digits), unknown otherwise; their hypotheses are assumptions
on the symbols (real, positive...), which those points satisfy, so they are never vacuous.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import z3

PROVED, REFUTED, UNKNOWN, VACUOUS = "proved", "refuted", "unknown", "vacuous"


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Axiom:
    """A named axiom schema: ``instances(index)`` gives its ground instances for a query's terms."""

    name: str
    statement: str
    justification: str
    instances: Callable[["TermIndex"], list]


@dataclass
class Proof:
    """The outcome of one check: what was claimed, how it was decided, and the evidence."""

    claim: str
    tool: str
    status: str
    hypotheses: tuple[str, ...] = ()
    axioms: tuple[str, ...] = ()  # the axioms (and proven lemmas) the proof depends on
    countermodel: dict[str, str] | None = None
    case: str = ""  # the case that failed, when a check splits into cases
    queries: int = 0
    seconds: float = 0.0
    detail: str = ""  # why unknown or vacuous
    query: str = ""  # SMT-LIB of an unknown query, for replay
    model: Any = field(default=None, repr=False, compare=False)  # the raw countermodel, when asked for

    @property
    def ok(self) -> bool:
        return self.status == PROVED

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "model"}


@dataclass(frozen=True)
class Query:
    """One solver query: ``hypotheses => claim``; ``show`` names the terms a counterexample prints."""

    claim: Any
    hypotheses: tuple[tuple[str, Any], ...] = ()
    show: Mapping[str, Any] = field(default_factory=dict)
    case: str = ""


class Budget:
    """The time one obligation may spend; all of its queries draw on it."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


# ---------------------------------------------------------------------------- Z3


def plain_solver(timeout_s: float) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", max(1, int(timeout_s * 1000)))
    return solver


def bitblast_solver(timeout_s: float) -> z3.Solver:
    """A solver for quantifier-free IEEE queries: to bit-vectors, uninterpreted functions
    (exp, log) eliminated by Ackermann's reduction, then SAT -- several times faster than
    Z3's default on these queries."""
    tactic = z3.Then("simplify", "fpa2bv", "simplify", "propagate-values", "ackermannize_bv", "bit-blast", "sat")
    return z3.TryFor(tactic, max(1, int(timeout_s * 1000))).solver()


def check_z3(claim: str, queries: Iterable[Query], *, budget: Budget, axioms: Sequence[Axiom] = (),
             solver: Callable[[float], z3.Solver] = plain_solver, keep_model: bool = False) -> Proof:
    """Decide every query (the cases of one theorem); the theorem is proved iff all are."""
    start = time.perf_counter()
    used: set[str] = set()
    hypotheses: dict[str, None] = {}
    count = 0
    for query in queries:
        count += 1
        hypotheses.update((text, None) for text, _ in query.hypotheses)
        outcome = _decide(query, axioms, budget, solver, keep_model)
        if outcome.status != PROVED:
            outcome.claim, outcome.hypotheses, outcome.queries = claim, tuple(hypotheses), count
            outcome.seconds = time.perf_counter() - start
            return outcome
        used.update(outcome.axioms)
    return Proof(claim, "z3", PROVED if count else UNKNOWN, tuple(hypotheses), tuple(sorted(used)),
                 queries=count, seconds=time.perf_counter() - start,
                 detail="" if count else "no query was generated")


def _decide(query: Query, axioms: Sequence[Axiom], budget: Budget, solver_for, keep_model=False) -> Proof:
    """Two fresh solvers: one finds a model of hypotheses + axioms, one refutes the negation.

    Each makes a single ``check``: Z3 then picks its best strategy for the logic (nonlinear
    integer queries are orders of magnitude faster than in incremental mode).
    """
    if budget.left() <= 0:
        return Proof("", "z3", UNKNOWN, case=query.case, detail="obligation timeout reached before this query")
    terms = TermIndex([query.claim, *(formula for _, formula in query.hypotheses)]) if axioms else None
    instances = {axiom.name: axiom.instances(terms) for axiom in axioms}
    instances = {name: formulas for name, formulas in instances.items() if formulas}
    labelled = [*((f"axiom {n}", z3.And(*f)) for n, f in instances.items()),
                *((f"hypothesis {t}", f) for t, f in query.hypotheses)]
    not_vacuous = _satisfiable(labelled, query, budget)
    if not_vacuous is not None:
        return not_vacuous

    solver = solver_for(budget.left())
    solver.add(*(formula for _, formula in labelled), z3.Not(query.claim))
    verdict = solver.check()
    if verdict == z3.unsat:
        used = (f"{a.name}: {a.statement} ({a.justification})" for a in axioms if a.name in instances)
        return Proof("", "z3", PROVED, axioms=tuple(sorted(used)), case=query.case)
    if verdict == z3.sat:
        model = solver.model()  # before the readability attempt, which may end without one
        model = _readable_model(solver, query.show) or model
        return Proof("", "z3", REFUTED, case=query.case, countermodel=render(model, query.show),
                     model=model if keep_model else None)
    return _unknown(solver, query, solver.reason_unknown())


_SATISFIABLE: set[tuple[str, ...]] = set()  # premises already shown satisfiable (as SMT-LIB text)


def _satisfiable(labelled, query: Query, budget: Budget) -> Proof | None:
    """None if the premises have a model; else the vacuous or unknown outcome.

    Many queries share a few small premises (all tile queries assume only ``len_q, len_k, bm,
    bn >= 0``), so a small set of premises shown satisfiable once is not checked again.
    """
    key = tuple(formula.sexpr() for _, formula in labelled) if len(labelled) <= 4 else None
    if key in _SATISFIABLE:
        return None
    solver = plain_solver(budget.left())  # finding a model is easy; the tactics need not return one
    for index, (text, formula) in enumerate(labelled):
        solver.assert_and_track(formula, z3.Bool(f"[{index}] {text}"))
    verdict = solver.check()
    if verdict == z3.sat:
        if key is not None:
            _SATISFIABLE.add(key)
        return None
    if verdict == z3.unsat:
        core = sorted(str(label) for label in solver.unsat_core())
        return Proof("", "z3", VACUOUS, case=query.case,
                     detail="no model of the hypotheses and axiom instances; conflicting: " + "; ".join(core))
    return _unknown(solver, query, "satisfiability of the hypotheses: " + solver.reason_unknown())


def _readable_model(solver, show):
    """A counterexample with small whole numbers where one exists (quick try, else None)."""
    wishes = [wish for wish in map(_small_whole_number, show.values()) if wish is not None]
    if not wishes:
        return None
    solver.push()
    solver.set("timeout", 500)
    solver.add(*wishes)
    model = solver.model() if solver.check() == z3.sat else None
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


def _unknown(solver, query: Query, reason: str) -> Proof:
    return Proof("", "z3", UNKNOWN, case=query.case, detail=reason, query=solver.sexpr())


class TermIndex:
    """Every distinct subterm of a query, found in one DAG walk; axioms instantiate from it."""

    def __init__(self, roots: Iterable[z3.ExprRef]):
        self.roots = list(roots)
        self.subterms, self._by_decl, stack = {}, {}, list(self.roots)
        while stack:
            term = stack.pop()
            if not z3.is_app(term) or term.get_id() in self.subterms:
                continue
            self.subterms[term.get_id()] = term
            self._by_decl.setdefault(term.decl().name(), []).append(term)
            stack.extend(term.children())

    def applications(self, decl: z3.FuncDeclRef) -> list[z3.ExprRef]:
        return [t for t in self._by_decl.get(decl.name(), []) if t.decl().eq(decl)]


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
        except TimeoutError:
            status, countermodel, detail = UNKNOWN, None, "obligation timeout reached"
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
    symbols = sorted((lhs - rhs).free_symbols, key=str)
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


# ---------------------------------------------------------------------------- obligations


@dataclass(frozen=True)
class Settings:
    """What a run proves for: the per-obligation timeout and the tile schedules to check."""

    timeout: float = 60.0
    schedules: tuple = ()  # ((label, TileSchedule), ...)
    schedule_specs: tuple = ()  # ("module:attribute", ...) the user named: must load
    kernel_schedule_specs: tuple = ()  # the project's kernels: skipped if an optional dependency is missing


@dataclass(frozen=True)
class Control:
    """A negative control: one definition replaced by a broken one, and the check it must fail.

    The prover must come back *refuted*, with a counterexample: that shows the check can fail.
    """

    name: str
    breaks: str  # what is wrong, in words
    target: Any  # the module (or class) that holds the definition
    attribute: str
    replacement: Any  # the broken definition
    check: Callable[[Budget], Proof]

    @property
    def replaces(self) -> str:
        owner = self.target.__name__ if inspect.ismodule(self.target) else \
            f"{self.target.__module__}.{self.target.__qualname__}"
        return f"{owner}.{self.attribute}"

    def run(self, settings: Settings, budget: Budget) -> Proof:
        with patched(self.target, self.attribute, self.replacement):
            return self.check(budget)


# ---------------------------------------------------------------------------- negative controls


@contextlib.contextmanager
def patched(target, name: str, value):
    """Temporarily replace ``target.name`` (a spec function or constant) by a broken ``value``."""
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)
