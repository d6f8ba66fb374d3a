"""Tiled FlashAttention-2 in plain torch, driven by the schedule; runs on any torch device.

Forward: for each query block, fold the visited key tiles into a softmax state with
``merge(state, block_state(tile))`` (one state per split-KV part, then ``combine``; the sink
merged once, into the first part), and finalise: :func:`attnformal.kernels.split_kv.fold_row`.
Backward: recompute P from the saved log-sum-exp tile by tile
(:func:`attnformal.tile.tile_grads_and_dbias`); ``d sinks`` from ``lse`` and ``rowsum(dO * O)``.
Nothing of size ``Sq x Sk`` is built, except ``d bias`` when the bias requires grad (it is
summed down to the bias's own shape); fp16 and bf16 inputs are computed in float32, float64
inputs in float64.
"""

from __future__ import annotations

import torch

from attnformal.masks import may_attend
from attnformal.merge import block_state, empty_state, finalize
from attnformal.schedule import DEFAULT_SCHEDULE, FULL, TileSchedule
from attnformal.spec import AttentionSpec
from attnformal.tile import sink_grads, tile_grads_and_dbias, tile_scores
from attnformal.kernels import protocol_entry
from attnformal.kernels.split_kv import fold_row

# The protocol features this kernel computes; any other active one is refused.
SUPPORTS = frozenset({"causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask", "softcap",
                      "alibi_slopes", "bias", "sinks", "dropout_p", "dropout_mask", "cu_seqlens_q", "cu_seqlens_k"})


@protocol_entry(SUPPORTS)
def attention(q, k, v, spec: AttentionSpec, schedule: TileSchedule | None):
    """The implementation protocol, computed tile by tile from ``schedule``.

    Returns ``out`` ``[B, Hq, Sq, Dv]`` in the input dtype, and with ``return_lse`` also
    ``lse`` ``[B, Hq, Sq]`` (float32; float64 for float64 inputs). Differentiable.
    """
    # sinks and bias are inputs of the autograd function so their gradients reach the caller.
    return _TiledAttention.apply(q, k, v, spec.sinks, spec.bias, spec, schedule or DEFAULT_SCHEDULE)


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

    def bias(self, rows, cols):
        """The tile's additive score bias (ALiBi and ``bias``), or None."""
        return self.spec.score_bias(self.batches, rows, cols, self.dtype)

    def sinks(self, rows):
        """Each row's sink logit ``[B, Hq, rows, 1]``, or None."""
        if self.spec.sinks is None:
            return None
        sinks = self.spec.sinks.detach().to(self.dtype)[None, :, None, None]
        return sinks.expand(len(self.batches), -1, rows.stop - rows.start, 1)

    def scores(self, bm, bn):
        rows, cols = self.rows(bm), self.cols(bn)
        s, _ = tile_scores(self.q[:, :, rows], self.kv(self.k, cols), self.spec.scale,
                           self.spec.softcap, self.allowed(bm, bn, rows, cols), self.bias(rows, cols))
        return s

    def tile_state(self, bm, bn):
        """The softmax state of tile ``(bm, bn)``."""
        rows, cols = self.rows(bm), self.cols(bn)
        return block_state(self.scores(bm, bn), self.kv(self.v, cols), self.dropout_weights(rows, cols))


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
            shape = (len(batches), spec.heads_q, rows.stop - rows.start)
            empty = empty_state(shape, spec.head_dim_v, dtype=dtype, device=q.device)
            o, row_lse = finalize(fold_row(schedule.split_ranges(bm, pb.g), empty,
                                           lambda bn: pb.tile_state(bm, bn), pb.sinks(rows)))
            out[batches, :, rows] = o
            lse[batches, :, rows] = row_lse.squeeze(-1)
    return out, lse


def _backward(spec, schedule, q, k, v, out, lse, grad_out, grad_lse, need_dbias):
    """``(dq, dk, dv, dsinks, dbias)``; ``dsinks`` None without sinks, ``dbias`` None unless needed."""
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
    dbias = torch.zeros((spec.batch, spec.heads_q, spec.len_q, spec.len_k), dtype=dtype,
                        device=q.device) if need_dbias else None
    for batches in _groups(spec, q.device):
        pb = _Problem(spec, schedule, batches, q, k, v)
        group_rows = {name: None if t is None else t[batches] for name, t in row_inputs.items()}
        dq_group, dk_group, dv_group = dq[batches], dk[batches], dv[batches]
        for bm in range(schedule.num_q_blocks(pb.g)):
            rows = pb.rows(bm)
            at_rows = {name: None if t is None else t[:, :, rows] for name, t in group_rows.items()}
            for bn in schedule.kv_range(bm, pb.g):
                cols = pb.cols(bn)
                dq_t, dk_t, dv_t, dbias_t = tile_grads_and_dbias(
                    pb.q[:, :, rows], pb.kv(pb.k, cols), pb.kv(pb.v, cols), **at_rows,
                    scale=spec.scale, softcap=spec.softcap, allowed=pb.allowed(bm, bn, rows, cols),
                    weights=pb.dropout_weights(rows, cols), bias=pb.bias(rows, cols))
                dq_group[:, :, rows] += dq_t
                # dK, dV of a KV head: the sum over the query heads of its group.
                dk_group[:, :, cols].index_add_(1, pb.heads, dk_t)
                dv_group[:, :, cols].index_add_(1, pb.heads, dv_t)
                if dbias is not None:
                    dbias[batches, :, rows, cols] = dbias_t
        dq[batches], dk[batches], dv[batches] = dq_group, dk_group, dv_group
    return dq, dk, dv, _sinks_grad(spec, row_inputs, dtype), dbias


def _sinks_grad(spec, row_inputs, dtype):
    """``d sinks[h] = sum_{b, i} p_sink (dlse - D)``; None without sinks."""
    if spec.sinks is None:
        return None
    sinks = spec.sinks.detach().to(dtype)[None, :, None, None]
    rows = {name: row_inputs[name] for name in ("lse", "delta", "grad_lse")}
    return sink_grads(sinks, **rows).sum(dim=(0, 2, 3))


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, spec, schedule):
        out, lse = _forward(spec, schedule, q, k, v)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.schedule = spec, schedule
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        spec = ctx.spec
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv, dsinks, dbias = _backward(spec, ctx.schedule, q, k, v, out, lse, grad_out, grad_lse,
                                              need_dbias=ctx.needs_input_grad[4])
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                None if dsinks is None else dsinks.to(spec.sinks.dtype),
                None if dbias is None else dbias.sum_to_size(spec.bias.shape).to(spec.bias.dtype), None, None)
