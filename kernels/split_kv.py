"""Split-KV (flash-decoding) combine, and the per-row fold every tiled kernel runs.

The merge is associative and commutative with the empty state as identity (proven), so
the order and grouping of the partial states do not change the result. :func:`fold_row` is the
one place the kernels' sequence of ``initial_state`` / ``merge`` / ``combine`` calls is written;
obligations 11 and 17 evaluate it symbolically (``python -m attnformal.prove``).
"""

from __future__ import annotations

import functools

from attnformal.merge import SoftmaxState, initial_state, merge


def combine(partials: list[SoftmaxState]) -> SoftmaxState:
    """The state of the union of the partials' key ranges."""
    return functools.reduce(merge, partials)


def fold_row(parts, empty: SoftmaxState, tile_state, sinks=None) -> SoftmaxState:
    """A row block's state: each split-KV part folds its key blocks from ``empty`` with ``merge``,
    the sink (if any) merged once per row, into the first part's fold; the partials ``combine``\\d.

    ``parts``: the key blocks of each part (``TileSchedule.split_ranges``); ``tile_state(bn)``: the
    state of key block ``bn`` (``merge.block_state``); ``sinks``: the rows' sink logits, or None.
    """
    partials = []
    for part, blocks in enumerate(parts):
        state = initial_state(empty, sinks) if part == 0 else empty
        for bn in blocks:
            state = merge(state, tile_state(bn))
        partials.append(state)
    return combine(partials)
