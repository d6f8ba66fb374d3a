"""Predicted work of one problem, read off the spec's mask and the tiling schedule.

No scaling law is written down here ("dense is N^2, a window is N*W"): every count comes
from the functions the kernels themselves run -- :func:`~attnformal.masks.key_interval`
for the allowed pairs, :func:`~attnformal.schedule.kv_block_range` for the tiles a kernel
visits, :meth:`~attnformal.schedule.TileSchedule.class_table` for how many of those it
must mask. The exponents the sweep predicts are fitted to these counts, so a ragged last
block or a window clipped at the sequence start shows up in the prediction too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attnformal.masks import MaskGeometry, key_interval
from attnformal.schedule import FULL, PARTIAL, TileSchedule, kv_block_range
from attnformal.spec import AttentionSpec

# Work models a measured exponent is compared with, each in matmul flops so that a sweep
# over head dim or batch is predicted as well as one over sequence length.
# A tile is costed as a whole block: a kernel computes a ragged or partly masked tile in
# full and masks it, so the tile count, not the clipped area, sets its work.
MODELS = {
    "schedule": "tiles the schedule visits, masked tiles skipped",
    "pairs": "allowed (query, key) pairs only",
    "dense": "every tile, as a kernel that skips nothing",
}


@dataclass(frozen=True)
class Work:
    """Counts over all batches and query heads of one problem."""

    pairs: int  # allowed (query, key) pairs
    tiles_visited: int  # tiles in the schedule's kv ranges
    tiles_full: int  # ... of which computed without a mask
    tiles_partial: int  # ... of which masked element-wise
    tiles_total: int  # every tile of the score matrix
    tile_area: int  # block_m * block_n
    flops_per_entry: int  # matmul flops per score entry (forward, or forward + backward)

    def flops(self, model: str) -> float:
        """Matmul flops under one of :data:`MODELS`."""
        entries = {"schedule": self.tiles_visited * self.tile_area, "pairs": self.pairs,
                   "dense": self.tiles_total * self.tile_area}
        return float(entries[model] * self.flops_per_entry)

    def to_json(self) -> dict:
        return {**asdict(self), **{f"flops_{m}": self.flops(m) for m in MODELS}}


def flops_per_entry(head_dim: int, head_dim_v: int, backward: bool) -> int:
    """Forward: S = QK^T (2D) and PV (2Dv) per entry. FA2 backward recomputes S (2D) and
    forms dV = P^T dO (2Dv), dP = dO V^T (2Dv), dQ = dS K (2D), dK = dS^T Q (2D)."""
    forward = 2 * (head_dim + head_dim_v)
    return forward + (6 * head_dim + 4 * head_dim_v if backward else 0)


def allowed_pairs(g: MaskGeometry) -> int:
    """Allowed (query, key) pairs of one (batch, head): the lengths of the key intervals."""
    rows = torch.arange(g.len_q)
    lo, hi = key_interval(rows, g)
    widths = torch.as_tensor(hi - lo + 1).clamp(min=0)
    return int(widths.expand(g.len_q).sum())


def visited_tiles(g: MaskGeometry, schedule: TileSchedule) -> int:
    """Tiles one (batch, head) visits: the lengths of its query blocks' kv ranges."""
    bm = torch.arange(schedule.num_q_blocks(g))
    start, end = kv_block_range(bm, g, schedule.block_m, schedule.block_n)
    return int(torch.as_tensor(end - start).clamp(min=0).sum())


def predict_work(spec: AttentionSpec, schedule: TileSchedule, *, backward: bool = False) -> Work:
    """The work of ``spec`` under ``schedule`` (index masks only; explicit mask data has no schedule)."""
    if spec.attn_mask is not None:
        raise ValueError("predict_work: an explicit attn_mask is data, its pair count is not the schedule's")
    per_batch = [spec.geometry(b) for b in range(spec.batch)]
    classes = schedule.class_table(spec)
    heads = spec.heads_q
    return Work(
        pairs=heads * sum(allowed_pairs(g) for g in per_batch),
        tiles_visited=heads * sum(visited_tiles(g, schedule) for g in per_batch),
        tiles_full=heads * int((classes == FULL).sum()),
        tiles_partial=heads * int((classes == PARTIAL).sum()),
        tiles_total=heads * classes.numel(),
        tile_area=schedule.block_m * schedule.block_n,
        flops_per_entry=flops_per_entry(spec.head_dim, spec.head_dim_v, backward),
    )
