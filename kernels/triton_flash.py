"""FlashAttention-2 in Triton, forward and backward, launched from the spec's schedule.

One query block per program in the forward; the host hands every kernel the schedule's
decisions as small int tables, so the kernels make none of their own:

* block sizes: ``schedule.block_m`` / ``block_n`` become ``BLOCK_M`` / ``BLOCK_N``;
* loop bounds: the key blocks each (batch, query block, split) visits come from
  ``schedule.split_ranges`` (the forward) and ``schedule.kv_range`` (dQ); the query blocks
  each key block meets (dK, dV) are read off the class table, whose non-SKIP tiles are
  contiguous along the query axis (proven, and checked here before launch);
* masking: ``schedule.class_table(spec)`` says, per tile, FULL (no element-wise mask) or
  PARTIAL (apply it); SKIP tiles are never visited. The element-wise mask is the spec's own
  key interval: the host evaluates :func:`attnformal.masks.key_interval` once on index tensors
  into ``ROW_LO, ROW_HI [B, Sq]`` and a PARTIAL tile keeps ``lo(i) <= j <= hi(i)`` (ANDed with
  the explicit mask). Every index-mask feature (causal, window, kv_lens, chunked, prefix, ...)
  reaches the kernels through these tables, so the kernels hold no mask rule of their own.

The forward leaves one softmax state ``(m, l, acc)`` per split-KV part; the host merges
them with :func:`attnformal.kernels.split_kv.combine`, merges the sinks' state
(:func:`attnformal.merge.sink_state`, last: the monoid laws and obligation 14 allow any
place) and divides with :func:`attnformal.merge.finalize`, so the final division, the
log-sum-exp, the sink and the empty-row rule are the spec's own code. The additive score
bias (ALiBi and ``bias``) is the spec's :meth:`AttentionSpec.score_bias`, evaluated once on the
host into ``BIAS [B, Hq, Sq, Sk]`` (state dtype; O(Sq Sk) memory, as a given bias already is)
and added to each tile after the softcap; d bias is the dQ kernel's ``dS`` before the softcap's
chain rule, stored per tile and summed to the bias's shape on the host; d sinks comes from lse
and D on the host (:func:`attnformal.tile.sink_grads`). The backward is FlashAttention-2: P is
recomputed from the saved log-sum-exp, ``D = rowsum(dO * O)``; one kernel walks key blocks
(dK, dV, summing the query heads of a GQA group in registers, no atomics), one walks
query blocks (dQ).

Only the merge (:func:`_merge`, from :mod:`attnformal.merge`) and the GQA head map are
restated in Triton, because a device language cannot call Python;
``tests/kernels/test_triton_flash.py`` checks each against the spec's definition.

Arguments: Triton has no structs, so every kernel takes the same groups, flat and in one
order: its tensors, then :class:`Geometry`, :class:`IndexMask`, :class:`Scores`,
:class:`DataMasks`, :class:`ScheduleTables` and the kernel's own loop table, then the
compile-time :class:`Features` and :class:`Tiles`. :class:`Launch` builds each group once
from the spec and the schedule and passes every argument by name; the tile helpers take
what they need in the same order (``seq_q`` before ``seq_k`` everywhere). A new index-mask
feature needs no change here (only ``SUPPORTS``); a new score modification is a field of
:class:`Scores` and a step of :func:`_modify_scores`.

Precision: scores and all states accumulate in float32 (float64 for float64 inputs).
As in FlashAttention-2, P and dS are rounded to the input dtype before the P@V, dS@K and
dS^T@Q products, so fp16/bf16 use tensor cores. fp32 products use ``input_precision=
"ieee"`` (Triton's default on CUDA is TF32, ~1e-3 relative).

Portability (triton-ascend): only core ``tl`` operations, no libdevice or inline asm;
mask tiles are loaded as int8 (triton-ascend documents some comparisons without uint8); head dims are padded
to a power of two in {16, ..., 256}; under ``causal`` the schedule must have ``block_m >= block_n``
(the compile-time ``CAUSAL`` serves that check only). Ascend has no fp64. ``make ascend-check``
lowers every kernel through triton-ascend's ``ttir`` and ``ttadapter`` stages (Linalg/HIVM) for Ascend 910B;
nothing was compiled to an NPU binary or run on Ascend hardware (docs/ascend.md).

Interpreter: ``TRITON_INTERPRET=1`` must be set before this module is imported (Triton
decides at decoration time). The interpreter stores bf16 as raw uint16 and its ``tl.dot``
multiplies those bit patterns (triton-lang/triton#11584), so under the interpreter bf16
dot operands are widened to fp32 first. That changes no value: bf16 numbers and their
products are exact in fp32, so only the fp32 summation order differs from a tensor core.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

try:  # first: without triton nothing here can run
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError as missing:
    raise ImportError("attnformal.kernels.triton_flash needs triton: pip install 'attnformal[triton]'") from missing

import torch

from attnformal.kernels import protocol_entry
from attnformal.kernels.split_kv import combine
from attnformal.masks import CAUSAL_MODES, MaskGeometry, key_interval
from attnformal.merge import SoftmaxState, empty_state, finalize, merge, sink_state
from attnformal.schedule import FULL, SKIP, TileSchedule
from attnformal.spec import AttentionSpec, SpecError
from attnformal.tile import sink_grads

# The protocol features this kernel computes; any other active one is refused.
SUPPORTS = frozenset({"causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask", "softcap",
                      "alibi_slopes", "bias", "sinks", "dropout_p", "dropout_mask", "cu_seqlens_q", "cu_seqlens_k"})
DEFAULT_SCHEDULE = TileSchedule(block_m=128, block_n=64)  # the Triton tutorial's forward tile
MAX_HEAD_DIM = 256  # the largest head dim triton-ascend's attention supports (pads to {16..256})
MIN_BLOCK = 16  # tl.dot needs every tile dimension >= 16
MAX_INT32 = 2 ** 31 - 1  # Triton passes ints below 2**31 as int32 (tile row indices are int32)

# Compile-time constants the kernels compare against, taken from the spec's own encodings.
FULL_TILE: tl.constexpr = tl.constexpr(FULL)
NOT_CAUSAL: tl.constexpr = tl.constexpr(CAUSAL_MODES.index(None))


# ----------------------------------------------------------------------------------------
# The spec, restated in Triton (each one checked against its Python definition by a test)
# ----------------------------------------------------------------------------------------

@triton.jit
def _row_intervals(ROW_LO, ROW_HI, b, rows, seq_q):
    """The key interval ``[lo, hi]`` of each query row (the host's :func:`attnformal.masks.key_interval`);
    a row past the end gets the empty ``[1, 0]``."""
    inside = rows < seq_q
    lo = tl.load(ROW_LO + b * seq_q + rows, mask=inside, other=1)
    hi = tl.load(ROW_HI + b * seq_q + rows, mask=inside, other=0)
    return lo, hi


@triton.jit
def _kv_head_of(h, group):
    """:func:`attnformal.spec.kv_head_of`: consecutive groups of query heads share a KV head."""
    return h // group


@triton.jit
def _first_query_head(kv_head, group):
    """The query heads reading ``kv_head`` are ``first, first + 1, ..., first + group - 1``."""
    return kv_head * group


@triton.jit
def _finite_shift(m):
    """:func:`attnformal.merge.finite_shift`: 0 for a row that has seen no key, so exp(-inf - 0) = 0."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _merge(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """:func:`attnformal.merge.merge`: the state of the union of two disjoint key sets."""
    m = tl.maximum(m_a, m_b)
    shift = _finite_shift(m)
    alpha = tl.exp(m_a - shift)  # rescales a from its own max to the common one; <= 1
    beta = tl.exp(m_b - shift)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * acc_a + beta[:, None] * acc_b


# ----------------------------------------------------------------------------------------
# Tile helpers. Their parameters follow the kernels' group order (module note).
# ----------------------------------------------------------------------------------------

@triton.jit
def _check_tile(SIZE: tl.constexpr):
    tl.static_assert(SIZE >= 16, "tl.dot needs tile dimensions >= 16")
    tl.static_assert((SIZE & (SIZE - 1)) == 0, "tl.arange needs power-of-two tile dimensions")


@triton.jit
def _check_tiles(CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr):
    _check_tile(BLOCK_M)
    _check_tile(BLOCK_N)
    _check_tile(BLOCK_D)
    _check_tile(BLOCK_DV)
    tl.static_assert(BLOCK_D <= 256 and BLOCK_DV <= 256, "triton-ascend supports head dims up to 256")
    tl.static_assert(CAUSAL == NOT_CAUSAL or BLOCK_M >= BLOCK_N,
                     "triton-ascend's causal attention needs BLOCK_M >= BLOCK_N")


@triton.jit
def _heads(bh, heads_q, group):
    """A (batch x query head) program index as ``(b, h, kv_bh)``, ``kv_bh`` the KV head's row of K and V."""
    b = bh // heads_q
    h = bh % heads_q
    return b, h, b * (heads_q // group) + _kv_head_of(h, group)


@triton.jit
def _dot(a, b, BF16_VIA_FP32: tl.constexpr):
    """``a @ b`` accumulated in fp32 (fp64 for fp64 operands); see the module note on bf16."""
    if BF16_VIA_FP32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _load_rows(base, rows, cols, n_rows, n_cols):
    """A ``[rows, cols]`` tile of a row-major ``[n_rows, n_cols]`` matrix, 0 outside it. The row offset is
    64-bit: ``n_rows * n_cols`` may pass 2**31 (Sq = 2**25 at D = 64; Sq * Sk for the bias)."""
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(base + rows[:, None].to(tl.int64) * n_cols + cols[None, :], mask=inside, other=0.0)


@triton.jit
def _flags_base(FLAGS, b, h, stride_b, stride_h):
    """Where the ``[Sq, Sk]`` flags of batch ``b``, query head ``h`` start (stride 0: broadcast)."""
    return FLAGS + b * stride_b + h * stride_h


@triton.jit
def _load_flags(base, rows, cols, seq_q, seq_k, stride_i, stride_j):
    """A bool tile of an int8 view of a bool ``[Sq, Sk]`` mask with any strides (0: broadcast)."""
    inside = (rows[:, None] < seq_q) & (cols[None, :] < seq_k)
    offsets = rows[:, None].to(tl.int64) * stride_i + cols[None, :].to(tl.int64) * stride_j  # may pass 2**31
    flags = tl.load(base + offsets, mask=inside, other=0)
    return flags != 0


@triton.jit
def _tanh(x):
    """tanh from ``tl.exp`` alone: core Triton has no tanh, and libdevice's is backend-specific.

    ``e = exp(-2|x|)`` lies in (0, 1], so nothing overflows for any x; the result is odd
    by construction. Its absolute error is a few ulp of 1, which is what the softmax sees.
    """
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _load_scalars(SCALARS):
    """The float parameters, stored in the state dtype: ``(scale, softcap, 1/(1-p))``."""
    return tl.load(SCALARS + 0), tl.load(SCALARS + 1), tl.load(SCALARS + 2)


@triton.jit
def _modify_scores(s, softcap, HAS_SOFTCAP: tl.constexpr):
    """Score modifications after ``scale q k^T``, before the mask: ``(s, ds_out/ds_in)``.

    Only the softcap today: ``softcap tanh(s / softcap)``, whose derivative is ``1 - tanh^2``.
    A new modification is one more step here, with its parameters in the score group.
    """
    slope = 1.0
    if HAS_SOFTCAP:
        s = softcap * _tanh(s / softcap)
        slope = 1.0 - (s / softcap) * (s / softcap)
    return s, slope


@triton.jit
def _tile_scores(q, k, rows, cols, tile_class,
                 seq_q, seq_k, row_lo, row_hi, scale, softcap, bias_base, mask_base, mask_si, mask_sj,
                 HAS_ATTN_MASK: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BF16_VIA_FP32: tl.constexpr):
    """:func:`attnformal.tile.tile_scores`: ``(s, slope)`` of a tile, masked only if it is not FULL.

    ``s`` is ``scale q k^T`` modified (:func:`_modify_scores`), plus the host's score bias tile,
    then -inf outside each row's key interval ``[row_lo, row_hi]`` or where the explicit mask
    forbids; ``slope`` is the modification's derivative (1 without).
    """
    s, slope = _modify_scores(_dot(q, tl.trans(k), BF16_VIA_FP32) * scale, softcap, HAS_SOFTCAP)
    if HAS_BIAS:
        s = s + _load_rows(bias_base, rows, cols, seq_q, seq_k)
    if tile_class != FULL_TILE:
        allowed = (row_lo[:, None] <= cols[None, :]) & (cols[None, :] <= row_hi[:, None])
        if HAS_ATTN_MASK:
            allowed = allowed & _load_flags(mask_base, rows, cols, seq_q, seq_k, mask_si, mask_sj)
        s = tl.where(allowed, s, float("-inf"))
    return s, slope


@triton.jit
def _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj):
    """Dropout weights of a tile: ``1/(1-p)`` where the replayed keep-mask is True, else 0."""
    return tl.where(_load_flags(keep_base, rows, cols, seq_q, seq_k, keep_si, keep_sj), keep_scale, 0.0)


@triton.jit
def _load_query_rows(Q, DO, LSE, DELTA, bh, rows, dims, dims_v, seq_q, head_dim, head_dim_v):
    """What the backward needs of a block of query rows: q, dO, lse and D (0 past the end)."""
    q = _load_rows(Q + bh * seq_q * head_dim, rows, dims, seq_q, head_dim)
    do = _load_rows(DO + bh * seq_q * head_dim_v, rows, dims_v, seq_q, head_dim_v)
    stats = bh * seq_q + rows
    lse = tl.load(LSE + stats, mask=rows < seq_q, other=0.0)
    delta = tl.load(DELTA + stats, mask=rows < seq_q, other=0.0)
    return q, do, lse, delta


# ----------------------------------------------------------------------------------------
# Forward: one program per (query block, split, batch x query head)
# ----------------------------------------------------------------------------------------

@triton.jit
def _attn_fwd(
    Q, K, V, M_PART, L_PART, ACC_PART,  # q, k, v contiguous [B, H, S, D]; partial states [splits, B, Hq, Sq(, Dv)]
    batch, heads_q, group, seq_q, seq_k, head_dim, head_dim_v,  # geometry
    ROW_LO, ROW_HI,  # index mask: [B, Sq] each row's key interval
    SCALARS, BIAS,  # scores: (scale, softcap, 1/(1-p)); the score bias [B, Hq, Sq, Sk] (state dtype)
    ATTN_MASK, mask_sb, mask_sh, mask_si, mask_sj, KEEP, keep_sb, keep_sh, keep_si, keep_sj,  # data masks
    CLASSES, num_q_blocks, num_kv_blocks, KV_SPLITS, num_splits,  # schedule: [B, nM, nN]; [B, nM, splits, 2]
    CAUSAL: tl.constexpr, HAS_ATTN_MASK: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BF16_VIA_FP32: tl.constexpr,
):
    """The softmax state of one query block of one query head over one split's key blocks."""
    _check_tiles(CAUSAL, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    bm = tl.program_id(0)
    split = tl.program_id(1).to(tl.int64)  # splits * batch may pass 2**31
    bh = tl.program_id(2).to(tl.int64)  # 64-bit offsets: B*H*S*D may pass 2**31
    b, h, kv_bh = _heads(bh, heads_q, group)
    scale, softcap, keep_scale = _load_scalars(SCALARS)
    mask_base = _flags_base(ATTN_MASK, b, h, mask_sb, mask_sh)
    keep_base = _flags_base(KEEP, b, h, keep_sb, keep_sh)
    bias_base = BIAS + bh * seq_q * seq_k
    class_row = CLASSES + (b * num_q_blocks + bm) * num_kv_blocks
    split_range = KV_SPLITS + ((b * num_q_blocks + bm) * num_splits + split) * 2

    rows = bm * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    q = _load_rows(Q + bh * seq_q * head_dim, rows, dims, seq_q, head_dim)
    row_lo, row_hi = _row_intervals(ROW_LO, ROW_HI, b, rows, seq_q)
    k_base = K + kv_bh * seq_k * head_dim
    v_base = V + kv_bh * seq_k * head_dim_v

    # The empty state (merge's identity): m = -inf, l = 0, acc = 0.
    m_i = tl.full([BLOCK_M], float("-inf"), M_PART.dtype.element_ty)
    l_i = tl.zeros([BLOCK_M], M_PART.dtype.element_ty)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], M_PART.dtype.element_ty)
    for bn in range(tl.load(split_range), tl.load(split_range + 1)):
        cols = bn * BLOCK_N + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, cols, dims, seq_k, head_dim)
        v = _load_rows(v_base, cols, dims_v, seq_k, head_dim_v)
        # -- scores; the element-wise mask only where the schedule says PARTIAL
        s, _ = _tile_scores(q, k, rows, cols, tl.load(class_row + bn),
                            seq_q, seq_k, row_lo, row_hi, scale, softcap, bias_base,
                            mask_base, mask_si, mask_sj, HAS_ATTN_MASK, HAS_SOFTCAP, HAS_BIAS, BF16_VIA_FP32)
        # -- the tile's own state (attnformal.merge.block_state); dropout after the denominator
        m_ij = tl.max(s, 1)
        p = tl.exp(s - _finite_shift(m_ij)[:, None])
        l_ij = tl.sum(p, 1)
        if HAS_KEEP:
            p = p * _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj)
        acc_ij = _dot(p.to(v.dtype), v, BF16_VIA_FP32)
        # -- fold it into the running state
        m_i, l_i, acc = _merge(m_i, l_i, acc, m_ij, l_ij, acc_ij)

    state_rows = ((split * batch + b) * heads_q + h) * seq_q + rows
    in_rows = rows < seq_q
    tl.store(M_PART + state_rows, m_i, mask=in_rows)
    tl.store(L_PART + state_rows, l_i, mask=in_rows)
    tl.store(ACC_PART + state_rows[:, None] * head_dim_v + dims_v[None, :], acc,
             mask=in_rows[:, None] & (dims_v[None, :] < head_dim_v))


