"""The online-softmax state and its merge, written once for every interpretation.

For a set ``K`` of allowed keys of one query row, the state is::

    m   = max_{j in K} s_j                       (-inf when K is empty)
    l   = sum_{j in K} exp(s_j - m)
    acc = sum_{j in K} exp(s_j - m) * w_j * v_j   (w_j: dropout weight, 1 without dropout)

and the answer is ``out = acc / l``, ``lse = m + log l``. Merging the states of two
disjoint key sets gives the state of their union, so a kernel may fold tiles in any
order, split the keys across programs or devices, and merge the partial states.

An attention **sink** (a per-head logit that joins the denominator and carries no value) is one
more state, :func:`sink_state` ``(sink, 1, 0)``: the kernels merge it into the row state (they
start the fold from it), so every law above carries over and nothing else changes. A row with
no allowed key then finalises to ``out = 0`` and ``lse = sink``; a sink of ``-inf`` merges as
the identity (no sink).

Kernels compute each tile with :func:`block_state` and fold it with :func:`merge`; split-KV
combines partial states with the same :func:`merge`; :func:`finalize` produces the output.
The prover checks exactly these functions (on SymPy, Z3 real and Z3 IEEE terms).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from attnformal import ops
from attnformal.ops import NEG_INF


class SoftmaxState(NamedTuple):
    m: Any  # running maximum of the allowed scores seen so far; -inf before the first
    l: Any  # sum of exp(s - m) over them
    acc: Any  # sum of exp(s - m) * w * v over them


def finite_shift(m):
    """The shift used in ``exp(s - shift)``: ``m`` itself, or 0 when no key was allowed.

    With ``m = -inf`` every score is -inf too, and ``-inf - (-inf)`` is NaN; any finite
    shift instead gives ``exp(-inf - 0) = 0``, the right weight for an excluded key.
    """
    return ops.where(ops.is_neg_inf(m), 0.0, m)


def block_state(s, v, weights=None) -> SoftmaxState:
    """The state of one tile.

    ``s``: scores ``[..., BM, BN]`` with disallowed entries already ``-inf`` (so they
    never reach the max or the denominator); ``v``: values ``[..., BN, Dv]``;
    ``weights``: optional dropout weights ``[..., BM, BN]`` (0 or ``1/(1-p)``), applied
    after the denominator, so dropout never changes ``l`` or ``lse``.
    """
    m = ops.rowmax(s)
    p = ops.exp(s - finite_shift(m))
    l = ops.rowsum(p)
    if weights is not None:
        p = p * weights
    return SoftmaxState(m, l, ops.matmul(p, v))


def merge(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """The state of the union of two disjoint key sets (associative, commutative, unit = empty)."""
    m = ops.maximum(a.m, b.m)
    shift = finite_shift(m)
    alpha = ops.exp(a.m - shift)  # rescales a from its own max to the common one; <= 1
    beta = ops.exp(b.m - shift)
    return SoftmaxState(m, alpha * a.l + beta * b.l, alpha * a.acc + beta * b.acc)


def sink_state(sink) -> SoftmaxState:
    """The state of a sink logit: the key set of one score ``sink`` whose value is 0.

    ``l = exp(sink - sink) = 1`` and ``acc = 0`` (scalars: they broadcast against the row
    state they are merged into). Dropout does not apply to it: it has no value to drop.
    """
    return SoftmaxState(sink, 1.0, 0.0)


def finalize(state: SoftmaxState):
    """``(out, lse)``; a row that saw no allowed key gives ``out = 0`` and ``lse = -inf``."""
    seen = state.l > 0
    l_safe = ops.where(seen, state.l, 1.0)  # keeps the unused branch free of 0/0
    out = ops.where(seen, state.acc / l_safe, 0.0)
    lse = ops.where(seen, state.m + ops.log(l_safe), NEG_INF)
    return out, lse


def empty_state(rows: tuple[int, ...], head_dim_v: int, *, dtype, device=None) -> SoftmaxState:
    """The identity of :func:`merge` as torch tensors: ``m = -inf, l = 0, acc = 0``."""
    import torch

    return SoftmaxState(
        torch.full((*rows, 1), NEG_INF, dtype=dtype, device=device),
        torch.zeros((*rows, 1), dtype=dtype, device=device),
        torch.zeros((*rows, head_dim_v), dtype=dtype, device=device),
    )


def initial_state(empty: SoftmaxState, sinks=None) -> SoftmaxState:
    """The state a row's fold starts from: the identity ``empty``, merged with the sink state if any.

    ``sinks``: None, or the sink logit of each row, shaped like ``empty.m``.
    """
    return empty if sinks is None else merge(empty, sink_state(sinks))
