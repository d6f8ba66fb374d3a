"""FlashAttention-3 / CuTe DSL: the forward's and backward's block ranges, pack-GQA and split-KV.

Transcribed from Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced:

* ``flash_attn/cute/block_info.py`` -- ``BlockInfo.get_n_block_min_max`` (causal, local, pack-GQA,
  split-KV), ``get_m_block_min_max`` (the backward), ``get_n_block_min_causal_local_mask`` and
  ``get_n_block_min_before_local_mask`` (where the masked iterations stop);
* ``flash_attn/cute/interface.py`` -- ``_resolve_causal_local_window``: causal sets
  ``window_size_right = 0``; a window with no left bound and right bound 0 *is* causal;
* the forward main loop (``flash_attn/cute/flash_fwd_sm90.py``; ``no_mask_fn`` in
  ``hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp``): the last key block gets the sequence mask,
  blocks from ``n_block_min_causal_local_mask`` up get the causal/local mask, blocks below
  ``n_block_min_before_local_mask`` the local mask, and the blocks in between none. (The CuTe
  sm90 loop currently passes its mask function to those middle blocks too; the C++ kernel does
  not. The tiling models the C++ split, the stronger claim.)

CuTe DSL's ``//`` on ``Int32`` lowers to ``arith.floordivsi`` (floor division), and
``cute.ceil_div(a, b)`` is ``(a + b - 1) // b``: ``division = "floor"``. ``Int32`` wraps:
``int_bits = 32``. FA3's causal is bottom-right; it has no top-left mode.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.tiling import WITHOUT_TOP_LEFT, KernelTiling, window_size

class FA3Forward(KernelTiling):
    """FA3 forward (sm90 tile 128 x 128: causal / local, head dim 128) and backward block ranges."""

    block_m, block_n = 128, 128
    division = "floor"
    int_bits = 32
    masks = WITHOUT_TOP_LEFT  # causal is bottom-right only
    case_dtype = "bfloat16"  # flash_attn runs fp16 and bf16 only: its cases replay on the real kernel

    # -- interface.py: _resolve_causal_local_window

    def resolve(self, g):
        """``(is_causal, is_local, window_size_left, window_size_right)`` with ``None`` = unbounded.

        FA3 turns a window with no left bound and right bound 0 into causal; a symbolic right
        bound stays local, where ``n_idx + window_size_right`` reads the same for 0.
        interface.py:388-408.
        """
        left, right = window_size(g)
        if g.causal == "bottom_right":
            right = 0
        if left is None and isinstance(right, int) and right == 0:
            return True, False, None, None
        return False, left is not None or right is not None, left, right

    # -- block_info.py

    def get_n_block_min_max(self, m_block, g, split_idx=None):
        """block_info.py:28-69."""
        is_causal, is_local, window_size_left, window_size_right = self.resolve(g)
        n_block_max = self.ceil_div(g.len_k, self.block_n)
        if is_causal or (is_local and window_size_right is not None):
            m_idx_max = (m_block + 1) * self.block_m
            if self.qhead_per_kvhead > 1:
                m_idx_max = self.ceil_div(m_idx_max, self.qhead_per_kvhead)
            n_idx = m_idx_max + g.len_k - g.len_q
            n_idx_right = n_idx if is_causal else n_idx + window_size_right
            n_block_max = ops.minimum(n_block_max, self.ceil_div(n_idx_right, self.block_n))
        n_block_min = 0
        if is_local and window_size_left is not None:
            m_idx_min = m_block * self.block_m
            if self.qhead_per_kvhead > 1:
                m_idx_min = self.div(m_idx_min, self.qhead_per_kvhead)
            n_idx = m_idx_min + g.len_k - g.len_q
            n_idx_left = n_idx - window_size_left
            n_block_min = ops.maximum(self.div(n_idx_left, self.block_n), 0)
        if split_idx is not None:
            num_splits = self.num_splits
            num_n_blocks_per_split = ops.where(n_block_max <= n_block_min, 0,
                                               self.div(n_block_max - n_block_min + num_splits - 1, num_splits))
            n_block_min = n_block_min + split_idx * num_n_blocks_per_split
            n_block_max = ops.minimum(n_block_min + num_n_blocks_per_split, n_block_max)
        return n_block_min, n_block_max

    def get_m_block_min_max(self, n_block, g):
        """block_info.py:71-85."""
        is_causal, is_local, window_size_left, window_size_right = self.resolve(g)
        m_block_max = self.ceil_div(g.len_q, self.block_m)
        m_block_min = 0
        if is_causal or (is_local and window_size_right is not None):
            n_idx_min = n_block * self.block_n
            m_idx = n_idx_min + g.len_q - g.len_k
            m_idx_right = m_idx if is_causal else m_idx - window_size_right
            m_block_min = ops.maximum(m_block_min, self.div(m_idx_right, self.block_m))
        if is_local and window_size_left is not None:
            n_idx_max = (n_block + 1) * self.block_n
            m_idx = n_idx_max + g.len_q - g.len_k
            m_idx_left = m_idx + window_size_left
            m_block_max = ops.minimum(m_block_max, self.ceil_div(m_idx_left, self.block_m))
        return m_block_min, m_block_max

    def get_n_block_min_causal_local_mask(self, m_block, n_block_min, g):
        """block_info.py:118-136."""
        _, is_local, _, window_size_right = self.resolve(g)
        m_idx_min = m_block * self.block_m
        if self.qhead_per_kvhead > 1:
            m_idx_min = self.div(m_idx_min, self.qhead_per_kvhead)
        n_idx = m_idx_min + g.len_k - g.len_q
        n_idx_right = n_idx if not is_local or window_size_right is None else n_idx + window_size_right
        return ops.maximum(n_block_min, self.div(n_idx_right, self.block_n))

    def get_n_block_min_before_local_mask(self, m_block, n_block_min, g):
        """block_info.py:137-154."""
        _, is_local, window_size_left, _ = self.resolve(g)
        if not is_local or window_size_left is None:
            return n_block_min
        m_idx_max = (m_block + 1) * self.block_m
        if self.qhead_per_kvhead > 1:
            m_idx_max = self.ceil_div(m_idx_max, self.qhead_per_kvhead)
        n_idx = m_idx_max + g.len_k - g.len_q
        n_idx_left = n_idx - window_size_left
        return ops.maximum(n_block_min, self.ceil_div(n_idx_left, self.block_n))

    # -- the attnformal.tiling hooks

    def kv_blocks(self, m_block, g):
        return self.get_n_block_min_max(m_block, g)

    def masked(self, m_block, n_block, g):
        """hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp:1307-1335: first_iter_mask_fn, then mask_fn down to
        n_block_min_causal_local_mask, no_mask_fn down to n_block_min_before_local_mask, local_mask_fn."""
        is_causal, is_local, _, _ = self.resolve(g)
        n_block_min, n_block_max = self.get_n_block_min_max(m_block, g)
        first = n_block == n_block_max - 1  # the first iteration: sequence (and causal/local) mask
        if not (is_causal or is_local):
            return first
        causal_from = self.get_n_block_min_causal_local_mask(m_block, n_block_min, g)
        local_below = self.get_n_block_min_before_local_mask(m_block, n_block_min, g)
        return ops.or_(first, n_block >= causal_from, n_block < local_below)

    def q_blocks(self, n_block, g):
        return self.get_m_block_min_max(n_block, g)


class FA3SplitKV(FA3Forward):
    """FA3 forward with split-KV (``is_split_kv``): three splits of each query block's key range."""

    num_splits = 3

    def split(self, m_block, split_idx, g):
        return self.get_n_block_min_max(m_block, g, split_idx)


