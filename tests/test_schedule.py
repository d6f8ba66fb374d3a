"""Tile classification, visited ranges and split-KV parts against brute force over the mask.

The prover shows the same properties for all lengths with Z3; these tests check the
Python and torch evaluations of the very same functions on many concrete shapes.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from attnformal.masks import MaskGeometry, key_interval, may_attend
from attnformal.schedule import (FULL, PARTIAL, SKIP, Blocks, TileSchedule, blocks, kv_block_range, split_part,
                                 tile_class)
from attnformal.spec import AttentionSpec

BLOCKS = ((4, 4), (4, 8), (8, 4), (3, 5))
GEOMETRIES = [
    MaskGeometry(len_q, len_k, causal, window, has_mask)
    for len_q, len_k in ((0, 5), (1, 1), (7, 7), (9, 16), (16, 9), (17, 33))
    for causal in (None, "top_left", "bottom_right")
    for window in (None, (2, 0), (-1, 3), (5, 5))
    for has_mask in (False, True)
]


def brute_class(bm, bn, g, block_m, block_n):
    pairs = [(i, j) for i in range(bm * block_m, (bm + 1) * block_m)
             for j in range(bn * block_n, (bn + 1) * block_n)]
    allowed = [may_attend(i, j, g) for i, j in pairs]
    return any(allowed), all(allowed)


def violations(classify, kv_range, g, block_m, block_n):
    """Every way the classification disagrees with brute force over the mask predicate."""
    found = []
    sched = TileSchedule(block_m, block_n)
    for bm in range(sched.num_q_blocks(g) + 1):  # one block past the end too
        visited = set(range(*kv_range(bm, g, block_m, block_n)))
        for bn in range(sched.num_kv_blocks(g) + 1):
            cls = classify(bm, bn, g, block_m, block_n)
            some, every = brute_class(bm, bn, g, block_m, block_n)
            if cls == SKIP and some:
                found.append(("skipped a tile with an allowed pair", bm, bn))
            if cls == FULL and not (every and not g.has_attn_mask):
                found.append(("unsound FULL", bm, bn))
            if (cls != SKIP) != (bn in visited):
                found.append(("visited range != non-skip tiles", bm, bn))
            if some and not every and cls != PARTIAL:
                found.append(("mixed tile not PARTIAL", bm, bn))
    return found


@pytest.mark.parametrize("block_m,block_n", BLOCKS)
def test_classes_are_sound_and_ranges_exact(block_m, block_n):
    for g in GEOMETRIES:
        assert violations(tile_class, kv_block_range, g, block_m, block_n) == [], g


def test_brute_force_catches_an_off_by_one_skip_rule():
    # Negative control: a skip rule that also drops the tile starting at the last allowed key.
    def off_by_one(bm, bn, g, block_m, block_n):
        last_row = min((bm + 1) * block_m, g.len_q) - 1
        if bn * block_n == key_interval(last_row, g)[1]:
            return SKIP
        return tile_class(bm, bn, g, block_m, block_n)

    g = MaskGeometry(9, 16, "top_left")
    assert ("skipped a tile with an allowed pair", 2, 2) in violations(off_by_one, kv_block_range, g, 4, 4)


def test_full_is_exact_without_explicit_mask():
    # FULL is not merely sound: an all-allowed, unclipped tile is never masked needlessly.
    for g in GEOMETRIES:
        if g.has_attn_mask:
            continue
        for bm, bn in itertools.product(range(5), range(5)):
            _, every = brute_class(bm, bn, g, 4, 4)
            assert (tile_class(bm, bn, g, 4, 4) == FULL) == every, (g, bm, bn)


def test_class_table_matches_per_tile_classes():
    q, k = torch.zeros(3, 2, 19, 4), torch.zeros(3, 1, 23, 4)
    spec = AttentionSpec.from_inputs(q, k, k, causal="bottom_right", window=(6, 2), kv_lens=[23, 0, 11])
    sched = TileSchedule(4, 8)
    table = sched.class_table(spec)
    assert table.shape == (3, 5, 3)
    for b, bm, bn in itertools.product(range(3), range(5), range(3)):
        assert table[b, bm, bn] == sched.tile_class(bm, bn, spec.geometry(b)), (b, bm, bn)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_split_ranges_partition_the_visited_range(num_splits):
    sched = TileSchedule(4, 4, num_splits)
    for g in GEOMETRIES:
        for bm in range(sched.num_q_blocks(g)):
            parts = sched.split_ranges(bm, g)
            assert len(parts) == num_splits
            assert [bn for part in parts for bn in part] == list(sched.kv_range(bm, g))


@pytest.mark.parametrize("field,value", [("block_m", 0), ("block_n", -4), ("num_splits", 1.5), ("block_m", True)])
def test_bad_schedule_arguments_are_named(field, value):
    with pytest.raises(ValueError, match=f"TileSchedule.{field}: expected an int >= 1"):
        TileSchedule(**{field: value})


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5])
def test_split_part_cuts_any_range_into_contiguous_parts(num_splits):
    for start, end in itertools.combinations_with_replacement(range(0, 9), 2):
        parts = [split_part(start, end, num_splits, s) for s in range(num_splits)]
        assert [b for lo, hi in parts for b in range(lo, hi)] == list(range(start, end))
        assert all(lo <= hi for lo, hi in parts)


def test_blocks_is_a_range_for_ints_and_a_pair_for_symbols():
    import z3

    assert blocks(2, 5) == range(2, 5)
    start, stop = z3.Ints("start stop")
    assert blocks(start, stop) == Blocks(start, stop)


def test_class_table_of_an_empty_batch_and_of_one_without_kv_lens():
    q, k = torch.zeros(0, 1, 5, 4), torch.zeros(0, 1, 7, 4)
    assert TileSchedule(2, 3).class_table(AttentionSpec.from_inputs(q, k, k)).shape == (0, 3, 3)
    q, k = torch.zeros(2, 1, 5, 4), torch.zeros(2, 1, 7, 4)
    spec = AttentionSpec.from_inputs(q, k, k, causal="top_left")
    table = TileSchedule(2, 3).class_table(spec)
    assert table.shape == (2, 3, 3) and torch.equal(table[0], table[1])
    assert table[0].tolist() == [[tile_class(bm, bn, spec.geometry(0), 2, 3) for bn in range(3)] for bm in range(3)]
