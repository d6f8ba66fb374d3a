"""The Triton tutorial's fused attention (``python/tutorials/06-fused-attention.py``): its causal loops.

Transcribed from triton-lang/triton at commit 003da478d84f5bb0f51b3988cf0ea0bbe60282b7:

* ``_attn_fwd`` / ``_attn_fwd_inner`` (the block-pointer path): every query block walks all keys
  ``range(0, N_CTX, BLOCK_N)``; under ``CAUSAL`` a tile with ``start_n >= start_m * BLOCK_M`` gets
  the mask ``offs_m[:, None] >= start_n + offs_n[None, :]``, the others none;
* ``_attn_fwd_tma`` / ``_attn_fwd_inner_tma`` (the TMA path): ``STAGE = 3`` under causal runs stage 1,
  ``lo, hi = 0, start_m * BLOCK_M`` unmasked, then stage 2, ``lo, hi = start_m * BLOCK_M,
  (start_m + 1) * BLOCK_M`` masked; ``STAGE = 1`` runs ``0, N_CTX`` unmasked. Each stage loads whole
  ``BLOCK_N`` tiles from ``lo`` (``for start_n in range(lo, hi, BLOCK_N)``, no boundary check);
  its autotune space is ``BLOCK_M`` in {64, 128} x ``BLOCK_N`` in {32, 64, 128}.

The tutorial has one ``N_CTX`` (``len_q == len_k``, so its top-left causal is also bottom-right)
and loads without boundary checks (``N_CTX`` a multiple of ``BLOCK_M``): both are ``requires``.
Triton's ``//`` on signed integers truncates (``sdiv``); nothing here is negative.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.tiling import KernelTiling


class TritonTutorialForward(KernelTiling):
    """``_attn_fwd``: all key blocks for every query block; the mask from the diagonal block on."""

    block_m, block_n = 128, 64
    division = "trunc"
    int_bits = 32
    masks = ("dense", "top_left")

    def requires(self, g):
        return ops.and_(g.len_q == g.len_k, g.len_q % self.block_m == 0)

    def kv_blocks(self, m_block, g):
        return 0, self.ceil_div(g.len_k, self.block_n)  # range(lo, hi, BLOCK_N) with lo, hi = 0, N_CTX

    def masked(self, m_block, n_block, g):
        causal_start = m_block * self.block_m if g.causal else g.len_k
        return n_block * self.block_n >= causal_start


class TritonTutorialStages(KernelTiling):
    """``_attn_fwd_tma``: stage 1 (off-band, unmasked) and stage 2 (on-band, masked), in keys."""

    block_m, block_n = 128, 64
    division = "trunc"
    int_bits = 32
    masks = ("dense", "top_left")
    kv_unit = "keys"
    clips_last_tile = False  # desc_k.load reads whole BLOCK_N tiles
    num_splits = 2  # the two stages

    def requires(self, g):
        return ops.and_(g.len_q == g.len_k, g.len_q % self.block_m == 0)

    def stage(self, start_m, stage, g):
        if stage == 1:
            return 0, start_m * self.block_m
        if stage == 2:
            return start_m * self.block_m, (start_m + 1) * self.block_m
        return 0, g.len_k  # causal = False

    def kv_blocks(self, m_block, g):
        return 0, (m_block + 1) * self.block_m if g.causal else g.len_k

    def split(self, m_block, split_idx, g):
        if not g.causal:  # STAGE = 1: one loop over everything (the second part is empty)
            return self.stage(m_block, 3, g) if split_idx == 0 else (0, 0)
        return self.stage(m_block, split_idx + 1, g)

    def masked(self, m_block, start_n, g):
        return ops.and_(bool(g.causal), start_n >= m_block * self.block_m)  # stage 2's tiles start there


class TritonTutorialStages64x128(TritonTutorialStages):
    """The same loops with ``BLOCK_M = 64, BLOCK_N = 128``, a configuration in the tutorial's TMA autotune list."""

    block_m, block_n = 64, 128


# ---------------------------------------------------------------------------- wrong variants


class TritonTutorialOnBandUnmasked(TritonTutorialStages):
    breaks = "the causal launch with STAGE = 1's loop: the on-band block joins stage 1 and runs without the mask"

    def split(self, m_block, split_idx, g):
        return (0, (m_block + 1) * self.block_m if g.causal else g.len_k) if split_idx == 0 else (0, 0)

    def masked(self, m_block, start_n, g):
        return False


class TritonTutorialLateMask(TritonTutorialForward):
    breaks = "causal_start = (start_m + 1) * BLOCK_M: the diagonal tile gets no mask"

    def masked(self, m_block, n_block, g):
        causal_start = (m_block + 1) * self.block_m if g.causal else g.len_k
        return n_block * self.block_n >= causal_start


TritonTutorialForward.controls = (TritonTutorialLateMask,)
TritonTutorialStages.controls = (TritonTutorialOnBandUnmasked,)
TritonTutorialStages64x128.controls = ()
