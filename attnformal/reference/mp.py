"""The mpmath reference: the spec's definition transcribed loop by loop, at ``dps`` digits.

Slow (``O(B Hq Sq Sk (D + Dv))`` Python-level multiprecision operations) and plain on
purpose: it shares nothing with the certified pipeline but the mask (``spec.allowed()``)
and the head map (``spec.kv_heads()``), so the two check each other. Each input element
becomes ``mpmath.mpf(float(x))``, exactly the binary value it holds (float16, bfloat16,
float32 and float64 all convert to a Python float without rounding).

For one query row ``i`` (batch ``b``, head ``h``, KV head ``g``), over its allowed keys ``j``::

    r_j = scale q_i . k_j ;  s_j = c tanh(r_j / c) with softcap c, else r_j
    lse = log sum_j exp(s_j) ;  P_j = exp(s_j - lse) ;  w_j = keep_ij / (1 - p)
    out_i = sum_j P_j w_j v_j
    dP_j = w_j dO_i . v_j ;  D = dO_i . out_i ;  dS_j = P_j (dP_j - D) [(1 - tanh^2(r_j / c))]
    dQ_i = scale sum_j dS_j k_j ;  dK_j += scale dS_j q_i ;  dV_j += P_j w_j dO_i

A row with no allowed key has ``out = 0``, ``lse = -inf`` and contributes no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np
import torch

from attnformal.reference.certified import FIELDS, exact_inputs
from attnformal.spec import AttentionSpec

DEFAULT_DPS = 40


@dataclass(frozen=True)
class MpResult:
    """Object arrays of ``mpmath.mpf``: out, lse and (with ``grad_out``) dq, dk, dv."""

    dps: int
    out: np.ndarray
    lse: np.ndarray
    dq: np.ndarray | None = None
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None

    def float64(self, name: str) -> torch.Tensor:
        """The field rounded to float64."""
        return torch.tensor(np.vectorize(float, otypes=[np.float64])(getattr(self, name)))

    def fields(self) -> tuple[str, ...]:
        return tuple(name for name in FIELDS if getattr(self, name) is not None)


def mp_attention(q, k, v, grad_out=None, *, dps: int = DEFAULT_DPS, **protocol) -> MpResult:
    """Attention (and its gradients for ``grad_out``) in mpmath at ``dps`` decimal digits.

    Arguments as :func:`~attnformal.reference.certified_attention` (the implementation
    protocol's keywords; dropout needs its keep-mask).
    """
    spec = AttentionSpec.from_inputs(q, k, v, **protocol)
    x = exact_inputs(spec, q, k, v, grad_out)
    with mpmath.workdps(dps):
        return _Computation(spec, x).run(dps)


class _Computation:
    def __init__(self, spec: AttentionSpec, x: dict):
        self.spec = spec
        self.q, self.k, self.v = (_mpf_array(x[name]) for name in ("q", "k", "v"))
        self.grad_out = _mpf_array(x["grad_out"]) if "grad_out" in x else None
        self.allowed = spec.allowed().numpy()
        self.keep = spec.dropout_mask.cpu().numpy() if spec.dropout_mask is not None else None
        self.heads = spec.kv_heads().tolist()
        self.scale = mpmath.mpf(spec.scale)
        self.cap = None if spec.softcap is None else mpmath.mpf(spec.softcap)
        self.kappa = 1 / (1 - mpmath.mpf(spec.dropout_p))

    def run(self, dps: int) -> MpResult:
        sp = self.spec
        zeros = np.vectorize(lambda _: mpmath.mpf(0), otypes=[object])
        out = zeros(np.empty((sp.batch, sp.heads_q, sp.len_q, sp.head_dim_v)))
        lse = np.full((sp.batch, sp.heads_q, sp.len_q), mpmath.mpf("-inf"), dtype=object)
        grads = None
        if self.grad_out is not None:
            grads = {"dq": zeros(np.empty(self.q.shape)), "dk": zeros(np.empty(self.k.shape)),
                     "dv": zeros(np.empty(self.v.shape))}
        for b in range(sp.batch):
            for h in range(sp.heads_q):
                for i in range(sp.len_q):
                    self._row(b, h, i, out, lse, grads)
        return MpResult(dps=dps, out=out, lse=lse, **(grads or {}))

    def _row(self, b, h, i, out, lse, grads):
        g = self.heads[h]
        keys = [j for j in range(self.spec.len_k) if self.allowed[b, h, i, j]]
        if not keys:
            return  # empty row: out 0, lse -inf, no gradient
        qi, k, v = self.q[b, h, i], self.k[b, g], self.v[b, g]
        raw = {j: self.scale * mpmath.fdot(qi, k[j]) for j in keys}
        s = {j: self._softcap(raw[j]) for j in keys}
        top = max(s.values())
        lse[b, h, i] = top + mpmath.log(mpmath.fsum(mpmath.exp(s[j] - top) for j in keys))
        p = {j: mpmath.exp(s[j] - lse[b, h, i]) for j in keys}
        w = {j: self._weight(b, h, i, j) for j in keys}
        out[b, h, i] = [mpmath.fsum(p[j] * w[j] * v[j, d] for j in keys) for d in range(v.shape[1])]
        if grads is None:
            return
        do = self.grad_out[b, h, i]
        delta = mpmath.fdot(do, out[b, h, i])
        for j in keys:
            ds = p[j] * (w[j] * mpmath.fdot(do, v[j]) - delta)
            if self.cap is not None:
                ds *= 1 - mpmath.tanh(raw[j] / self.cap) ** 2
            grads["dq"][b, h, i] += self.scale * ds * k[j]
            grads["dk"][b, g, j] += self.scale * ds * qi
            grads["dv"][b, g, j] += p[j] * w[j] * do

    def _softcap(self, r):
        return r if self.cap is None else self.cap * mpmath.tanh(r / self.cap)

    def _weight(self, b, h, i, j):
        if self.keep is None:
            return 1
        return self.kappa if self.keep[b, h, i, j] else 0


def _mpf_array(t: torch.Tensor) -> np.ndarray:
    return np.vectorize(mpmath.mpf, otypes=[object])(t.numpy())
