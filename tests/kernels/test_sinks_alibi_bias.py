"""Sinks, ALiBi and the additive bias: both kernels (torch tiled, Triton) against the fp64 oracle.

Outputs, lse and every gradient (q, k, v, sinks, bias) in float64 (to 1e-12), float32, bfloat16
and float16, alone and with the mask families, softcap, dropout replay and split-KV.
"""

from __future__ import annotations

import pytest
import torch

from kernel_checks import assert_matches, make_problem
from attnformal.kernels import torch_tiled
from attnformal.oracle import attention_oracle
from attnformal.schedule import TileSchedule

SMALL = TileSchedule(block_m=16, block_n=16)
SPLIT = TileSchedule(block_m=16, block_n=16, num_splits=3)


def kernels():
    """``{name: attention}`` of the kernels at hand (Triton only where it is installed)."""
    found = {"torch_tiled": torch_tiled.attention}
    try:
        from attnformal.kernels import triton_flash
    except ImportError:
        return found
    return {**found, "triton_flash": triton_flash.attention}


KERNELS = kernels()
SHAPE = dict(batch=2, heads_q=4, heads_kv=2, len_q=37, len_k=53, head_dim=16)
DIFFERENTIABLE = ("sinks", "bias")  # the keyword tensors whose gradients the protocol returns


def sinks(dtype, *, seed=5, minus_inf_head=None):
    values = torch.randn(SHAPE["heads_q"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if minus_inf_head is not None:
        values[minus_inf_head] = float("-inf")  # no sink on that head
    return values.to(dtype)


def slopes(dtype, *, per_batch=False, seed=6):
    shape = (SHAPE["batch"], SHAPE["heads_q"]) if per_batch else (SHAPE["heads_q"],)
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def bias(dtype, shape, *, seed=7):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def run(impl, q, k, v, grad_out, grad_lse_weight=0.25, **kwargs):
    """``{name: value}`` of out, lse and the gradients of q, k, v and the differentiable keywords.

    The loss is ``<dO, out> + w * sum(finite lse)``, so ``d lse`` enters the backward too.
    """
    leaves = {"q": q, "k": k, "v": v, **{n: kwargs[n] for n in DIFFERENTIABLE if kwargs.get(n) is not None}}
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in leaves.items()}
    out, lse = impl(leaves["q"], leaves["k"], leaves["v"], return_lse=True,
                    **{**kwargs, **{n: leaves[n] for n in DIFFERENTIABLE if n in leaves}})
    finite_lse = torch.where(torch.isfinite(lse), lse, 0.0)
    ((out * grad_out.to(out.dtype)).sum() + grad_lse_weight * finite_lse.sum()).backward()
    return {"out": out.detach(), "lse": lse.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}


def check(dtype=torch.float64, schedule=SMALL, shape=None, kernel="torch_tiled", **kwargs):
    q, k, v, grad_out = make_problem(seed=0, dtype=dtype, **{**SHAPE, **(shape or {})})
    ref = run(attention_oracle, q, k, v, grad_out, **kwargs)
    got = run(lambda *t, **kw: KERNELS[kernel](*t, schedule=schedule, **kw), q, k, v, grad_out, **kwargs)
    assert set(got) == set(ref)
    for name, r in ref.items():
        assert got[name] is not None, f"no gradient for {name}"
        if dtype == torch.float64:  # the kernel and the oracle share no softmax code: agree to 1e-12
            torch.testing.assert_close(got[name], r, rtol=1e-12, atol=1e-12, msg=name)
        else:
            assert_matches(name, got[name], r, dtype)


def features(dtype):
    b, h, sq, sk = SHAPE["batch"], SHAPE["heads_q"], SHAPE["len_q"], SHAPE["len_k"]
    return {
        "sinks": dict(sinks=sinks(dtype)),
        "sinks, one -inf": dict(sinks=sinks(dtype, minus_inf_head=2)),
        "alibi [Hq]": dict(alibi_slopes=slopes(dtype)),
        "alibi [B, Hq] + kv_lens": dict(alibi_slopes=slopes(dtype, per_batch=True), kv_lens=[sk, 20]),
        "bias full": dict(bias=bias(dtype, (b, h, sq, sk))),
        "bias [Hq, 1, Sk]": dict(bias=bias(dtype, (h, 1, sk))),
        "bias [Sq, Sk] + softcap": dict(bias=bias(dtype, (sq, sk)), softcap=2.5),
        "all + causal": dict(sinks=sinks(dtype), alibi_slopes=slopes(dtype), bias=bias(dtype, (b, 1, sq, sk)),
                             causal="bottom_right"),
        "all + window + kv_lens 0": dict(sinks=sinks(dtype), alibi_slopes=slopes(dtype, per_batch=True),
                                         bias=bias(dtype, (1, h, 1, 1)), window=(6, 2), kv_lens=[0, 40]),
    }


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("schedule", [SMALL, SPLIT], ids=["16x16", "16x16 split3"])
@pytest.mark.parametrize("name", list(features(torch.float64)))
def test_float64_matches_the_oracle_to_1e_12(name, schedule, kernel):
    check(schedule=schedule, kernel=kernel, **features(torch.float64)[name])


@pytest.mark.numerics
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["sinks, one -inf", "alibi [B, Hq] + kv_lens", "bias [Hq, 1, Sk]",
                                  "all + window + kv_lens 0"])
def test_low_precision_matches_the_oracle(name, dtype, kernel):
    check(dtype=dtype, kernel=kernel, **features(dtype)[name])


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_sinks_with_dropout_replay_leave_the_sink_undropped(kernel):
    b, h, sq, sk = SHAPE["batch"], SHAPE["heads_q"], SHAPE["len_q"], SHAPE["len_k"]
    keep = torch.rand(b, h, sq, sk, generator=torch.Generator().manual_seed(3)) < 0.7
    check(kernel=kernel, sinks=sinks(torch.float64), bias=bias(torch.float64, (sq, sk)), dropout_p=0.3,
          dropout_mask=keep)


def test_a_bias_without_requires_grad_gets_no_gradient_and_the_sink_gradient_is_the_formula():
    """d sink_h = sum_{b,i} p_sink (dlse - rowsum(dO * O)), computed here from the oracle's own out and lse."""
    q, k, v, grad_out = make_problem(seed=1, **SHAPE)
    sink = sinks(torch.float64).requires_grad_(True)
    fixed_bias = bias(torch.float64, (SHAPE["len_q"], SHAPE["len_k"]))
    out, lse = torch_tiled.attention(q, k, v, sinks=sink, bias=fixed_bias, return_lse=True, schedule=SMALL)
    (out * grad_out).sum().backward()
    assert fixed_bias.grad is None
    ref_out, ref_lse = attention_oracle(q, k, v, sinks=sink.detach(), bias=fixed_bias, return_lse=True)
    p_sink = torch.exp(sink.detach()[None, :, None] - ref_lse)
    expected = (-p_sink * (grad_out * ref_out).sum(-1)).sum(dim=(0, 2))
    torch.testing.assert_close(sink.grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("keyword", ["sinks", "alibi_slopes", "bias"])
def test_the_ring_kernel_refuses_them_rather_than_compute_without_them(keyword):
    from attnformal.kernels import ring

    q, k, v, _ = make_problem(seed=0, **SHAPE)
    value = {"sinks": sinks(torch.float64), "alibi_slopes": slopes(torch.float64),
             "bias": bias(torch.float64, (SHAPE["len_q"], SHAPE["len_k"]))}[keyword]
    with pytest.raises(NotImplementedError, match=keyword):
        ring.make_attention()(q, k, v, **{keyword: value})
