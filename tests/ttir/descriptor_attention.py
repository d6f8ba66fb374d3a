"""A forward attention kernel reading and writing through host tensor descriptors, launched as the Triton tutorial's
host launches its ``_attn_fwd_tma`` (``launch.TRITON_TUTORIAL_TMA``: the same arguments, each of q, k, v, o behind a
descriptor over its ``[Z * H * N_CTX, HEAD_DIM]`` view). Unlike the tutorial's, head ``(z, h)``'s rows start at
``off_hz * N_CTX`` and masked scores are ``-inf``; like the tutorial's, it folds in base 2 and M is a base-2
log-sum-exp, so the host ``attnformal.examples.triton_tutorial`` launches either. CUDA's ttir stage rewrites
descriptors to pointer arithmetic below sm_90: that IR is what the theorems read.
"""

import triton
import triton.language as tl


@triton.jit
def _attn_fwd_tma(sm_scale, M, Z, H, desc_q, desc_k, desc_v, desc_o, N_CTX,  #
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8_OUTPUT: tl.constexpr,
                  STAGE: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    head_row = off_hz * N_CTX  # row 0 of head (z, h) = off_hz in the flattened [Z * H * N_CTX, HEAD_DIM] views
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # (acc, l, m): the order of the tutorial's loop state
    l = tl.zeros([BLOCK_M], tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # base 2, as the tutorial's: s and m in units of log2 e
    q = desc_q.load([head_row + start_m * BLOCK_M, 0])
    end = (start_m + 1) * BLOCK_M if STAGE == 3 else N_CTX  # STAGE 3: causal
    key_row = head_row
    for start_n in range(0, end, BLOCK_N):
        s = tl.dot(q, desc_k.load([key_row, 0]).T) * qk_scale
        if STAGE == 3:
            s = tl.where(rows[:, None] >= start_n + cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), desc_v.load([key_row, 0]), acc * alpha[:, None])
        m = m_new
        key_row += BLOCK_N
    tl.store(M + off_hz * N_CTX + rows, m + tl.log2(l))
    desc_o.store([head_row + start_m * BLOCK_M, 0], (acc / l[:, None]).to(tl.float16))
