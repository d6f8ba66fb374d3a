"""A kernel with a classic boundary bug, for trying the battery on.

It hands every causal mask to SDPA's ``is_causal``, which is top-left aligned. That is right
whenever Sq == Sk -- most test cases -- and wrong for bottom-right causal with Sq != Sk
(decoding with a KV cache, chunked prefill). Try:

    python -m attnformal.verify --impl examples/causal_alignment_bug.py:attention --only 'mask.*'
"""

import torch


def attention(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None,
              softcap=None, dropout_p=0.0, dropout_mask=None, return_lse=False):
    if window is not None or attn_mask is not None or kv_lens is not None or softcap is not None \
            or dropout_p or return_lse:
        raise NotImplementedError("only plain and causal attention")
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal is not None, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