# ----------------------------------------------------------------------------------------
# Backward (FlashAttention-2): P from the saved lse, dS = P * (dP - D)
# ----------------------------------------------------------------------------------------

@triton.jit
def _tile_grads(q, k, v, do, lse, delta, rows, cols, tile_class,
                seq_q, seq_k, row_lo, row_hi, scale, softcap, keep_scale, bias_base,
                mask_base, mask_si, mask_sj, keep_base, keep_si, keep_sj,
                HAS_ATTN_MASK: tl.constexpr, HAS_KEEP: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, BF16_VIA_FP32: tl.constexpr):
    """``(P * weights, dS, slope)`` of one tile, as :func:`attnformal.tile.tile_grads_and_dbias`
    forms them: ``dS`` is the gradient of the final (biased) scores, before the softcap's ``slope``."""
    s, slope = _tile_scores(q, k, rows, cols, tile_class,
                            seq_q, seq_k, row_lo, row_hi, scale, softcap, bias_base,
                            mask_base, mask_si, mask_sj, HAS_ATTN_MASK, HAS_SOFTCAP, HAS_BIAS, BF16_VIA_FP32)
    p = tl.exp(s - _finite_shift(lse)[:, None])  # 0 on masked keys and on empty rows
    dp = _dot(do, tl.trans(v), BF16_VIA_FP32)
    p_kept = p
    if HAS_KEEP:
        weights = _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj)
        p_kept = p * weights
        dp = dp * weights
    ds = p * (dp - delta[:, None])
    return p_kept, ds, slope


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV,  # contiguous [B, H, S, D]; LSE, DELTA [B, Hq, Sq]
    batch, heads_q, group, seq_q, seq_k, head_dim, head_dim_v,  # geometry
    ROW_LO, ROW_HI,  # index mask
    SCALARS, BIAS,  # scores
    ATTN_MASK, mask_sb, mask_sh, mask_si, mask_sj, KEEP, keep_sb, keep_sh, keep_si, keep_sj,  # data masks
    CLASSES, num_q_blocks, num_kv_blocks, Q_RANGES,  # schedule: [B, nM, nN]; [B, nN, 2]
    CAUSAL: tl.constexpr, HAS_ATTN_MASK: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BF16_VIA_FP32: tl.constexpr,
):
    """dK, dV of one key block of one KV head: the sum over the query heads of its group."""
    _check_tiles(CAUSAL, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    bn = tl.program_id(0)
    bhk = tl.program_id(1).to(tl.int64)
    heads_kv = heads_q // group
    b = bhk // heads_kv
    kv_head = bhk % heads_kv
    scale, softcap, keep_scale = _load_scalars(SCALARS)
    q_range = Q_RANGES + (b * num_kv_blocks + bn) * 2

    cols = bn * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    k = _load_rows(K + bhk * seq_k * head_dim, cols, dims, seq_k, head_dim)
    v = _load_rows(V + bhk * seq_k * head_dim_v, cols, dims_v, seq_k, head_dim_v)

    dk = tl.zeros([BLOCK_N, BLOCK_D], LSE.dtype.element_ty)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], LSE.dtype.element_ty)
    first_head = _first_query_head(kv_head, group)
    for g in range(group):
        h = first_head + g
        bh = b * heads_q + h
        mask_base = _flags_base(ATTN_MASK, b, h, mask_sb, mask_sh)
        keep_base = _flags_base(KEEP, b, h, keep_sb, keep_sh)
        bias_base = BIAS + bh * seq_q * seq_k
        for bm in range(tl.load(q_range), tl.load(q_range + 1)):
            rows = bm * BLOCK_M + tl.arange(0, BLOCK_M)
            q, do, lse, delta = _load_query_rows(Q, DO, LSE, DELTA, bh, rows, dims, dims_v, seq_q, head_dim,
                                                 head_dim_v)
            row_lo, row_hi = _row_intervals(ROW_LO, ROW_HI, b, rows, seq_q)
            tile_class = tl.load(CLASSES + (b * num_q_blocks + bm) * num_kv_blocks + bn)
            p_kept, ds, slope = _tile_grads(q, k, v, do, lse, delta, rows, cols, tile_class,
                                            seq_q, seq_k, row_lo, row_hi, scale, softcap, keep_scale, bias_base,
                                            mask_base, mask_si, mask_sj, keep_base, keep_si, keep_sj,
                                            HAS_ATTN_MASK, HAS_KEEP, HAS_SOFTCAP, HAS_BIAS, BF16_VIA_FP32)
            dv += _dot(tl.trans(p_kept.to(do.dtype)), do, BF16_VIA_FP32)
            dk += scale * _dot(tl.trans((ds * slope).to(q.dtype)), q, BF16_VIA_FP32)

    in_cols = cols[:, None] < seq_k
    out_rows = bhk * seq_k + cols[:, None]
    tl.store(DK + out_rows * head_dim + dims[None, :], dk.to(DK.dtype.element_ty),
             mask=in_cols & (dims[None, :] < head_dim))
    tl.store(DV + out_rows * head_dim_v + dims_v[None, :], dv.to(DV.dtype.element_ty),
             mask=in_cols & (dims_v[None, :] < head_dim_v))


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, DBIAS,  # contiguous [B, H, S, D]; LSE, DELTA [B, Hq, Sq]; [B, Hq, Sq, Sk]
    batch, heads_q, group, seq_q, seq_k, head_dim, head_dim_v,  # geometry
    ROW_LO, ROW_HI,  # index mask
    SCALARS, BIAS,  # scores
    ATTN_MASK, mask_sb, mask_sh, mask_si, mask_sj, KEEP, keep_sb, keep_sh, keep_si, keep_sj,  # data masks
    CLASSES, num_q_blocks, num_kv_blocks, KV_RANGES,  # schedule: [B, nM, nN]; [B, nM, 2]
    CAUSAL: tl.constexpr, HAS_ATTN_MASK: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BF16_VIA_FP32: tl.constexpr,
):
    """dQ of one query block of one query head, over the key blocks the schedule visits (and, with
    a bias, its tiles' dS: d bias before the sum over broadcast dimensions; SKIP tiles stay 0)."""
    _check_tiles(CAUSAL, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    bm = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h, kv_bh = _heads(bh, heads_q, group)
    scale, softcap, keep_scale = _load_scalars(SCALARS)
    mask_base = _flags_base(ATTN_MASK, b, h, mask_sb, mask_sh)
    keep_base = _flags_base(KEEP, b, h, keep_sb, keep_sh)
    class_row = CLASSES + (b * num_q_blocks + bm) * num_kv_blocks
    kv_range = KV_RANGES + (b * num_q_blocks + bm) * 2
    bias_base = BIAS + bh * seq_q * seq_k

    rows = bm * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    q, do, lse, delta = _load_query_rows(Q, DO, LSE, DELTA, bh, rows, dims, dims_v, seq_q, head_dim, head_dim_v)
    row_lo, row_hi = _row_intervals(ROW_LO, ROW_HI, b, rows, seq_q)
    k_base = K + kv_bh * seq_k * head_dim
    v_base = V + kv_bh * seq_k * head_dim_v

    dq = tl.zeros([BLOCK_M, BLOCK_D], LSE.dtype.element_ty)
    for bn in range(tl.load(kv_range), tl.load(kv_range + 1)):
        cols = bn * BLOCK_N + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, cols, dims, seq_k, head_dim)
        v = _load_rows(v_base, cols, dims_v, seq_k, head_dim_v)
        _, ds, slope = _tile_grads(q, k, v, do, lse, delta, rows, cols, tl.load(class_row + bn),
                                   seq_q, seq_k, row_lo, row_hi, scale, softcap, keep_scale, bias_base,
                                   mask_base, mask_si, mask_sj, keep_base, keep_si, keep_sj,
                                   HAS_ATTN_MASK, HAS_KEEP, HAS_SOFTCAP, HAS_BIAS, BF16_VIA_FP32)
        if HAS_BIAS:
            tl.store(DBIAS + bh * seq_q * seq_k + rows[:, None].to(tl.int64) * seq_k + cols[None, :], ds,
                     mask=(rows[:, None] < seq_q) & (cols[None, :] < seq_k))
        dq += scale * _dot((ds * slope).to(k.dtype), k, BF16_VIA_FP32)

    tl.store(DQ + (bh * seq_q + rows)[:, None] * head_dim + dims[None, :], dq.to(DQ.dtype.element_ty),
             mask=(rows[:, None] < seq_q) & (dims[None, :] < head_dim))


