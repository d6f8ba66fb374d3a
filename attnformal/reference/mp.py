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
    """Nested Python lists of mpf (faster than object arrays); sums are ``mpmath.fdot``."""

    def __init__(self, spec: AttentionSpec, x: dict):
        self.spec = spec
        self.q, self.k, self.v = (_mpf_lists(x[name]) for name in ("q", "k", "v"))
        self.grad_out = _mpf_lists(x["grad_out"]) if "grad_out" in x else None
        self.allowed = spec.allowed("cpu").tolist()
        self.keep = spec.dropout_mask.cpu().tolist() if spec.dropout_mask is not None else None
        self.heads = spec.kv_heads().tolist()
        self.scale = mpmath.mpf(spec.scale)
        self.cap = None if spec.softcap is None else mpmath.mpf(spec.softcap)
        self.kappa = 1 / (1 - mpmath.mpf(spec.dropout_p))

    def run(self, dps: int) -> MpResult:
        sp = self.spec
        zero = mpmath.mpf(0)
        shapes = {"out": (sp.batch, sp.heads_q, sp.len_q, sp.head_dim_v), "lse": (sp.batch, sp.heads_q, sp.len_q),
                  "dq": (sp.batch, sp.heads_q, sp.len_q, sp.head_dim),
                  "dk": (sp.batch, sp.heads_kv, sp.len_k, sp.head_dim),
                  "dv": (sp.batch, sp.heads_kv, sp.len_k, sp.head_dim_v)}
        out, lse = _filled(shapes["out"], zero), _filled(shapes["lse"], mpmath.mpf("-inf"))
        grads = None
        if self.grad_out is not None:
            grads = {name: _filled(shapes[name], zero) for name in ("dq", "dk", "dv")}
        for b in range(sp.batch):
            # per key: the (coefficient, row vector) terms of its dK and dV, summed once all rows are done
            dk_terms = [[[] for _ in range(sp.len_k)] for _ in range(sp.heads_kv)]
            dv_terms = [[[] for _ in range(sp.len_k)] for _ in range(sp.heads_kv)]
            for h in range(sp.heads_q):
                for i in range(sp.len_q):
                    self._row(b, h, i, out, lse, grads, dk_terms, dv_terms)
            if grads is not None:
                for g in range(sp.heads_kv):
                    for j in range(sp.len_k):
                        grads["dk"][b][g][j] = _combine(dk_terms[g][j], sp.head_dim, self.scale)
                        grads["dv"][b][g][j] = _combine(dv_terms[g][j], sp.head_dim_v, 1)
        values = {"out": out, "lse": lse, **(grads or {})}
        return MpResult(dps=dps, **{name: _array(value, shapes[name]) for name, value in values.items()})

    def _row(self, b, h, i, out, lse, grads, dk_terms, dv_terms):
        g = self.heads[h]
        keys = [j for j, ok in enumerate(self.allowed[b][h][i]) if ok]
        if not keys:
            return  # empty row: out 0, lse -inf, no gradient
        qi, k, v = self.q[b][h][i], self.k[b][g], self.v[b][g]
        raw = [self.scale * mpmath.fdot(qi, k[j]) for j in keys]
        s = [self._softcap(r) for r in raw]
        top = max(s)
        lse[b][h][i] = top + mpmath.log(mpmath.fsum(mpmath.exp(x - top) for x in s))
        p = [mpmath.exp(x - lse[b][h][i]) for x in s]
        pw = [pj * self._weight(b, h, i, j) for pj, j in zip(p, keys)]  # P_j w_j
        out[b][h][i] = [mpmath.fdot(pw, [v[j][d] for j in keys]) for d in range(self.spec.head_dim_v)]
        if grads is None:
            return
        do = self.grad_out[b][h][i]
        delta = mpmath.fdot(do, out[b][h][i])
        ds = []
        for pj, rj, j in zip(p, raw, keys):
            dsj = pj * (self._weight(b, h, i, j) * mpmath.fdot(do, v[j]) - delta)
            ds.append(dsj if self.cap is None else dsj * (1 - mpmath.tanh(rj / self.cap) ** 2))
        grads["dq"][b][h][i] = [self.scale * mpmath.fdot(ds, [k[j][d] for j in keys])
                                for d in range(self.spec.head_dim)]
        for dsj, pwj, j in zip(ds, pw, keys):
            dk_terms[g][j].append((dsj, qi))
            dv_terms[g][j].append((pwj, do))

    def _softcap(self, r):
        return r if self.cap is None else self.cap * mpmath.tanh(r / self.cap)

    def _weight(self, b, h, i, j):
        if self.keep is None:
            return 1
        return self.kappa if self.keep[b][h][i][j] else 0


def _combine(terms, dim, factor):
    """``factor * sum_t c_t x_t`` for the ``(c_t, x_t)`` terms, element by element."""
    return [factor * mpmath.fdot([c for c, _ in terms], [x[d] for _, x in terms]) for d in range(dim)]


def _mpf_lists(t: torch.Tensor) -> list:
    return _map_leaves(t.tolist(), mpmath.mpf)


def _map_leaves(nested, fn):
    return [_map_leaves(x, fn) for x in nested] if isinstance(nested, list) else fn(nested)


def _filled(shape, value) -> list:
    return [_filled(shape[1:], value) for _ in range(shape[0])] if shape else value


def _array(nested, shape) -> np.ndarray:
    """A nested list of mpf as an object array of the given shape (zero-size dimensions too)."""
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        item = nested
        for n in idx:
            item = item[n]
        out[idx] = item
    return out
