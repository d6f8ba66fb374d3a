"""What a kernel computes on one tile: its scores, and its FlashAttention-2 backward.

Both are written with ``@``, ``swapaxes`` and :mod:`attnformal.ops`, so they run on torch
tiles in the kernels and on numpy arrays of SymPy symbols in the prover, which checks
:func:`tile_grads` against the exact derivative of the forward.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.merge import finite_shift
from attnformal.ops import NEG_INF
from attnformal.spec import apply_softcap


def tile_scores(q, k, scale, softcap=None, allowed=None):
    """``(s, slope)``: scores ``[..., BM, BN]`` of a tile and the softcap derivative.

    ``s = scale * q k^T``, then capped (after scaling), then ``-inf`` where ``allowed`` is
    False (``allowed=None``: a FULL tile, nothing to mask). ``slope`` is ``ds/d(raw)``,
    ``1 - tanh^2``, taken from the unmasked capped scores so it stays finite; None
    without softcap.
    """
    s = scale * (q @ k.swapaxes(-1, -2))
    slope = None
    if softcap is not None:
        s = apply_softcap(s, softcap)
        slope = 1 - (s / softcap) * (s / softcap)
    if allowed is not None:
        s = ops.where(allowed, s, NEG_INF)
    return s, slope


def tile_grads(q, k, v, grad_out, lse, delta, *, scale, softcap=None, allowed=None, weights=None,
               grad_lse=None):
    """``(dq, dk, dv)`` contributions of one tile, per query head.

    ``lse``, ``delta`` (``= rowsum(dO * O)``) and ``grad_lse`` are ``[..., BM, 1]``;
    ``weights`` are the dropout weights the forward used (0 or ``1/(1-p)``).
    P is recomputed from the saved ``lse``; masked entries and empty rows give ``P = 0``.
    """
    s, slope = tile_scores(q, k, scale, softcap, allowed)
    p = ops.exp(s - finite_shift(lse))
    dp = grad_out @ v.swapaxes(-1, -2)  # gradient w.r.t. the probabilities the output used
    dropped = p
    if weights is not None:
        dropped = p * weights
        dp = dp * weights
    ds = p * (dp - delta)
    if grad_lse is not None:
        ds = ds + p * grad_lse  # d lse / d s_j = P_j
    if slope is not None:
        ds = ds * slope
    return scale * (ds @ k), scale * (ds.swapaxes(-1, -2) @ q), dropped.swapaxes(-1, -2) @ grad_out
