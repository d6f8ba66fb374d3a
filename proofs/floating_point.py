"""Obligation 8 -- IEEE floating point: no NaN, no overflow in exp, a safe final division.

For float32, float16 and bfloat16 (Z3 ``Float32()``, ``FPSort(5, 11)``, ``FPSort(8, 8)``),
with the real IEEE encodings of ``-inf``, ``+-0`` and NaN, on the spec's own ``tile_scores``,
``block_state``, ``merge``, ``finalize`` and ``ops.maximum``. Let ``H = 2**(emax - 2)``
(float32: 2**125, float16: 8192, bfloat16: 2**125).

* **(a) maximum.** ``ops.maximum`` is SMT-LIB ``fp.max``, which leaves ``max(-0, +0)`` open
  (torch, too, returns either zero): for non-NaN ``a, b`` it is ``>= a`` and ``>= b`` and is one
  of them bit for bit -- whichever zero it picks, so every theorem below holds for both.
* **(b) tile.** For two keys with finite raw scores, any mask, values ``|v| <= H``, the state
  ``block_state(tile_scores(...))`` has no NaN; every ``exp`` argument is ``<= 0`` (so exp
  cannot overflow); ``l >= 1`` and ``m`` finite if a key is allowed; the identity ``(-inf, 0, 0)``
  if none is (a fully masked row).
* **(c) merge.** For well-formed states -- ``(-inf, 0, 0)``, or ``m`` finite, ``1 <= l <= H``,
  ``|acc| <= H`` -- the merge has no NaN, every ``exp`` argument is ``<= 0``, and the result is
  well-formed: ``-inf`` with zeros, or ``m`` finite with ``l >= 1`` and ``l``, ``acc`` finite.
  (``l >= 1`` after the first nonempty tile: the state holding the max is rescaled by exactly
  ``exp(0) = 1``.)
* **(d) finalize.** For a well-formed state: ``out`` and ``lse`` are not NaN (no ``0/0``, no
  ``inf - inf``); the identity gives ``out = 0``, ``lse = -inf``.

The bounds ``l, |acc| <= H`` before each merge are the no-overflow hypothesis: ``l`` is at most
the number of keys, ``|acc|`` at most that times ``max |v|``; kernels accumulate in float32
(where H is 4e37), and a float16 accumulator would overflow ``l`` past 8192 keys.

**How it is proved** (details in :mod:`attnformal.proofs.ieee`). Bit-blasting a whole merge
in float32 is far too slow, so the proof is compositional: 13 lemmas about single IEEE
operations and about ``ops.maximum`` are proved bit-precisely for each format (e.g.
``0 <= x <= 1, |y| <= H => |x*y| <= H``), then (b)-(d) are proved on abstract floats whose
operations are constrained by those lemmas only; each real IEEE run is one of their models. A
case that fails there is decided in real IEEE arithmetic, so a counterexample is always real.
``exp`` and ``log`` are uninterpreted, with axioms true of any faithfully rounded libm (the true
value is bracketed by the two floats around it, and 0, 1, the bounds are floats):

* ``exp-nan``: ``exp(NaN) = NaN``; ``exp-neg-inf``: ``exp(-inf) = +0`` (IEEE 754 9.2);
  ``exp-zero``: ``exp(+-0) = 1``; ``exp-unit``: ``x <= 0 => +0 <= exp(x) <= 1``;
* ``log-range``: ``1 <= x <= H => log(x)`` finite and ``>= 0``.

No axiom says that exp of a moderate argument stays above zero, so the theorems hold for an
exp that flushes small results to zero, as GPUs may. The report lists, per theorem, the axioms
and lemmas its solver's unsat cores show it used.
"""

from __future__ import annotations

import numpy as np
import z3

from attnformal import merge as spec
from attnformal import ops, tile
from attnformal.domains import FloatFormat, abstract_operation
from attnformal.logic import UNKNOWN, Budget, Control, Proof, Query, Settings, applications
from attnformal.merge import SoftmaxState
from attnformal.proofs import pipeline
from attnformal.proofs.ieee import bound_H, fp_theorem, prove_lemmas

COST = 4  # rough seconds; the prover starts the longest obligations first
TITLE = "Floating point (float32, float16, bfloat16)"
FORMATS = (FloatFormat("float32", 8, 24), FloatFormat("float16", 5, 11), FloatFormat("bfloat16", 8, 8))


# ---- the theorems, built on either domain


def exp_arguments(d, terms):
    decl = abstract_operation("exp", d.fmt) if d.abstract else ops.z3_function("exp", d.fmt.sort)
    return [a.arg(0) for a in applications([d.raw(t) for t in terms], decl)]


def column(xs):
    return np.array([[x] for x in xs], dtype=object)


