"""The mask predicate: which keys a query may attend.

Every index mask the spec supports (causal top-left, causal bottom-right, a sliding
window, per-batch key lengths, and any AND of them) lets query row ``i`` see one
contiguous interval of keys ``[lo(i), hi(i)]``, and both ends never decrease as ``i``
grows. :func:`key_interval` computes that interval; :func:`may_attend` is the predicate.
Both are written against :mod:`attnformal.ops`, so the same lines evaluate on Python
ints, on torch index tensors (a whole tile at once) and on Z3 integers (for all lengths).

Families, for query ``i`` and key ``j`` with ``offset = len_k - len_q``:

* in range:            ``0 <= i < len_q`` and ``0 <= j < len_k``
* causal top-left:     ``j <= i``
* causal bottom-right: ``j <= i + offset`` (the last query sees the last key)
* window (left, right), aligned bottom-right:
                       ``i + offset - left <= j <= i + offset + right``;
                       a negative bound leaves that side unbounded
* per-batch key length: ``len_k`` is ``kv_lens[b]`` (keys past it are padding), and
  bottom-right alignment uses it in place of ``Sk``.

An explicit boolean ``attn_mask`` is ANDed on top by the callers; it is data, not an
index rule, so a tile under it is never classified as fully allowed.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.features import FEATURES, with_role
from attnformal.features.causal import CAUSAL_MODES

__all__ = ["CAUSAL_MODES", "MaskGeometry", "key_interval", "may_attend"]


class MaskGeometry:
    """The index mask of one batch element: its lengths and the value of every mask feature.

    Values may be ints, int tensors or Z3 Ints. The first arguments keep their historic order
    (``MaskGeometry(len_q, len_k, causal, window, has_attn_mask)``); every other mask feature is a
    keyword named after it (``chunk_size=...``). ``g.<feature>`` reads a value (None: inactive).
    """

    def __init__(self, len_q, len_k, causal=None, window=None, has_attn_mask=False, **values):
        if causal not in CAUSAL_MODES:
            raise ValueError(f"causal must be one of {CAUSAL_MODES}, got {causal!r}")
        known = {f.name for f in _mask_features()}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"MaskGeometry: no mask feature named {unknown[0]!r}; known: {', '.join(sorted(known))}")
        object.__setattr__(self, "len_q", len_q)
        object.__setattr__(self, "len_k", len_k)  # effective key length: kv_lens[b] when given, else Sk
        object.__setattr__(self, "values", {"causal": causal, "window": window, "attn_mask": has_attn_mask, **values})

    def __getattr__(self, name):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        if any(f.name == name for f in _mask_features()):
            return None
        raise AttributeError(f"MaskGeometry has no attribute {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError("MaskGeometry is immutable: use replace()")

    def replace(self, **changes) -> MaskGeometry:
        """A copy with ``len_q``, ``len_k``, ``has_attn_mask`` or feature values changed."""
        values = dict(self.values)
        if "has_attn_mask" in changes:
            values["attn_mask"] = changes.pop("has_attn_mask")
        values.update(changes)
        return MaskGeometry(values.pop("len_q", self.len_q), values.pop("len_k", self.len_k), values.pop("causal"),
                            values.pop("window"), values.pop("attn_mask"), **values)

    def _key(self):
        return (self.len_q, self.len_k, tuple(sorted((k, repr(v)) for k, v in self.values.items())))

    def __eq__(self, other):
        return isinstance(other, MaskGeometry) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        shown = ", ".join(f"{k}={v!r}" for k, v in self.values.items() if v is not None and v is not False)
        return f"MaskGeometry(len_q={self.len_q!r}, len_k={self.len_k!r}{', ' if shown else ''}{shown})"

    @property
    def has_attn_mask(self):
        """Whether mask data is ANDed on top (then no tile is FULL)."""
        return any(f.active(self.values.get(f.name)) for f in with_role("data"))

    @property
    def offset(self):
        """Bottom-right alignment: query ``i`` lines up with key ``i + offset``."""
        return self.len_k - self.len_q


def _mask_features():
    return [f for f in FEATURES if f.role in ("interval", "data")]


def key_interval(i, g: MaskGeometry):
    """``(lo, hi)``: the keys query ``i`` may attend are ``lo <= j <= hi`` (empty if lo > hi).

    Each active index-mask feature narrows the interval in turn, in the registry's order.
    """
    lo, hi = 0, g.len_k - 1
    for feature in with_role("interval"):
        value = g.values.get(feature.name)
        if feature.active(value):
            lo, hi = feature.narrow(i, lo, hi, value, g)
    return lo, hi


def may_attend(i, j, g: MaskGeometry):
    """True iff query ``i`` may attend key ``j`` under the index mask ``g``."""
    lo, hi = key_interval(i, g)
    return ops.and_(0 <= i, i < g.len_q, lo <= j, j <= hi)
