"""The tiled certified reference: the spec's merge on balls agrees with the dense pipeline within radii.

Small tiles (4 x 8) and tasks (8 rows x 16 keys) make every case span many tiles, query
chunks and key parts, so the merge, the combine across parts and the dK/dV accumulation all
run. The dense float64 pipeline (no merge, no schedule) is the independent cross-check.
"""

from __future__ import annotations

import pytest
import torch

from attnformal.merge import SoftmaxState
from attnformal.oracle import attention_oracle, forward_backward
from attnformal.reference import certified_attention, tiled
from attnformal.reference.mp import mp_attention
from attnformal.reference.tiled import Tiling
from attnformal.schedule import TileSchedule
from reference_cases import case, mp_inside_float_balls, sinks_alibi_bias

FIELDS = ("out", "lse", "dq", "dk", "dv")
SMALL = Tiling(TileSchedule(block_m=4, block_n=8), chunk_rows=8, part_keys=16)

CASES = {
    "gqa_bottom_right": lambda: case((2, 4, 2, 21, 37, 8, 5), torch.float16, 1, causal="bottom_right"),
    "window_kv_lens_empty_batch": lambda: case((3, 2, 1, 19, 40, 8), seed=2, causal="top_left", window=(6, 3),
                                               kv_lens=[40, 0, 17]),
    "softcap_dropout_attn_mask": lambda: case((1, 2, 2, 13, 30, 8), seed=3, input_scale=3.0, softcap=2.5,
                                              dropout_p=0.3, attn_mask_density=0.6),
    "extreme_logits": lambda: case((1, 1, 1, 9, 33, 4), torch.float32, 9, input_scale=60.0, scale=1.0),
    "no_queries": lambda: case((1, 2, 1, 0, 9, 4), seed=4),
    "no_keys": lambda: case((1, 2, 1, 5, 0, 4), seed=5),
    "sinks_alibi_bias_kv_lens": lambda: case((2, 2, 1, 13, 37, 8), torch.float32, 6, kv_lens=[37, 9], window=(9, 4),
                                             **sinks_alibi_bias(2, 2, 13, 37)),
}


def run(make, **options):
    x, kwargs = make()
    return certified_attention(x["q"], x["k"], x["v"], x["grad_out"], **options, **kwargs)


def overlap(a, b, field) -> torch.Tensor:
    """Where the two balls of ``field`` share a point (equal infinities count)."""
    am, bm = getattr(a, field), getattr(b, field)
    gap = (am - bm).abs().nan_to_num(nan=0.0)
    close = gap <= (getattr(a, f"{field}_radius") + getattr(b, f"{field}_radius")) * (1 + 2**-40)
    return torch.where(torch.isinf(am) | torch.isinf(bm), am == bm, close)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiled_agrees_with_the_dense_pipeline_within_radii(name):
    tiled_result, dense = run(CASES[name], tiling=SMALL), run(CASES[name], dense=True)
    assert tiled_result.tier == dense.tier == "float64"
    assert tiled_result.fields() == dense.fields()
    for field in tiled_result.fields():
        inside = overlap(tiled_result, dense, field)
        assert inside.all(), f"{name}: {field} balls disjoint at {(~inside).nonzero()[:3].tolist()}"


@pytest.mark.parametrize("name", ["gqa_bottom_right", "softcap_dropout_attn_mask", "sinks_alibi_bias_kv_lens"])
def test_mpmath_and_the_oracle_lie_in_the_tiled_balls(name):
    x, kwargs = CASES[name]()
    args = (x["q"], x["k"], x["v"], x["grad_out"])
    result = certified_attention(*args, tiling=SMALL, **kwargs)
    exact = mp_attention(*args, dps=40, **kwargs)
    oracle = dict(zip(FIELDS, forward_backward(attention_oracle, *(t.double() for t in args), **kwargs)))
    for field in FIELDS:
        mid, rad = getattr(result, field), getattr(result, f"{field}_radius")
        assert mp_inside_float_balls(getattr(exact, field), mid, rad).all(), f"{name}: mpmath {field}"
        assert result.contains(field, oracle[field]).all(), f"{name}: oracle {field}"


def test_empty_rows_are_exact():
    result = run(CASES["window_kv_lens_empty_batch"], tiling=SMALL)  # batch 1 has no keys at all
    assert bool((result.lse[1] == float("-inf")).all()) and not bool(result.lse_radius[1].any())
    for field in ("out", "dq"):
        assert not bool(getattr(result, field)[1].any()) and not bool(getattr(result, f"{field}_radius")[1].any())


def test_another_tiling_rounds_differently_but_stays_within_radii():
    """Bitwise identity holds for one tiling (see test_distributed_reference); across tilings the merge
    order changes the rounding, and both results still enclose the same exact values."""
    small, large = run(CASES["gqa_bottom_right"], tiling=SMALL), run(CASES["gqa_bottom_right"])
    assert not torch.equal(small.dq, large.dq)
    for field in FIELDS:
        assert overlap(small, large, field).all(), field


def merge_without_rescale(a, b):
    """A planted bug: the states are added without rescaling to the common maximum."""
    from attnformal import ops

    return SoftmaxState(ops.maximum(a.m, b.m), a.l + b.l, a.acc + b.acc)


def test_a_merge_without_rescaling_is_caught(monkeypatch):
    """Negative control: the cross-check fails when the tiles are folded with a wrong merge."""
    monkeypatch.setattr(tiled, "merge", merge_without_rescale)
    broken, dense = run(CASES["gqa_bottom_right"], tiling=SMALL), run(CASES["gqa_bottom_right"], dense=True)
    assert not overlap(broken, dense, "out").all()
    assert not overlap(broken, dense, "lse").all()