def build_tile(d):
    H = bound_H(d.fmt)
    scores, values = [d.var(f"s{j}") for j in range(2)], [d.var(f"v{j}") for j in range(2)]
    allowed = [z3.Bool(f"allowed{j}") for j in range(2)]
    state = pipeline.tile_state(np.array([[d.number(1.0)]], dtype=object), column(scores), column(values),
                                np.array([allowed], dtype=object))
    m, l, acc = (x[0, 0] for x in state)
    hypotheses = (("raw scores finite", z3.And(*(d.is_finite(s) for s in scores))),
                  ("|v| <= H", z3.And(*(d.abs_le(v, H) for v in values))))
    show = {**{f"s{j}": s for j, s in enumerate(scores)}, **{f"allowed{j}": a for j, a in enumerate(allowed)},
            **{f"v{j}": v for j, v in enumerate(values)}, "m": m, "l": l, "acc": acc}
    claims = {
        "no NaN": z3.Not(z3.Or(d.is_nan(m), d.is_nan(l), d.is_nan(acc))),
        "exp arguments <= 0": z3.And(*(d.le(x, 0.0) for x in exp_arguments(d, [m, l, acc]))),
        "a key allowed => m finite, l >= 1": z3.Implies(z3.Or(*allowed), z3.And(d.is_finite(m), d.le(1.0, l))),
        "no key allowed => (-inf, 0, 0)": z3.Implies(z3.Not(z3.Or(*allowed)),
                                                     z3.And(d.is_neg_inf(m), d.is_zero(l), d.is_zero(acc))),
    }
    return [Query(c, hypotheses, show, case=name) for name, c in claims.items()]


def _state(d, name):
    m, l, acc = d.var(f"{name}.m"), d.var(f"{name}.l"), d.var(f"{name}.acc")
    H = bound_H(d.fmt)
    well_formed = z3.If(d.is_neg_inf(m), z3.And(d.is_zero(l), d.is_zero(acc)),
                        z3.And(d.is_finite(m), d.le(1.0, l), d.abs_le(l, H), d.abs_le(acc, H)))
    return SoftmaxState(m, l, acc), (f"{name} well-formed, l and |acc| <= H", well_formed)


def build_merge(d):
    (a, a_ok), (b, b_ok) = _state(d, "a"), _state(d, "b")
    merged = spec.merge(a, b)
    m, l, acc = merged
    show = {**dict(zip(("a.m", "a.l", "a.acc"), a)), **dict(zip(("b.m", "b.l", "b.acc"), b)),
            "merge.m": m, "merge.l": l, "merge.acc": acc}
    claims = {
        "no NaN": z3.Not(z3.Or(d.is_nan(m), d.is_nan(l), d.is_nan(acc))),
        "exp arguments <= 0": z3.And(*(d.le(x, 0.0) for x in exp_arguments(d, merged))),
        "result well-formed": z3.If(d.is_neg_inf(m), z3.And(d.is_zero(l), d.is_zero(acc)),
                                    z3.And(d.is_finite(m), d.is_finite(l), d.is_finite(acc), d.le(1.0, l))),
    }
    return [Query(c, (a_ok, b_ok), show, case=name) for name, c in claims.items()]


def build_finalize(d):
    state, ok = _state(d, "state")
    out, lse = spec.finalize(state)
    show = {"m": state.m, "l": state.l, "acc": state.acc, "out": out, "lse": lse}
    claims = {
        "no NaN": z3.Not(z3.Or(d.is_nan(out), d.is_nan(lse))),
        "empty row => out = 0, lse = -inf": z3.Implies(d.is_neg_inf(state.m),
                                                       z3.And(d.is_zero(out), d.is_neg_inf(lse))),
    }
    return [Query(c, (ok,), show, case=name) for name, c in claims.items()]


THEOREMS = (("tile: no NaN, exp args <= 0, l >= 1 if a key is allowed, identity if none", build_tile),
            ("merge of well-formed states: no NaN, exp args <= 0, well-formed result", build_merge),
            ("finalize: no NaN; an empty row gives (0, -inf)", build_finalize))


def checks(settings: Settings, budget: Budget):
    for f in FORMATS:
        lemmas = prove_lemmas(f, budget)  # theorem (a) is the lemma "maximum"
        yield lemmas
        for claim, build in THEOREMS:
            if lemmas.ok:
                yield fp_theorem(claim, build, f, budget, lemmas)
            else:  # the theorems rest on the lemmas
                yield Proof(f"{f.name}: {claim}", "z3", UNKNOWN, detail="its lemmas were not proved")


# ---- negative controls (on float16: the smallest, so the fastest to refute)

FLOAT16 = FORMATS[1]


def _on_float16(theorem: int):
    claim, build = THEOREMS[theorem]
    return lambda budget: fp_theorem(claim, build, FLOAT16, budget)


CONTROLS = (
    Control("maximum computes the minimum", "ops.maximum on floats with its branches swapped (fp.min)",
            ops._Z3, "maximum", staticmethod(lambda a, b: z3.fpMin(a, b)),
            lambda budget: prove_lemmas(FLOAT16, budget)),
    Control("unguarded m_old - m_new (float16)", "merge shifts by m itself: -inf - (-inf) = NaN",
            spec, "finite_shift", lambda m: m, _on_float16(1)),
    Control("mask applied after the max (float16)", "the tile's max includes masked scores: an allowed "
            "score below it gets a weight < 1, or 0 once it underflows", pipeline, "tile_state",
            pipeline.mask_after_max_state, _on_float16(0)),
    Control("finite -1e4 mask sentinel (float16)", "tile_scores writes -10000 at masked keys",
            tile, "NEG_INF", -1e4, _on_float16(0)),
)
