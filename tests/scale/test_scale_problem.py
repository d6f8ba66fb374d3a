"""Sweep and mask arguments: what they mean, and one clear error when they are wrong."""

import pytest

from attnformal.scale.problem import MaskFamily, Problem, parse_mask, parse_sweep


def test_range_sweeps_are_geometric_and_rounded_to_the_multiple():
    assert parse_sweep("N=512..8192", per_octave=1).values == (512, 1024, 2048, 4096, 8192)
    assert parse_sweep("N=512..4096", per_octave=2, multiple=128).values == (512, 768, 1024, 1408, 2048, 2944, 4096)
    assert all(v % 128 == 0 for v in parse_sweep("N=512..16384", 3, multiple=128).values)
    assert parse_sweep("B=1..8").values == (1, 2, 3, 4, 6, 8)  # small values stay integers, no repeats
    assert parse_sweep("D=16,40,64").values == (16, 40, 64)


@pytest.mark.parametrize("text", ["N=512..", "X=1..4", "N=8..4", "N=0..4", "N=4,2", "N=2,2,3", "n=1..8"])
def test_bad_sweeps_name_the_argument(text):
    with pytest.raises(ValueError, match="argument '--sweep': expected"):
        parse_sweep(text)


def test_mask_families():
    assert parse_mask("dense").kwargs(100) == {}
    assert parse_mask("causal").kwargs(100) == {"causal": "top_left"}
    assert parse_mask("window:256").kwargs(4096) == {"window": (256, 0)}
    assert parse_mask("window:N/8").kwargs(4096) == {"window": (512, 0)}  # grows with N
    assert parse_mask("window").kwargs(4096, swept_width=64) == {"window": (64, 0)}
    assert [parse_mask(t).label for t in ("dense", "window:256", "window:N/8", "window")] == \
        ["dense", "window:256", "window:N/8", "window:W"]


def test_chunk_families_take_the_sizes_of_a_window():
    assert parse_mask("chunk:256").kwargs(4096) == {"chunk_size": 256}
    assert parse_mask("chunk:N/8").kwargs(4096) == {"chunk_size": 512}
    assert parse_mask("chunk:N/8").kwargs(1) == {"chunk_size": 1}  # the trivial problem: a chunk of one key
    assert parse_mask("chunk").kwargs(4096, swept_width=64) == {"chunk_size": 64}
    assert [parse_mask(t).label for t in ("chunk:256", "chunk:N/8", "chunk")] == ["chunk:256", "chunk:N/8", "chunk:W"]
    assert [parse_mask(t).swept for t in ("chunk", "window", "chunk:8", "causal")] == [True, True, False, False]


@pytest.mark.parametrize("text", ["full", "window:", "window:-3", "window:N/0", "window:N", "causal:1", "chunk:0",
                                  "chunk:N/0", "chunk:", "chunks:8"])
def test_bad_masks_name_the_argument(text):
    with pytest.raises(ValueError, match="argument '--mask': expected"):
        parse_mask(text)


def test_a_problem_moves_only_the_swept_parameter():
    base = Problem(2, 4, 2, 1024, 64, MaskFamily("window", per_n=8))
    at = base.at("N", 4096)
    assert (at.batch, at.heads, at.heads_kv, at.head_dim) == (2, 4, 2, 64)
    assert at.spec().window == (512, 0) and at.spec().len_q == at.spec().len_k == 4096
    assert base.at("D", 128).spec().head_dim == 128
    assert base.at("B", 8).spec().batch == 8
    assert base.describe("N") == "B=2 H=4/2 D=64"
    trivial = base.trivial()
    assert (trivial.batch, trivial.heads, trivial.seq) == (1, 1, 1)
