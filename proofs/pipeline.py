"""The spec's tile pipeline as obligations 4 and 8 run it, and the broken variant of a control.

A row of ``n`` keys goes through ``tile_scores`` with ``q = [[1]]``, ``k`` the column of raw
scores and ``scale = 1``, so the scores are the given ones and only the masking step of
``tile_scores`` acts; then ``block_state``. The obligations call :func:`tile_state` through
this module, so a negative control can swap in :func:`mask_after_max_state`.
"""

from __future__ import annotations

from attnformal import merge as spec
from attnformal import ops, tile
from attnformal.merge import SoftmaxState


def tile_state(q, k, v, allowed, weights=None) -> SoftmaxState:
    """``block_state(tile_scores(q, k, 1, allowed=allowed), v, weights)``."""
    s, _ = tile.tile_scores(q, k, 1.0, allowed=allowed)
    return spec.block_state(s, v, weights)


def mask_after_max_state(q, k, v, allowed, weights=None) -> SoftmaxState:
    """BROKEN: the max is taken over all scores, masked ones included; masking comes after."""
    s, _ = tile.tile_scores(q, k, 1.0)
    m = ops.rowmax(s)
    p = ops.where(allowed, ops.exp(s - spec.finite_shift(m)), 0.0)
    l = ops.rowsum(p)
    if weights is not None:
        p = p * weights
    return SoftmaxState(m, l, ops.matmul(p, v))
