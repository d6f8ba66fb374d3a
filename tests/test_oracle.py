"""The fp64 oracle on cases whose answer is known by hand."""

from __future__ import annotations

import math

import pytest
import torch

from attnformal.oracle import attention_oracle, forward_backward


def zeros_q(len_q=4, len_k=6, dim=3):
    """q = 0 makes every logit equal, so each row's output is the mean of its allowed values."""
    gen = torch.Generator().manual_seed(0)
    q = torch.zeros(1, 1, len_q, dim, dtype=torch.float64)
    k = torch.randn(1, 1, len_k, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 1, len_k, 2, generator=gen, dtype=torch.float64)
    return q, k, v


def test_uniform_logits_average_the_allowed_values():
    q, k, v = zeros_q()
    out, lse = attention_oracle(q, k, v, causal="bottom_right", return_lse=True)
    for i in range(4):
        allowed = i + 2 + 1  # bottom-right: row i sees keys 0 .. i + (6 - 4)
        assert torch.allclose(out[0, 0, i], v[0, 0, :allowed].mean(0), rtol=1e-14, atol=1e-15)
        assert lse[0, 0, i].item() == pytest.approx(math.log(allowed), rel=1e-14)


def test_one_dominant_score_selects_its_value():
    q, k, v = zeros_q(len_q=1)
    k = torch.zeros_like(k)
    k[0, 0, 4, 0] = 1.0
    q[0, 0, 0, 0] = 800.0  # exp(-800 / sqrt(3)) underflows far below fp64 rounding of v
    assert torch.equal(attention_oracle(q, k, v)[0, 0, 0], v[0, 0, 4])


def test_masked_dominant_score_is_excluded_before_the_max():
    q, k, v = zeros_q(len_q=1)
    k = torch.zeros_like(k)
    k[0, 0, 5, 0] = 1.0
    q[0, 0, 0, 0] = 800.0
    mask = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    mask[..., 5] = False  # the dominant key is masked: the rest are tied at 0
    out = attention_oracle(q, k, v, attn_mask=mask)
    assert torch.allclose(out[0, 0, 0], v[0, 0, :5].mean(0), rtol=1e-14, atol=1e-15)


def test_single_key_returns_its_value():
    q, k, v = zeros_q(len_q=3, len_k=1)
    q.normal_(generator=torch.Generator().manual_seed(1))
    assert torch.equal(attention_oracle(q, k, v), v.expand(1, 1, 3, 2))


def test_empty_rows_give_zero_output_minus_inf_lse_and_zero_gradients():
    q, k, v = zeros_q()
    q.normal_(generator=torch.Generator().manual_seed(2))
    grad_out = torch.ones(1, 1, 4, 2, dtype=torch.float64)
    out, lse, dq, dk, dv = forward_backward(attention_oracle, q, k, v, grad_out, kv_lens=[0])
    assert torch.equal(out, torch.zeros_like(out)) and (lse == -math.inf).all()
    for grad in (dq, dk, dv):
        assert torch.equal(grad, torch.zeros_like(grad))


def one_key(score, value):
    """q k^T = ``score`` with scale 1, one key of value ``value``."""
    t = torch.tensor
    return (t([[[[1.0]]]], dtype=torch.float64), t([[[[score]]]], dtype=torch.float64),
            t([[[[value]]]], dtype=torch.float64))


def test_one_key_and_a_sink_share_the_denominator():
    q, k, v = one_key(2.0, 3.0)
    out, lse = attention_oracle(q, k, v, scale=1.0, sinks=torch.tensor([0.5], dtype=torch.float64), return_lse=True)
    assert out.item() == pytest.approx(3.0 * math.exp(2.0) / (math.exp(2.0) + math.exp(0.5)), rel=1e-15)
    assert lse.item() == pytest.approx(math.log(math.exp(2.0) + math.exp(0.5)), rel=1e-15)


def test_an_empty_row_with_a_sink_gives_zero_output_and_lse_sink_and_d_sink_from_lse_alone():
    q, k, v = one_key(2.0, 3.0)
    sink = torch.tensor([0.75], dtype=torch.float64, requires_grad=True)
    out, lse = attention_oracle(q, k, v, scale=1.0, sinks=sink, kv_lens=[0], return_lse=True)
    assert out.item() == 0.0 and lse.item() == 0.75
    (out.sum() + 2.0 * lse.sum()).backward()
    assert sink.grad.item() == 2.0  # p_sink = 1, out = 0: d sink = dlse


