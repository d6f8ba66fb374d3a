"""Cross-checks: mpmath, the certified tiers and the fp64 oracle agree within the certified radii.

Every case is seeded (``case(shape, dtype, seed, ...)``); shapes are small because the
mpmath reference is a Python loop.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from attnformal.oracle import attention_oracle, forward_backward
from attnformal.reference import CertificationError, certified, certified_attention
from attnformal.reference.mp import mp_attention
from attnformal.spec import SpecError
from reference_cases import case, mp_inside_arb_balls, mp_inside_float_balls, sinks_alibi_bias

FIELDS = ("out", "lse", "dq", "dk", "dv")

CASES = {
    "plain": lambda: case((1, 2, 2, 5, 7, 4)),
    "gqa_bottom_right": lambda: case((2, 4, 2, 6, 9, 4, 3), torch.float16, 1, causal="bottom_right"),
    "top_left_window": lambda: case((1, 2, 1, 8, 8, 4), torch.float32, 2, causal="top_left", window=(2, 1)),
    "kv_lens_fully_masked_batch": lambda: case((2, 2, 2, 5, 6, 4), seed=3, kv_lens=[6, 0]),
    "bottom_right_empty_rows": lambda: case((1, 1, 1, 7, 4, 3), torch.float32, 4, causal="bottom_right"),
    "softcap": lambda: case((1, 2, 2, 4, 6, 5), seed=5, input_scale=3.0, softcap=2.5),
    "dropout_replay": lambda: case((1, 2, 1, 5, 6, 4), seed=6, dropout_p=0.4),
    "attn_mask": lambda: case((2, 2, 1, 5, 5, 3), seed=7, attn_mask_density=0.4),
    "float64_inputs": lambda: case((1, 1, 1, 4, 5, 6), torch.float64, 8, window=(1, -1)),
    # |scale * s| up to ~1e4: softmax is nearly one-hot and exp spans hundreds of binades
    "extreme_logits": lambda: case((1, 2, 1, 4, 6, 4), torch.float32, 9, input_scale=60.0, scale=1.0),
    "long_rows": lambda: case((1, 1, 1, 2, 1500, 4), torch.float16, 10),
    "sinks_alibi_bias": lambda: case((2, 2, 1, 5, 7, 4), torch.float32, 13, causal="bottom_right", kv_lens=[7, 0],
                                     softcap=3.0, **sinks_alibi_bias(2, 2, 5, 7)),
}


def cancelling_case():
    """Uniform attention (q = 0) over values +-1 (+ 2^-20 jitter): out ~ 1e-7, terms ~ 1."""
    x, kwargs = case((1, 1, 1, 3, 8, 2), torch.float32, 11)
    x["q"] = torch.zeros_like(x["q"])
    signs = torch.tensor([1.0, -1.0] * 4).view(1, 1, 8, 1)
    x["v"] = (signs + 2.0**-20 * torch.randint(-3, 4, (1, 1, 8, 2), generator=torch.Generator().manual_seed(11))
              ).float()
    return x, kwargs


CASES["near_cancelling"] = cancelling_case


def run_all(make):
    x, kwargs = make()
    args = (x["q"], x["k"], x["v"], x["grad_out"])
    reference = mp_attention(*args, dps=50, **kwargs)
    certified = certified_attention(*args, **kwargs)
    oracle = forward_backward(attention_oracle, *(t.double() for t in args), **kwargs)
    return x, kwargs, reference, certified, dict(zip(FIELDS, oracle))


@pytest.fixture(scope="module", params=sorted(CASES))
def computed(request):
    return request.param, run_all(CASES[request.param])


def test_mpmath_values_lie_in_the_float64_balls(computed):
    name, (_, _, reference, certified, _) = computed
    assert certified.tier == "float64"
    for field in FIELDS:
        inside = mp_inside_float_balls(getattr(reference, field), getattr(certified, field),
                                       getattr(certified, f"{field}_radius"))
        assert inside.all(), f"{name}: {field} has {(~inside).sum()} mpmath values outside the certified balls"


def test_fp64_oracle_agrees_within_the_radii(computed):
    name, (_, _, _, certified, oracle) = computed
    for field in FIELDS:
        inside = certified.contains(field, oracle[field])
        assert inside.all(), f"{name}: oracle {field} outside the certified radius at {(~inside).nonzero()[:3]}"


def term_scales(x, certified) -> dict:
    """A priori size of the terms each output sums (P <= 1, sum_j P_j = 1), per tensor.

    An exact value can be far smaller than its terms (cancellation, one-hot softmax); what
    a radius must be small against is the size of the terms, which any kernel rounds.
    """
    spec = certified.spec
    kappa = 1 / (1 - spec.dropout_p)
    mq, mk, mv, mo = (float(x[n].double().abs().max()) for n in ("q", "k", "v", "grad_out"))
    grad_p = 2 * kappa * spec.head_dim_v * mo * mv  # |dP_j - D|
    lse = certified.lse[torch.isfinite(certified.lse)].abs()
    return {"out": kappa * mv, "lse": float(lse.max()) if lse.numel() else 0.0, "dv": kappa * spec.len_q * mo,
            "dq": abs(spec.scale) * grad_p * mk, "dk": abs(spec.scale) * spec.len_q * grad_p * mq}


def test_radii_are_far_below_float32_rounding_of_the_terms(computed):
    """Not vacuous: every radius is below 1e-9 of the size of the terms its value sums
    (plus 1e-80, what the float64 tier's underflow floor FLOOR = 2^-300 can contribute)."""
    name, (x, _, _, certified, _) = computed
    for field, scale in term_scales(x, certified).items():
        radius = float(getattr(certified, f"{field}_radius").max())
        assert radius <= 1e-9 * scale + 1e-80, f"{name}: {field} radius {radius:.3g} vs terms of size {scale:.3g}"


def certify(name):
    x, kwargs = CASES[name]()
    return x, kwargs, certified_attention(x["q"], x["k"], x["v"], x["grad_out"], **kwargs)


def test_the_cases_cover_what_they_claim():
    x, kwargs, _ = certify("extreme_logits")
    logits = kwargs["scale"] * (x["q"].double() @ x["k"].double().mT)
    assert 3e3 < float(logits.abs().max()) < 1e5
    _, _, certified = certify("near_cancelling")
    assert float(certified.out.abs().max()) < 1e-5  # the terms are +-1: the output nearly cancels
    _, _, certified = certify("bottom_right_empty_rows")
    assert int(torch.isinf(certified.lse).sum()) == 3  # Sq - Sk rows see no key
    assert float(certified.out[..., :3, :].abs().max()) == 0.0 and float(certified.out_radius[..., :3, :].max()) == 0


def test_a_perturbed_value_is_detected_outside():
    x, kwargs, certified = certify("gqa_bottom_right")
    oracle = dict(zip(FIELDS, forward_backward(attention_oracle, *(x[n].double() for n in ("q", "k", "v", "grad_out")),
                                               **kwargs)))
    for field in ("out", "dk"):
        value = oracle[field].clone()
        radius = getattr(certified, f"{field}_radius")
        value[0, 1, 2, 1] += 4 * radius[0, 1, 2, 1] + 1e-300
        inside = certified.contains(field, value)
        assert not inside[0, 1, 2, 1] and int((~inside).sum()) == 1


def test_a_one_ulp_input_change_moves_the_exact_answer_outside():
    x, kwargs = CASES["plain"]()
    certified = certified_attention(x["q"], x["k"], x["v"], **kwargs)
    q = x["q"].clone()
    q.view(torch.int16)[0, 0, 3, 2] += 1  # next bfloat16 up
    moved = mp_attention(q, x["k"], x["v"], dps=40, **kwargs)
    inside = mp_inside_float_balls(moved.out, certified.out, certified.out_radius)
    assert not inside[0, 0, 3].any()  # every output of that row moved by far more than the radius
    assert inside[0, 1].all()  # the other head did not move


def test_arb_tier_balls_contain_mpmath_and_sit_inside_float64_balls(computed):
    name, (x, kwargs, reference, certified, _) = computed
    tight = certified_attention(x["q"], x["k"], x["v"], x["grad_out"], prec=128, **kwargs)
    assert tight.tier == "arb-128"
    for field in FIELDS:
        assert mp_inside_arb_balls(getattr(reference, field), tight.enclosures[field]).all(), f"{name}: {field}"
        assert certified.contains(field, getattr(tight, field)).all(), f"{name}: {field}"


def test_sink_and_bias_gradients_lie_in_every_tier():
    """d sinks and d bias: mpmath inside the float64 balls (tiled and dense) and the Arb tier's, and
    the oracle's autograd gradients inside the float64 balls."""
    x, kwargs = CASES["sinks_alibi_bias"]()
    args = (x["q"], x["k"], x["v"], x["grad_out"])
    reference = mp_attention(*args, dps=50, **kwargs)
    results = [certified_attention(*args, **kwargs), certified_attention(*args, dense=True, **kwargs),
               certified_attention(*args, prec=128, **kwargs)]
    leaves = {n: kwargs[n].double().requires_grad_(True) for n in ("sinks", "bias")}
    out = attention_oracle(*(x[n].double() for n in ("q", "k", "v")), **{**kwargs, **leaves})
    (out * x["grad_out"].double()).sum().backward()
    for result in results:
        assert result.fields()[-2:] == ("dsinks", "dbias")
        for field in ("dsinks", "dbias"):
            mid, rad = getattr(result, field), getattr(result, f"{field}_radius")
            assert mp_inside_float_balls(getattr(reference, field), mid, rad).all(), (result.tier, field)
            if result.tier == "float64":  # Arb's radii are far below the oracle's own rounding
                assert result.contains(field, leaves[field.removeprefix("d")].grad).all(), (result.tier, field)
    assert mp_inside_arb_balls(reference.dsinks, results[2].enclosures["dsinks"]).all()


def test_a_sink_left_out_is_detected_outside_the_balls():
    """Negative control: the same problem without the sinks' term gives out, lse outside the balls."""
    x, kwargs = CASES["sinks_alibi_bias"]()
    certified = certified_attention(x["q"], x["k"], x["v"], **kwargs)
    without = attention_oracle(*(x[n].double() for n in ("q", "k", "v")), return_lse=True,
                               **{**kwargs, "sinks": None})
    for field, value in zip(("out", "lse"), without):
        assert not certified.contains(field, value)[:, 0].all()  # head 0 has a finite sink


def test_precision_is_raised_until_the_requested_radius_is_met():
    x, kwargs = CASES["extreme_logits"]()
    args = (x["q"], x["k"], x["v"], x["grad_out"])
    with mpmath.workdps(80):
        reference = mp_attention(*args, dps=80, **kwargs)
    for max_radius, tier in ((1e-30, "arb-128"), (1e-60, "arb-256")):
        result = certified_attention(*args, max_radius=max_radius, **kwargs)
        assert result.tier == tier and result.enclosure_radius <= max_radius
        for field in FIELDS:
            assert mp_inside_arb_balls(getattr(reference, field), result.enclosures[field]).all(), field


def test_an_unreachable_radius_raises(monkeypatch):
    monkeypatch.setattr(certified, "ARB_MAX_PREC", 256)  # 1e-100 needs ~340 bits
    x, kwargs = case((1, 1, 1, 2, 3, 2))
    with pytest.raises(CertificationError, match="not max_radius=1e-100, at 256 bits"):
        certified_attention(x["q"], x["k"], x["v"], max_radius=1e-100, **kwargs)


def test_what_float64_cannot_certify_moves_to_arb():
    x, kwargs = case((1, 1, 1, 3, 4, 2), torch.float64, 12)
    tiny_cap = certified_attention(x["q"], x["k"], x["v"], softcap=1e-40)
    assert tiny_cap.tier == "arb-128"
    huge = 1e200 * x["v"]
    overflowing = certified_attention(1e200 * x["q"], x["k"], huge)  # q.k overflows float64
    # s ~ 1e200: exp(s - shift) needs s to within ~1, so the Arb tier escalates past 128 bits
    assert overflowing.tier in ("arb-256", "arb-512", "arb-1024") and math.isfinite(overflowing.enclosure_radius)
    reference = mp_attention(1e200 * x["q"], x["k"], huge, dps=40)
    assert mp_inside_float_balls(reference.out, overflowing.out, overflowing.out_radius).all()


@pytest.mark.parametrize("call, argument", [
    (lambda x: certified_attention(x["q"], x["k"], x["v"], x["grad_out"][..., :1]), "grad_out"),
    (lambda x: certified_attention(x["q"], x["k"], x["v"], dropout_p=0.5), "dropout_mask"),
    (lambda x: certified_attention(x["q"] * math.inf, x["k"], x["v"]), "q"),
    (lambda x: certified_attention(x["q"], x["k"], x["v"], max_radius=0.0), "max_radius"),
    (lambda x: certified_attention(x["q"], x["k"], x["v"], prec=10), "prec"),
    (lambda x: certified_attention(x["q"], x["k"], x["v"], causal="bottom-right"), "causal"),
    (lambda x: mp_attention(x["q"], x["k"], x["v"][:, :, :2]), "v"),
])
def test_bad_input_names_the_argument(call, argument):
    x, _ = case((1, 2, 1, 3, 4, 2))
    with pytest.raises(SpecError, match=f"argument '{argument}'"):
        call(x)
