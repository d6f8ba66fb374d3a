"""The battery's protocol around the Triton tutorial's TMA forward kernel, for the cases its refutations write.

The tutorial (triton-lang/triton at 003da478d84f5bb0f51b3988cf0ea0bbe60282b7, ``python/tutorials/06-fused-attention.py``)
is not vendored, and its module asks for a GPU driver at import. So this host compiles the ``@triton.jit`` functions
of the copy that ``ATTNFORMAL_KERNEL_FILE`` names (their code alone: none of its host code runs) and launches
``_attn_fwd_tma`` as ``_attention.forward`` does: q, k, v, o behind host TensorDescriptors over their
``[Z * H * N_CTX, HEAD_DIM]`` views, grid ``(cdiv(N_CTX, BLOCK_M), Z * H)``, ``STAGE = 3`` when causal, in a
configuration :data:`~attnformal.ttir.launch.TRITON_TUTORIAL_TMA` proves (so the kernel replayed is the kernel
proven). It runs under the Triton interpreter on a CPU and natively on a GPU::

    ATTNFORMAL_KERNEL_FILE=path/to/06-fused-attention.py python -m attnformal.verify \\
        --impl attnformal.examples.triton_tutorial:attention_tma --replay CASE
"""

import math
import os

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from attnformal.ttir.launch import KERNEL_FILE_ENV, TRITON_TUTORIAL_TMA
from attnformal.ttir.theorems import load_attr

_FILE = os.environ.get(KERNEL_FILE_ENV, "")
if not _FILE.endswith(".py") or not os.path.isfile(_FILE):
    raise ValueError(f"environment variable {KERNEL_FILE_ENV}: expected the path of a copy of the tutorial's "
                     f"06-fused-attention.py, got {_FILE!r}")
_attn_fwd_tma = load_attr(f"{_FILE}:_attn_fwd_tma")


def attention_tma(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None, softcap=None,
                  dropout_p=0.0, dropout_mask=None, return_lse=False):
    """``[B, H, S, D]`` q, k, v in float16 (the tutorial's dtype); the tutorial's M is a base-2 log-sum-exp, so
    ``lse = M * ln 2``. Refused: what the tutorial does not compute (masks, windows, dropout, GQA, Sq != Sk), and
    launches the proven configurations do not cover (its own precondition: N_CTX a multiple of BLOCK_M)."""
    if window is not None or attn_mask is not None or kv_lens is not None or softcap is not None or dropout_p:
        raise NotImplementedError("triton tutorial: plain and causal attention only")
    z, h, n_ctx, head_dim = q.shape
    if k.shape != q.shape or v.shape != q.shape or q.dtype != torch.float16:
        raise NotImplementedError("triton tutorial: argument 'k', 'v': q's shape (one N_CTX, no GQA), float16")
    stage = 3 if causal else 1
    configs = [c for c in TRITON_TUTORIAL_TMA.configs if c["STAGE"] == stage and c["HEAD_DIM"] == head_dim]
    if not configs or n_ctx % configs[0]["BLOCK_M"]:
        raise NotImplementedError(f"triton tutorial: head dim and N_CTX of a proven configuration "
                                  f"({[(c['HEAD_DIM'], c['BLOCK_M']) for c in TRITON_TUTORIAL_TMA.configs]}: "
                                  "N_CTX a multiple of BLOCK_M)")
    config = configs[0]
    o = torch.empty_like(q)
    m = torch.empty((z, h, n_ctx), device=q.device, dtype=torch.float32)
    rows = z * h * n_ctx
    # As the tutorial's host: each tensor's memory seen as row-major [Z * H * N_CTX, HEAD_DIM], whatever its strides.
    descriptors = [TensorDescriptor(t, shape=[rows, head_dim], strides=[head_dim, 1], block_shape=[config[block], head_dim])
                   for t, block in ((q, "BLOCK_M"), (k, "BLOCK_N"), (v, "BLOCK_N"), (o, "BLOCK_M"))]
    grid = (triton.cdiv(n_ctx, config["BLOCK_M"]), z * h, 1)
    _attn_fwd_tma[grid](scale if scale is not None else 1 / math.sqrt(head_dim), m, z, h, *descriptors, n_ctx,
                        **config)
    return (o, m * math.log(2)) if return_lse else o
