"""The mpmath reference: the spec's definition transcribed loop by loop, at ``dps`` digits.

Slow (``O(B Hq Sq Sk (D + Dv))`` Python-level multiprecision operations) and plain on
purpose: it shares nothing with the certified pipeline but the mask (``spec.allowed()``)
and the head map (``spec.kv_heads()``), so the two check each other. Each input element
becomes ``mpmath.mpf(float(x))``, exactly the binary value it holds (float16, bfloat16,
float32 and float64 all convert to a Python float without rounding).

For one query row ``i`` (batch ``b``, head ``h``, KV head ``g``), over its allowed keys ``j``::

    r_j = scale q_i . k_j ;  s_j = c tanh(r_j / c) with softcap c, else r_j ;  s_j += bias_ij
    lse = log (exp(sink_h) + sum_j exp(s_j)) ;  P_j = exp(s_j - lse) ;  w_j = keep_ij / (1 - p)
    out_i = sum_j P_j w_j v_j
    dP_j = w_j dO_i . v_j ;  D = dO_i . out_i ;  dB_ij = P_j (dP_j - D) ;  dS_j = dB_ij [(1 - tanh^2(r_j / c))]
    dQ_i = scale sum_j dS_j k_j ;  dK_j += scale dS_j q_i ;  dV_j += P_j w_j dO_i
    dsink_h += -exp(sink_h - lse) D

``bias_ij`` is ALiBi's (``features.alibi.alibi_bias``, exact on the integer distance) plus ``bias``;
``exp(sink_h)`` is there only with sinks; ``dbias`` is ``dB`` summed over the dimensions the bias
was broadcast along. A row with no allowed key has ``out = 0``, ``lse = -inf`` (``sink_h``
with a sink) and contributes no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np
import torch

from attnformal.reference.certified import FIELDS, exact_inputs
from attnformal.features.alibi import alibi_bias
from attnformal.spec import AttentionSpec

DEFAULT_DPS = 40
PARAMETER_FIELDS = ("dsinks", "dbias")  # gradients of the differentiable keywords, when present


@dataclass(frozen=True)
class MpResult:
    """Object arrays of ``mpmath.mpf``: out, lse and (with ``grad_out``) dq, dk, dv, and the
    gradients of the sinks and the bias when the problem has them."""

    dps: int
    out: np.ndarray
    lse: np.ndarray
    dq: np.ndarray | None = None
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None
    dsinks: np.ndarray | None = None
    dbias: np.ndarray | None = None

    def float64(self, name: str) -> torch.Tensor:
        """The field rounded to float64."""
        return torch.tensor(np.vectorize(float, otypes=[np.float64])(getattr(self, name)))

    def fields(self) -> tuple[str, ...]:
        return tuple(name for name in (*FIELDS, *PARAMETER_FIELDS) if getattr(self, name) is not None)


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
        self.sinks = None if spec.sinks is None else _mpf_lists(spec.sinks.detach().cpu().double())
        self.slopes = None if spec.alibi_slopes is None else _mpf_lists(spec.alibi_slopes.cpu().double())
        self.bias = None
        if spec.bias is not None:
            full = (spec.batch, spec.heads_q, spec.len_q, spec.len_k)
            self.bias = _mpf_lists(spec.bias.detach().cpu().double().expand(full))

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
            shapes["dsinks"], shapes["dbias"] = (sp.heads_q,), (sp.batch, sp.heads_q, sp.len_q, sp.len_k)
            wanted = ("dq", "dk", "dv", *(["dsinks"] if sp.sinks is not None else []),
                      *(["dbias"] if sp.bias is not None else []))
            grads = {name: _filled(shapes[name], zero) for name in wanted}
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
        arrays = {name: _array(value, shapes[name]) for name, value in values.items()}
        if "dbias" in arrays:
            arrays["dbias"] = _sum_to_shape(arrays["dbias"], tuple(sp.bias.shape))
        return MpResult(dps=dps, **arrays)

    def _row(self, b, h, i, out, lse, grads, dk_terms, dv_terms):
        g = self.heads[h]
        keys = [j for j, ok in enumerate(self.allowed[b][h][i]) if ok]
        sink = None if self.sinks is None or self.sinks[h] == -mpmath.inf else self.sinks[h]
        if not keys:
            if sink is not None:
                lse[b][h][i] = sink  # out 0; D = 0, so no gradient either
            return  # empty row: out 0, lse -inf, no gradient
        qi, k, v = self.q[b][h][i], self.k[b][g], self.v[b][g]
        raw = [self.scale * mpmath.fdot(qi, k[j]) for j in keys]
        s = [self._softcap(r) + self._bias(b, h, i, j) for r, j in zip(raw, keys)]
        logits = s if sink is None else [*s, sink]  # the sink joins the denominator only
        top = max(logits)
        lse[b][h][i] = top + mpmath.log(mpmath.fsum(mpmath.exp(x - top) for x in logits))
        p = [mpmath.exp(x - lse[b][h][i]) for x in s]
        pw = [pj * self._weight(b, h, i, j) for pj, j in zip(p, keys)]  # P_j w_j
        out[b][h][i] = [mpmath.fdot(pw, [v[j][d] for j in keys]) for d in range(self.spec.head_dim_v)]
        if grads is None:
            return
        do = self.grad_out[b][h][i]
        delta = mpmath.fdot(do, out[b][h][i])
        if sink is not None and "dsinks" in grads:
            grads["dsinks"][h] -= mpmath.exp(sink - lse[b][h][i]) * delta
        ds = []
        for pj, rj, j in zip(p, raw, keys):
            dsj = pj * (self._weight(b, h, i, j) * mpmath.fdot(do, v[j]) - delta)
            if "dbias" in grads:
                grads["dbias"][b][h][i][j] = dsj
            ds.append(dsj if self.cap is None else dsj * (1 - mpmath.tanh(rj / self.cap) ** 2))
        grads["dq"][b][h][i] = [self.scale * mpmath.fdot(ds, [k[j][d] for j in keys])
                                for d in range(self.spec.head_dim)]
        for dsj, pwj, j in zip(ds, pw, keys):
            dk_terms[g][j].append((dsj, qi))
            dv_terms[g][j].append((pwj, do))

    def _bias(self, b, h, i, j):
        """ALiBi's bias (from the spec's formula, on exact ints and the mpf slope) plus ``bias``."""
        total = mpmath.mpf(0)
        if self.slopes is not None:
            len_k = self.spec.len_k if self.spec.kv_lens is None else self.spec.kv_lens[b]
            total += alibi_bias(i, j, self.slopes[b][h], self.spec.len_q, len_k)
        if self.bias is not None:
            total += self.bias[b][h][i][j]
        return total

    def _softcap(self, r):
        return r if self.cap is None else self.cap * mpmath.tanh(r / self.cap)

    def _weight(self, b, h, i, j):
        if self.keep is None:
            return 1
        return self.kappa if self.keep[b][h][i][j] else 0


def _sum_to_shape(full: np.ndarray, shape: tuple) -> np.ndarray:
    """``full`` ``[B, Hq, Sq, Sk]`` summed over the dimensions a tensor of ``shape`` was broadcast along."""
    padded = (1,) * (full.ndim - len(shape)) + shape
    axes = tuple(d for d, n in enumerate(padded) if n == 1 and full.shape[d] != 1)
    summed = full.sum(axis=axes, keepdims=True) if axes else full
    return summed.reshape(shape)


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
