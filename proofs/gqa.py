"""Obligation 6 -- the GQA head mapping ``kv_head_of(h, Hq, Hkv) = h // (Hq // Hkv)``.

**Theorem 6a (Z3, all head counts).** For ``Hkv >= 1``, ``Hq = G * Hkv`` with ``G >= 1`` and
every query head ``0 <= h < Hq``: ``0 <= kv_head_of(h) < Hkv`` -- each query head reads exactly
one KV head, an existing one.

**Theorem 6b (Z3, all head counts).** For every KV head ``0 <= k < Hkv``:
``kv_head_of(h) = k  <=>  k*G <= h < (k+1)*G`` -- each KV head serves exactly ``G = Hq/Hkv``
query heads, the consecutive group ``k*G .. (k+1)*G - 1`` (the layout of ``repeat_interleave``,
which the oracle and FlashAttention use).

**Theorem 6c (SymPy, Hq = 4, Hkv = 2).** In the backward, ``dK`` and ``dV`` of a KV head are
the sums, over its group, of the per-query-head ``tile_grads``: for the exact forward
``L = sum_h dO_h . attention(q_h, K[kv_head_of(h)], V[kv_head_of(h)])`` (two keys, head dim 1),
``dL/dK_k = sum_{h in group(k)} dk_h`` and likewise for ``V``.
"""

from __future__ import annotations

import numpy as np
import sympy
import z3

from attnformal import spec
from attnformal.logic import Budget, Control, Query, Settings, check_identities, check_z3
from attnformal.tile import tile_grads

TITLE = "GQA head mapping"
HQ, HKV, KEYS = 4, 2, 2


def checks(settings: Settings, budget: Budget):
    yield one_kv_head(budget)
    yield consecutive_groups(budget)
    yield grads_sum_over_group(budget)


def _heads():
    h, heads_kv, group, k = z3.Ints("h Hkv G k")
    heads_q = group * heads_kv  # Hq = G * Hkv, substituted: Z3 decides these much faster than with an equation
    hypotheses = (("Hkv >= 1, G >= 1", z3.And(heads_kv >= 1, group >= 1)),
                  ("0 <= h < Hq = G * Hkv", z3.And(0 <= h, h < heads_q)))
    return h, heads_q, heads_kv, group, k, hypotheses


def one_kv_head(budget: Budget):
    h, heads_q, heads_kv, group, _, hypotheses = _heads()
    g = spec.kv_head_of(h, heads_q, heads_kv)
    show = {"Hq": heads_q, "Hkv": heads_kv, "h": h, "kv_head_of(h)": g}
    query = Query(z3.And(0 <= g, g < heads_kv), hypotheses, show)
    return check_z3("every query head maps to one KV head in [0, Hkv)", [query], budget=budget)


def consecutive_groups(budget: Budget):
    h, heads_q, heads_kv, group, k, hypotheses = _heads()
    g = spec.kv_head_of(h, heads_q, heads_kv)
    claim = (g == k) == z3.And(k * group <= h, h < (k + 1) * group)
    query = Query(claim, (*hypotheses, ("0 <= k < Hkv", z3.And(0 <= k, k < heads_kv))),
                  {"Hq": heads_q, "Hkv": heads_kv, "h": h, "k": k, "kv_head_of(h)": g})
    return check_z3("KV head k serves exactly the query heads k*G .. (k+1)*G - 1 (G = Hq/Hkv)", [query], budget=budget)


def grads_sum_over_group(budget: Budget):
    scale = sympy.Rational(1, 2)
    q = [sympy.Symbol(f"q{h}", real=True) for h in range(HQ)]
    grad_out = [sympy.Symbol(f"dO{h}", real=True) for h in range(HQ)]
    k = [[sympy.Symbol(f"k{c}_{j}", real=True) for j in range(KEYS)] for c in range(HKV)]
    v = [[sympy.Symbol(f"v{c}_{j}", real=True) for j in range(KEYS)] for c in range(HKV)]
    heads = [spec.kv_head_of(h, HQ, HKV) for h in range(HQ)]
    loss, per_head = 0, []
    for h, c in enumerate(heads):
        e = [sympy.exp(scale * q[h] * k[c][j]) for j in range(KEYS)]
        out = sum(ej * vj for ej, vj in zip(e, v[c])) / sum(e)
        loss += grad_out[h] * out
        column = np.array([[x] for x in k[c]], dtype=object)
        dq, dk, dv = tile_grads(np.array([[q[h]]], dtype=object), column, np.array([[x] for x in v[c]], dtype=object),
                                np.array([[grad_out[h]]], dtype=object), np.array([[sympy.log(sum(e))]], dtype=object),
                                np.array([[grad_out[h] * out]], dtype=object), scale=scale)
        per_head.append((c, dk[:, 0], dv[:, 0]))

    def pairs():
        for c in range(HKV):
            for j in range(KEYS):
                yield (f"dK[{c}][{j}]", sympy.diff(loss, k[c][j]), sum(dk[j] for head, dk, _ in per_head if head == c))
                yield (f"dV[{c}][{j}]", sympy.diff(loss, v[c][j]), sum(dv[j] for head, _, dv in per_head if head == c))

    return check_identities(f"dK, dV of a KV head = sum of tile_grads over its query heads (Hq={HQ}, Hkv={HKV})",
                            pairs(), budget=budget)


# ---- negative controls


def _wrong_divisor(h, heads_q, heads_kv):
    return h / heads_kv if isinstance(h, z3.ArithRef) else h // heads_kv


CONTROLS = (
    Control("GQA h % Hkv", "query head h reads KV head h % Hkv (interleaved, not grouped)",
            spec, "kv_head_of", lambda h, heads_q, heads_kv: h % heads_kv, consecutive_groups),
    Control("GQA h // Hkv", "query head h reads KV head h // Hkv (divides by the wrong count)",
            spec, "kv_head_of", _wrong_divisor, one_kv_head),
)
