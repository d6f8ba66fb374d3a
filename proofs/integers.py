"""Shared by the integer obligations: symbolic specs and schedules, and the floor-division lemma.

* :func:`symbolic_spec` -- an :class:`~attnformal.spec.AttentionSpec` whose lengths, window
  bounds and ``kv_lens`` (a Z3 array, so every batch element ``b`` at once) are Z3 Ints, so
  ``spec.geometry(b)`` is the spec's own code run on symbols.
* :func:`symbolic_schedule` -- a :class:`~attnformal.schedule.TileSchedule` whose block sizes
  are Z3 Ints: the very methods the kernels call, for all block sizes at once.
* :func:`floor_division_lemma` -- ``floordiv(x, n) <= k  <=>  x < (k + 1) n`` and
  ``k <= floordiv(x, n)  <=>  k n <= x`` for ``n >= 1``, proved on ``ops.floordiv``'s Z3 terms;
  :func:`floor_division` instantiates it as an axiom schema. With symbolic block sizes a tile
  query divides by a variable (nonlinear); the lemma's instances for the products ``k n`` the
  query contains make those queries easy (seconds become milliseconds).
* :func:`linear_abstraction` -- the tile queries in linear arithmetic: every division by a symbolic
  divisor and every product of two symbols read as a fresh variable, with instances of four proven
  lemmas about floor division and products (:func:`linear_lemmas`); a sound over-approximation
  (:class:`~attnformal.logic.Abstraction`) that decides them in a hundredth of the resources.
"""

from __future__ import annotations

import itertools

import z3

from attnformal import ops
from attnformal.features import FEATURES, with_role
from attnformal.logic import Abstraction, Axiom, Budget, Proof, Query, TermIndex, check_z3
from attnformal.masks import MaskGeometry
from attnformal.schedule import TileSchedule
from attnformal.spec import AttentionSpec

BLOCK_M, BLOCK_N = z3.Ints("block_m block_n")
BLOCK_SIZES = ("block_m, block_n >= 1", z3.And(BLOCK_M >= 1, BLOCK_N >= 1))
ATTN_MASK = "attn_mask data"  # stands for a given explicit mask: the index rules only ask whether there is one


def symbolic_spec(values: dict, attn_mask: bool) -> AttentionSpec:
    """Lengths ``Sq, Sk`` symbolic, and the given feature values (Z3 symbols; per-batch ones are
    arrays over batch indices, so ``spec.geometry(b)`` covers every batch element ``b`` at once)."""
    len_q, len_k = z3.Ints("Sq Sk")
    return AttentionSpec(batch=z3.Int("B"), heads_q=1, heads_kv=1, len_q=len_q, len_k=len_k, head_dim=1,
                         head_dim_v=1, scale=1.0, **values, attn_mask=ATTN_MASK if attn_mask else None)


def spec_families():
    """``(label, values)`` of every index-mask combination a spec can ask for (``attn_mask`` aside): every
    mask feature's :meth:`~attnformal.features.Feature.prover_values`, all combinations the features
    accept together (:meth:`~attnformal.features.Feature.conflict`)."""
    index_features = with_role("interval", "length")
    for choice in itertools.product(*(f.prover_values() for f in index_features)):
        values = {f.name: value for f, (_, value) in zip(index_features, choice)}
        if any(f.active(values[f.name]) and f.conflict(values) for f in index_features):
            continue
        yield ", ".join(label for label, _ in choice), values


def geometries():
    """``(label, MaskGeometry)`` for every mask family and combination (lengths symbolic), with and
    without an explicit mask: ``spec.geometry(b)`` of each :func:`spec_families` spec for a symbolic ``b``.

    ``len_k`` is replaced by a free symbol, the batch element's effective key length
    (``kv_lens[b]``, or ``Sk``), so padding keys are the keys ``j >= len_k``; obligation 10 shows
    ``spec.geometry(b)`` builds exactly this. Families differing only in per-batch lengths coincide.
    """
    len_q, len_k = z3.Ints("len_q len_k")
    seen = set()
    for (label, values), has_mask in itertools.product(spec_families(), (False, True)):
        g = symbolic_spec(values, has_mask).geometry(z3.Int("b"))
        labels = [part for part in label.split(", ") if "kv_lens" not in part]
        label = ", ".join([*labels, "attn_mask" if has_mask else "no attn_mask"])
        if label not in seen:
            seen.add(label)
            yield label, g.replace(len_q=len_q, len_k=len_k)


