"""The tiling schedule: which tiles a kernel visits and which of them it must mask.

The score matrix of one (batch, head) is cut into tiles of ``block_m`` query rows by
``block_n`` key columns; the last block in each direction may be ragged. Each tile is

* ``SKIP``    -- it holds no allowed pair, so the kernel never loads it;
* ``FULL``    -- every position of the (unclipped) tile is in range and allowed, so the
                 kernel computes it without a mask;
* ``PARTIAL`` -- anything else: the kernel applies the mask predicate element-wise.

:func:`tile_class`, :func:`kv_block_range` and :func:`split_part` are written against
:mod:`attnformal.ops` (ints, int tensors, Z3 Ints); the prover shows, for all sequence lengths
and block sizes, that SKIP and FULL are sound, that the visited range is exactly the non-SKIP
tiles and that split-KV parts partition it. Kernels are launched from a :class:`TileSchedule`
and take block sizes, loop bounds and per-tile masking decisions from its methods, which the
prover evaluates on symbolic lengths too (their loop bounds come back as :class:`Blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from attnformal import ops
from attnformal.masks import MaskGeometry, key_interval

SKIP, PARTIAL, FULL = 0, 1, 2
TILE_CLASS_NAMES = {SKIP: "skip", PARTIAL: "partial", FULL: "full"}


def tile_class(bm, bn, g: MaskGeometry, block_m, block_n):
    """SKIP, PARTIAL or FULL for query block ``bm`` and key block ``bn``."""
    r0, c0 = bm * block_m, bn * block_n
    r1, c1 = r0 + block_m, c0 + block_n  # unclipped tile: rows [r0, r1), keys [c0, c1)
    r_last = ops.minimum(r1, g.len_q) - 1  # last real row of a ragged block
    c_last = ops.minimum(c1, g.len_k) - 1
    lo_first, hi_first = key_interval(r0, g)
    lo_last, hi_last = key_interval(r_last, g)
    # lo and hi never decrease with the row, so the first and last rows bound the tile.
    skip = ops.or_(r0 >= g.len_q, c0 >= g.len_k, lo_first > c_last, hi_last < c0)
    full = ops.and_(
        not g.has_attn_mask,  # explicit mask data can exclude any pair
        r1 <= g.len_q, c1 <= g.len_k,  # no ragged edge to guard
        lo_last <= c0, hi_first >= c1 - 1,  # every row's interval covers every key of the tile
    )
    return ops.where(skip, SKIP, ops.where(full, FULL, PARTIAL))


def kv_block_range(bm, g: MaskGeometry, block_m, block_n):
    """``(start, end)``: the key blocks query block ``bm`` visits, exactly its non-SKIP tiles."""
    r0 = bm * block_m
    r_last = ops.minimum(r0 + block_m, g.len_q) - 1
    lo, _ = key_interval(r0, g)
    _, hi = key_interval(r_last, g)
    start = ops.floordiv(lo, block_n)
    end = ops.minimum(ops.cdiv(g.len_k, block_n), ops.floordiv(hi, block_n) + 1)
    visits = ops.and_(r0 < g.len_q, lo < g.len_k, start < end)
    return ops.where(visits, start, 0), ops.where(visits, end, 0)


def split_part(start, end, num_splits, s):
    """``(start_s, end_s)``: part ``s`` of the blocks ``[start, end)`` cut into ``num_splits``
    contiguous parts of ``cdiv(end - start, num_splits)`` blocks (the last ones may be short or empty)."""
    per_split = ops.cdiv(end - start, num_splits)
    return ops.minimum(start + s * per_split, end), ops.minimum(start + (s + 1) * per_split, end)


class Blocks(NamedTuple):
    """The blocks ``start <= b < stop`` when the bounds are symbolic (a ``range`` needs ints)."""

    start: Any
    stop: Any


def blocks(start, stop):
    """``range(start, stop)``; :class:`Blocks` for bounds that are not integers (the prover's Z3 Ints)."""
    try:
        return range(start, stop)
    except TypeError:
        return Blocks(start, stop)


@dataclass(frozen=True)
class TileSchedule:
    """Block sizes and split-KV partitioning; the one object kernels are launched from."""

    block_m: int = 64
    block_n: int = 64
    num_splits: int = 1  # flash-decoding: partial states over key ranges, merged at the end

    def __post_init__(self):
        for name in ("block_m", "block_n", "num_splits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TileSchedule.{name}: expected an int >= 1, got {value!r}")

    def num_q_blocks(self, g: MaskGeometry) -> int:
        return ops.cdiv(g.len_q, self.block_m)

    def num_kv_blocks(self, g: MaskGeometry) -> int:
        return ops.cdiv(g.len_k, self.block_n)

    def tile_class(self, bm, bn, g: MaskGeometry):
        return tile_class(bm, bn, g, self.block_m, self.block_n)

    def kv_range(self, bm: int, g: MaskGeometry) -> range | Blocks:
        """The key blocks query block ``bm`` visits: exactly its non-SKIP tiles."""
        return blocks(*kv_block_range(bm, g, self.block_m, self.block_n))

    def split_ranges(self, bm: int, g: MaskGeometry) -> list[range | Blocks]:
        """The visited key blocks of ``bm`` cut into ``num_splits`` contiguous parts (some empty)."""
        visited = self.kv_range(bm, g)
        return [blocks(*split_part(visited.start, visited.stop, self.num_splits, s)) for s in range(self.num_splits)]

    def class_table(self, spec, device=None):
        """``[B, nM, nN]`` int tensor of tile classes: batch ``b`` classified under ``spec.geometry(b)``
        (its own ``kv_lens``), all batch elements at once."""
        import torch

        b = torch.arange(spec.batch, device=device)[:, None, None]
        bm = torch.arange(ops.cdiv(spec.len_q, self.block_m), device=device)[None, :, None]
        bn = torch.arange(ops.cdiv(spec.len_k, self.block_n), device=device)[None, None, :]
        classes = self.tile_class(bm, bn, spec.geometry(b))
        return torch.as_tensor(classes, device=device).expand(spec.batch, bm.shape[1], bn.shape[2])


# The torch-tiled kernel's tiles (attnformal.kernels.torch_tiled launches with them), which scale predicts from
# by default: named here, where the command line reads them without importing torch.
DEFAULT_SCHEDULE = TileSchedule(block_m=128, block_n=128)
