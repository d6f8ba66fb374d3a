"""Obligation 10 -- the mask predicate means what the spec says, for all lengths and windows.

Z3 over unbounded integers. The spec's text is stated a second time, declaratively, in
:mod:`attnformal.proofs.mask_meaning` (no code shared with ``masks.py``); the spec's own code
is run on a symbolic :class:`~attnformal.spec.AttentionSpec`: ``Sq, Sk >= 0``, window bounds
``L, R`` (any sign), ``kv_lens`` an array with ``0 <= kv_lens[b] <= Sk`` for a symbolic batch
index ``b`` -- so ``g = spec.geometry(b)`` is what the kernels build for every batch element.
For every family and combination (causal none / top-left / bottom-right, times no window / a
window, times no ``kv_lens`` / ``kv_lens``) and all ``i, j``:

* (a) ``may_attend(i, j, g)`` = ``meaning(i, j)`` -- the spec's mask, with ``n = kv_lens[b]``
  (or ``Sk``) for padding and for bottom-right alignment;
* (b) one interval per row: ``meaning(i, j)`` <=> ``0 <= i < Sq`` and ``lo(i) <= j <= hi(i)``
  for ``(lo, hi) = key_interval(i, g)`` -- the interval the schedule classifies tiles by;
* (c) its ends never decrease: ``i <= i2`` => ``lo(i) <= lo(i2)`` and ``hi(i) <= hi(i2)``
  (so a tile's first and last rows bound all of its rows);
* (d) ``g.has_attn_mask`` holds exactly when an explicit ``attn_mask`` is given (a tile is
  FULL only without one).
"""

from __future__ import annotations

import z3

from attnformal import masks
from attnformal.logic import Budget, Control, Query, Settings, check_z3
from attnformal.proofs import mask_meaning
from attnformal.proofs.integers import domain, linear_abstraction, shown_values, spec_families, symbolic_spec
from attnformal.spec import AttentionSpec

TITLE = "Mask semantics (the spec's text)"


def checks(settings: Settings, budget: Budget):
    for claim, prop in PROPERTIES:
        yield check_property(claim, prop, budget)
    yield attn_mask_flag(budget)


class Row:
    """The geometry of batch element ``b`` of a symbolic spec, and the meaning of its mask."""

    def __init__(self, spec: AttentionSpec):
        self.spec, self.b = spec, z3.Int("b")
        self.g = spec.geometry(self.b)
        self.kv_len = spec.len_k if spec.kv_lens is None else spec.kv_lens[self.b]

    def meaning(self, i, j):
        s = self.spec
        prefix_len = None if s.prefix_lens is None else s.prefix_lens[self.b]
        return mask_meaning.allowed(i, j, len_q=s.len_q, len_k=s.len_k, kv_len=self.kv_len, causal=s.causal,
                                    window=s.window, chunk_size=s.chunk_size, prefix_len=prefix_len)

    def hypotheses(self):
        s = self.spec
        out = [("Sq, Sk >= 0", z3.And(s.len_q >= 0, s.len_k >= 0))]
        if s.kv_lens is not None:
            out.append(("0 <= kv_lens[b] <= Sk", z3.And(0 <= self.kv_len, self.kv_len <= s.len_k)))
        return (*out, *domain(self.g))

    def show(self, **terms):
        s = self.spec
        shown = {"Sq": s.len_q, "Sk": s.len_k, **terms}
        if s.kv_lens is not None:
            shown["kv_lens[b]"] = self.kv_len
        if s.window is not None:
            shown.update(L=s.window[0], R=s.window[1])
        return {**shown, **shown_values(self.g.values)}


def equals_meaning(row: Row):
    i, j = z3.Ints("i j")
    rule = masks.may_attend(i, j, row.g)
    return rule == row.meaning(i, j), row.show(i=i, j=j, may_attend=rule, meaning=row.meaning(i, j))


def one_interval(row: Row):
    i, j = z3.Ints("i j")
    lo, hi = masks.key_interval(i, row.g)
    interval = z3.And(0 <= i, i < row.spec.len_q, lo <= j, j <= hi)
    return row.meaning(i, j) == interval, row.show(i=i, j=j, lo=lo, hi=hi)


