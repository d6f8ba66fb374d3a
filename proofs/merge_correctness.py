"""Obligation 1 -- merge correctness.

**Theorem 1a (any block length; Z3).** For disjoint key sets ``K1``, ``K2`` of one query row,

    merge(state(K1), state(K2)) = state(K1 u K2),

where ``state(K) = (M_K, E_K exp(-M_K), A_K exp(-M_K))`` and ``state({}) = (-inf, 0, 0)`` with
``M, E, A`` the max, the unshifted sum of ``exp(s_j)`` and of ``exp(s_j) v_j`` (see
:mod:`attnformal.proofs.keysets`). The spec's ``merge`` runs on extended reals; ``exp`` is
uninterpreted with the axioms ``exp-positive``, ``exp-add``, ``exp-zero``; each of the four
empty/nonempty combinations is one query. Since the sums are abstract, this holds for tiles
and key sets of every length.

**Theorem 1b (SymPy, exact).** The rescaling identity
``exp(s - m_new) = exp(s - m_old) * exp(m_old - m_new)``.

**Theorem 1c (concrete lengths; SymPy, exact, ``-oo`` a value).** For ``n = 1..4`` symbolic
scores, every mask pattern (each score finite or ``-oo``) and every order of the finite scores,
with symbolic values and dropout weights:

    block_state(s, v, w) = merge(...merge(block_state(s_1, v_1, w_1), block_state(s_2, ...))..., ...)

i.e. a tile's state is the fold of its keys' singleton states. (The order is fixed by writing
the scores as ``t, t - d_1, t - d_1 - d_2, ...`` with ``d_i >= 0``, which covers every real
tuple, ties included; the order cases are exhaustive by construction.)
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import sympy

from attnformal import merge as spec
from attnformal.logic import Budget, Control, Query, Settings, check_identities, check_z3
from attnformal.merge import SoftmaxState
from attnformal.proofs.keysets import (EXP_AXIOMS, describe, key_set_cases, same_state, show_state,
                                       union_state)

TITLE = "Merge correctness"
FOLD_LENGTHS = (1, 2, 3, 4)


def checks(settings: Settings, budget: Budget):
    yield union_of_disjoint_sets(budget)
    yield rescaling_identity(budget)
    yield tile_is_fold_of_keys(budget)


def union_of_disjoint_sets(budget: Budget):
    def queries():
        for k1, k2 in key_set_cases("K1", "K2"):
            merged = spec.merge(k1.state(), k2.state())
            yield Query(same_state(merged, union_state(k1, k2)), (*k1.facts(), *k2.facts()),
                        case=describe((k1, k2)), show={**k1.show(), **k2.show(), **show_state("merge", merged)})

    return check_z3("merge(state(K1), state(K2)) = state(K1 u K2) for disjoint key sets of any length",
                    queries(), budget=budget, axioms=EXP_AXIOMS)


def rescaling_identity(budget: Budget):
    s, m_old, m_new = sympy.symbols("s m_old m_new", real=True)
    return check_identities("exp(s - m_new) = exp(s - m_old) * exp(m_old - m_new)",
                            [("", sympy.exp(s - m_new), sympy.exp(s - m_old) * sympy.exp(m_old - m_new))],
                            budget=budget, hypotheses=("s, m_old, m_new real",))


def tile_is_fold_of_keys(budget: Budget):
    def pairs():
        for n in FOLD_LENGTHS:
            for scores, label in score_cases(n):
                v = np.array([[sympy.Symbol(f"v{j}", real=True)] for j in range(n)], dtype=object)
                w = np.array([[sympy.Symbol(f"w{j}", nonnegative=True) for j in range(n)]], dtype=object)
                tile = spec.block_state(scores, v, w)
                keys = [spec.block_state(scores[:, j:j + 1], v[j:j + 1], w[:, j:j + 1]) for j in range(n)]
                folded = functools.reduce(spec.merge, keys)
                for field, a, b in zip(SoftmaxState._fields, tile, folded):
                    yield f"n={n}, {label}, {field}", a[0, 0], b[0, 0]

    return check_identities("block_state of n keys = fold of merge over the keys' singleton states, n = 1..4",
                            pairs(), budget=budget,
                            hypotheses=("scores finite or -oo (masked)", "values real", "dropout weights >= 0"))


def score_cases(n: int):
    """``([1, n] scores, label)`` for every mask pattern and order of the finite scores."""
    t = sympy.Symbol("t", real=True)
    gaps = sympy.symbols(f"d1:{n + 1}", nonnegative=True)
    for masked in itertools.product((False, True), repeat=n):
        finite = [j for j in range(n) if not masked[j]]
        for order in itertools.permutations(finite):
            scores = [-sympy.oo] * n
            for rank, j in enumerate(order):
                scores[j] = t - sum(gaps[:rank])
            label = "scores (" + ", ".join(map(str, scores)) + ")"
            yield np.array([scores], dtype=object), label


# ---- negative controls


def merge_without_rescale(a, b):
    """BROKEN: forgets to rescale the running state ``a`` when the max grows."""
    from attnformal import ops

    m = ops.maximum(a.m, b.m)
    beta = ops.exp(b.m - spec.finite_shift(m))
    return SoftmaxState(m, a.l + beta * b.l, a.acc + beta * b.acc)


def block_state_without_shift(s, v, weights=None):
    """BROKEN: exponentiates the raw scores instead of ``s - m``."""
    from attnformal import ops

    p = ops.exp(s)
    l = ops.rowsum(p)
    if weights is not None:
        p = p * weights
    return SoftmaxState(ops.rowmax(s), l, ops.matmul(p, v))


CONTROLS = (
    Control("missing rescale", "merge adds the new tile without multiplying the running l, acc by "
            "exp(m_old - m_new)", spec, "merge", merge_without_rescale, union_of_disjoint_sets),
    Control("tile state without max shift", "block_state uses exp(s) instead of exp(s - m)",
            spec, "block_state", block_state_without_shift, tile_is_fold_of_keys),
)
