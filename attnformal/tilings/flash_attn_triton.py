"""FlashAttention's Triton kernel (``flash_attn/flash_attn_triton.py``): its causal ranges, top-left.

Transcribed from Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced:

* ``_fwd_kernel``: ``end_n = seqlen_k if not IS_CAUSAL else tl.minimum((start_m + 1) * BLOCK_M,
  seqlen_k)``, ``for start_n in range(0, end_n, BLOCK_N)``; every tile gets the column bound when
  ``not EVEN_N`` and the causal mask ``offs_m[:, None] >= (start_n + offs_n)[None, :]`` under causal;
* ``_bwd_kernel_one_col_block``: ``begin_m = 0 if not IS_CAUSAL else ((start_n * BLOCK_N) // BLOCK_M)
  * BLOCK_M``, ``for start_m in range(begin_m, num_block_m * BLOCK_M, BLOCK_M)``;
* ``_flash_attn_forward``: ``BLOCK = 128`` for ``BLOCK_M`` and ``BLOCK_N`` (the backward's configs too).

Its causal mask is top-left (``j <= i``), unlike FlashAttention's CUDA kernels, whose ``causal=True``
is bottom-right since v2.1. :class:`FlashAttnTriton` claims ``top_left``; the same tiling asked for
``bottom_right`` (:class:`FlashAttnTritonAsBottomRight`, what ``causal=True`` means for
``flash_attn_func``) is shipped as a tiling the prover refutes whenever ``seqlen_k > seqlen_q``: not
as a control of :class:`FlashAttnTriton`, which does not claim ``bottom_right`` (a control must be
refuted where its base is proved).
"""

from __future__ import annotations

from attnformal import ops
from attnformal.tiling import KernelTiling


class FlashAttnTriton(KernelTiling):
    """flash_attn_triton forward (end_n) and backward (begin_m), 128 x 128 blocks."""

    block_m, block_n = 128, 128
    division = "trunc"
    int_bits = 32
    masks = ("dense", "top_left")

    def kv_blocks(self, m_block, g):
        """flash_attn_triton.py:160-161."""
        end_n = g.len_k if not g.causal else ops.minimum((m_block + 1) * self.block_m, g.len_k)
        return 0, self.ceil_div(end_n, self.block_n)  # the start_n of range(0, end_n, BLOCK_N)

    def masked(self, m_block, n_block, g):
        """flash_attn_triton.py:185-188: a tile gets a mask when ``not EVEN_N`` or ``IS_CAUSAL``."""
        even_n = g.len_k % self.block_n == 0
        return ops.or_(bool(g.causal), ops.not_(even_n))

    def element_mask(self, i, j, g):
        """flash_attn_triton.py:185-188: the column bound when ``not EVEN_N``, ``offs_m >= start_n + offs_n``
        under ``IS_CAUSAL`` (top-left)."""
        keep = ops.where(g.len_k % self.block_n == 0, True, j < g.len_k)
        return ops.and_(keep, i >= j) if g.causal else keep

    def q_blocks(self, n_block, g):
        """flash_attn_triton.py:400 and 463 (``_bwd_kernel_one_col_block``)."""
        begin_m = 0 if not g.causal else self.div(n_block * self.block_n, self.block_m) * self.block_m
        num_block_m = self.ceil_div(g.len_q, self.block_m)
        return self.div(begin_m, self.block_m), num_block_m


class FlashAttnTritonAsBottomRight(FlashAttnTriton):
    """The same tiling, claimed for bottom-right causal: refuted."""

    breaks = "the kernel's causal=True read as flash_attn_func's bottom-right causal (its end_n and mask are " \
             "top-left)"
    masks = ("bottom_right",)


class FlashAttnTritonEndOneBlockEarly(FlashAttnTriton):
    breaks = "end_n = min(start_m * BLOCK_M, seqlen_k) under causal: the diagonal block is never visited"

    def kv_blocks(self, m_block, g):
        if not g.causal:
            return FlashAttnTriton.kv_blocks(self, m_block, g)
        return 0, self.ceil_div(ops.minimum(m_block * self.block_m, g.len_k), self.block_n)


FlashAttnTriton.controls = (FlashAttnTritonEndOneBlockEarly,)
FlashAttnTritonAsBottomRight.controls = ()  # refuted in every check: only the generic control, "not a control"
