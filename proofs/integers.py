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
"""

from __future__ import annotations

import itertools

import z3

from attnformal import ops
from attnformal.features import FEATURES, with_role
from attnformal.logic import Axiom, Budget, Proof, Query, TermIndex, check_z3
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
        products = [t for t in index.subterms.values() if z3.is_mul(t) and t.num_args() == 2]
        out = []
        for q in index.subterms.values():
            if not z3.is_app_of(q, z3.Z3_OP_IDIV):
                continue
            x, n = q.children()
            factors = [q] + [a for t in products for a, b in (t.children(), t.children()[::-1]) if b.eq(n)]
            for k in {f.get_id(): f for f in factors}.values():
                out.append(z3.Implies(n >= 1, z3.And((q <= k) == (x < (k + 1) * n), (k <= q) == (k * n <= x))))
        return out

    return Axiom("floor-division", "n >= 1 => (x div n <= k <=> x < (k+1) n) and (k <= x div n <=> k n <= x)",
                 "a proven lemma about ops.floordiv on Z3 Ints", instances, by=(lemma,))
