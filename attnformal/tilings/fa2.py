"""FlashAttention-2 (CUDA): the forward's key-block range, its masking iterations and split-KV.

Transcribed from Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced:

* ``csrc/flash_attn/flash_api.cpp`` -- ``mha_fwd``: ``window_size_left >= seqlen_k`` or
  ``window_size_right >= seqlen_k`` becomes ``-1``, ``seqlen_q == 1`` turns causal off, causal sets
  ``window_size_right = 0``; ``set_params_fprop``: ``is_causal = left < 0 && right == 0``, a negative
  left (right) bound beside a non-negative other one becomes ``seqlen_k``;
  ``flash_fwd_launch_template.h``: ``Is_local = (left >= 0 || right >= 0) && !Is_causal``,
  ``Is_even_MN = seqlen_q % kBlockM == 0 && seqlen_k % kBlockN == 0``;
* ``csrc/flash_attn/src/flash_fwd_kernel.h`` -- ``compute_attn_1rowblock``: ``n_block_min``,
  ``n_block_max``, ``n_masking_steps`` (the first iterations, from ``n_block_max - 1`` down, call
  ``apply_mask<Is_causal, Is_even_MN>``; the others ``apply_mask</*Causal_mask=*/false>`` with
  ``Is_even_MN`` left true, which masks only under ``Is_local``: ``csrc/flash_attn/src/mask.h``,
  ``Need_masking``); ``compute_attn_1rowblock_splitkv``: ``n_blocks_per_split``;
* ``csrc/flash_attn/src/block_info.h`` -- ``actual_seqlen_q/k`` (here the lengths themselves).

C++ ``int`` arithmetic: ``division = "trunc"``, ``int_bits = 32``. FA2's causal is bottom-right
(since v2.1); ``window_size = (left, right)`` with ``-1`` for an unbounded side, as in the spec.
Tile: ``Flash_fwd_kernel_traits<128, 128, 64, 4>`` (head dim 128, causal and local).

Each method cites the lines it transcribes (``api:`` flash_api.cpp, ``launch:``
flash_fwd_launch_template.h, ``kernel:`` flash_fwd_kernel.h, ``mask:`` mask.h, at that commit);
checked against them line by line in December 2026.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.tiling import WITHOUT_TOP_LEFT, KernelTiling

class FA2Forward(KernelTiling):
    """FA2 forward, ``flash_fwd_kernel.h`` with the host's window normalisation (``flash_api.cpp``)."""

    block_m, block_n = 128, 64
    division = "trunc"
    int_bits = 32
    masks = WITHOUT_TOP_LEFT  # causal is bottom-right only
    case_dtype = "bfloat16"  # flash_attn runs fp16 and bf16 only: its cases replay on the real kernel

    def params(self, g):
        """``(Is_causal, Is_local, window_size_left, window_size_right)`` as the kernel receives them.

        api:422-427 (mha_fwd), api:157-160 (set_params_fprop), launch:70 (LOCAL_SWITCH)."""
        seqlen_q, seqlen_k = g.len_q, g.len_k
        left, right = (-1, -1) if g.window is None else (ops.where(side < 0, -1, side) for side in g.window)
        # mha_fwd
        left = ops.where(left >= seqlen_k, -1, left)
        right = ops.where(right >= seqlen_k, -1, right)
        is_causal = ops.and_(g.causal == "bottom_right", ops.not_(seqlen_q == 1))
        right = ops.where(is_causal, 0, right)
        # set_params_fprop
        is_causal = ops.and_(left < 0, right == 0)
        left = ops.where(ops.and_(left < 0, right >= 0), seqlen_k, left)
        right = ops.where(ops.and_(left >= 0, right < 0), seqlen_k, right)
        # run_mha_fwd_: LOCAL_SWITCH
        is_local = ops.and_(ops.or_(left >= 0, right >= 0), ops.not_(is_causal))
        return is_causal, is_local, left, right

    def kv_blocks(self, m_block, g):
        """kernel:90-95 (n_block_min, n_block_max)."""
        is_causal, is_local, window_size_left, window_size_right = self.params(g)
        kBlockM, kBlockN = self.block_m, self.block_n
        n_block_min = ops.where(is_local, ops.maximum(0, self.div(
            m_block * kBlockM + g.len_k - g.len_q - window_size_left, kBlockN)), 0)
        n_block_max = self.ceil_div(g.len_k, kBlockN)
        n_block_max = ops.where(ops.or_(is_causal, is_local), ops.minimum(n_block_max, self.ceil_div(
            (m_block + 1) * kBlockM + g.len_k - g.len_q + window_size_right, kBlockN)), n_block_max)
        return n_block_min, n_block_max

    def n_masking_steps(self, g):
        """kernel:305-307; Is_even_MN: launch:65."""
        is_causal, is_local, _, _ = self.params(g)
        is_even_mn = ops.and_(g.len_q % self.block_m == 0, g.len_k % self.block_n == 0)
        steps = self.ceil_div(self.block_m, self.block_n)
        return ops.where(ops.or_(is_causal, is_local), ops.where(ops.and_(is_even_mn, is_causal), steps, steps + 1), 1)

    def masked(self, m_block, n_block, g):
        """kernel:309 and 335 (the masking steps), 385 and 410 (the other iterations); mask:137."""
        is_causal, is_local, _, _ = self.params(g)
        is_even_mn = ops.and_(g.len_q % self.block_m == 0, g.len_k % self.block_n == 0)
        _, n_block_max = self.kv_blocks(m_block, g)
        masking_step = n_block >= n_block_max - self.n_masking_steps(g)
        # Mask::apply_mask: Need_masking = Causal_mask || Is_local || !Is_even_MN (mask.h:137). The masking
        # steps call apply_mask<Is_causal, Is_even_MN> (flash_fwd_kernel.h:335), the other iterations
        # apply_mask</*Causal_mask=*/false> with Is_even_MN left true (:410): only the local mask there
        return ops.where(masking_step, ops.or_(is_causal, is_local, ops.not_(is_even_mn)), is_local)


