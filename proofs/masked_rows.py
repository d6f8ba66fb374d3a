"""Obligation 4 -- masked keys and empty rows.

The tile pipeline is the spec's own: ``s = tile_scores(q, k, scale, allowed=mask)`` then
``block_state(s, v, w)``, on extended reals with a symbolic mask (``n = 3`` keys; the scores
are passed through ``tile_scores`` as ``q = [[1]]``, ``k = s``, ``scale = 1``; ``w`` are
dropout weights).

**Theorem 4a (masking happens before the max and the denominator; Z3).** If some key is
allowed, the tile's state is that of the allowed keys alone: ``m = M`` (the max over allowed
keys), ``l = sum_{allowed} exp(s_j - M)``, ``acc = sum_{allowed} exp(s_j - M) w_j v_j`` --
a masked key, however large its score, changes nothing.

**Theorem 4b (empty rows; Z3).** If no key of the tile is allowed, its state is the identity
``(-inf, 0, 0)``; merging it into the identity leaves the identity; and ``finalize`` of the
identity is ``out = 0, lse = -inf``. By the monoid laws, a row with no allowed key anywhere
stays at the identity through every tile and finalises to ``(0, -inf)``.

**Theorem 4c (late keys; Z3).** A row whose only allowed keys arrive in a late tile ``T``:
folding two fully masked tiles and then ``state(T)`` from the empty state gives ``state(T)``.
"""

from __future__ import annotations

import itertools

import numpy as np
import z3

from attnformal import merge as spec
from attnformal import ops, tile
from attnformal.domains import ExtendedReal, extended_reals
from attnformal.logic import Budget, Control, Query, Settings, check_z3
from attnformal.merge import SoftmaxState
from attnformal.proofs import pipeline
from attnformal.proofs.keysets import EXP_AXIOMS, EXP_POSITIVE, EXP_ZERO, KeySet, empty_state, same_state, show_state

TITLE = "Masked keys and empty rows"
WIDTH = 3


def checks(settings: Settings, budget: Budget):
    yield mask_before_max(budget)
    yield empty_row(budget)
    yield late_keys(budget)


class Tile:
    """Symbolic scores, values, dropout weights and mask of one row of ``WIDTH`` keys."""

    def __init__(self, name="t"):
        self.scores = extended_reals(" ".join(f"{name}.s{j}" for j in range(WIDTH)))
        self.values = extended_reals(" ".join(f"{name}.v{j}" for j in range(WIDTH)))
        self.weights = extended_reals(" ".join(f"{name}.w{j}" for j in range(WIDTH)))
        self.allowed = [z3.Bool(f"{name}.allowed{j}") for j in range(WIDTH)]

    def state(self, allowed=None) -> SoftmaxState:
        """The spec's tile pipeline (masking in tile_scores, then block_state), as a row state."""
        allowed = self.allowed if allowed is None else allowed
        state = pipeline.tile_state(np.array([[ExtendedReal.finite(1)]], dtype=object), column(self.scores),
                                    column(self.values), np.array([allowed], dtype=object),
                                    np.array([self.weights], dtype=object))
        return SoftmaxState(*(x[0, 0] for x in state))

    def show(self, allowed=None):
        allowed = self.allowed if allowed is None else allowed
        return {**{f"s{j}": s for j, s in enumerate(self.scores)},
                **{f"allowed{j}": a for j, a in enumerate(allowed)}}


def mask_before_max(budget: Budget):
    def queries():
        t = Tile()
        M = z3.Real("M")
        for allowed in itertools.product((False, True), repeat=WIDTH):
            if not any(allowed):
                continue  # theorem 4b
            kept = [s for a, s in zip(allowed, t.scores) if a]
            hypotheses = (  # M is the max over the allowed keys, by its definition
                ("M >= every allowed score", z3.And(*(s.value <= M for s in kept))),
                ("M is an allowed score", z3.Or(*(s.value == M for s in kept))),
            )
            weight = [ops.exp(s.value - M) for s in t.scores]
            expected = SoftmaxState(
                ExtendedReal.finite(M),
                ExtendedReal.finite(sum(e for a, e in zip(allowed, weight) if a)),
                ExtendedReal.finite(sum(e * w.value * v.value
                                        for a, e, w, v in zip(allowed, weight, t.weights, t.values) if a)))
            state = t.state(list(allowed))
            yield Query(same_state(state, expected), hypotheses, {**t.show(list(allowed)), "M": M,
                                                                 **show_state("tile", state)},
                        case="allowed " + str([j for j in range(WIDTH) if allowed[j]]))

    return check_z3("some key allowed => block_state(tile_scores(.., mask)) = state of the allowed keys only",
                    queries(), budget=budget, axioms=(EXP_POSITIVE, EXP_ZERO))


def empty_row(budget: Budget):
    t = Tile()
    masked = [False] * WIDTH
    state = t.state(masked)
    identity = empty_state()
    row = spec.merge(identity, state)
    out, lse = spec.finalize(row)
    claim = z3.And(same_state(state, identity), same_state(row, identity),
                   ExtendedReal.lift(out).same(0), ExtendedReal.lift(lse).same(float("-inf")))
    show = {**t.show(masked), **{f"v{j}": v for j, v in enumerate(t.values)}, **show_state("tile", state),
            "out": ExtendedReal.lift(out), "lse": ExtendedReal.lift(lse)}
    return check_z3("no key allowed => tile state = identity, merge keeps it, finalize gives (0, -inf)",
                    [Query(claim, show=show)], budget=budget, axioms=EXP_AXIOMS)


def late_keys(budget: Budget):
    masked = [False] * WIDTH
    first, second, late = Tile("t1").state(masked), Tile("t2").state(masked), KeySet("T", False)
    state = empty_state()
    for tile_state in (first, second, late.state()):
        state = spec.merge(state, tile_state)
    return check_z3("masked, masked, then T: the fold from the empty state gives state(T)",
                    [Query(same_state(state, late.state()), late.facts(),
                           {**late.show(), **show_state("fold", state)})],
                    budget=budget, axioms=EXP_AXIOMS)


def column(xs):
    return np.array([[x] for x in xs], dtype=object)


# ---- negative controls

CONTROLS = (
    Control("mask applied after the max", "block_state takes the max over all scores, masked ones included, "
            "and zeroes masked keys only afterwards", pipeline, "tile_state", pipeline.mask_after_max_state,
            mask_before_max),
    Control("finite -1e4 mask sentinel", "tile_scores writes -10000 instead of -inf at masked keys",
            tile, "NEG_INF", -1e4, empty_row),
)