def test_a_minus_inf_sink_is_no_sink():
    q, k, v = zeros_q()
    q.normal_(generator=torch.Generator().manual_seed(5))
    plain = attention_oracle(q, k, v, causal="top_left", return_lse=True)
    sunk = attention_oracle(q, k, v, causal="top_left", sinks=torch.tensor([-math.inf], dtype=torch.float64),
                            return_lse=True)
    for a, b in zip(plain, sunk):
        assert torch.equal(a, b)


def test_alibi_weights_keys_by_their_distance_from_the_bottom_right_diagonal():
    q, k, v = zeros_q(len_q=2, len_k=4)  # equal logits: only ALiBi's bias differs between keys
    out = attention_oracle(q, k, v, alibi_slopes=torch.tensor([0.5], dtype=torch.float64), kv_lens=[3])
    for i in range(2):
        diagonal = i + 3 - 2  # the batch's own key length, 3
        weights = torch.tensor([math.exp(-0.5 * abs(diagonal - j)) for j in range(3)], dtype=torch.float64)
        torch.testing.assert_close(out[0, 0, i], weights @ v[0, 0, :3] / weights.sum(), rtol=1e-14, atol=1e-15)


def test_a_bias_constant_along_a_row_leaves_out_and_shifts_lse():
    q, k, v = zeros_q()
    q.normal_(generator=torch.Generator().manual_seed(6))
    row_bias = torch.arange(4, dtype=torch.float64)[:, None]
    plain_out, plain_lse = attention_oracle(q, k, v, return_lse=True)
    out, lse = attention_oracle(q, k, v, bias=row_bias, return_lse=True)
    torch.testing.assert_close(out, plain_out, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(lse, plain_lse + row_bias[:, 0], rtol=1e-14, atol=1e-14)


def test_dropout_replay_scales_kept_values():
    q, k, v = zeros_q(len_q=1)
    keep = torch.tensor([True, False, True, True, False, False]).reshape(1, 1, 1, 6)
    out = attention_oracle(q, k, v, dropout_p=0.25, dropout_mask=keep)
    expected = v[0, 0, keep.flatten()].sum(0) / 6 / 0.75
    assert torch.allclose(out[0, 0, 0], expected, rtol=1e-14, atol=1e-15)


def test_softcap_bounds_the_logits():
    q, k, v = zeros_q(len_q=1, len_k=2)
    k = torch.tensor([[[[1.0, 0, 0], [0, 0, 0]]]], dtype=torch.float64)
    q[0, 0, 0, 0] = 100.0
    out, lse = attention_oracle(q, k, v, scale=1.0, softcap=2.0, return_lse=True)
    capped = 2.0 * math.tanh(50.0)  # the first logit, 100, capped; the second is 0
    assert lse[0, 0, 0].item() == pytest.approx(math.log(math.exp(capped) + 1.0), rel=1e-14)
    w = math.exp(capped) / (math.exp(capped) + 1)
    assert torch.allclose(out[0, 0, 0], w * v[0, 0, 0] + (1 - w) * v[0, 0, 1], rtol=1e-14)


def test_gqa_equals_mha_with_explicitly_repeated_kv_and_summed_gradients():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 5, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 3, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(2, 6, 5, 3, generator=gen, dtype=torch.float64)
    gqa = forward_backward(attention_oracle, q, k, v, grad_out, causal="top_left")
    mha = forward_backward(attention_oracle, q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), grad_out,
                           causal="top_left")
    torch.testing.assert_close(gqa[0], mha[0])
    torch.testing.assert_close(gqa[2], mha[2])
    torch.testing.assert_close(gqa[3], mha[3].reshape(2, 2, 3, 7, 4).sum(2))
    torch.testing.assert_close(gqa[4], mha[4].reshape(2, 2, 3, 7, 3).sum(2))


@pytest.mark.parametrize("kwargs", [dict(), dict(causal="bottom_right", window=(2, 1)), dict(softcap=1.5),
                                    dict(kv_lens=[3, 0], causal="top_left")])
def test_autograd_matches_central_finite_differences(kwargs):
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, s, 3, generator=gen, dtype=torch.float64, requires_grad=True)
               for s in (4, 5, 5))
    assert torch.autograd.gradcheck(lambda *t: attention_oracle(*t, **kwargs), (q, k, v))


def test_sink_and_bias_gradients_match_central_finite_differences():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 2, s, 3, generator=gen, dtype=torch.float64) for s in (4, 5, 5))
    sinks = torch.randn(2, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, 1, 5, generator=gen, dtype=torch.float64, requires_grad=True)

    def lse_and_out(sinks, bias):
        out, lse = attention_oracle(q, k, v, sinks=sinks, bias=bias, causal="top_left", kv_lens=[5, 0],
                                    return_lse=True)
        return out, lse

    assert torch.autograd.gradcheck(lse_and_out, (sinks, bias))