# ----------------------------------------------------------------------------------------
# Host side: validation, the schedule's tables, the kernels' arguments, launches
# ----------------------------------------------------------------------------------------

@protocol_entry(SUPPORTS)
def attention(q, k, v, spec: AttentionSpec, schedule: TileSchedule | None):
    """The implementation protocol, computed by the Triton kernels from ``schedule``.

    Returns ``out`` ``[B, Hq, Sq, Dv]`` in the input dtype, and with ``return_lse`` also
    ``lse`` ``[B, Hq, Sq]`` (float32; float64 for float64 inputs). Differentiable.
    """
    schedule = DEFAULT_SCHEDULE if schedule is None else schedule
    check_launchable(spec, schedule, q.dtype, q.device.type)
    # sinks and bias are inputs of the autograd function so their gradients reach the caller.
    return _FlashAttention.apply(q, k, v, spec.sinks, spec.bias, spec, schedule)


def check_launchable(spec: AttentionSpec, schedule: TileSchedule, dtype, device_type: str):
    """What these kernels need beyond a valid spec; one error naming the argument otherwise.

    Besides Triton's own tile rules, the restrictions triton-ascend documents but its front
    end does not check at lowering time (docs/ascend.md cites where each is documented):
    ``block_m >= block_n`` under causal masking, padded head dims in {16, ..., 256}, and no
    float64 on an NPU (``device_type="npu"``; the interpreter and CUDA do have float64).
    """
    if not isinstance(schedule, TileSchedule):
        raise SpecError("schedule", "a TileSchedule or None", type(schedule).__name__)
    for name in ("block_m", "block_n"):
        size = getattr(schedule, name)
        if size < MIN_BLOCK or size & (size - 1):
            raise SpecError("schedule", f"{name} a power of two >= {MIN_BLOCK} (Triton tile sizes)",
                            f"{name}={size}")
    if spec.causal is not None and schedule.block_m < schedule.block_n:
        raise SpecError("schedule", "block_m >= block_n when causal is set (triton-ascend's causal attention)",
                        f"block_m={schedule.block_m}, block_n={schedule.block_n}")
    for name, length, block in (("q", spec.len_q, schedule.block_m), ("k", spec.len_k, schedule.block_n)):
        if -(-length // block) * block > MAX_INT32:  # row and column indices are int32 in the kernels
            raise NotImplementedError(f"triton_flash: argument '{name}': sequence length {length}, padded to "
                                      f"a multiple of {block}, must stay below 2**31 (int32 tile indices)")
    for name, dim in (("q", spec.head_dim), ("v", spec.head_dim_v)):
        if dim > MAX_HEAD_DIM:
            raise NotImplementedError(f"triton_flash: argument '{name}': head dim {dim} > {MAX_HEAD_DIM} "
                                      "is not supported (triton-ascend's limit)")
    if device_type == "npu" and dtype == torch.float64:
        raise NotImplementedError("triton_flash: argument 'q': Ascend NPUs have no float64")
    if device_type == "cpu" and not _INTERPRETED:
        raise NotImplementedError("triton_flash: CPU tensors run only under the Triton interpreter: set "
                                  "TRITON_INTERPRET=1 before importing attnformal.kernels.triton_flash")


def _state_dtype(dtype):
    """Accumulation dtype: float64 stays float64, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _IndexGeometry:
    """A spec as a cache key: equal when everything the schedule's tables read is equal, namely
    the lengths and every batch element's :class:`~attnformal.masks.MaskGeometry` (each mask
    feature's value for it, and whether mask data is given: that decides FULL tiles)."""

    def __init__(self, spec: AttentionSpec):
        self.spec, self.per_batch = spec, tuple(spec.geometry(b) for b in range(spec.batch))
        self.key = (spec.batch, spec.len_q, spec.len_k, self.per_batch)

    def __eq__(self, other):
        return self.key == other.key

    def __hash__(self):
        return hash(self.key)


@functools.lru_cache(maxsize=64)
def _schedule_tables(schedule: TileSchedule, geometry: _IndexGeometry, device):
    """The schedule, evaluated once per geometry (in Python, query block by query block).

    ``classes [B, nM, nN]``, ``q_ranges [B, nN, 2]`` (dK/dV loops), ``kv_ranges [B, nM, 2]``
    (dQ loops), ``kv_splits [B, nM, splits, 2]`` (forward loops) and the row intervals
    ``row_lo, row_hi [B, Sq]`` (:func:`_row_interval_tables`).
    """
    spec, per_batch = geometry.spec, geometry.per_batch
    classes = schedule.class_table(spec).to(torch.int32).contiguous()
    per_geometry = {g: _block_ranges(schedule, g) for g in per_batch}
    ranges = [per_geometry[g] for g in per_batch]
    tables = (classes, _q_block_ranges(classes), torch.stack([r[0] for r in ranges]),
              torch.stack([r[1] for r in ranges]), *_row_interval_tables(spec))
    return tuple(t.to(device) for t in tables)


def _row_interval_tables(spec: AttentionSpec):
    """``(row_lo, row_hi)``, int32 ``[B, Sq]``: each row's key interval, the spec's :func:`key_interval`
    evaluated once on index tensors (every batch element and row at once).

    Intersected with the keys that exist (``lo`` in ``[0, Sk]``, ``hi`` in ``[-1, Sk - 1]``), which
    keeps the allowed keys ``0 <= j < Sk`` of every row and every bound inside int32.
    """
    b = torch.arange(spec.batch)[:, None]
    i = torch.arange(spec.len_q)[None, :]
    lo, hi = (torch.as_tensor(end).expand(spec.batch, spec.len_q) for end in key_interval(i, spec.geometry(b)))
    return (lo.clamp(0, spec.len_k).to(torch.int32).contiguous(),
            hi.clamp(-1, spec.len_k - 1).to(torch.int32).contiguous())


def _block_ranges(schedule: TileSchedule, g: MaskGeometry):
    """One geometry's loop bounds: kv ranges ``[nM, 2]`` and split ranges ``[nM, splits, 2]``."""
    blocks = range(schedule.num_q_blocks(g))
    kv = [[r.start, r.stop] for r in (schedule.kv_range(bm, g) for bm in blocks)]
    splits = [[[r.start, r.stop] for r in schedule.split_ranges(bm, g)] for bm in blocks]
    return (torch.tensor(kv, dtype=torch.int32).reshape(len(blocks), 2),
            torch.tensor(splits, dtype=torch.int32).reshape(len(blocks), schedule.num_splits, 2))


def _q_block_ranges(classes):
    """``[B, nN, 2]``: per key block, the query blocks whose tile with it is not SKIP.

    They must be contiguous for the dK/dV loop; the prover shows they are for the spec's
    masks, and a hand-made class table that breaks this is refused here.
    """
    visited = classes != SKIP
    bm = torch.arange(classes.shape[1])[None, :, None]
    count = visited.sum(1)
    start = torch.where(visited, bm, classes.shape[1]).amin(1)
    stop = torch.where(visited, bm + 1, 0).amax(1)
    if bool(((stop - start != count) & (count > 0)).any()):
        raise ValueError("schedule.class_table: the non-SKIP tiles of a key block are not contiguous in bm")
    return torch.stack([torch.where(count > 0, start, 0), torch.where(count > 0, stop, 0)], -1).to(torch.int32)


# The kernels' argument groups, in the order every kernel takes them (between its tensors
# and the schedule's loop table); tests/kernels/test_triton_flash.py checks the signatures.

class Geometry(NamedTuple):
    batch: int
    heads_q: int
    group: int  # query heads per KV head
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int


class IndexMask(NamedTuple):
    """The index mask: each row's key interval, from the spec's ``key_interval`` (every index feature)."""

    ROW_LO: Any  # [B, Sq] int32
    ROW_HI: Any


class Scores(NamedTuple):
    SCALARS: Any  # (scale, softcap, 1/(1-p)) in the state dtype: Python floats would travel as fp32
    BIAS: Any  # the spec's score_bias [B, Hq, Sq, Sk] in the state dtype (a 1-element dummy without)


class DataMasks(NamedTuple):
    """The explicit mask and the dropout keep-mask: int8 views of bool tensors, with strides (0: broadcast)."""

    ATTN_MASK: Any
    mask_sb: int
    mask_sh: int
    mask_si: int
    mask_sj: int
    KEEP: Any
    keep_sb: int
    keep_sh: int
    keep_si: int
    keep_sj: int


class ScheduleTables(NamedTuple):
    """The class table every kernel reads; each kernel's own loop table follows it."""

    CLASSES: Any  # [B, nM, nN] int32
    num_q_blocks: int
    num_kv_blocks: int


class Features(NamedTuple):
    CAUSAL: int  # an index into attnformal.masks.CAUSAL_MODES: only for triton-ascend's tile check
    HAS_ATTN_MASK: bool
    HAS_KEEP: bool
    HAS_SOFTCAP: bool
    HAS_BIAS: bool


class Tiles(NamedTuple):
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_D: int  # head dims padded to a power of two >= 16
    BLOCK_DV: int
    BF16_VIA_FP32: bool  # the interpreter's bf16 dot workaround (module note)


RUNTIME_GROUPS = (Geometry, IndexMask, Scores, DataMasks, ScheduleTables)
COMPILE_TIME_GROUPS = (Features, Tiles)


class KernelCall(NamedTuple):
    """One launch: every parameter by name, in the kernel's order."""

    kernel: Any
    grid: tuple[int, ...]
    args: dict
    num_warps: int

    def launch(self):
        if all(n > 0 for n in self.grid):
            self.kernel[self.grid](**self.args, num_warps=self.num_warps)


class Launch:
    """The arguments of every kernel, built in one place from the spec, the schedule and q."""

    def __init__(self, spec: AttentionSpec, schedule: TileSchedule, q):
        device = q.device
        self.spec, self.schedule = spec, schedule
        self.state_dtype = _state_dtype(q.dtype)
        classes, self.q_ranges, self.kv_ranges, self.kv_splits, row_lo, row_hi = _schedule_tables(
            schedule, _IndexGeometry(spec), device)
        self.num_q_blocks, self.num_kv_blocks = classes.shape[1:]
        scalars = torch.tensor([spec.scale, spec.softcap or 1.0, 1.0 / (1.0 - spec.dropout_p)],
                               dtype=self.state_dtype, device=device)
        bias = spec.dense_score_bias(self.state_dtype, device)
        self.has_bias = bias is not None
        self.groups = (
            Geometry(spec.batch, spec.heads_q, spec.group, spec.len_q, spec.len_k, spec.head_dim, spec.head_dim_v),
            IndexMask(row_lo, row_hi),
            Scores(scalars, bias.detach().contiguous() if self.has_bias
                   else torch.zeros(1, dtype=self.state_dtype, device=device)),
            DataMasks(*_flags_args(spec.attn_mask, device), *_flags_args(spec.dropout_mask, device)),
            ScheduleTables(classes, self.num_q_blocks, self.num_kv_blocks),
        )
        self.compile_time = (
            Features(CAUSAL_MODES.index(spec.causal), spec.attn_mask is not None, spec.dropout_mask is not None,
                     spec.softcap is not None, self.has_bias),
            Tiles(schedule.block_m, schedule.block_n, _padded(spec.head_dim), _padded(spec.head_dim_v),
                  _INTERPRETED and q.dtype == torch.bfloat16),
        )

    def forward_call(self, q, k, v, parts: SoftmaxState) -> KernelCall:
        splits = self.schedule.num_splits
        tensors = dict(Q=q, K=k, V=v, M_PART=parts.m, L_PART=parts.l, ACC_PART=parts.acc)
        return self._call(_attn_fwd, (self.num_q_blocks, splits, self.spec.batch * self.spec.heads_q),
                          self.schedule.block_m, tensors, dict(KV_SPLITS=self.kv_splits, num_splits=splits))

    def dkdv_call(self, q, k, v, do, lse, delta, dk, dv) -> KernelCall:
        return self._call(_attn_bwd_dkdv, (self.num_kv_blocks, self.spec.batch * self.spec.heads_kv),
                          self.schedule.block_n, dict(Q=q, K=k, V=v, DO=do, LSE=lse, DELTA=delta, DK=dk, DV=dv),
                          dict(Q_RANGES=self.q_ranges))

    def dq_call(self, q, k, v, do, lse, delta, dq, dbias) -> KernelCall:
        return self._call(_attn_bwd_dq, (self.num_q_blocks, self.spec.batch * self.spec.heads_q),
                          self.schedule.block_m, dict(Q=q, K=k, V=v, DO=do, LSE=lse, DELTA=delta, DQ=dq, DBIAS=dbias),
                          dict(KV_RANGES=self.kv_ranges))

    def _call(self, kernel, grid, rows, tensors, loop_table) -> KernelCall:
        runtime = {name: value for group in self.groups for name, value in group._asdict().items()}
        compile_time = {name: value for group in self.compile_time for name, value in group._asdict().items()}
        return KernelCall(kernel, grid, {**tensors, **runtime, **loop_table, **compile_time}, _num_warps(rows))

    def calls(self, q, k, v) -> list[KernelCall]:
        """The three launches on zero outputs and zero backward inputs, not run: what the kernels
        are compiled for (``tools/ascend_check.py`` lowers these)."""
        spec = self.spec
        q, k, v = (t.contiguous() for t in (q, k, v))
        parts = self._partial_states(q.device)
        do = q.new_zeros(spec.batch, spec.heads_q, spec.len_q, spec.head_dim_v)
        lse, delta = (torch.zeros(do.shape[:3], dtype=self.state_dtype, device=q.device) for _ in range(2))
        return [self.forward_call(q, k, v, parts),
                self.dkdv_call(q, k, v, do, lse, delta, torch.zeros_like(k), torch.zeros_like(v)),
                self.dq_call(q, k, v, do, lse, delta, torch.zeros_like(q), self._dbias_buffer(q.device))]

    def _partial_states(self, device) -> SoftmaxState:
        """One state per split, each merge's identity to start; the forward overwrites every real row."""
        spec = self.spec
        return empty_state((self.schedule.num_splits, spec.batch, spec.heads_q, spec.len_q), spec.head_dim_v,
                           dtype=self.state_dtype, device=device)

    def _dbias_buffer(self, device):
        """Where the dQ kernel stores each tile's dS: ``[B, Hq, Sq, Sk]`` with a bias, else a dummy."""
        spec = self.spec
        shape = (spec.batch, spec.heads_q, spec.len_q, spec.len_k) if self.has_bias else (1,)
        return torch.zeros(shape, dtype=self.state_dtype, device=device)

    def sinks(self, device):
        """Each row's sink logit ``[B, Hq, Sq, 1]`` in the state dtype, or None."""
        spec = self.spec
        if spec.sinks is None:
            return None
        sinks = spec.sinks.detach().to(device=device, dtype=self.state_dtype)[None, :, None, None]
        return sinks.expand(spec.batch, -1, spec.len_q, 1)

    def forward(self, q, k, v):
        parts = self._partial_states(q.device)
        self.forward_call(q, k, v, parts).launch()
        state = combine([SoftmaxState(*(t[s] for t in parts)) for s in range(self.schedule.num_splits)])
        sinks = self.sinks(q.device)
        if sinks is not None:  # merged last: obligation 14 with the monoid laws
            state = merge(state, sink_state(sinks))
        return finalize(state)

    def backward(self, q, k, v, do, lse, delta):
        """``(dq, dk, dv, d sinks, d bias [B, Hq, Sq, Sk])``; the last two None without sinks / bias."""
        dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
        dbias = self._dbias_buffer(q.device)
        self.dkdv_call(q, k, v, do, lse, delta, dk, dv).launch()
        self.dq_call(q, k, v, do, lse, delta, dq, dbias).launch()
        sinks = self.sinks(q.device)
        dsinks = None if sinks is None else sink_grads(sinks[..., 0], lse, delta).sum(dim=(0, 2))
        return dq, dk, dv, dsinks, dbias if self.spec.bias is not None else None  # ALiBi alone: no gradient


def _num_warps(rows):
    """8 warps for tiles of 128+ rows, else 4 (Triton's default): a 128 x 128 fp32 accumulator
    is 128 registers per thread at 4 warps, before the operands."""
    return 8 if rows >= 128 else 4


def _flags_args(mask, device):
    """A bool ``[B, H, Sq, Sk]`` mask as the kernels take it: an int8 view (same strides) and its strides."""
    if mask is None:
        return torch.zeros(1, dtype=torch.int8, device=device), 0, 0, 0, 0
    return mask.view(torch.int8), *mask.stride()


def _padded(dim):
    """Head dims travel padded to a power of two >= 16 (masked loads fill the padding with 0)."""
    return max(MIN_BLOCK, triton.next_power_of_2(dim))


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, spec, schedule):
        ctx.set_materialize_grads(False)
        ctx.launch, ctx.spec = None, spec
        if q.numel() == 0:  # no query rows: nothing attends, every gradient is zero
            ctx.save_for_backward(q, k, v)
            shape = (spec.batch, spec.heads_q, spec.len_q)
            return q.new_zeros(*shape, spec.head_dim_v), q.new_empty(shape, dtype=_state_dtype(q.dtype))
        q, k, v = (t.contiguous() for t in (q, k, v))
        ctx.launch = Launch(spec, schedule, q)
        out, lse = ctx.launch.forward(q, k, v)
        out, lse = out.to(q.dtype), lse.squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        if ctx.launch is None:
            return (*(torch.zeros_like(t) for t in ctx.saved_tensors), *_no_rows_parameter_grads(ctx.spec), None, None)
        q, k, v, out, lse = ctx.saved_tensors
        state_dtype = ctx.launch.state_dtype
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        delta = (grad_out.to(state_dtype) * out.to(state_dtype)).sum(-1)  # D = rowsum(dO * O)
        if grad_lse is not None:
            # d lse / d s_j = P_j, so dS = P (dP - D) + P g = P (dP - (D - g)): fold g into D. The same
            # holds for the sink: d sink = p_sink (g - D).
            delta = delta - grad_lse.to(state_dtype)
        dq, dk, dv, dsinks, dbias = ctx.launch.backward(q, k, v, grad_out.contiguous(), lse.contiguous(),
                                                        delta.contiguous())
        spec = ctx.spec
        return (dq, dk, dv, None if dsinks is None else dsinks.to(spec.sinks.dtype),
                None if dbias is None else dbias.sum_to_size(spec.bias.shape).to(spec.bias.dtype), None, None)


def _no_rows_parameter_grads(spec: AttentionSpec):
    """Zero d sinks and d bias (or None) for a problem with no query rows."""
    return tuple(None if t is None else torch.zeros_like(t) for t in (spec.sinks, spec.bias))


_INTERPRETED = isinstance(_attn_fwd, InterpretedFunction)