def shown_values(values: dict) -> dict:
    """A counterexample's symbolic feature values beyond causal and window (shown as ``L, R``)."""
    return {f.name: values[f.name] for f in with_role("interval") if f.name not in ("causal", "window")
            and f.active(values.get(f.name))}


def slow(g: MaskGeometry) -> bool:
    """Whether a geometry has a feature whose tile queries are slow (:attr:`Feature.slow_tiles`)."""
    return any(f.slow_tiles and f.active(g.values.get(f.name)) for f in FEATURES)


def domain(g: MaskGeometry):
    """The hypotheses on a geometry's symbolic feature values: what validation allows (``C >= 1``, ...)."""
    return tuple(hypothesis for f in FEATURES if f.active(g.values.get(f.name))
                 for hypothesis in f.domain(g.values[f.name]))


def symbolic_schedule(num_splits: int = 1) -> TileSchedule:
    """``TileSchedule(block_m, block_n, num_splits)`` with Z3 Int block sizes (hypothesis: >= 1).

    ``TileSchedule`` checks for ints when built, so this one is built field by field; its
    methods are the class's own.
    """
    schedule = object.__new__(TileSchedule)
    for name, value in (("block_m", BLOCK_M), ("block_n", BLOCK_N), ("num_splits", num_splits)):
        object.__setattr__(schedule, name, value)
    return schedule


def floor_division_lemma(budget: Budget) -> Proof:
    x, n, k = z3.Ints("x n k")
    q = ops.floordiv(x, n)
    claim = z3.And((q <= k) == (x < (k + 1) * n), (k <= q) == (k * n <= x))
    return check_z3("floor division: floordiv(x, n) <= k <=> x < (k + 1) n and k <= floordiv(x, n) <=> k n <= x",
                    [Query(claim, (("n >= 1", n >= 1),), {"x": x, "n": n, "k": k, "floordiv(x, n)": q})],
                    budget=budget)


def floor_division(lemma: Proof) -> Axiom:
    """The lemma's instances for each ``x div n`` of a query and each ``k`` with ``k * n`` in it
    (and ``k`` the quotient itself: ``n q <= x < n q + n``)."""

    def instances(index: TermIndex):
        partners = {}  # a factor's id -> the other factor of each product of two it is in
        for product in index.of_kind(z3.Z3_OP_MUL):
            if product.num_args() == 2:
                a, b = product.children()
                partners.setdefault(b.get_id(), []).append(a)
                partners.setdefault(a.get_id(), []).append(b)
        out = []
        for q in index.of_kind(z3.Z3_OP_IDIV):
            x, n = q.children()
            factors = [q] + partners.get(n.get_id(), [])
            for k in {f.get_id(): f for f in factors}.values():
                out.append(z3.Implies(n >= 1, z3.And((q <= k) == (x < (k + 1) * n), (k <= q) == (k * n <= x))))
        return out

    return Axiom("floor-division", "n >= 1 => (x div n <= k <=> x < (k+1) n) and (k <= x div n <=> k n <= x)",
                 "a proven lemma about ops.floordiv on Z3 Ints", instances, by=(lemma,), valid=True)


def linear_lemmas(budget: Budget) -> tuple[Axiom, ...]:
    """The facts about ``floordiv(x, n)`` (``ops.floordiv``'s own Z3 terms) and products ``k n`` that
    :func:`linear_abstraction` keeps when it reads them as variables, each proved for all integers,
    ``n >= 1``. (Obligation 13 proves ``ops.floordiv`` is floor division on every interpretation.)"""
    x1, x2, n, k1, k2 = z3.Ints("x1 x2 n k1 k2")
    q1, q2 = ops.floordiv(x1, n), ops.floordiv(x2, n)
    lemmas = (
        ("floor-division bounds", "n >= 1 => n (x div n) <= x < n (x div n) + n",
         z3.And(n * q1 <= x1, x1 < n * q1 + n)),
        ("floor-division monotone", "n >= 1 and x1 <= x2 => x1 div n <= x2 div n",
         z3.Implies(x1 <= x2, q1 <= q2)),
        ("product sign", "n >= 1 => (k >= 0 => k n >= k), (k >= 1 => k n >= n), (k <= 0 => k n <= k), "
         "(k <= -1 => k n <= -n)", z3.And(z3.Implies(k1 >= 0, k1 * n >= k1), z3.Implies(k1 >= 1, k1 * n >= n),
                                           z3.Implies(k1 <= 0, k1 * n <= k1), z3.Implies(k1 <= -1, k1 * n <= -n))),
        ("product monotone", "n >= 1 => (k1 < k2 => k1 n + n <= k2 n) and (k1 = k2 => k1 n = k2 n)",
         z3.And(z3.Implies(k1 < k2, k1 * n + n <= k2 * n), z3.Implies(k1 == k2, k1 * n == k2 * n))),
    )
    show = {"x1": x1, "x2": x2, "n": n, "k1": k1, "k2": k2}
    return tuple(Axiom(name, statement, "a proven lemma about ops.floordiv and products on Z3 Ints",
                       _instantiated_by_the_abstraction,
                       by=(check_z3(f"{name}: {statement}", [Query(claim, (("n >= 1", n >= 1),), show)],
                                    budget=budget),))
                 for name, statement, claim in lemmas)


