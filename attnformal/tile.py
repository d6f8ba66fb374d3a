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


def tile_scores(q, k, scale, softcap=None, allowed=None, bias=None):
    """``(s, slope)``: scores ``[..., BM, BN]`` of a tile and the softcap derivative.

    ``s = scale * q k^T``, then capped (after scaling), then plus ``bias`` (the tile's additive
    score bias: ALiBi and ``bias``, see :meth:`AttentionSpec.score_bias`), then ``-inf`` where
    ``allowed`` is False (``allowed=None``: a FULL tile, nothing to mask). ``slope`` is
    ``ds/d(raw)``, ``1 - tanh^2``, taken from the unmasked capped scores so it stays finite;
    None without softcap.
    """
    s = scale * (q @ k.swapaxes(-1, -2))
    slope = None
    if softcap is not None:
        s = apply_softcap(s, softcap)
        slope = softcap_slope(s, softcap)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = ops.where(allowed, s, NEG_INF)
    return s, slope


def softcap_slope(capped, softcap):
    """``d capped / d raw`` of ``capped = softcap tanh(raw / softcap)``: ``1 - tanh^2``, from the capped scores."""
    return 1 - (capped / softcap) * (capped / softcap)


def tile_grads(q, k, v, grad_out, lse, delta, *, scale, softcap=None, allowed=None, weights=None,
               grad_lse=None, bias=None):
    """``(dq, dk, dv)`` contributions of one tile, per query head (see :func:`tile_grads_and_dbias`)."""
    return tile_grads_and_dbias(q, k, v, grad_out, lse, delta, scale=scale, softcap=softcap, allowed=allowed,
                                weights=weights, grad_lse=grad_lse, bias=bias)[:3]


def tile_grads_and_dbias(q, k, v, grad_out, lse, delta, *, scale, softcap=None, allowed=None, weights=None,
                         grad_lse=None, bias=None):
    """``(dq, dk, dv, dbias)`` contributions of one tile, per query head.

    ``lse``, ``delta`` (``= rowsum(dO * O)``) and ``grad_lse`` are ``[..., BM, 1]``;
    ``weights`` are the dropout weights the forward used (0 or ``1/(1-p)``); ``bias`` the
    tile's additive score bias. P is recomputed from the saved ``lse`` (which includes a sink's
    term, so P is already normalised with it); masked entries and empty rows give ``P = 0``.
    ``dbias`` is the gradient w.r.t. the final scores ``dS`` (a bias is added to them),
    taken before the softcap's chain rule.
    """
    s, slope = tile_scores(q, k, scale, softcap, allowed, bias)
    return score_grads(s, slope, q, k, v, grad_out, lse, delta, scale=scale, weights=weights, grad_lse=grad_lse)


def score_grads(s, slope, q, k, v, grad_out, lse, delta, *, scale, weights=None, grad_lse=None):
    """:func:`tile_grads_and_dbias` from the tile's final scores ``s`` and the softcap's ``slope`` (those of
    :func:`tile_scores`): where the TTIR prover takes over a kernel's own score tile."""
    p = ops.exp(s - finite_shift(lse))
    dp = grad_out @ v.swapaxes(-1, -2)  # gradient w.r.t. the probabilities the output used
    dropped = p
    if weights is not None:
        dropped = p * weights
        dp = dp * weights
    ds = p * (dp - delta)
    if grad_lse is not None:
        ds = ds + p * grad_lse  # d lse / d s_j = P_j
    dbias = ds
    if slope is not None:
        ds = ds * slope
    return scale * (ds @ k), scale * (ds.swapaxes(-1, -2) @ q), dropped.swapaxes(-1, -2) @ grad_out, dbias


def sink_grads(sink, lse, delta, grad_lse=None):
    """Each row's contribution to ``d sink``: ``p_sink * (grad_lse - delta)``, ``p_sink = exp(sink - lse)``.

    The sink enters ``out`` only through the denominator (``d out / d sink = -p_sink * out``) and
    ``lse`` with weight ``p_sink``. ``finite_shift`` keeps a ``-inf`` sink on an empty row at 0, not NaN.
    """
    p_sink = ops.exp(sink - finite_shift(lse))
    d = -p_sink * delta
    return d if grad_lse is None else d + p_sink * grad_lse
