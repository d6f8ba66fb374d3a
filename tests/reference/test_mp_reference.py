"""The mpmath reference against values known by hand, and its gradients against finite differences."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from attnformal.reference.mp import mp_attention
from reference_cases import case


@pytest.fixture(autouse=True)
def fifty_digits():
    """The tests' own mpmath arithmetic (expected values, sums) at 50 digits."""
    with mpmath.workdps(50):
        yield


def f64(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_row_with_one_allowed_key_returns_that_value():
    q, k, v = f64(1, 1, 3, 4, seed=1), f64(1, 1, 3, 4, seed=2), f64(1, 1, 3, 5, seed=3)
    result = mp_attention(q, k, v, causal="top_left", dps=30)
    assert [float(x) for x in result.out[0, 0, 0]] == v[0, 0, 0].tolist()  # row 0 sees key 0 only
    with mpmath.workdps(30):
        s = mpmath.fdot([mpmath.mpf(x) for x in q[0, 0, 0].tolist()], [mpmath.mpf(x) for x in k[0, 0, 0].tolist()])
        assert abs(result.lse[0, 0, 0] - s / 2) < mpmath.mpf(10) ** -28  # scale = 1/sqrt(4)


def test_uniform_logits_average_the_allowed_values():
    q, k, v = torch.zeros(1, 1, 4, 3, dtype=torch.float64), f64(1, 1, 6, 3, seed=4), f64(1, 1, 6, 2, seed=5)
    result = mp_attention(q, k, v, causal="bottom_right", dps=30)
    for i in range(4):
        allowed = i + 3  # bottom-right: row i sees keys 0 .. i + 2
        for d in range(2):
            assert abs(result.out[0, 0, i, d] - mpmath.fsum(mpmath.mpf(x) for x in v[0, 0, :allowed, d].tolist())
                       / allowed) < mpmath.mpf(10) ** -28
        assert abs(result.lse[0, 0, i] - mpmath.log(allowed)) < mpmath.mpf(10) ** -28


def test_a_dominant_score_wins_unless_it_is_masked():
    q = torch.ones(1, 1, 1, 2, dtype=torch.float64)
    k = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    k[0, 0, 2] = 40.0  # s = 40 * 2 / sqrt(2) ~ 56.6 against 0: P ~ 1 - 3e-25
    v = f64(1, 1, 4, 3, seed=6)
    dominant = mp_attention(q, k, v, dps=40)
    for d in range(3):
        assert abs(dominant.out[0, 0, 0, d] - v[0, 0, 2, d].item()) < 1e-23
    mask = torch.tensor([True, True, False, True]).view(1, 1, 1, 4)
    masked = mp_attention(q, k, v, attn_mask=mask, dps=40)
    for d in range(3):  # excluded before the max and the sum: a plain average of the other three
        expected = mpmath.fsum(mpmath.mpf(v[0, 0, j, d].item()) for j in (0, 1, 3)) / 3
        assert abs(masked.out[0, 0, 0, d] - expected) < mpmath.mpf(10) ** -35


def test_an_empty_row_gives_zero_output_minus_inf_lse_and_no_gradient():
    x, kwargs = case((2, 2, 1, 3, 4, 2), kv_lens=[4, 0])
    result = mp_attention(x["q"], x["k"], x["v"], x["grad_out"], **kwargs)
    assert all(value == 0 for value in result.out[1].flat)
    assert all(value == -mpmath.inf for value in result.lse[1].flat)
    assert all(value == 0 for name in ("dq", "dk", "dv") for value in getattr(result, name)[1].flat)
    assert any(value != 0 for value in result.dk[0].flat)


def test_gqa_equals_mha_on_explicitly_repeated_heads_with_summed_gradients():
    x, kwargs = case((1, 4, 2, 3, 5, 2), torch.float32, 7, causal="bottom_right", softcap=4.0)
    gqa = mp_attention(x["q"], x["k"], x["v"], x["grad_out"], **kwargs)
    repeat = torch.tensor([0, 0, 1, 1])  # the documented grouping: query head h reads KV head h // 2
    mha = mp_attention(x["q"], x["k"][:, repeat], x["v"][:, repeat], x["grad_out"], **kwargs)
    assert (gqa.out == mha.out).all() and (gqa.dq == mha.dq).all()
    for name in ("dk", "dv"):
        summed = getattr(mha, name).reshape(1, 2, 2, *getattr(mha, name).shape[2:]).sum(axis=2)
        assert all(abs(a - b) < mpmath.mpf(10) ** -35 for a, b in zip(getattr(gqa, name).flat, summed.flat))


def test_dropout_scales_the_kept_probabilities():
    x, _ = case((1, 1, 1, 3, 4, 2), torch.float32, 8)
    keep_all = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    plain = mp_attention(x["q"], x["k"], x["v"])
    dropped = mp_attention(x["q"], x["k"], x["v"], dropout_p=0.25, dropout_mask=keep_all)
    assert all(abs(a / mpmath.mpf(0.75) - b) < mpmath.mpf(10) ** -35 for a, b in zip(plain.out.flat, dropped.out.flat))
    assert (plain.lse == dropped.lse).all()  # dropout never changes lse


@pytest.mark.parametrize("name, index", [("q", (0, 1, 2, 0)), ("q", (0, 3, 0, 1)), ("k", (0, 1, 3, 2)),
                                         ("v", (0, 0, 4, 1)), ("k", (0, 0, 0, 0))])
def test_gradients_match_central_differences(name, index):
    """d/dx <dO, out(x)> by a central difference with step h = 2^-20 (exact in float64)."""
    x, kwargs = case((1, 4, 2, 3, 5, 3), torch.float64, 9, causal="bottom_right", softcap=3.0, dropout_p=0.3)
    h = 2.0**-20
    grads = mp_attention(x["q"], x["k"], x["v"], x["grad_out"], **kwargs)

    def loss(delta):
        moved = dict(x)
        moved[name] = x[name].clone()
        moved[name][index] += delta
        out = mp_attention(moved["q"], moved["k"], moved["v"], **kwargs).out
        return mpmath.fsum(a * mpmath.mpf(b) for a, b in zip(out.flat, x["grad_out"].flatten().tolist()))

    difference = (loss(h) - loss(-h)) / (2 * h)
    analytic = getattr(grads, f"d{name}")[index]
    assert abs(difference - analytic) <= 1e-9 * (1 + abs(analytic)), (float(difference), float(analytic))
    assert math.isfinite(float(analytic)) and float(analytic) != 0
