"""This project's own kernels, through the same interface: their schedules as kernel tilings.

``attnformal.kernels.torch_tiled`` and ``attnformal.kernels.triton_flash`` are launched from a
``TileSchedule``: key loop ``schedule.kv_block_range``, element-wise mask wherever
``schedule.tile_class`` is not FULL (obligation 5 proves these for their block sizes; here the same
functions go through the kernel-tiling obligations, so both routes check one another).
"""

from __future__ import annotations

from attnformal import schedule
from attnformal.kernels.torch_tiled import DEFAULT_SCHEDULE as TORCH_TILED_SCHEDULE
from attnformal.tiling import MASK_FAMILIES, KernelTiling

TRITON_FLASH_BLOCKS = (128, 64)  # attnformal.kernels.triton_flash.DEFAULT_SCHEDULE (importing it needs triton)


class TorchTiled(KernelTiling):
    """attnformal.kernels.torch_tiled with its default schedule (128 x 128)."""

    block_m, block_n = TORCH_TILED_SCHEDULE.block_m, TORCH_TILED_SCHEDULE.block_n
    masks = tuple(MASK_FAMILIES)

    def kv_blocks(self, m_block, g):
        return schedule.kv_block_range(m_block, g, self.block_m, self.block_n)

    def masked(self, m_block, n_block, g):
        return schedule.tile_class(m_block, n_block, g, self.block_m, self.block_n) != schedule.FULL


class TritonFlash(TorchTiled):
    """attnformal.kernels.triton_flash with its default schedule (128 x 64)."""

    block_m, block_n = TRITON_FLASH_BLOCKS


class TorchTiledFullForPartial(TorchTiled):
    breaks = "every visited tile treated as FULL (no element-wise mask)"

    def masked(self, m_block, n_block, g):
        return False


TorchTiled.controls = (TorchTiledFullForPartial,)
TritonFlash.controls = ()