def ends_never_decrease(row: Row):
    i, i2 = z3.Ints("i i2")
    (lo, hi), (lo2, hi2) = masks.key_interval(i, row.g), masks.key_interval(i2, row.g)
    claim = z3.Implies(i <= i2, z3.And(lo <= lo2, hi <= hi2))
    return claim, row.show(i=i, i2=i2, lo=lo, hi=hi, lo2=lo2, hi2=hi2)


PROPERTIES = (
    ("(a) may_attend(i, j, spec.geometry(b)) = the spec's mask", equals_meaning),
    ("(b) the allowed keys of row i are the interval key_interval(i)", one_interval),
    ("(c) the ends of key_interval never decrease with the row", ends_never_decrease),
)


def check_property(claim, prop, budget: Budget):
    def queries():
        for label, values in spec_families():
            row = Row(symbolic_spec(values, attn_mask=False))
            formula, show = prop(row)
            yield Query(formula, row.hypotheses(), show, case=label)

    return check_z3(claim, queries(), budget=budget, abstraction=linear_abstraction(budget))


def attn_mask_flag(budget: Budget):
    def queries():
        for given in (False, True):
            kv_lens = z3.Array("kv_lens", z3.IntSort(), z3.IntSort())
            flag = Row(symbolic_spec({"kv_lens": kv_lens}, attn_mask=given)).g.has_attn_mask
            yield Query(z3.BoolVal(flag == given), show={"attn_mask given": given, "has_attn_mask": flag},
                        case="attn_mask given" if given else "no attn_mask")

    return check_z3("(d) spec.geometry(b).has_attn_mask <=> an attn_mask is given", queries(), budget=budget)


# ---- negative controls


def _window_top_left_under_top_left(i, g):
    """BROKEN: under top-left causal the window is aligned top-left too (offset 0)."""
    if g.causal == "top_left" and g.window is not None:
        return _KEY_INTERVAL(i, g.replace(len_q=g.len_k))  # len_q only enters through the offset
    return _KEY_INTERVAL(i, g)


def _strict_diagonal_with_window(i, g):
    """BROKEN: top-left causal with a window excludes the diagonal (j < i)."""
    lo, hi = _KEY_INTERVAL(i, g)
    if g.causal == "top_left" and g.window is not None:
        hi = z3.If(hi < i - 1, hi, i - 1)
    return lo, hi


def _rows_from_the_bottom(i, g):
    """BROKEN: the interval of row ``i`` is computed for row ``len_q - 1 - i``."""
    return _KEY_INTERVAL(g.len_q - 1 - i, g)


def _geometry_without_kv_lens(self, b=None):
    """BROKEN: every batch element gets the full key length."""
    return _GEOMETRY(self, None)


def _geometry_without_attn_mask(self, b=None):
    return _GEOMETRY(self, b).replace(has_attn_mask=False)


_KEY_INTERVAL = masks.key_interval
_GEOMETRY = AttentionSpec.geometry


def _property(index):
    claim, prop = PROPERTIES[index]
    return lambda budget: check_property(claim, prop, budget)


CONTROLS = (
    Control("window aligned top-left under top-left causal", "key_interval aligns the window top-left "
            "whenever causal='top_left'", masks, "key_interval", _window_top_left_under_top_left, _property(0)),
    Control("strict diagonal under top-left + window", "key_interval uses j < i when top-left causal "
            "meets a window", masks, "key_interval", _strict_diagonal_with_window, _property(0)),
    Control("geometry ignores kv_lens", "spec.geometry(b) gives every batch element Sk keys",
            AttentionSpec, "geometry", _geometry_without_kv_lens, _property(0)),
    Control("rows counted from the bottom", "key_interval(i) is the interval of row len_q - 1 - i",
            masks, "key_interval", _rows_from_the_bottom, _property(2)),
    Control("geometry drops the attn_mask flag", "spec.geometry(b).has_attn_mask is always False",
            AttentionSpec, "geometry", _geometry_without_attn_mask, attn_mask_flag),
)
