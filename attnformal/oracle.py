"""The fp64 oracle: dense attention in float64, straight from the spec, with autograd backward.

It shares only the mask predicate and the GQA head map with the kernels (those are proven
separately); the softmax is dense, so it checks the tiling and the merge independently.
"""

from __future__ import annotations

import torch

from attnformal import ops
from attnformal.spec import AttentionSpec, apply_softcap


def attention_oracle(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None,
                     softcap=None, dropout_p=0.0, dropout_mask=None, return_lse=False):
    """Dense float64 attention; the implementation protocol, computed in float64.

    q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Sk, D]``, v ``[B, Hkv, Sk, Dv]``. Returns ``out``
    ``[B, Hq, Sq, Dv]`` (and ``lse`` ``[B, Hq, Sq]`` when ``return_lse``), both float64.
    Differentiable: gradients flow to q, k, v through autograd, zero for empty rows.
    """
    spec = AttentionSpec.from_inputs(q, k, v, scale=scale, causal=causal, window=window,
                                     attn_mask=attn_mask, kv_lens=kv_lens, softcap=softcap,
                                     dropout_p=dropout_p, dropout_mask=dropout_mask)
    out, lse = oracle_from_spec(spec, q, k, v)
    return (out, lse) if return_lse else out


def oracle_from_spec(spec: AttentionSpec, q, k, v):
    """``(out, lse)`` in float64 for a validated spec."""
    heads = spec.kv_heads(q.device)  # GQA by explicitly repeating K and V
    q, k, v = q.double(), k.double()[:, heads], v.double()[:, heads]
    s = spec.scale * (q @ k.transpose(-1, -2))
    if spec.softcap is not None:
        s = apply_softcap(s, spec.softcap)
    allowed = spec.allowed(q.device)
    # Shift by the row max of allowed scores; an empty row may use any finite shift.
    m = ops.rowmax(s.masked_fill(~allowed, float("-inf")))
    m = torch.where(torch.isfinite(m), m, 0.0).detach()
    # Excluded entries take exp(0) in the discarded branch, so no inf or NaN reaches autograd.
    e = torch.where(allowed, torch.where(allowed, s - m, 0.0).exp(), 0.0)
    l = e.sum(dim=-1, keepdim=True)
    seen = l > 0
    l_safe = torch.where(seen, l, 1.0)
    p = e / l_safe
    lse = torch.where(seen, m + l_safe.log(), float("-inf")).squeeze(-1)
    if spec.dropout_mask is not None:
        p = p * spec.dropout_mask / (1.0 - spec.dropout_p)
    return p @ v, lse


def forward_backward(impl, q, k, v, grad_out, **kwargs):
    """Run ``impl`` (the implementation protocol) and its backward on fresh leaves.

    Returns ``(out, lse, dq, dk, dv)``; ``lse`` is None if ``impl`` does not return one.
    """
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    result = impl(*leaves, return_lse=True, **kwargs)
    out, lse = result if isinstance(result, tuple) else (result, None)
    out.backward(grad_out.to(out.dtype))
    return (out.detach(), None if lse is None else lse.detach(), *(t.grad for t in leaves))
