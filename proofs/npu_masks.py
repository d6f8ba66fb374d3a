"""Obligation 9 -- Ascend NPU mask semantics (``torch_npu.npu_fusion_attention``).

:func:`attnformal.npu.npu_keeps` states the documented semantics of ``sparse_mode`` 0-4
(sources in :mod:`attnformal.npu`); :func:`attnformal.npu.npu_mask_args` maps a spec mask to
``(sparse_mode, pre_tokens, next_tokens)``.

**Theorem 9 (Z3, all lengths ``0 <= len_q, len_k <= 2**31 - 1``).** For every spec mask
geometry -- causal none / top-left / bottom-right, times no window / a window ``(L, R)`` with
symbolic bounds, times no / an explicit ``attn_mask`` (an uninterpreted ``attn_mask(i, j)``) --
for which ``npu_mask_args`` returns arguments, and every ``i, j``:

    npu_keeps(i, j, *npu_mask_args(g), atten_mask=...) = may_attend(i, j, g) and attn_mask(i, j)

with ``atten_mask = npu_atten_mask(allowed) = not allowed`` in mode 1 (True = masked out) and
none otherwise. So, for all lengths: mode 0 without a mask is no mask; mode 2 is causal
top-left; mode 3 is causal bottom-right; mode 4 with ``(pre, next) = (L, R)`` is the window
``(L, R)`` aligned bottom-right (and with ``next = 0`` that window cut by bottom-right causal);
mode 1 with the inverted dense mask is any explicit mask. The length bound is the NPU's own
(int32 lengths; ``INT_MAX`` stands for an unbounded side). Top-left causal with a window is
rejected by ``npu_mask_args`` (``NotImplementedError``), so it has no case here.

**Theorem 9b (TND layout, Z3, all B and cumulative lengths).** With ``actual_seq_qlen`` /
``actual_seq_kvlen`` = ``cu_seqlens_q[1:]`` / ``cu_seqlens_k[1:]`` (:func:`attnformal.npu.npu_varlen_args`),
the NPU's sequence ``b`` (from ``npu_sequence_start``) starts at the spec's packed ``cu[b]`` and has its
length; so theorem 9, for all lengths, applies to every sequence of a TND call (modes 0, 2-4 drawn per
sequence: the modelling assumption stated in :mod:`attnformal.npu`). Sparse modes 5-8 are not mapped.
"""

from __future__ import annotations

import itertools

import z3

from attnformal import masks, npu
from attnformal.logic import Budget, Control, Query, Settings, check_z3
from attnformal.features import varlen
from attnformal.features.base import element
from attnformal.masks import MaskGeometry
from attnformal.spec import AttentionSpec

TITLE = "Ascend NPU mask semantics"


def checks(settings: Settings, budget: Budget):
    yield mapping_is_exact(budget)
    yield tnd_sequences_are_the_packed_ones(budget)


def tnd_sequences_are_the_packed_ones(budget: Budget):
    """Theorem 9b: with ``actual_seq_len`` = ``npu_varlen_args``'s ``cu[1:]``, the NPU's sequence ``b`` starts
    and ends where the spec's packed map puts it (all B, all cumulative lengths): so theorem 9 applies to each
    sequence with its own lengths, and the TND call computes the spec's packed predicate."""

    def queries():
        b, batch, x = z3.Ints("b B x")
        for side in ("q", "k"):
            cu = z3.Array(f"cu_{side}", z3.IntSort(), z3.IntSort())
            spec = AttentionSpec(batch=batch, heads_q=1, heads_kv=1, len_q=cu[batch], len_k=cu[batch], head_dim=1,
                                 head_dim_v=1, scale=1.0, cu_seqlens_q=cu, cu_seqlens_k=cu)
            actual = z3.Lambda([x], cu[x + 1])  # the list cu[1:], as an array
            start, stop = npu.npu_sequence_start(actual, b), npu.npu_sequence_start(actual, b + 1)
            claim = z3.And(start == varlen.sequence_start(cu, b), stop - start == spec.sequence_lengths(b)[0])
            hypotheses = (("cu[0] = 0", cu[0] == 0), ("0 <= b < B", z3.And(0 <= b, b < batch)))
            yield Query(claim, hypotheses, {"b": b, "npu start": start, "cu[b]": cu[b]}, case=f"actual_seq_{side}len")

    return check_z3("TND: sequence b of actual_seq_qlen/kvlen = cu[1:] is the spec's packed sequence b", queries(),
                    budget=budget)


def mapping_is_exact(budget: Budget, families=None):
    def queries():
        len_q, len_k, left, right, i, j = z3.Ints("len_q len_k L R i j")
        data = z3.Function("attn_mask", z3.IntSort(), z3.IntSort(), z3.BoolSort())
        for causal, window, has_mask in itertools.product(masks.CAUSAL_MODES, (None, (left, right)), (False, True)):
            g = MaskGeometry(len_q, len_k, causal, window, has_mask)
            try:
                mode, pre, following = npu.npu_mask_args(g)
            except NotImplementedError:
                continue
            allowed = masks.may_attend(i, j, g)
            if has_mask:
                allowed = z3.And(allowed, data(i, j))
            atten_mask = npu.npu_atten_mask(allowed) if mode == 1 else None
            keeps = npu.npu_keeps(i, j, sparse_mode=mode, pre_tokens=pre, next_tokens=following,
                                  len_q=len_q, len_k=len_k, atten_mask=atten_mask)
            label = (f"causal={causal}, {'window=(L, R)' if window else 'no window'}, "
                     f"{'attn_mask' if has_mask else 'no attn_mask'} -> sparse_mode={mode}")
            hypotheses = (("0 <= len_q, len_k <= INT_MAX", z3.And(0 <= len_q, len_q <= npu.INT_MAX,
                                                                  0 <= len_k, len_k <= npu.INT_MAX)),)
            show = {"len_q": len_q, "len_k": len_k, "i": i, "j": j, "pre_tokens": pre, "next_tokens": following,
                    "npu keeps": keeps, "spec allows": allowed}
            if window:
                show.update(L=left, R=right)
            yield Query(keeps == allowed, hypotheses, show, case=label)

    return check_z3("npu_keeps(i, j, *npu_mask_args(g)) = allowed(i, j) for every expressible spec mask",
                    queries(), budget=budget)


# ---- negative controls


def _mode_2_for_bottom_right(g):
    mode, pre, following = _SPEC_ARGS(g)
    return (2, pre, following) if mode == 3 else (mode, pre, following)


def _pre_next_swapped(g):
    mode, pre, following = _SPEC_ARGS(g)
    return mode, following, pre


_SPEC_ARGS = npu.npu_mask_args


CONTROLS = (
    Control("top-left mode for bottom-right", "bottom-right causal mapped to sparse_mode=2 (leftUpCausal)",
            npu, "npu_mask_args", _mode_2_for_bottom_right, mapping_is_exact),
    Control("pre/next swapped", "the window's left bound passed as next_tokens and the right as pre_tokens",
            npu, "npu_mask_args", _pre_next_swapped, mapping_is_exact),
    Control("actual_seq_len with a leading 0", "actual_seq_qlen indexed as if it were cu_seqlens (leading 0 kept)",
            npu, "npu_sequence_start", element, tnd_sequences_are_the_packed_ones),
    Control("atten_mask polarity", "the torch mask (True = may attend) passed as atten_mask unchanged",
            npu, "npu_atten_mask", lambda allowed: allowed, mapping_is_exact),
)
