"""Ascend CANN ``FlashAttentionScore``: the host's sparse-mode conversion and the kernel's S2 loop range.

Transcribed from hicann/ops-transformer at commit c29bc1069d3252c641e2aa059ec88f392d3f05ac,
``attention/flash_attention_score/``:

* ``op_host/flash_attention_score_tiling_general.cpp`` -- ``GetSparseInfo`` (no ``atten_mask``: no
  sparsity), ``SparseModeProcess`` -> ``PretokenAndNexttokenAdjustment`` (leftUpCausal: CAUSAL;
  rightDownCausal: CAUSAL if ``S1 == S2``, else a BAND with ``preTokens = S1``, ``nextTokens = S2 - S1``;
  band: pre/next moved from the lower-right to the upper-left vertex when ``S1 != S2``),
  ``SparseBandModeCheck`` (which bands are accepted, ``s1SparseValidSize``/``s2SparseValidSize`` as
  ``min(AlignUp(tokens, HIGH_PERF_BLOCK_SIZE = 128), S)``), ``AlignUp`` (a negative count rounds
  toward zero: ``-(-num1 / num2) * num2``);
* ``op_kernel/flash_attention_score_s1s2_bn2gs1_sab.h`` -- ``GetS2LoopRange``: the keys
  ``[s2StartIdx, s2EndIdx)`` of S1 block ``s1oIdx``, walked in steps of ``s2BaseNratioSize`` whose
  last step stops at ``s2EndIdx`` (``SetExtraInfo``'s ``s2RealSize``); a block with no valid key
  computes ``[0, min(S2, 128))`` fully masked. (``flash_attention_score_s1s2_bn2gs1.h`` has the same
  ranges when its L1 reuse is off.)

The spec's mask reaches the operator through :func:`attnformal.npu.npu_mask_args` (the sparse mode
and pre/next tokens it is proven to mean, obligation 9). Host and kernel compute in ``int64_t``:
no int32 check. The per-tile choice of mask computation (``GetAttenMaskComputeMode``) is not
modelled: every tile counts as masked, so mask-safety is not claimed. Blocks: ``s1BaseSize`` and
``s2BaseNratioSize`` 128, one of the host's basic-block choices.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.npu import INT_MAX, npu_mask_args
from attnformal.tiling import WITHOUT_TOP_LEFT, KernelTiling

ALL, CAUSAL, BAND = 0, 3, 4  # SparseEnum
HIGH_PERF_BLOCK_SIZE = 128


class AscendFlashAttentionScore(KernelTiling):
    """CANN FlashAttentionScore forward, sparse modes 0 (no mask), 2, 3 and 4 (band)."""

    block_m, block_n = 128, 128  # s1BaseSize, s2BaseNratioSize
    division = "trunc"
    kv_unit = "keys"
    masks = (*WITHOUT_TOP_LEFT, "top_left")  # sparse mode 2; no mode cuts top-left with a window

    def align_up(self, num1, num2):
        return ops.where(num1 < 0, -self.div(-num1, num2) * num2, self.div(num1 + num2 - 1, num2) * num2)

    def host(self, g):
        """``(accepted, sparseType, s1SparseValidSize, s2SparseValidSize)`` from the tiling code."""
        sparse_mode, pre_tokens, next_tokens = npu_mask_args(g)
        s1_size, s2_size = g.len_q, g.len_k
        if sparse_mode == 0:  # no atten_mask: GetSparseInfo returns before any sparsity
            return True, ALL, 0, 0
        if sparse_mode == 2:  # LEFT_UP_CAUSAL
            return True, CAUSAL, 0, 0
        if sparse_mode == 3:  # RIGHT_DOWN_CAUSAL: unequal S becomes a band
            next_tokens = s2_size - s1_size
            return (True, ops.where(s1_size == s2_size, CAUSAL, BAND), s1_size,
                    ops.minimum(self.align_up(next_tokens, HIGH_PERF_BLOCK_SIZE), s2_size))
        # BAND: pre/next count from the lower-right vertex; move them to the upper-left one
        unequal = ops.not_(s1_size == s2_size)
        pre_tokens = ops.where(unequal, s1_size - s2_size + pre_tokens, pre_tokens)
        next_tokens = ops.where(unequal, s2_size - s1_size + next_tokens, next_tokens)
        return self.sparse_band_mode_check(s1_size, s2_size, pre_tokens, next_tokens)

    def sparse_band_mode_check(self, s1_size, s2_size, pre_tokens, next_tokens):
        both = ops.and_(pre_tokens >= 0, next_tokens >= 0)
        everything = ops.and_(both, pre_tokens >= s1_size, next_tokens >= s2_size)  # sparseType stays ALL
        pre_negative = ops.and_(pre_tokens < 0, next_tokens >= 0)
        next_negative = ops.and_(pre_tokens >= 0, next_tokens < 0)
        accepted = ops.or_(both,
                           ops.and_(pre_negative, next_tokens >= -pre_tokens, -pre_tokens < s2_size),
                           ops.and_(next_negative, -next_tokens <= pre_tokens, -next_tokens < s1_size))
        s1_valid = ops.minimum(self.align_up(pre_tokens, HIGH_PERF_BLOCK_SIZE), ops.where(pre_negative, 0, s1_size))
        s2_valid = ops.minimum(self.align_up(next_tokens, HIGH_PERF_BLOCK_SIZE),
                               ops.where(next_negative, 0, s2_size))
        return accepted, ops.where(everything, ALL, BAND), s1_valid, s2_valid

    def requires(self, g):
        # npu_mask_args means an unbounded side by INT_MAX: exact for lengths below 2**31 (obligation 9);
        # a band the host rejects never reaches the kernel
        return ops.and_(g.len_q <= INT_MAX, g.len_k <= INT_MAX, self.host(g)[0])

    def kv_blocks(self, m_block, g):
        """``GetS2LoopRange``: ``[s2StartIdx, s2EndIdx)`` in keys."""
        _, sparse_type, s1_sparse_valid_size, s2_sparse_valid_size = self.host(g)
        s1o_idx, s1_base_size, s2_size = m_block, self.block_m, g.len_k
        causal_end = ops.minimum((s1o_idx + 1) * s1_base_size, s2_size)
        band_start = ops.maximum(s1o_idx * s1_base_size - s1_sparse_valid_size, 0)
        band_end = ops.minimum((s1o_idx + 1) * s1_base_size + s2_sparse_valid_size, s2_size)
        no_valid_key = band_end - band_start <= 0  # "s1baseSize rows all invalid": one masked block
        band_start, band_end = (ops.where(no_valid_key, 0, band_start),
                                ops.where(no_valid_key, ops.minimum(s2_size, 128), band_end))
        s2_start_idx = ops.where(sparse_type == BAND, band_start, 0)
        s2_end_idx = ops.where(sparse_type == CAUSAL, causal_end, ops.where(sparse_type == BAND, band_end, s2_size))
        return s2_start_idx, s2_end_idx


# ---------------------------------------------------------------------------- wrong variants


class AscendAlignUpFloor(AscendFlashAttentionScore):
    breaks = "AlignUp of a negative token count as num1 / num2 * num2 with floor division (Python's //) where " \
             "C++ truncates: the band's loop starts past keys it allows"

    def align_up(self, num1, num2):
        return ops.where(num1 < 0, ops.floordiv(num1, num2) * num2, self.div(num1 + num2 - 1, num2) * num2)


class AscendRightDownAsLeftUp(AscendFlashAttentionScore):
    breaks = "rightDownCausal with S1 != S2 kept as CAUSAL (s2EndIdx from the upper-left diagonal) instead of " \
             "becoming a band"

    def host(self, g):
        accepted, sparse_type, s1_valid, s2_valid = AscendFlashAttentionScore.host(self, g)
        if g.causal == "bottom_right" and g.window is None:
            sparse_type = CAUSAL
        return accepted, sparse_type, s1_valid, s2_valid


AscendFlashAttentionScore.controls = (AscendAlignUpFloor, AscendRightDownAsLeftUp)
