"""Ring attention: the gloo ranks' merged states equal the dense oracle; planted merge bugs are caught.

The ranks are real processes exchanging states over torch.distributed; the pool starts once per
world size (a few seconds) and is reused by every test here.
"""

from __future__ import annotations

import pytest
import torch

from attnformal.kernels.ring import _bounds, make_attention
from attnformal.merge import SoftmaxState
from attnformal.oracle import attention_oracle, forward_backward
from attnformal.verify import Settings, run_battery
from attnformal.verify.report import render

RING = make_attention(3)
CHECKS = ("fwd.random", "mask.causal_bottom_right")  # enough to see a lost or unscaled state


def inputs(shape, dtype=torch.float64, seed=0):
    batch, heads_q, heads_kv, len_q, len_k, dim = shape
    g = torch.Generator().manual_seed(seed)
    sizes = ((batch, heads_q, len_q, dim), (batch, heads_kv, len_k, dim), (batch, heads_kv, len_k, dim),
             (batch, heads_q, len_q, dim))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in sizes]


CASES = {
    "gqa_bottom_right_uneven_slices": ((2, 4, 2, 37, 301, 16), {"causal": "bottom_right"}),
    "fewer_keys_than_ranks": ((1, 2, 1, 5, 2, 8), {}),
    "no_queries": ((1, 2, 1, 0, 9, 8), {}),
    "window_kv_lens_softcap": ((2, 2, 2, 200, 150, 8), {"window": (20, 3), "kv_lens": [150, 7], "softcap": 3.0}),
    "top_left_fully_masked_rows": ((1, 1, 1, 40, 20, 8), {"causal": "bottom_right"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_float64_ring_matches_the_oracle(name):
    shape, kwargs = CASES[name]
    q, k, v, do = inputs(shape)
    got = forward_backward(RING, q, k, v, do, **kwargs)
    want = forward_backward(attention_oracle, q, k, v, do, **kwargs)
    for field, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert a.dtype == torch.float64, field
        close = torch.isclose(a, b, rtol=1e-12, atol=1e-12) | ((a == b) & torch.isinf(b))
        assert close.all(), f"{name}: {field} differs by {(a - b).abs().nan_to_num().max():.3g}"


def test_dropout_replay_and_lse_gradient():
    q, k, v, do = inputs((1, 2, 2, 30, 50, 8), seed=1)
    keep = torch.rand(1, 2, 30, 50, generator=torch.Generator().manual_seed(2)) >= 0.3
    kwargs = {"dropout_p": 0.3, "dropout_mask": keep}
    got = [t.detach().requires_grad_() for t in (q, k, v)]
    want = [t.detach().requires_grad_() for t in (q, k, v)]
    for impl, leaves in ((RING, got), (attention_oracle, want)):
        out, lse = impl(*leaves, return_lse=True, **kwargs)
        ((out * do).sum() + lse.exp().sum()).backward()  # lse in the loss: its gradient reaches the ranks
    for a, b in zip(got, want):
        assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-12)


def test_slices_cover_every_index_once():
    for n in (0, 1, 2, 5, 301):
        spans = [_bounds(n, 3, r) for r in range(3)]
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_the_ring_passes_the_checks_that_catch_the_planted_bugs():
    """The negative control of the two below (the full battery: `python -m attnformal.verify --impl ring --profile
    full`, in docs/scale-out.md)."""
    report = run_battery(Settings(impl=RING, impl_name="ring", only=CHECKS))
    assert report.passed and report.count("pass") > 0, render(report)


def drop_received(received: SoftmaxState, own: SoftmaxState) -> SoftmaxState:
    """Planted bug: the state that arrives from the previous rank is dropped."""
    return own


def merge_without_rescale(received: SoftmaxState, own: SoftmaxState) -> SoftmaxState:
    """Planted bug: the states are added without rescaling to the common maximum."""
    return SoftmaxState(torch.maximum(received.m, own.m), received.l + own.l, received.acc + own.acc)


@pytest.mark.parametrize("bug", [drop_received, merge_without_rescale], ids=lambda f: f.__name__)
def test_a_planted_bug_in_the_cross_rank_merge_is_caught(bug):
    report = run_battery(Settings(impl=make_attention(3, combine=bug), impl_name=f"ring:{bug.__name__}",
                                  only=CHECKS))
    assert not report.passed, render(report)
    assert report.count("ERROR") == 0, render(report)
