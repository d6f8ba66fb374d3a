"""Obligation 7 -- the FlashAttention-2 backward identities of ``tile_grads``.

The exact forward loss, from the spec's definition (``spec.py``), in SymPy: for a query block
of ``BM = 2`` rows and ``BN = 2`` keys, head dims 1, symbolic ``q, k, v, dO``, scale ``1/3``,
a mask ``allowed``, optional softcap ``c``, dropout weights ``w`` and a gradient ``g`` of ``lse``:

    s = scale q k^T;  s = c tanh(s / c)             (softcap, after the scale)
    P = softmax over allowed keys of s;  lse = log sum_{allowed} exp(s)
    O = (P * w) v                                    (w = keep / (1 - p); 1 without dropout)
    L = sum(dO * O) + sum(g * lse)

**Theorem 7 (SymPy, exact).** ``tile_grads(q, k, v, dO, lse, D, ...)``, which recomputes
``P = exp(s - lse)`` and uses

    dV = (P * w)^T dO,   dP = (dO V^T) * w,   dS = P * (dP - D) + P * g,
    dS *= 1 - tanh^2(s_raw / c)  (softcap),   dQ = scale dS K,   dK = scale dS^T Q,

equals ``(dL/dQ, dL/dK, dL/dV)`` from ``sympy.diff``, entry by entry, when
``D = rowsum(dO * O)`` **with O the dropped output** -- equivalently ``D = rowsum(P * w * (dO V^T))``:
D uses the dropped probabilities ``P * w``, the ones that produced ``O``, exactly as
FlashAttention computes it from the saved output. Variants: masked (and split into two key
tiles whose contributions are summed -- what the kernel does), softcap, dropout, lse gradient,
and a fully masked row (``lse = -inf``: zero gradients).
"""

from __future__ import annotations

import sys

import numpy as np
import sympy

from attnformal import tile
from attnformal.logic import Budget, Control, Settings, check_identities
from attnformal.spec import apply_softcap

COST = 2  # rough seconds; the prover starts the longest obligations first
TITLE = "Backward identities"
BM, BN = 2, 2
SCALE = sympy.Rational(1, 3)
ALLOWED = np.array([[True, False], [True, True]], dtype=object)


def output_delta(problem):
    """``D = rowsum(dO * O)`` with ``O`` the output the forward returned (dropout applied)."""
    return (problem.grad_out * problem.out).sum(axis=1, keepdims=True)


def _matrix(name, rows, cols, **assumptions):
    return np.array([[sympy.Symbol(f"{name}{r}{c}", **assumptions) for c in range(cols)] for r in range(rows)],
                    dtype=object)


class Problem:
    """Symbols and the exact forward loss for one variant."""

    def __init__(self, allowed=ALLOWED, softcap=None, dropout=False, lse_gradient=False):
        self.allowed, self.softcap = allowed, softcap
        self.q, self.k = _matrix("q", BM, 1, real=True), _matrix("k", BN, 1, real=True)
        self.v = _matrix("v", BN, 1, real=True)
        self.grad_out = _matrix("dO", BM, 1, real=True)
        self.weights = _matrix("w", BM, BN, nonnegative=True) if dropout else None
        self.grad_lse = _matrix("g", BM, 1, real=True) if lse_gradient else None
        s = SCALE * (self.q @ self.k.T)
        if softcap is not None:
            s = apply_softcap(s, softcap)
        e = np.where(allowed.astype(bool), np.vectorize(sympy.exp, otypes=[object])(s), 0)
        total = e.sum(axis=1, keepdims=True)
        seen = np.array([[bool(any(row))] for row in allowed.astype(bool)])
        self.p = np.where(seen, e / np.where(seen, total, 1), 0)  # an empty row: P = 0, O = 0
        self.lse = np.where(seen, np.vectorize(sympy.log, otypes=[object])(np.where(seen, total, 1)), -sympy.oo)
        self.out = (self.p if self.weights is None else self.p * self.weights) @ self.v
        self.loss = (self.grad_out * self.out).sum()
        if lse_gradient:
            self.loss += (self.grad_lse * self.lse).sum()
        self.delta = output_delta(self)

    def grads(self, columns=((0, BN),)):
        """``tile_grads`` over the key tiles ``columns``, summed as the kernel does."""
        dq, dk, dv = 0, [], []
        for start, stop in columns:
            tq, tk, tv = tile.tile_grads(
                self.q, self.k[start:stop], self.v[start:stop], self.grad_out, self.lse,
                self.delta, scale=SCALE, softcap=self.softcap,
                allowed=self.allowed[:, start:stop],
                weights=None if self.weights is None else self.weights[:, start:stop], grad_lse=self.grad_lse)
            dq, dk, dv = dq + tq, dk + list(tk), dv + list(tv)
        return dq, np.array(dk, dtype=object), np.array(dv, dtype=object)

    def pairs(self, grads):
        for name, grad, x in zip(("dQ", "dK", "dV"), grads, (self.q, self.k, self.v)):
            for index in np.ndindex(x.shape):
                yield f"{name}{list(index)}", grad[index], sympy.diff(self.loss, x[index])


def _check(claim, problem, budget, **kwargs):
    return check_identities(claim, problem.pairs(problem.grads(**kwargs)), budget=budget,
                            hypotheses=("q, k, v, dO real", "dropout weights >= 0"))


def checks(settings: Settings, budget: Budget):
    yield masked_two_tiles(budget)
    yield softcap(budget)
    yield dropout(budget)
    yield _check("with an lse gradient g: dS += P * g", Problem(lse_gradient=True), budget)
    yield _check("a fully masked row (lse = -inf) gets zero gradients",
                 Problem(allowed=np.array([[True, True], [False, False]], dtype=object)), budget)


def masked_two_tiles(budget):
    return _check("masked, over two key tiles summed: tile_grads = exact gradients", Problem(), budget,
                  columns=((0, 1), (1, 2)))


def softcap(budget):
    return _check("with softcap: dS gets the chain factor 1 - tanh^2", Problem(softcap=sympy.Integer(5)), budget)


def dropout(budget):
    return _check("with dropout: D = rowsum(dO * O_dropped) = rowsum(P * w * dP)", Problem(dropout=True), budget)


# ---- negative controls


def undropped_delta(problem):
    """BROKEN: D from the probabilities before dropout, D = rowsum(dO * (P V))."""
    return (problem.grad_out * (problem.p @ problem.v)).sum(axis=1, keepdims=True)


def scores_without_slope(*args, **kwargs):
    """BROKEN: tile_scores that forgets the softcap slope, so dS misses 1 - tanh^2."""
    return TILE_SCORES(*args, **kwargs)[0], None


TILE_SCORES = tile.tile_scores

CONTROLS = (
    Control("D from undropped probabilities", "D = rowsum(dO * (P V)) ignoring the dropout weights",
            sys.modules[__name__], "output_delta", undropped_delta, dropout),
    Control("softcap chain rule dropped", "tile_scores returns no slope, so dS misses 1 - tanh^2",
            tile, "tile_scores", scores_without_slope, softcap),
)
