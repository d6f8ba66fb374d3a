"""Split-KV (flash-decoding) combine: the partial states of disjoint key ranges, merged.

The merge is associative and commutative with the empty state as identity (proven), so
the order and grouping of the partial states do not change the result.
"""

from __future__ import annotations

import functools

from attnformal.merge import SoftmaxState, merge


def combine(partials: list[SoftmaxState]) -> SoftmaxState:
    """The state of the union of the partials' key ranges."""
    return functools.reduce(merge, partials)
