"""A mutated spec function (monkeypatched where the spec defines it) makes its obligation fail.

The obligations read the spec's definitions when they run, so a bug put into the spec is a bug
the prover sees: these are the negative controls again, through pytest's monkeypatch, on the
spec modules themselves.
"""

import pytest
import z3

from attnformal import masks, merge, npu, ops, spec, tile
from attnformal.logic import Budget, Settings
from attnformal.proofs import (backward, floating_point, gqa, loop_invariant, masked_rows, merge_correctness, monoid,
                               npu_masks, pipeline, tile_classification)
from attnformal.merge import SoftmaxState

SETTINGS = Settings(timeout=120)


def fails(module) -> bool:
    """True as soon as one check of the obligation is not proved."""
    return any(not proof.ok for proof in module.checks(SETTINGS, Budget(SETTINGS.timeout)))


def test_unmutated_obligations_hold():
    assert not fails(monoid) and not fails(npu_masks)


def test_merge_without_the_finite_shift_guard_breaks_the_monoid(monkeypatch):
    monkeypatch.setattr(merge, "finite_shift", lambda m: m)
    assert fails(monoid)


def test_merge_without_rescale_breaks_merge_correctness(monkeypatch):
    monkeypatch.setattr(merge, "merge", merge_correctness.merge_without_rescale)
    assert fails(merge_correctness)


def test_block_state_without_the_shift_breaks_merge_correctness(monkeypatch):
    monkeypatch.setattr(merge, "block_state", merge_correctness.block_state_without_shift)
    assert fails(merge_correctness)


def test_finalize_without_log_breaks_the_loop_invariant(monkeypatch):
    original = merge.finalize
    monkeypatch.setattr(merge, "finalize", lambda state: (original(state)[0], state.m + state.l))
    assert fails(loop_invariant)


def test_a_finite_mask_sentinel_breaks_empty_rows(monkeypatch):
    monkeypatch.setattr(tile, "NEG_INF", -1e4)
    assert fails(masked_rows)


def test_a_causal_mask_off_by_one_breaks_the_tile_classification_and_the_npu_mapping(monkeypatch):
    original = masks.key_interval

    def one_key_too_many(i, g):
        lo, hi = original(i, g)
        return lo, hi + 1 if g.causal else hi

    monkeypatch.setattr(masks, "key_interval", one_key_too_many)  # may_attend changes; the schedule does not
    assert fails(tile_classification)
    assert fails(npu_masks)


def test_a_tile_class_that_ignores_ragged_edges_breaks_the_tile_classification(monkeypatch):
    monkeypatch.setattr(tile_classification.schedule, "tile_class", tile_classification._tile_class_padded_lengths)
    assert fails(tile_classification)


def test_gqa_interleaved_heads_break_the_gqa_obligation(monkeypatch):
    monkeypatch.setattr(spec, "kv_head_of", lambda h, heads_q, heads_kv: h % heads_kv)
    assert fails(gqa)


def test_a_missing_scale_in_dq_breaks_the_backward(monkeypatch):
    original = tile.tile_grads

    def unscaled(*args, scale, **kwargs):
        dq, dk, dv = original(*args, scale=scale, **kwargs)
        return dq / scale, dk, dv

    monkeypatch.setattr(tile, "tile_grads", unscaled)
    assert fails(backward)


def test_a_maximum_that_returns_the_minimum_breaks_the_floating_point_obligation(monkeypatch):
    monkeypatch.setattr(ops._Z3, "maximum", staticmethod(lambda a, b: z3.fpMin(a, b)))
    assert fails(floating_point)


def test_an_unguarded_merge_produces_nan_in_floating_point(monkeypatch):
    monkeypatch.setattr(merge, "finite_shift", lambda m: m)
    proof = floating_point.fp_theorem(*floating_point.THEOREMS[1], floating_point.FORMATS[1], Budget(60))
    assert proof.status == "refuted" and proof.countermodel["merge.l"] == "nan"


def test_swapped_npu_window_arguments_break_the_npu_obligation(monkeypatch):
    original = npu.npu_mask_args

    def swapped(g):
        mode, pre, following = original(g)
        return mode, following, pre

    monkeypatch.setattr(npu, "npu_mask_args", swapped)
    assert fails(npu_masks)


@pytest.mark.parametrize("dtype_name", ["float16", "float32"])
def test_floating_point_counterexamples_replay_in_torch(dtype_name):
    """The 'mask after max' counterexample is real: torch, same dtype, gives l < 1 for an allowed key."""
    import torch

    control = next(c for c in floating_point.CONTROLS if c.name.startswith("mask applied after the max"))
    cex = control.run(SETTINGS, Budget(60)).countermodel
    dtype = getattr(torch, dtype_name)
    scores = torch.tensor([[float(cex["s0"]), float(cex["s1"])]], dtype=dtype)
    allowed = torch.tensor([[cex["allowed0"] == "True", cex["allowed1"] == "True"]])
    values = torch.tensor([[float(cex["v0"])], [float(cex["v1"])]], dtype=dtype)
    broken = pipeline.mask_after_max_state(torch.ones(1, 1, dtype=dtype), scores.T, values, allowed)
    correct = merge.block_state(torch.where(allowed, scores, float("-inf")), values)
    assert broken.l.item() < 1 <= correct.l.item()
    assert isinstance(broken, SoftmaxState)
