"""Ascend ``torch_npu.npu_fusion_attention`` mask semantics, and the spec masks they express.

Sources (read for this module; the statements below are what they document):

* the torch_npu API reference of ``npu_fusion_attention`` (hiascend.com, "ptaoplist"
  pages, CANN 7.0 to 8.0): ``atten_mask`` -- "1 means the position does not take part in the
  computation, 0 means it does" (**True = masked OUT**, the opposite of torch's ``attn_mask``);
  ``pre_tockens`` / ``next_tockens`` -- how many tokens before / after the query the attention
  is computed with, default 2147483647; ``sparse_mode`` 0-8;
* "sparseMode Introduction", hicann/ops-transformer ``docs/en/context/sparse_mode_introduction.md``:
  mode 0 (defaultMask): without ``atten_mask`` nothing is masked and pre/next are ignored; with
  it, the band between pre and next is computed and ``atten_mask`` applies; mode 1 (allMask):
  only the full ``atten_mask``, pre/next ignored; mode 2 (leftUpCausal): lower triangle from the
  upper-left vertex; mode 3 (rightDownCausal): lower triangle from the lower-right vertex; mode 4
  (band): the band between pre and next, "the parameter starting point is the lower-right
  corner"; modes 2-4 take the compressed 2048x2048 ``triu(ones, 1)`` as ``atten_mask``;
  modes 5-8 (prefix, varlen outer split) are not modelled here;
* torch_npu's own test ``test/custom_ops/test_npu_fusion_attention.py``: for mode 0 it builds
  ``atten_mask = triu(ones, k=next+1) + tril(ones, k=-pre-1)``, i.e. keeps ``-pre <= j - i <= next``.

With ``offset = len_k - len_q``, key ``j`` is kept for query ``i`` (both in range) iff

    mode 0: -pre <= j - i <= next and not atten_mask[i, j]    (no atten_mask: every key)
    mode 1: not atten_mask[i, j]
    mode 2: j <= i
    mode 3: j <= i + offset
    mode 4: -pre <= j - i - offset <= next

Obligation 9 proves, for all lengths below ``2**31`` (the NPU's int32 lengths), that
:func:`npu_keeps` with the arguments of :func:`npu_mask_args` is the spec's ``may_attend``.

Score bias (``pse``). The MindSpeed ``fusion_attention`` interface document (docs/zh/ops/
fusion_attention.md) and MindSpore's ``speed_fusion_attention`` reference state two formulas:
``pse_type = 1`` (the default) gives ``Softmax(Mask(scale * (pse + q k^T)))``, any other valid
value ``Softmax(Mask(scale * q k^T + pse))``; ops-transformer's ``pse.h`` names 0
``PSE_OUTER_MUL_ADD_TYPE`` (an outer pse added after the scale). ``pse`` is 4-D: ``BNSS``,
``BN1Skv`` or ``1NSS``, in the dtype of q (FLOAT16/BFLOAT16; older pages also FLOAT). So the
spec's additive score bias (ALiBi's and ``bias``, without softcap: the NPU has none) is
:func:`npu_pse` with ``pse_type = 0``, exactly for float32 inputs and rounded once to q's dtype
otherwise. Not mapped: ``pse_type = 2, 3`` (ALiBi generated inside from float32 slopes with
``q_start_idx``/``kv_start_idx``: the documents do not state the distance's alignment), and
attention sinks -- npu_fusion_attention has no parameter for a logit without a value.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.features import with_role
from attnformal.features.base import element
from attnformal.masks import MaskGeometry

MAPPED = ("causal", "window")  # the index-mask features npu_mask_args maps to a sparse mode; others: mode 1
INT_MAX = 2147483647  # torch_npu's default pre_tockens / next_tockens: "no limit"


def npu_keeps(i, j, *, sparse_mode, pre_tokens, next_tokens, len_q, len_k, atten_mask=None):
    """True iff ``npu_fusion_attention`` lets query ``i`` attend key ``j`` (documented semantics).

    ``atten_mask`` is the value of ``atten_mask[i, j]`` (True = masked OUT) for modes 0 and 1,
    or None when no mask is passed; modes 2-4 take the fixed compressed triangle, which carries
    no per-position choice, so it is not an argument here. Works on ints, torch tensors, Z3 Ints.
    """
    in_range = ops.and_(0 <= i, i < len_q, 0 <= j, j < len_k)
    offset = len_k - len_q
    if sparse_mode == 0:
        if atten_mask is None:
            return in_range
        return ops.and_(in_range, -pre_tokens <= j - i, j - i <= next_tokens, ops.not_(atten_mask))
    if sparse_mode == 1:
        if atten_mask is None:
            raise ValueError("sparse_mode=1 (allMask) needs the full atten_mask")
        return ops.and_(in_range, ops.not_(atten_mask))
    if sparse_mode == 2:
        return ops.and_(in_range, j <= i)
    if sparse_mode == 3:
        return ops.and_(in_range, j <= i + offset)
    if sparse_mode == 4:
        return ops.and_(in_range, -pre_tokens <= j - i - offset, j - i - offset <= next_tokens)
    raise NotImplementedError(f"sparse_mode={sparse_mode}: only modes 0-4 are modelled")


def npu_sequence_start(actual_seq_len, b):
    """Where sequence ``b`` starts in a TND tensor: CANN's ``actual_seq_qlen`` / ``actual_seq_kvlen`` are the
    *cumulative* lengths without the leading 0 (``[2, 5]``: sequences of 2 and 3 tokens)."""
    return ops.where(b == 0, 0, element(actual_seq_len, b - 1))


def npu_varlen_args(spec):
    """Keyword arguments of ``npu_fusion_attention(..., "TND", ...)`` for a packed spec.

    ``actual_seq_qlen = cu_seqlens_q[1:]``, ``actual_seq_kvlen = cu_seqlens_k[1:]``, and the sparse mode of
    :func:`npu_mask_args` for the sequences' geometry: in TND, modes 0, 2, 3 and 4 apply to each sequence with
    its own ``Sq``, ``Skv`` (the modelling assumption, from the sparse-mode page: the varlen masks are drawn per
    batch). Not mapped: ``kv_lens`` (TND has no padding: pack only the valid keys), an explicit mask, and the
    modes 7/8 -- "varlen circumscribed" cuts of one long sequence split across devices, whose band starts
    from a corner of the whole split sequence; for an unsplit batch they are modes 3/2, which are mapped.
    """
    mode, pre, following = npu_mask_args(spec.geometry(0))
    return {"input_layout": "TND", "actual_seq_qlen": list(spec.cu_seqlens_q[1:]),
            "actual_seq_kvlen": list(spec.cu_seqlens_k[1:]), "sparse_mode": mode, "pre_tockens": pre,
            "next_tockens": following}


def npu_atten_mask(allowed):
    """The dense ``atten_mask`` for modes 0 and 1 from a torch-style mask (True = may attend)."""
    return ops.not_(allowed)


def npu_mask_args(g: MaskGeometry):
    """``(sparse_mode, pre_tokens, next_tokens)`` under which the NPU applies the mask ``g``.

    * explicit ``attn_mask``: mode 1 -- pass ``atten_mask = npu_atten_mask(spec.allowed())``,
      the index rule folded in (modes 2-4 cannot take a user mask);
    * no causal, no window: mode 0 without ``atten_mask``;
    * causal top-left / bottom-right: mode 2 / mode 3;
    * a window (left, right), with or without bottom-right causal: mode 4 (band from the
      lower-right corner), ``pre = left``, ``next = right`` (``0`` under causal); a negative
      (unbounded) side becomes ``INT_MAX``;
    * top-left causal with a window: ``NotImplementedError`` -- it needs a band cut at
      ``next = min(right, len_q - len_k)``, negative whenever ``len_k > len_q``, which the band
      mode's documentation does not cover; pass it as an ``attn_mask`` instead.

    Modes 2-4 also need the compressed ``triu(ones(2048, 2048), 1)`` as ``atten_mask``.
    Window bounds may be ints or Z3 Ints. ``g.len_k`` must be the key length the NPU sees: with
    ``kv_lens``, slice the keys or pass ``actual_seq_kvlen``.
    """
    if g.has_attn_mask:
        return 1, INT_MAX, INT_MAX
    unmapped = [f.name for f in with_role("interval") if f.name not in MAPPED and f.active(g.values.get(f.name))]
    if unmapped:
        raise NotImplementedError(f"no sparse_mode is mapped for {unmapped[0]}; pass the mask as attn_mask "
                                  "(sparse_mode=1)")
    if g.window is None:
        return {None: 0, "top_left": 2, "bottom_right": 3}[g.causal], INT_MAX, INT_MAX
    if g.causal == "top_left":
        raise NotImplementedError("no sparse_mode combines a top-left causal cut with a bottom-right "
                                  "window for all lengths; pass the mask as attn_mask (sparse_mode=1)")
    left, right = g.window
    pre = ops.where(left < 0, INT_MAX, left)
    following = 0 if g.causal == "bottom_right" else ops.where(right < 0, INT_MAX, right)
    return 4, pre, following


NPU_PSE_TYPE = 0  # PSE_OUTER_MUL_ADD_TYPE: scale * q k^T + pse


def npu_pse(spec, device, dtype):
    """The spec's additive score bias (ALiBi and ``bias``) as npu_fusion_attention's ``pse``
    ``[B, N, Sq, Sk]`` in ``dtype``, for ``pse_type = NPU_PSE_TYPE``; None when there is none."""
    import torch

    bias = spec.dense_score_bias(torch.float64 if dtype == torch.float64 else torch.float32, device)
    return None if bias is None else bias.to(dtype).contiguous()
