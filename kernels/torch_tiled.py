"""Tiled FlashAttention-2 in plain torch, driven by the schedule; runs on any torch device.

Forward: for each query block, fold the visited key tiles into a softmax state with
``merge(state, block_state(tile))`` (one state per split-KV part, then :func:`combine`),
and finalise. Backward: recompute P from the saved log-sum-exp tile by tile
(:func:`attnformal.tile.tile_grads`). Nothing of size ``Sq x Sk`` is ever built; fp16 and
bf16 inputs are computed in float32, float64 inputs in float64.
"""

from __future__ import annotations

import torch

from attnformal.masks import may_attend
from attnformal.merge import block_state, empty_state, finalize, merge
from attnformal.schedule import FULL, TileSchedule
from attnformal.spec import AttentionSpec
from attnformal.tile import tile_grads, tile_scores
from attnformal.kernels import protocol_entry
from attnformal.kernels.split_kv import combine

# The protocol features this kernel computes; any other active one is refused.
SUPPORTS = frozenset({"causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask", "softcap",
                      "dropout_p", "dropout_mask", "cu_seqlens_q", "cu_seqlens_k"})
DEFAULT_SCHEDULE = TileSchedule(block_m=128, block_n=128)


@protocol_entry(SUPPORTS)
def attention(q, k, v, spec: AttentionSpec, schedule: TileSchedule | None):
    """The implementation protocol, computed tile by tile from ``schedule``.

    Returns ``out`` ``[B, Hq, Sq, Dv]`` in the input dtype, and with ``return_lse`` also
    ``lse`` ``[B, Hq, Sq]`` (float32; float64 for float64 inputs). Differentiable.
    """
    return _TiledAttention.apply(q, k, v, spec, schedule or DEFAULT_SCHEDULE)


def compute_dtype(dtype):
    """Accumulation dtype: float64 stays float64, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Problem:
    """One batch group (elements sharing a geometry) and its tile views."""

    def __init__(self, spec: AttentionSpec, schedule: TileSchedule, batches, q, k, v):
        self.spec, self.schedule = spec, schedule
        self.batches = batches  # index tensor into the batch dimension
        self.g = spec.geometry(int(batches[0]))
        self.dtype = compute_dtype(q.dtype)
        self.heads = spec.kv_heads(q.device)  # GQA: query head h reads K/V head kv_head_of(h)
        self.q, self.k, self.v = (t[batches].to(self.dtype) for t in (q, k, v))

    def rows(self, bm):
        return _span(bm, self.schedule.block_m, self.spec.len_q)

    def cols(self, bn):
        return _span(bn, self.schedule.block_n, self.spec.len_k)

    def kv(self, t, cols):
        """K or V columns of a tile, one copy per query head."""
        return t[:, self.heads, cols]

    def per_element(self, full, rows, cols):
        """A ``[B, Hq, Sq, Sk]`` input (masks) restricted to this group and tile."""
        return full[:, :, rows, cols][self.batches]

    def allowed(self, bm, bn, rows, cols):
        """The tile's mask, or None when the schedule says the tile is FULL."""
        if self.schedule.tile_class(bm, bn, self.g) == FULL:
            return None
        i = torch.arange(rows.start, rows.stop, device=self.q.device)[:, None]
        j = torch.arange(cols.start, cols.stop, device=self.q.device)[None, :]
        allowed = may_attend(i, j, self.g)
        if self.spec.attn_mask is not None:
            allowed = allowed & self.per_element(self.spec.attn_mask, rows, cols)
        return allowed

    def dropout_weights(self, rows, cols):
        if self.spec.dropout_mask is None:
            return None
        keep = self.per_element(self.spec.dropout_mask, rows, cols)
        return keep.to(self.dtype) / (1.0 - self.spec.dropout_p)

    def scores(self, bm, bn):
        rows, cols = self.rows(bm), self.cols(bn)
        s, _ = tile_scores(self.q[:, :, rows], self.kv(self.k, cols), self.spec.scale,
                           self.spec.softcap, self.allowed(bm, bn, rows, cols))
        return s


def _span(block, size, length):
    return slice(block * size, min((block + 1) * size, length))


def _groups(spec: AttentionSpec, device):
    """Index tensors of batch elements that share a geometry (one schedule each)."""
    for batches in spec.batch_groups():
        yield torch.tensor(batches, device=device)


def _forward(spec, schedule, q, k, v):
    dtype = compute_dtype(q.dtype)
    out = torch.zeros(spec.batch, spec.heads_q, spec.len_q, spec.head_dim_v, dtype=dtype, device=q.device)
    lse = torch.full((spec.batch, spec.heads_q, spec.len_q), float("-inf"), dtype=dtype, device=q.device)
    for batches in _groups(spec, q.device):
        pb = _Problem(spec, schedule, batches, q, k, v)
        for bm in range(schedule.num_q_blocks(pb.g)):
            rows = pb.rows(bm)
            partials = []
            for blocks in schedule.split_ranges(bm, pb.g):
                state = empty_state((len(batches), spec.heads_q, rows.stop - rows.start),
                                    spec.head_dim_v, dtype=dtype, device=q.device)
                for bn in blocks:
                    cols = pb.cols(bn)
                    tile = block_state(pb.scores(bm, bn), pb.kv(pb.v, cols), pb.dropout_weights(rows, cols))
                    state = merge(state, tile)
                partials.append(state)
            o, row_lse = finalize(combine(partials))
            out[batches, :, rows] = o
            lse[batches, :, rows] = row_lse.squeeze(-1)
    return out, lse


def _backward(spec, schedule, q, k, v, out, lse, grad_out, grad_lse):
    dtype = compute_dtype(q.dtype)
    grad_out = grad_out.to(dtype)
    row_inputs = {
        "grad_out": grad_out,
        "lse": lse.to(dtype)[..., None],
        "delta": (grad_out * out.to(dtype)).sum(-1, keepdim=True),  # D = rowsum(dO * O)
        "grad_lse": None if grad_lse is None else grad_lse.to(dtype)[..., None],
    }
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=q.device)
    for batches in _groups(spec, q.device):
        pb = _Problem(spec, schedule, batches, q, k, v)
        group_rows = {name: None if t is None else t[batches] for name, t in row_inputs.items()}
        dq_group, dk_group, dv_group = dq[batches], dk[batches], dv[batches]
        for bm in range(schedule.num_q_blocks(pb.g)):
            rows = pb.rows(bm)
            at_rows = {name: None if t is None else t[:, :, rows] for name, t in group_rows.items()}
            for bn in schedule.kv_range(bm, pb.g):
                cols = pb.cols(bn)
                dq_t, dk_t, dv_t = tile_grads(
                    pb.q[:, :, rows], pb.kv(pb.k, cols), pb.kv(pb.v, cols), **at_rows,
                    scale=spec.scale, softcap=spec.softcap, allowed=pb.allowed(bm, bn, rows, cols),
                    weights=pb.dropout_weights(rows, cols))
                dq_group[:, :, rows] += dq_t
                # dK, dV of a KV head: the sum over the query heads of its group.
                dk_group[:, :, cols].index_add_(1, pb.heads, dk_t)
                dv_group[:, :, cols].index_add_(1, pb.heads, dv_t)
        dq[batches], dk[batches], dv[batches] = dq_group, dk_group, dv_group
    return dq, dk, dv


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec, schedule):
        out, lse = _forward(spec, schedule, q, k, v)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.schedule = spec, schedule
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv = _backward(ctx.spec, ctx.schedule, q, k, v, out, lse, grad_out, grad_lse)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None
