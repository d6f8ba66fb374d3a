"""Attention sinks, ALiBi and the additive bias: closed forms, the reference, gradients, relations.

* A sink is a logit in the denominator with no value: with one key the output is
  ``v e^s / (e^s + e^sink)`` and lse ``log(e^s + e^sink)``; with no key, out 0 and lse = sink;
  with every value 0 the output is exactly 0 whatever the sink (a sink given a value shows).
* Sinks against the reference with lse (a sink left out of lse is explained by a mutant
  problem); ALiBi (flash-attention's alignment, bottom-right with the batch's own key length)
  and the bias on the output alone (so a library without lse is judged too), Sq < Sk and
  Sq > Sk, with kv_lens, causal and softcap; a wrong sign or alignment is a mutant problem.
* Gradients: dQ, dK, dV and d sinks, d bias against the reference.
* Relations of the implementation with itself: a sink of -inf is no sink; ALiBi with slope 0 is
  no ALiBi; a bias constant along each row leaves out unchanged and shifts lse by it.
"""

from __future__ import annotations

import math

import torch

from attnformal.testing import compare_attention, tolerance_for
from attnformal.verify.cases import generator, randn, random_case, shape
from attnformal.verify.checks import check
from attnformal.spec import SpecError
from attnformal.verify.diagnosis import PATTERN, STRONG


def _case(run, name, sh, *, grad=False, tensors=None, **kw):
    """A seeded random case adapted to the implementation, with keyword tensors built for the
    adapted shape by ``tensors(shape, gen)`` (sinks, slopes and bias in the case's dtype)."""
    sh, kw, notes = run.adapt(sh, kw)
    if tensors is not None:
        kw.update({n: t.to(run.dtype) if n != "alibi_slopes" else t
                   for n, t in tensors(sh, generator(run.seed(name, "tensors"))).items()})
    return random_case(name, sh, run.dtype, run.device, run.seed(name), grad=grad, **kw).with_(adapted=notes)


def sink_logits(sh, gen, *, minus_inf_head=True):
    """One logit per query head (the last head without a sink when ``minus_inf_head``)."""
    sinks = randn(gen, sh.heads_q)
    if minus_inf_head and sh.heads_q > 1:
        sinks[-1] = -math.inf
    return sinks