def _instantiated_by_the_abstraction(index: TermIndex):
    return []  # linear_abstraction instantiates these lemmas itself, on the variables it introduces


def linear_abstraction(budget: Budget) -> Abstraction:
    """Integer queries read linearly: each ``x div n`` with a symbolic ``n`` and each product of two
    symbols becomes a fresh variable, constrained by the :func:`linear_lemmas`' instances on them
    (bounds of each quotient, monotonicity for each pair with the same divisor, sign and monotonicity
    for each pair of products with a common factor). Polynomials are first put in sum-of-monomials
    form (``(bm + 1) block_m`` is ``bm block_m + block_m``), so equal products are one variable.

    One abstraction reads many queries (the properties of an obligation share their hypotheses): each
    formula, quotient and product is read once (:class:`_LinearReading`), and a query collects the
    instances for the quotients and products its formulas hold."""
    bounds, monotone, sign, product_monotone = axioms = linear_lemmas(budget)
    reading = _LinearReading()

    def apply(formulas):
        read = [reading.formula(f) for f in formulas]
        quotients = _union(q for _, qs, _ in read for q in qs)
        division = [reading.division(q) for q in quotients]
        ordered = [reading.ordered(q1, q2) for q1, q2 in itertools.permutations(quotients, 2)
                   if reading.quotients[q1][2].eq(reading.quotients[q2][2])]
        products = _union(p for _, _, ps in (*read, *division, *ordered) for p in ps)
        signs, pairs = [], []
        for n, factors in _by_common_factor([(reading.products[p][1], p) for p in products]):
            signs += [reading.sign(n, k, p) for k, p in factors]
            pairs += [reading.product_pair(n, k1, p1, k2, p2)
                      for (k1, p1), (k2, p2) in itertools.permutations(factors, 2)]
        return [f for f, _, _ in read], [(bounds, [f for f, _, _ in division]), (monotone, [f for f, _, _ in ordered]),
                                         (sign, signs), (product_monotone, pairs)]

    return Abstraction("linear arithmetic, with floor-division and product lemmas", apply, axioms, _linearizing_symbols)


def _union(keys):
    return list(dict.fromkeys(keys))