class FA2SplitKV(FA2Forward):
    """FA2 ``flash_fwd_splitkv_kernel``: the key blocks cut into 3 splits, each clipped to the row's range."""

    num_splits = 3

    def split(self, m_block, split_idx, g):
        """kernel:535-543 (compute_attn_1rowblock_splitkv)."""
        is_causal, is_local, window_size_left, window_size_right = self.params(g)
        kBlockM, kBlockN, num_n_splits = self.block_m, self.block_n, self.num_splits
        n_blocks_per_split = self.div(self.div(g.len_k + kBlockN - 1, kBlockN) + num_n_splits - 1, num_n_splits)
        n_block_min = ops.where(is_local, ops.maximum(split_idx * n_blocks_per_split, self.div(
            m_block * kBlockM + g.len_k - g.len_q - window_size_left, kBlockN)), split_idx * n_blocks_per_split)
        n_block_max = ops.minimum(self.ceil_div(g.len_k, kBlockN), (split_idx + 1) * n_blocks_per_split)
        n_block_max = ops.where(ops.or_(is_causal, is_local), ops.minimum(n_block_max, self.ceil_div(
            (m_block + 1) * kBlockM + g.len_k - g.len_q + window_size_right, kBlockN)), n_block_max)
        return n_block_min, n_block_max


# ---------------------------------------------------------------------------- wrong variants


class FA2MaskingStepsSwapped(FA2Forward):
    breaks = "n_masking_steps = ceil_div(kBlockN, kBlockM): the block sizes swapped, so with kBlockM > kBlockN " \
             "a diagonal tile runs without the causal mask"

    def n_masking_steps(self, g):
        is_causal, is_local, _, _ = self.params(g)
        is_even_mn = ops.and_(g.len_q % self.block_m == 0, g.len_k % self.block_n == 0)
        steps = self.ceil_div(self.block_n, self.block_m)
        return ops.where(ops.or_(is_causal, is_local), ops.where(ops.and_(is_even_mn, is_causal), steps, steps + 1), 1)


class FA2NoRaggedMaskingStep(FA2Forward):
    breaks = "n_masking_steps without the extra step for a ragged seqlen_k (\"we need to mask 2 blocks\")"

    def n_masking_steps(self, g):
        is_causal, is_local, _, _ = self.params(g)
        return ops.where(ops.or_(is_causal, is_local), self.ceil_div(self.block_m, self.block_n), 1)


class FA2TopLeftNBlockMax(FA2Forward):
    breaks = "n_block_max aligned top-left ((m_block + 1) * kBlockM + window_size_right, the seqlen_k - " \
             "seqlen_q dropped) under bottom-right causal"

    def kv_blocks(self, m_block, g):
        is_causal, is_local, _, window_size_right = self.params(g)
        n_block_min, _ = FA2Forward.kv_blocks(self, m_block, g)
        n_block_max = ops.where(ops.or_(is_causal, is_local), ops.minimum(
            self.ceil_div(g.len_k, self.block_n),
            self.ceil_div((m_block + 1) * self.block_m + window_size_right, self.block_n)),
            self.ceil_div(g.len_k, self.block_n))
        return n_block_min, n_block_max


FA2Forward.controls = (FA2MaskingStepsSwapped, FA2NoRaggedMaskingStep, FA2TopLeftNBlockMax)
FA2SplitKV.controls = ()
