"""A forward attention kernel written with block pointers, launched as the Triton tutorial's host launches its
``_attn_fwd`` (``launch.TRITON_TUTORIAL``: the same arguments), for tests of the interpreter's ``make_tensor_ptr`` /
``advance`` and of loop-carried block pointers. Unlike the tutorial's, each tensor is addressed with its own strides,
masked scores are ``-inf`` and M's row offset is i64; like the tutorial's, it folds in base 2 (``exp2`` of scores in
units of log2 e) and M is a base-2 log-sum-exp. Block pointers are gone from recent Triton (3.9 here):
triton-ascend lowers it.
"""

import triton
import triton.language as tl


@triton.jit
def _attn_fwd(Q, K, V, sm_scale, M, Out,  #
              stride_qz, stride_qh, stride_qm, stride_qk, stride_kz, stride_kh, stride_kn, stride_kk,  #
              stride_vz, stride_vh, stride_vk, stride_vn, stride_oz, stride_oh, stride_om, stride_on,  #
              Z, H, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    z, h = (off_hz // H).to(tl.int64), (off_hz % H).to(tl.int64)
    q_tile = tl.make_block_ptr(Q + z * stride_qz + h * stride_qh, shape=(N_CTX, HEAD_DIM), strides=(stride_qm, stride_qk),
                               offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    k_tile = tl.make_block_ptr(K + z * stride_kz + h * stride_kh, shape=(HEAD_DIM, N_CTX), strides=(stride_kk, stride_kn),
                               offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N), order=(0, 1))  # K transposed
    v_tile = tl.make_block_ptr(V + z * stride_vz + h * stride_vh, shape=(N_CTX, HEAD_DIM), strides=(stride_vk, stride_vn),
                               offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))
    o_tile = tl.make_block_ptr(Out + z * stride_oz + h * stride_oh, shape=(N_CTX, HEAD_DIM),
                               strides=(stride_om, stride_on), offsets=(start_m * BLOCK_M, 0),
                               block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # (acc, l, m): the order of the tutorial's loop state
    l = tl.zeros([BLOCK_M], tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # base 2, as the tutorial's: s and m in units of log2 e
    q = tl.load(q_tile)
    end = (start_m + 1) * BLOCK_M if CAUSAL else N_CTX  # causal: no key past the block's last row
    for start_n in range(0, end, BLOCK_N):
        s = tl.dot(q, tl.load(k_tile)) * qk_scale
        if CAUSAL:
            s = tl.where(rows[:, None] >= start_n + cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), tl.load(v_tile), acc * alpha[:, None])
        m = m_new
        k_tile = tl.advance(k_tile, (0, BLOCK_N))
        v_tile = tl.advance(v_tile, (BLOCK_N, 0))
    tl.store(M + off_hz.to(tl.int64) * N_CTX + rows, m + tl.log2(l))
    tl.store(o_tile, (acc / l[:, None]).to(tl.float16))