def alibi_slopes_for(sh, gen, per_batch=False):
    """ALiBi's geometric slopes 2^(-8 (h + 1) / Hq), per batch element scaled differently when asked."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, sh.heads_q + 1, dtype=torch.float64) / sh.heads_q)
    if per_batch:
        return slopes[None] * (1 + torch.arange(sh.batch, dtype=torch.float64))[:, None]
    return slopes


def _with_closed_form(run, case, **values):
    expected = run.expected(case)
    expected.values.update(values)
    return expected


# -- closed forms


@check("hand.sinks")
def sink_closed_forms(run):
    """One key and a sink: out = v e^s / (e^s + e^sink), lse = log(e^s + e^sink); no key: out 0, lse = sink."""
    case = _case(run, "one key + sink, batch 0 has no key", shape(2, 2, 2, 6, 1, 16), scale=1.0, kv_lens=[0, 1],
                 tensors=lambda sh, gen: {"sinks": randn(gen, sh.heads_q)})
    spec = case.spec
    q, k, v = (t.double().cpu() for t in (case.q, case.k, case.v))
    sink = case.kwargs["sinks"].double().cpu()[None, :, None]
    s = spec.scale * (q * k[:, spec.kv_heads()]).sum(-1)  # [B, Hq, Sq]: the one key's score
    has_key = torch.tensor([n > 0 for n in spec.kv_lens])[:, None, None]
    z = torch.where(has_key, s.exp(), 0.0) + sink.exp()
    out = torch.where(has_key[..., None], (s.exp() / z)[..., None] * v[:, spec.kv_heads()], 0.0)
    run.against_reference(case, lse=True, expected=_with_closed_form(run, case, out=out, lse=z.log()))

    zero = _case(run, "every value 0", shape(2, 2, 2, 20, 37, 16), causal="bottom_right",
                 tensors=lambda sh, gen: {"sinks": sink_logits(sh, gen)})
    zero = zero.with_(v=torch.zeros_like(zero.v))
    record = run.against_reference(zero, expected=_with_closed_form(run, zero, out=torch.zeros(
        zero.spec.batch, zero.spec.heads_q, zero.spec.len_q, zero.spec.head_dim_v, dtype=torch.float64)))
    if record is not None and record.status == "FAIL":
        largest = float(record.observed.out.double().abs().max())
        run.find("sink_value", STRONG, f"with every value 0 the output reaches {largest:.3g}, not 0: the sink "
                                       "carries a value into the output")

    # V = 1: out = 1 - p_sink, which a sink value proportional to V (invisible at V = 0) moves
    ones = zero.with_(name="every value 1", v=torch.ones_like(zero.v))
    record = run.against_reference(ones, lse=True)
    if record is not None and record.status == "FAIL" and record.comparisons[1].passed \
            and _passes_without_sinks(run, ones):
        run.find("sink_value", STRONG, "with every value 1 the output is not 1 - exp(sink - lse) while lse is right, "
                                       "and without the sinks it is 1: the sink carries a value (one that scales "
                                       "with V)")


def _passes_without_sinks(run, case) -> bool:
    """The control twin of a failing sinks case: every sink -inf (no sink) passes."""
    none = torch.full_like(case.kwargs["sinks"], -math.inf)
    twin = case.with_(name=f"{case.name}, sinks -inf", kwargs={**case.kwargs, "sinks": none}, role="control")
    record = run.against_reference(twin)
    return record is not None and record.status == "pass"


# -- against the reference


@check("fwd.sinks", names_causes=True)
def sinks(run):
    """Sinks (one head without: -inf) with causal masks, kv_lens and GQA; lse too (empty rows: hand.sinks)."""
    for name, sh, kw in [("sinks", shape(2, 4, 4, 33, 47, 32), {}),
                         ("sinks + causal + kv_lens", shape(2, 4, 2, 40, 30, 32),
                          {"causal": "top_left", "kv_lens": [30, 7]}),
                         ("sinks + window", shape(1, 2, 2, 64, 64, 32), {"window": (8, 0)})]:
        record = run.against_reference(_case(run, name, sh, tensors=lambda sh, gen: {"sinks": sink_logits(sh, gen)},
                                             **kw), lse=True)
        if record is not None and record.status == "FAIL" and record.comparisons[1].passed \
                and _passes_without_sinks(run, record.case):
            run.find("sink_value", PATTERN, f"{name}: lse is right but out is not, and without the sinks out is "
                                            "right: the sink adds something to the accumulator")


@check("fwd.alibi")
def alibi(run):
    """ALiBi slopes [Hq] and [B, Hq], Sq < Sk and Sq > Sk, with kv_lens, causal and softcap (lse: the relations)."""
    for name, sh, kw, per_batch in [
        ("alibi Sq < Sk", shape(2, 4, 4, 24, 61, 32), {}, False),
        ("alibi Sq > Sk", shape(2, 2, 2, 50, 21, 32), {}, False),
        ("alibi [B, Hq] + kv_lens + causal", shape(2, 4, 2, 30, 45, 32),
         {"kv_lens": [45, 17], "causal": "bottom_right"}, True),
        ("alibi + softcap", shape(1, 2, 2, 33, 40, 32), {"softcap": 5.0}, False),
    ]:
        case = _case(run, name, sh, **kw,
                     tensors=lambda sh, gen, pb=per_batch: {"alibi_slopes": alibi_slopes_for(sh, gen, pb)})
        run.against_reference(case)


@check("fwd.bias")
def bias(run):
    """An additive bias [B, Hq, Sq, Sk], [Hq, 1, Sk] and [Sq, Sk], with a causal mask and softcap."""
    for name, sh, kw, dims in [
        ("bias [B, Hq, Sq, Sk]", shape(2, 4, 2, 33, 47, 32), {}, lambda sh: (sh.batch, sh.heads_q, sh.len_q, sh.len_k)),
        ("bias [Hq, 1, Sk] + causal", shape(2, 2, 2, 40, 40, 32), {"causal": "top_left"},
         lambda sh: (sh.heads_q, 1, sh.len_k)),
        ("bias [Sq, Sk] + softcap", shape(1, 2, 2, 20, 70, 32), {"softcap": 4.0}, lambda sh: (sh.len_q, sh.len_k)),
    ]:
        case = _case(run, name, sh, tensors=lambda sh, gen, dims=dims: {"bias": 2.0 * randn(gen, *dims(sh))}, **kw)
        run.against_reference(case)


@check("bwd.sinks_alibi_bias")
def gradients(run):
    """dQ, dK, dV, d sinks and d bias against the reference (sinks, ALiBi, bias; alone and together)."""
    both = shape(2, 4, 2, 30, 45, 32)
    for name, sh, kw, tensors in [
        ("sinks", shape(2, 2, 2, 33, 47, 32), {"kv_lens": [47, 0]}, lambda sh, gen: {"sinks": sink_logits(sh, gen)}),
        ("alibi", shape(2, 2, 2, 24, 61, 32), {}, lambda sh, gen: {"alibi_slopes": alibi_slopes_for(sh, gen)}),
        ("bias [Hq, Sq, 1]", shape(2, 2, 2, 33, 47, 32), {"causal": "bottom_right"},
         lambda sh, gen: {"bias": randn(gen, sh.heads_q, sh.len_q, 1)}),
        ("all three + softcap", both, {"softcap": 5.0, "causal": "bottom_right"},
         lambda sh, gen: {"sinks": sink_logits(sh, gen), "alibi_slopes": alibi_slopes_for(sh, gen, True),
                          "bias": randn(gen, sh.batch, 1, sh.len_q, sh.len_k)}),
    ]:
        run.against_reference(_case(run, name, sh, grad=True, tensors=tensors, **kw), backward=True)


FEATURE_BACKWARD_CASES = [  # (name, shape, keywords, keyword tensors): each feature through lse and the backward
    ("chunk 9 + causal", shape(2, 2, 2, 40, 57, 32), {"chunk_size": 9, "causal": "bottom_right"}, None),
    ("prefix [30, 12] + causal, batch 0's prefix past its kv_lens [20, 57]", shape(2, 2, 2, 40, 57, 32),
     {"prefix_lens": [30, 12], "kv_lens": [20, 57], "causal": "bottom_right"}, None),
    ("alibi [B, Hq] + kv_lens, not causal", shape(2, 4, 2, 30, 45, 32), {"kv_lens": [45, 17]},
     lambda sh, gen: {"alibi_slopes": alibi_slopes_for(sh, gen, True)}),
    ("alibi + causal (lse)", shape(2, 2, 2, 33, 47, 32), {"causal": "bottom_right"},
     lambda sh, gen: {"alibi_slopes": alibi_slopes_for(sh, gen)}),
]
FULL_FEATURE_BACKWARD_CASES = [  # full adds these (sinks and bias have their backward in bwd.sinks_alibi_bias)
    ("sinks + chunk 16 + kv_lens", shape(2, 2, 2, 40, 57, 32), {"chunk_size": 16, "kv_lens": [57, 30]},
     lambda sh, gen: {"sinks": sink_logits(sh, gen)}),
    ("bias [B, Hq, Sq, Sk] + window + kv_lens", shape(2, 2, 2, 33, 47, 32), {"window": (9, 3), "kv_lens": [47, 25]},
     lambda sh, gen: {"bias": randn(gen, sh.batch, sh.heads_q, sh.len_q, sh.len_k)}),
]
MASK_KEYWORDS = ("chunk_size", "prefix_lens", "window", "kv_lens", "causal")  # what a backward may forget to apply


@check("bwd.features")
def features(run):
    """Each feature through lse and the backward: chunk, a prefix longer than kv_lens, ALiBi with kv_lens and not
    causal, ALiBi with causal (full: sinks, bias with masks); a mask the backward forgets is named by its twin."""
    lse = run.caps is None or not run.caps.refuses("lse")  # a kernel without lse still has its backward judged
    for name, sh, kw, tensors in FEATURE_BACKWARD_CASES + run.pick([], FULL_FEATURE_BACKWARD_CASES):
        case = _case(run, name, sh, grad=True, tensors=tensors, **kw)
        record = run.against_reference(case, lse=lse, backward=True)
        if record is not None and record.status == "FAIL" and all(c.passed for c in record.comparisons
                                                                  if c.name in ("out", "lse")):
            _forgotten_in_backward(run, record)


def _forgotten_in_backward(run, record):
    """Out (and lse) are right, a gradient is not: the mask keyword whose removal makes the gradients right too
    is one the backward does not apply (it recomputes P without it)."""
    case = record.case
    for keyword in MASK_KEYWORDS:
        if case.kwargs.get(keyword) is None:
            continue
        twin = case.with_(name=f"{case.name}, without {keyword}",
                          kwargs={k: v for k, v in case.kwargs.items() if k != keyword}).with_(role="control")
        try:
            twin.spec  # noqa: B018 -- a prefix needs a causal mode: some twins do not exist
        except SpecError:
            continue
        control = run.against_reference(twin, backward=True)
        if control is not None and control.status == "pass":
            run.find("backward_mask", STRONG, f"{case.name}: out and lse are right, the gradients are not, and "
                                              f"without {keyword} they are: the backward recomputes P without it")
            return
    run.find("backward_wrong", PATTERN, f"{case.name}: out and lse are right, the gradients are not")


# -- relations of the implementation with itself


@check("metamorphic.sinks_alibi_bias")
def relations(run):
    """A -inf sink is no sink; ALiBi slope 0 is no ALiBi; a bias constant along rows keeps out and shifts lse."""
    sh = shape(2, 2, 2, 24, 37, 32)
    base = _case(run, "plain", sh, causal="bottom_right", kv_lens=[37, 11])
    hq = base.spec.heads_q
    _same(run, base, base.with_(name="sinks = -inf", kwargs={**base.kwargs, "sinks": torch.full(
        (hq,), -math.inf, dtype=run.dtype, device=run.device)}))
    _same(run, base, base.with_(name="alibi slopes = 0", kwargs={**base.kwargs, "alibi_slopes": torch.zeros(
        hq, device=run.device)}))
    rows = 4.0 * torch.arange(base.spec.len_q, dtype=torch.float64)[:, None] - 40.0  # exact in every dtype
    shifted = base.with_(name="bias constant per row", kwargs={**base.kwargs, "bias": rows.to(run.dtype).to(
        run.device)})
    _same(run, base, shifted, lse_shift=rows[:, 0])


def _same(run, case, transformed, lse_shift=None):
    """The implementation on ``transformed`` equals it on ``case`` (lse shifted by ``lse_shift`` per row)."""
    base, moved = run.observe(case, lse=True), run.observe(transformed, lse=True)
    if base is None or moved is None:
        return None
    rtol, atol = tolerance_for(run.dtype)
    reference = run.expected(case)
    expected_lse = base.lse.double().cpu()
    if lse_shift is not None:
        expected_lse = expected_lse + lse_shift
    comparisons = [
        compare_attention(moved.out, base.out, dtype=run.dtype, rtol=2 * rtol, atol=2 * atol,
                          magnitude=reference.magnitude["out"], name="out"),
        compare_attention(moved.lse, expected_lse, dtype=torch.float32 if run.dtype != torch.float64 else run.dtype,
                          rtol=2 * rtol, atol=2 * atol, magnitude=reference.magnitude["lse"], name="lse"),
    ]
    return run.record(transformed, comparisons=comparisons, lse=True, observed=moved, expected=reference)
