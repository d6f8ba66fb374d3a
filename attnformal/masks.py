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

from dataclasses import dataclass
from typing import Any

from attnformal import ops

CAUSAL_MODES = (None, "top_left", "bottom_right")


@dataclass(frozen=True)
class MaskGeometry:
    """The index mask of one batch element. Fields may be ints, int tensors or Z3 Ints."""

    len_q: Any
    len_k: Any  # effective key length: kv_lens[b] when given, else Sk
    causal: str | None = None
    window: tuple[Any, Any] | None = None  # (left, right); negative: unbounded on that side
    has_attn_mask: bool = False  # an explicit mask is ANDed on top of the index rule

    def __post_init__(self):
        if self.causal not in CAUSAL_MODES:
            raise ValueError(f"causal must be one of {CAUSAL_MODES}, got {self.causal!r}")

    @property
    def offset(self):
        """Bottom-right alignment: query ``i`` lines up with key ``i + offset``."""
        return self.len_k - self.len_q


def key_interval(i, g: MaskGeometry):
    """``(lo, hi)``: the keys query ``i`` may attend are ``lo <= j <= hi`` (empty if lo > hi)."""
    lo, hi = 0, g.len_k - 1
    if g.causal == "top_left":
        hi = ops.minimum(hi, i)
    elif g.causal == "bottom_right":
        hi = ops.minimum(hi, i + g.offset)
    if g.window is not None:
        left, right = g.window
        lo = ops.where(left < 0, lo, ops.maximum(lo, i + g.offset - left))
        hi = ops.where(right < 0, hi, ops.minimum(hi, i + g.offset + right))
    return lo, hi


def may_attend(i, j, g: MaskGeometry):
    """True iff query ``i`` may attend key ``j`` under the index mask ``g``."""
    lo, hi = key_interval(i, g)
    return ops.and_(0 <= i, i < g.len_q, lo <= j, j <= hi)
