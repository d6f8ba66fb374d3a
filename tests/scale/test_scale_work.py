"""Predicted work against brute-force counts of the spec's own dense mask."""

import random

import pytest
import torch

from attnformal.masks import key_interval
from attnformal.schedule import TileSchedule
from attnformal.scale.problem import MaskFamily, Problem
from attnformal.scale.work import predict_work
from attnformal.spec import AttentionSpec

SEED = 2024


def random_spec(rng: random.Random) -> AttentionSpec:
    """A small problem with a random index mask (every family, ragged and empty cases included)."""
    batch, heads_kv = rng.randint(1, 3), rng.choice([1, 2])
    heads_q = heads_kv * rng.choice([1, 2])
    len_q, len_k = rng.randint(0, 40), rng.randint(1, 40)
    q = torch.empty(batch, heads_q, len_q, 4, device="meta")
    k = torch.empty(batch, heads_kv, len_k, 4, device="meta")
    kwargs = {}
    if rng.random() < 0.6:
        kwargs["causal"] = rng.choice(["top_left", "bottom_right"])
    if rng.random() < 0.6:
        kwargs["window"] = (rng.randint(-1, 12), rng.randint(-1, 12))  # -1: unbounded side
    if rng.random() < 0.4:
        kwargs["kv_lens"] = [rng.randint(0, len_k) for _ in range(batch)]
    return AttentionSpec.from_inputs(q, k, k, **kwargs)


def brute_force(spec: AttentionSpec, schedule: TileSchedule):
    """``(pairs, visited tiles, full tiles)`` counted element by element from ``spec.allowed()``."""
    allowed = spec.allowed()
    tiles = full = 0
    for b in range(spec.batch):
        for r0 in range(0, spec.len_q, schedule.block_m):
            for c0 in range(0, spec.len_k, schedule.block_n):
                tile = allowed[b, 0, r0:r0 + schedule.block_m, c0:c0 + schedule.block_n]
                tiles += bool(tile.any())
                whole = tile.shape == (schedule.block_m, schedule.block_n)
                full += whole and bool(tile.all())
    return int(allowed.sum()), tiles * spec.heads_q, full * spec.heads_q


def has_inverted_row(spec: AttentionSpec) -> bool:
    """A row whose key interval is empty by inversion (lo > hi) while both ends lie in [0, Sk).

    Causal top-left with a window aligned bottom-right makes such rows when Sq < Sk. The
    schedule decides SKIP from interval ends, so a tile of inverted rows is visited although
    it holds no allowed pair: sound (nothing allowed is skipped), one tile of wasted work.
    """
    for b in range(spec.batch):
        g = spec.geometry(b)
        for i in range(spec.len_q):
            lo, hi = key_interval(i, g)
            if lo > hi and lo < g.len_k and hi >= 0:
                return True
    return False


def test_pair_and_tile_counts_equal_brute_force_counts_of_the_mask():
    rng = random.Random(SEED)
    seen_pairs, inverted = set(), 0
    for case in range(150):
        spec = random_spec(rng)
        schedule = TileSchedule(rng.choice([1, 4, 8, 16]), rng.choice([1, 4, 8, 16]))
        work = predict_work(spec, schedule)
        pairs, tiles, full = brute_force(spec, schedule)
        context = f"case {case} (seed {SEED}): {spec} {schedule}"
        assert work.pairs == pairs, context
        assert work.tiles_full == full, context
        assert work.tiles_full + work.tiles_partial == work.tiles_visited, context
        if has_inverted_row(spec):
            inverted += 1
            assert work.tiles_visited >= tiles, context  # sound: every tile with an allowed pair
        else:
            assert work.tiles_visited == tiles, context  # and exactly those
        seen_pairs.add(pairs)
    assert len(seen_pairs) > 50  # the cases really differ (the equalities are not all 0 == 0)
    assert inverted < 30  # most cases take the exact branch


def test_counting_is_sensitive_to_a_one_off_window():
    """Negative control: the brute force tells a window (4, 0) from (5, 0)."""
    q = torch.empty(1, 1, 64, 8, device="meta")
    spec = AttentionSpec.from_inputs(q, q, q, window=(4, 0))
    wider = AttentionSpec.from_inputs(q, q, q, window=(5, 0))
    assert predict_work(spec, TileSchedule(8, 8)).pairs != brute_force(wider, TileSchedule(8, 8))[0]


def test_schedule_work_grows_as_the_tiles_it_visits():
    schedule = TileSchedule(128, 128)

    def work(mask, n):
        return predict_work(Problem(1, 2, 2, n, 64, mask).spec(), schedule)

    dense, causal, window = MaskFamily("dense"), MaskFamily("causal"), MaskFamily("window", width=256)
    assert work(dense, 4096).flops("schedule") == 4 * work(dense, 2048).flops("schedule")
    assert work(dense, 4096).tiles_visited == 2 * 32 * 32
    assert work(causal, 4096).tiles_visited == 2 * 32 * 33 // 2  # the diagonal and everything below it
    # a fixed window visits at most 3 key blocks per query block: linear in N
    assert work(window, 8192).tiles_visited == 2 * (3 * 64 - 2 - 1)  # blocks 0 and 1 see 1 and 2
    assert work(window, 8192).flops("dense") == 4 * work(window, 4096).flops("dense")
    # chunks of 256 keys over blocks of 128: each query block lies in one chunk, which spans 2 key blocks
    chunk = MaskFamily("chunk", width=256)
    assert work(chunk, 8192).tiles_visited == 2 * 64 * 2
    assert work(chunk, 8192).tiles_visited == 2 * work(chunk, 4096).tiles_visited


def test_backward_adds_the_five_backward_matmuls():
    spec = Problem(1, 1, 1, 256, 64, MaskFamily("dense")).spec()
    forward = predict_work(spec, TileSchedule(64, 64))
    both = predict_work(spec, TileSchedule(64, 64), backward=True)
    assert both.flops("pairs") == pytest.approx(3.5 * forward.flops("pairs"))  # 7 matmuls vs 2


def test_explicit_mask_data_is_refused():
    q = torch.zeros(1, 1, 4, 2)
    spec = AttentionSpec.from_inputs(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask"):
        predict_work(spec, TileSchedule(2, 2))