class FA3PackGQA(FA3Forward):
    """FA3 forward with pack-GQA: 3 query heads per KV head share one block of 128 packed rows."""

    qhead_per_kvhead = 3
    q_blocks = None  # the backward does not pack GQA


# ---------------------------------------------------------------------------- wrong variants


class FA3TopLeftNBlockMax(FA3Forward):
    breaks = "n_block_max aligned top-left (n_idx = m_idx_max, the + seqlen_k - seqlen_q dropped) under " \
             "bottom-right causal"

    def kv_blocks(self, m_block, g):
        n_block_min, n_block_max = self.get_n_block_min_max(m_block, g)
        is_causal, _, _, _ = self.resolve(g)
        if is_causal:
            n_block_max = ops.minimum(self.ceil_div(g.len_k, self.block_n),
                                      self.ceil_div((m_block + 1) * self.block_m, self.block_n))
        return n_block_min, n_block_max


class FA3NBlockMinFromLastRow(FA3Forward):
    breaks = "n_block_min taken from the block's last row ((m_block + 1) * tile_m - 1) instead of its first"

    def kv_blocks(self, m_block, g):
        n_block_min, n_block_max = self.get_n_block_min_max(m_block, g)
        _, is_local, window_size_left, _ = self.resolve(g)
        if is_local and window_size_left is not None:
            n_idx_left = (m_block + 1) * self.block_m - 1 + g.len_k - g.len_q - window_size_left
            n_block_min = ops.maximum(self.div(n_idx_left, self.block_n), 0)
        return n_block_min, n_block_max


class FA3SplitFloor(FA3SplitKV):
    breaks = "num_n_blocks_per_split rounded down ((n_block_max - n_block_min) // num_splits): the last " \
             "blocks of the range belong to no split"

    def split(self, m_block, split_idx, g):
        n_block_min, n_block_max = self.get_n_block_min_max(m_block, g)
        per_split = self.div(n_block_max - n_block_min, self.num_splits)
        first = n_block_min + split_idx * per_split
        return first, ops.minimum(first + per_split, n_block_max)


class FA3PackGQAFloor(FA3PackGQA):
    breaks = "pack-GQA m_idx_max = (m_block + 1) * tile_m // qhead_per_kvhead: floor where the code takes " \
             "the ceiling, so the block's last query position is left out"

    def kv_blocks(self, m_block, g):
        n_block_min, _ = self.get_n_block_min_max(m_block, g)
        is_causal, _, _, window_size_right = self.resolve(g)
        n_block_max = self.ceil_div(g.len_k, self.block_n)
        if is_causal or window_size_right is not None:
            n_idx = self.div((m_block + 1) * self.block_m, self.qhead_per_kvhead) + g.len_k - g.len_q
            n_idx_right = n_idx if is_causal else n_idx + window_size_right
            n_block_max = ops.minimum(n_block_max, self.ceil_div(n_idx_right, self.block_n))
        return n_block_min, n_block_max


FA3Forward.controls = (FA3TopLeftNBlockMax, FA3NBlockMinFromLastRow)
FA3SplitKV.controls = (FA3SplitFloor,)
FA3PackGQA.controls = (FA3PackGQAFloor,)
