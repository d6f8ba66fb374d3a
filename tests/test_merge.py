"""The merge step on torch tensors: state of a union, monoid laws, -inf and empty rows."""

from __future__ import annotations

import functools

import pytest
import torch

from attnformal import ops
from attnformal.merge import SoftmaxState, block_state, empty_state, finalize, merge

NEG_INF = float("-inf")


def scores_and_values(seed, keys=12, masked_fraction=0.3):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(3, keys, generator=gen, dtype=torch.float64) * 5
    s[torch.rand(3, keys, generator=gen) < masked_fraction] = NEG_INF
    s[2] = NEG_INF  # one fully masked row
    return s, torch.randn(keys, 4, generator=gen, dtype=torch.float64)


def dense(s, v):
    """softmax(s) v and logsumexp(s), computed directly."""
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.where(torch.isinf(lse), 0.0, (s - lse).exp())
    return p @ v, lse


def folded(merge_fn, s, v, cuts):
    blocks = [block_state(s[:, a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    return finalize(functools.reduce(merge_fn, blocks, empty_state((3,), 4, dtype=torch.float64)))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("cuts", [(0, 12), (0, 1, 12), (0, 5, 6, 12), (0, 3, 6, 9, 12), (0, 0, 12, 12)])
def test_folding_tiles_gives_dense_softmax(seed, cuts):
    s, v = scores_and_values(seed)
    out, lse = folded(merge, s, v, cuts)
    ref_out, ref_lse = dense(s, v)
    torch.testing.assert_close(out, ref_out, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-13, atol=1e-13)
    assert torch.equal(out[2], torch.zeros(4)) and lse[2].item() == NEG_INF


def test_the_check_catches_a_missing_rescale():
    # Negative control: dropping alpha (no rescale of the running state) must be caught.
    def unrescaled(a, b):
        m = ops.maximum(a.m, b.m)
        beta = torch.where(torch.isinf(m), 0.0, (b.m - m).exp())
        return SoftmaxState(m, a.l + beta * b.l, a.acc + beta * b.acc)

    s, v = scores_and_values(0, masked_fraction=0.0)
    out, _ = folded(unrescaled, s, v, (0, 3, 6, 9, 12))
    assert not torch.allclose(out[:2], dense(s, v)[0][:2], rtol=1e-3)


def random_state(seed, empty=False):
    if empty:
        return empty_state((2,), 3, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(2, 4, generator=gen, dtype=torch.float64) * 3
    return block_state(s, torch.randn(4, 3, generator=gen, dtype=torch.float64))


def assert_same_state(x, y):
    for a, b in zip(x, y):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("empties", [(False, False, False), (True, False, False), (False, True, True),
                                     (True, True, True)])
def test_monoid_laws_numerically(empties):
    a, b, c = (random_state(i, e) for i, e in enumerate(empties))
    assert_same_state(merge(merge(a, b), c), merge(a, merge(b, c)))
    assert_same_state(merge(a, b), merge(b, a))
    e = random_state(0, empty=True)
    assert_same_state(merge(a, e), a)
    for part in merge(e, e):
        assert not torch.isnan(part).any()


def test_dropout_weights_leave_the_denominator_alone():
    s, v = scores_and_values(3)
    weights = (torch.rand(s.shape, generator=torch.Generator().manual_seed(1)) > 0.5) / 0.5
    plain, dropped = block_state(s, v), block_state(s, v, weights)
    assert torch.equal(plain.m, dropped.m) and torch.equal(plain.l, dropped.l)
    p = torch.where(torch.isinf(plain.m), 0.0, (s - plain.m).exp())
    torch.testing.assert_close(dropped.acc, (p * weights) @ v)


def test_finalize_after_a_nonempty_tile_has_l_at_least_one():
    s, v = scores_and_values(4)
    state = block_state(s, v)
    assert (state.l[:2] >= 1).all() and state.l[2].item() == 0.0
