"""Obligation 3 -- the kernel loop ``state = merge(state, block_state(tile))`` by induction.

Invariant ``I(state, K)`` after the tiles holding key set ``K``: ``state = state(K)``
(:mod:`attnformal.proofs.keysets`) -- so ``m`` is the running maximum -- and ``l >= 1`` once
``K`` is nonempty.

* **Base (Z3).** The spec's empty state ``(NEG_INF, 0, 0)`` is ``state({})``.
* **Step (Z3, any tile length).** For any prefix set ``K`` and any next tile ``T`` disjoint
  from it (each empty or not), with ``state(K)`` and the tile's state ``state(T)``:
  ``merge(state(K), state(T)) = state(K u T)``, ``l >= 1`` if ``K u T`` is nonempty, and every
  ``exp`` the merge evaluates has an argument ``<= 0`` (``-inf`` included) -- the running max
  never lets ``exp`` overflow. Axioms: ``exp-positive``, ``exp-add``, ``exp-zero``; hypothesis
  ``E >= exp(M)`` for each nonempty set.
* **Tile (Z3, n = 3).** ``block_state`` of scores that are each finite or ``-inf`` (all 8
  patterns) evaluates ``exp`` only at arguments ``<= 0``, and has ``l >= 1`` when a score is
  finite: the tile's own max is among its keys.
* **Termination (SymPy, exact exp and log).** After the last tile ``K`` is the row's allowed
  set and, for nonempty ``K``, ``finalize(state(K)) = (A/E, log E)``: ``out = sum_j softmax(s)_j v_j``
  and ``lse = logsumexp(s)``. (Empty rows are obligation 4.)

Base and step give ``I`` after every tile by induction on the number of tiles; with
termination, the kernel's output is ``softmax(S) V`` and its ``lse`` is ``logsumexp(S)``.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import sympy
import z3

from attnformal import merge as spec
from attnformal.domains import ExtendedReal, _ExtendedRealOps, extended_reals
from attnformal.logic import Budget, Control, Query, Settings, check_identities, check_z3, patched
from attnformal.merge import SoftmaxState
from attnformal.proofs.keysets import (EXP_AXIOMS, describe, empty_state, key_set_cases, same_state,
                                       show_state, union_state)

TITLE = "Loop invariant (induction over tiles)"
TILE_WIDTH = 3


def checks(settings: Settings, budget: Budget):
    yield base(budget)
    yield step(budget)
    yield tile_exp_arguments(budget)
    yield termination(budget)


@contextlib.contextmanager
def exp_arguments():
    """Record the argument of every ``exp`` the spec evaluates on extended reals."""
    seen = []
    evaluate = _ExtendedRealOps.exp

    def recording(x):
        seen.append(ExtendedReal.lift(x))
        return evaluate(x)

    with patched(_ExtendedRealOps, "exp", staticmethod(recording)):
        yield seen


def base(budget: Budget):
    start = SoftmaxState(spec.NEG_INF, 0.0, 0.0)  # what merge.empty_state fills its tensors with
    return check_z3("the empty state (NEG_INF, 0, 0) is state({})",
                    [Query(same_state(start, empty_state()), show=show_state("start", start))], budget=budget)


def step(budget: Budget):
    def queries():
        for K, T in key_set_cases("K", "T"):
            with exp_arguments() as arguments:
                merged = spec.merge(K.state(), T.state())
            union = union_state(K, T)
            claim = z3.And(same_state(merged, union), *(x <= 0 for x in arguments))
            if not (K.empty and T.empty):
                claim = z3.And(claim, ExtendedReal.lift(merged.l) >= 1)
            show = {**K.show(), **T.show(), **show_state("merge", merged),
                    **{f"exp argument {i}": x for i, x in enumerate(arguments)}}
            yield Query(claim, (*K.facts(), *T.facts()), show, case=describe((K, T)))

    return check_z3("I(state, K) => I(merge(state, state(T)), K u T); merge's exp arguments <= 0",
                    queries(), budget=budget, axioms=EXP_AXIOMS)


def tile_exp_arguments(budget: Budget):
    def queries():
        scores = extended_reals(" ".join(f"s{j}" for j in range(TILE_WIDTH)))
        v = np.array([[x] for x in extended_reals(" ".join(f"v{j}" for j in range(TILE_WIDTH)))], dtype=object)
        for masked in itertools.product((False, True), repeat=TILE_WIDTH):
            row = [ExtendedReal.lift(spec.NEG_INF) if mask else s for mask, s in zip(masked, scores)]
            with exp_arguments() as arguments:
                tile = spec.block_state(np.array([row], dtype=object), v)
            claim = z3.And(*(x <= 0 for x in arguments))
            if not all(masked):
                claim = z3.And(claim, ExtendedReal.lift(tile.l[0, 0]) >= 1)
            show = {**{f"s{j}": x for j, x in enumerate(row)}, "m": tile.m[0, 0], "l": tile.l[0, 0]}
            yield Query(claim, show=show, case="masked " + str([j for j in range(TILE_WIDTH) if masked[j]]))

    return check_z3(f"block_state (n = {TILE_WIDTH}): every exp argument <= 0, l >= 1 if a key is allowed",
                    queries(), budget=budget, axioms=EXP_AXIOMS)


def termination(budget: Budget):
    M, A = sympy.symbols("M A", real=True)
    E = sympy.Symbol("E", positive=True)
    final = SoftmaxState(M, E * sympy.exp(-M), A * sympy.exp(-M))  # state(K), K nonempty
    out, lse = spec.finalize(final)
    return check_identities("finalize(state(K)) = (A/E, log E) = (softmax(s) v, logsumexp(s)) for nonempty K",
                            [("out", out, A / E), ("lse", lse, sympy.log(E))], budget=budget,
                            hypotheses=("K nonempty: E > 0",))


# ---- negative controls


def merge_without_running_max(a, b):
    """BROKEN: keeps the old maximum instead of max(m_old, m_tile)."""
    from attnformal import ops

    shift = spec.finite_shift(a.m)
    alpha, beta = ops.exp(a.m - shift), ops.exp(b.m - shift)
    return SoftmaxState(a.m, alpha * a.l + beta * b.l, alpha * a.acc + beta * b.acc)


def finalize_without_log(state):
    """BROKEN: lse = m + l instead of m + log(l)."""
    out, _ = FINALIZE(state)
    return out, state.m + state.l


FINALIZE = spec.finalize  # the real one, which the broken variant calls for ``out``

CONTROLS = (
    Control("running max not updated", "merge keeps m_old instead of max(m_old, m_tile)",
            spec, "merge", merge_without_running_max, step),
    Control("lse without log", "finalize returns m + l instead of m + log(l)",
            spec, "finalize", finalize_without_log, termination),
)