class _LinearReading:
    """The fresh variables of one abstraction, and each formula read with them, once.

    A quotient ``x div n`` (``n`` not a number) is named by the term's id, a product by its factors' ids;
    the memos hold the terms, so that no id is reused for another term while the names stand. A read
    formula is ``(formula, quotient ids, ids of the products of two symbols)``."""

    def __init__(self):
        self.quotients = {}  # term id -> (term, x, n, q), x and n read (inner quotients as variables)
        self.products = {}  # sorted factor ids -> (factors, (a, b) if two else None, p)
        self.read = {}  # formula id -> (formula, read formula)
        self.side = {}  # the ids a lemma instance is about -> the instance, read

    def formula(self, f):
        found = self.read.get(f.get_id())
        if found is None:
            found = self.read[f.get_id()] = (f, self._linear(*self._without_quotients(z3.simplify(f, som=True))))
        return found[1]

    def division(self, q):
        """``n q <= x < n q + n``: the bounds of quotient ``q``."""
        if (q,) not in self.side:
            _, x, n, v = self.quotients[q]
            self.side[(q,)] = self._linear(z3.Implies(n >= 1, z3.And(n * v <= x, x < n * v + n)))
        return self.side[(q,)]

    def ordered(self, q1, q2):
        """``x1 <= x2 => q1 <= q2`` for two quotients by the same divisor."""
        if (q1, q2) not in self.side:
            (_, x1, n, v1), (_, x2, _, v2) = self.quotients[q1], self.quotients[q2]
            self.side[(q1, q2)] = self._linear(z3.Implies(z3.And(n >= 1, x1 <= x2), v1 <= v2))
        return self.side[(q1, q2)]

    def sign(self, n, k, p):
        """The sign facts of product ``p = k n`` (``p``: its key)."""
        if (n.get_id(), p) not in self.side:
            v = self.products[p][2]
            self.side[(n.get_id(), p)] = z3.Implies(n >= 1, z3.And(
                z3.Implies(k >= 0, v >= k), z3.Implies(k >= 1, v >= n), z3.Implies(k <= 0, v <= k),
                z3.Implies(k <= -1, v <= -n)))
        return self.side[(n.get_id(), p)]

    def product_pair(self, n, k1, p1, k2, p2):
        """Monotonicity of the products ``p1 = k1 n`` and ``p2 = k2 n`` (keys) in their other factors."""
        if (n.get_id(), p1, p2) not in self.side:
            v1, v2 = self.products[p1][2], self.products[p2][2]
            self.side[(n.get_id(), p1, p2)] = z3.Implies(n >= 1, z3.And(z3.Implies(k1 < k2, v1 + n <= v2),
                                                                        z3.Implies(k1 == k2, v1 == v2)))
        return self.side[(n.get_id(), p1, p2)]

    def _without_quotients(self, f):
        """``(f with each quotient a variable, the quotients' ids)``, inner quotients first."""
        used = []
        for term in _postorder([f], z3.Z3_OP_IDIV, lambda t: not z3.is_int_value(t.arg(1))):
            if term.get_id() not in self.quotients:
                inner = [(self.quotients[i][0], self.quotients[i][3]) for i in used]
                x, n = (z3.substitute(a, *inner) if inner else a for a in term.children())
                self.quotients[term.get_id()] = (term, x, n, z3.Int(f"abstract!div{len(self.quotients)}"))
            used.append(term.get_id())
        substitution = [(self.quotients[i][0], self.quotients[i][3]) for i in used]
        return (z3.substitute(f, *substitution) if substitution else f), used

    def _linear(self, f, quotients=()):
        """``f`` in sum-of-monomials form, each product of two or more symbols a variable (a numeric
        coefficient stays outside): ``(formula, quotient ids, product keys)``."""
        f = z3.simplify(f, som=True)
        substitution, keys = [], []
        for term in _postorder([f], z3.Z3_OP_MUL, lambda t: len(_factors(t)) >= 2):
            factors = _factors(term)
            key = tuple(sorted(x.get_id() for x in factors))
            if key not in self.products:
                self.products[key] = (factors, tuple(factors) if len(factors) == 2 else None,
                                      z3.Int(f"abstract!mul{len(self.products)}"))
            variable = self.products[key][2]
            coefficient = [c for c in term.children() if z3.is_int_value(c)]
            substitution.append((term, variable * coefficient[0] if coefficient else variable))
            if self.products[key][1] is not None:
                keys.append(key)
        return (z3.substitute(f, *substitution) if substitution else f), quotients, keys


def _linearizing_symbols(formulas):
    """The symbols that, fixed to numbers, make the formulas linear: every divisor, and one factor of
    every other product of two symbols (the one in the most products)."""
    divisors = {t.arg(1).get_id(): t.arg(1) for t in _postorder(formulas, z3.Z3_OP_IDIV)
                if z3.is_const(t.arg(1)) and not z3.is_int_value(t.arg(1))}
    products = [_factors(t) for t in _postorder([z3.simplify(f, som=True) for f in formulas], z3.Z3_OP_MUL,
                                                 lambda t: len(_factors(t)) == 2)]
    count = {}
    for factor in (f for pair in products for f in pair):
        count[factor.get_id()] = count.get(factor.get_id(), 0) + 1
    fixed = dict(divisors)
    for pair in products:
        if not any(f.get_id() in fixed for f in pair):
            chosen = max(pair, key=lambda f: (count[f.get_id()], str(f)))
            if z3.is_const(chosen):
                fixed[chosen.get_id()] = chosen
    return sorted(fixed.values(), key=str)


def _postorder(formulas, operator, keep=lambda term: True):
    """The distinct applications of Z3 ``operator`` that ``keep`` picks, inner ones before the terms that
    contain them."""
    return [term for term in TermIndex(formulas).of_kind(operator) if keep(term)]


def _factors(term):
    return [c for c in term.children() if not z3.is_int_value(c)]


def _by_common_factor(products):
    """``(n, [(k, p), ...])``: for each factor ``n``, the products ``p = k n`` it is in."""
    shared = {}
    for (a, b), p in products:
        for n, k in ((a, b), (b, a)):
            shared.setdefault(n.get_id(), (n, []))[1].append((k, p))
    return list(shared.values())
