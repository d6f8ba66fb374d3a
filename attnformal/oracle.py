"""The fp64 oracle: dense attention in float64, straight from the spec, with autograd backward.

It shares only the mask predicate and the GQA head map with the kernels (those are proven
separately); the softmax is dense, so it checks the tiling and the merge independently.
"""

from __future__ import annotations

import functools

import torch

from attnformal import ops
from attnformal.features import FEATURES, refuse_unsupported
from attnformal.features.varlen import run_packed
from attnformal.spec import AttentionSpec

# The parts a feature can play that the dense computation below knows how to compute.
ORACLE_ROLES = ("interval", "length", "data", "scores", "bias", "state", "dropout", "layout")


def attention_oracle(q, k, v, *, scale=None, return_lse=False, **features):
    """Dense float64 attention; the implementation protocol, computed in float64.

    q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Sk, D]``, v ``[B, Hkv, Sk, Dv]``. Returns ``out``
    ``[B, Hq, Sq, Dv]`` (and ``lse`` ``[B, Hq, Sq]`` when ``return_lse``), both float64.
    Differentiable: gradients flow to q, k, v (zero for empty rows), ``sinks`` and ``bias``
    through autograd. Every registered feature is a keyword (:mod:`attnformal.features`); the
    oracle computes them all.
    """
    spec = AttentionSpec.from_inputs(q, k, v, scale=scale, **features)
    refuse_unsupported(spec, {f.name for f in FEATURES if f.role in ORACLE_ROLES}, "the fp64 oracle")
    out, lse = oracle_from_spec(spec, q, k, v)
    return (out, lse) if return_lse else out


def oracle_from_spec(spec: AttentionSpec, q, k, v, dtype=torch.float64):
    """``(out, lse)`` for a validated spec, computed in ``dtype`` (float64: the oracle).

    Another ``dtype`` gives the same dense computation in that precision: the naive
    same-dtype control that the battery's "k x the naive error" criterion compares with. A packed
    batch is computed sequence by sequence (:func:`attnformal.features.varlen.run_packed`).
    """
    if spec.packed:
        return run_packed(spec, q, k, v, functools.partial(oracle_from_spec, dtype=dtype))
    p, lse = oracle_probabilities(spec, q, k, dtype)
    return oracle_output(spec, p, v), lse


def oracle_output(spec: AttentionSpec, p, v):
    """``out = dropout(p) @ v`` for probabilities ``p`` from :func:`oracle_probabilities`, in ``p``'s dtype."""
    if spec.dropout_mask is not None:
        p = p * spec.dropout_mask / (1.0 - spec.dropout_p)
    return p @ v.to(p.dtype)[:, spec.kv_heads(p.device)]


def oracle_probabilities(spec: AttentionSpec, q, k, dtype=torch.float64):
    """``(p, lse)``: the attention probabilities ``[B, Hq, Sq, Sk]`` before dropout (0 at
    disallowed keys and on empty rows) and the log-sum-exp ``[B, Hq, Sq]``, in ``dtype``."""
    q, k = q.to(dtype), k.to(dtype)[:, spec.kv_heads(q.device)]  # GQA by explicitly repeating K
    s = spec.scale * (q @ k.transpose(-1, -2))
    s = spec.modify_scores(s)
    bias = spec.dense_score_bias(dtype, q.device)
    if bias is not None:
        s = s + bias
    allowed = spec.allowed(q.device)
    sink = None if spec.sinks is None else spec.sinks.to(dtype)[None, :, None, None]
    # Shift by the row max of allowed scores and the sink; an empty row may use any finite shift.
    m = ops.rowmax(s.masked_fill(~allowed, float("-inf")))
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, 0.0).detach()
    # Excluded entries take exp(0) in the discarded branch, so no inf or NaN reaches autograd.
    e = torch.where(allowed, torch.where(allowed, s - m, 0.0).exp(), 0.0)
    l = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        l = l + (sink - m).exp()  # the sink's term: in the denominator, never in the output
    seen = l > 0
    l_safe = torch.where(seen, l, 1.0)
    lse = torch.where(seen, m + l_safe.log(), float("-inf")).squeeze(-1)
    return e / l_safe, lse


def forward_backward(impl, q, k, v, grad_out, **kwargs):
    """Run ``impl`` (the implementation protocol) and its backward on fresh leaves.

    Returns ``(out, lse, dq, dk, dv)``; ``lse`` is None if ``impl`` does not return one.
    """
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    result = impl(*leaves, return_lse=True, **kwargs)
    out, lse = result if isinstance(result, tuple) else (result, None)
    out.backward(grad_out.to(out.dtype))
    return (out.detach(), None if lse is None else lse.detach(), *(t.grad for t in leaves))
