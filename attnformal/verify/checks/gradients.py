"""Gradients: dQ, dK, dV against the reference, by finite differences, and an exact invariant.

* Reference gradients over varied shapes, ragged boundaries, masks, GQA (dK/dV summed over
  each group), empty rows (exactly zero) and non-contiguous inputs and dO.
* Central finite differences on a tiny float64 case, independent of any reference code.
* Softmax ignores a constant added to a row's logits, so ``sum_j dS_ij = 0`` and hence
  ``sum_j dK_j = scale * sum_i q_i sum_j dS_ij = 0`` for every head (no softcap). A wrong
  ``D = rowsum(dO * O)`` breaks exactly this.
"""

from __future__ import annotations

import math

import torch

from attnformal.testing import compare_attention, tolerance_for
from attnformal.verify.cases import (bshd, cache_slice, generator, non_contiguous, randn, random_attn_mask, shape,
                                    strided_features)
from attnformal.verify.checks import check
from attnformal.verify.checks.accuracy import empty_row_cases, prefix_masked
from attnformal.verify.diagnosis import HINT, PATTERN, STRONG, name_factor

GRADS = ("dq", "dk", "dv")


def _backward_case(run, case, *, expect_refusal=False):
    """Judge out and the three gradients; note when only the backward is wrong."""
    record = run.against_reference(case, backward=True, expect_refusal=expect_refusal)
    if record is not None and record.status == "FAIL" and record.comparisons[0].passed:
        bad = [c.name for c in record.comparisons[1:] if not c.passed]
        run.find("backward_wrong", HINT, f"the forward is right but {', '.join(bad)} fail")
        if "dv" not in bad:
            _key_sum_evidence(run, record)
    return record


def _key_sum_evidence(run, record):
    problem = _key_sum_problem(record)
    if problem:
        run.find("backward_delta", STRONG, f"dV is right but {problem}: D = rowsum(dO * O) is wrong")


@check("bwd.random")
def random(run):
    """Random inputs: dQ, dK, dV against the reference."""
    cases = [(shape(2, 4, 4, 33, 47, 32), {}), (shape(3, 2, 2, 64, 64, 64), {"scale": 0.3}),
             (shape(1, 3, 3, 100, 17, 16), {})]
    cases += run.pick([], [(shape(2, 4, 4, 512, 512, 128), {}), (shape(1, 2, 2, 1000, 1000, 64), {})])
    for n, (sh, kw) in enumerate(cases):
        _backward_case(run, run.random_case(f"random #{n}", sh, **kw))


@check("bwd.lengths")
def lengths(run):
    """Ragged boundaries: lengths around block multiples, Sq != Sk, with and without causal (lengths an
    adaptation rounds up also tried as asked: expected refusals, judged where accepted)."""
    for sk, sq, causal in LENGTHS + run.pick([], FULL_LENGTHS):
        kw = {"causal": "bottom_right"} if causal else {}
        sh = shape(2, 2, 2, sq, sk, 32)
        case = run.random_case(f"Sk={sk}", sh, **kw)
        _backward_case(run, case)
        probe = run.as_asked(case, sh, **kw)
        if probe is not None:
            _backward_case(run, probe, expect_refusal=True)


# (Sk, Sq, causal) of bwd.lengths; full adds to quick's cases, never changes one
LENGTHS = [(1, 13, False), (17, 70, True), (63, 63, False), (129, 13, True)]
FULL_LENGTHS = [(sk, (13, 70, sk)[n % 3], n % 2 == 1) for n, sk in enumerate((15, 31, 33, 65, 127, 255, 257))]


@check("bwd.gqa")
def gqa(run):
    """GQA and MQA: dK and dV of a KV head are the sum over its query heads (MHA twin as control)."""
    control = _backward_case(run, run.random_case("MHA control", shape(2, 4, 4, 40, 56, 32), causal="bottom_right",
                                                  incidental=("causal",)))
    failed = []
    for n, sh in enumerate((shape(2, 8, 2, 40, 56, 32), shape(2, 4, 1, 33, 47, 32))):
        record = _backward_case(run, run.random_case(f"gqa #{n}", sh, causal="bottom_right", incidental=("causal",)))
        if record is not None and record.status == "FAIL":
            failed.append(record)
    if control is not None and control.status == "pass" and failed:
        only_kv = all(c.passed for r in failed for c in r.comparisons if c.name in ("out", "dq"))
        if only_kv:
            run.find("gqa_backward_not_summed", STRONG, "MHA passes; with shared KV heads only dK/dV fail")


@check("bwd.masks")
def masks(run):
    """Gradients under every mask family and softcap."""
    sh = shape(2, 2, 2, 30, 45, 32)
    mask = random_attn_mask(generator(run.seed("mask")), sh, 0.7)
    for kw in ({"causal": "top_left"}, {"causal": "bottom_right"}, {"window": (6, 2)}, {"kv_lens": [45, 17]},
               {"attn_mask": mask}, {"softcap": 5.0, "scale": 1.0}):
        _backward_case(run, run.random_case(" + ".join(kw), sh, **kw))
    across = shape(1, 2, 2, 16, 300, 32)  # rows whose first 64 ... 256 keys are masked, and later keys not
    _backward_case(run, run.random_case("attn_mask with masked prefixes", across,
                                        attn_mask=prefix_masked(generator(run.seed("prefix")), across)))


@check("bwd.empty_rows")
def empty_rows(run):
    """Rows with no allowed key: zero gradients, never NaN."""
    for case in empty_row_cases(run, grad=True):
        record = _backward_case(run, case)
        if record is not None and record.status == "FAIL":
            grads = [record.observed.get(n) for n in GRADS]
            if any(not torch.isfinite(g).all() for g in grads):
                run.find("nan_empty_rows", STRONG, f"{case.name}: NaN/Inf in the gradients")


@check("bwd.noncontiguous")
def noncontiguous(run):
    """Non-contiguous q, k, v and dO (one shared layout, and each its own), against their contiguous twin."""
    sh = shape(2, 4, 2, 37, 53, 32)
    control = run.random_case("contiguous twin", sh, causal="bottom_right", incidental=("causal",))
    twin = control.with_(name="non-contiguous", q=non_contiguous(control.q), k=non_contiguous(control.k),
                         v=non_contiguous(control.v), grad_out=non_contiguous(control.grad_out))
    mixed = control.with_(name="q [B, S, H, D], k head-dim stride 2, v a KV-cache slice, dO [B, S, H, D]",
                          q=bshd(control.q), k=strided_features(control.k), v=cache_slice(control.v),
                          grad_out=bshd(control.grad_out))  # each tensor its own layout
    passed = _backward_case(run, control)
    for record in (_backward_case(run, twin), _backward_case(run, mixed)):
        if record is not None and record.status == "FAIL" and passed is not None and passed.status == "pass":
            run.find("strides_ignored", STRONG, f"{record.case.name}: the same gradients fail only in these layouts")


@check("bwd.key_sum", names_causes=True)
def key_sum(run):
    """sum_j dK_j = 0 for every head: softmax is blind to a constant added to a row's logits."""
    sh = shape(2, 4, 2, 30, 45, 32)
    mask = random_attn_mask(generator(run.seed("mask")), sh, 0.7)
    for kw in ({}, {"causal": "bottom_right", "kv_lens": [45, 20]}, {"attn_mask": mask}):
        case = run.random_case(" + ".join(kw) or "no mask", sh, incidental=("causal",), **kw)
        observed = run.observe(case, backward=True)
        if observed is None:
            continue
        expected = run.expected(case, backward=True)
        comparison = _key_sum_comparison(case, observed, expected)
        run.record(case, comparisons=[comparison], backward=True, observed=observed, expected=expected)
        if not comparison.passed and all(
                compare_attention(observed.get(n), expected.values[n], **expected.tolerance(n)).passed
                for n in ("out", "dv")):
            run.find("backward_delta", STRONG, "out and dV are right but sum_j dK_j != 0: D = rowsum(dO * O) "
                                               "is wrong")


def _key_sum_comparison(case, observed, expected):
    """``sum_j dK_j`` against 0, allowing the sum of the per-element dK tolerances."""
    rtol, atol = tolerance_for(case.dtype)
    per_element = rtol * expected.values["dk"].abs() + atol * expected.magnitude["dk"]
    bound = per_element.sum(2) + expected.values["dk"].sum(2).abs()  # the reference's own rounding
    total = observed.dk.double().cpu().sum(2)
    return compare_attention(total, torch.zeros_like(total), dtype=case.dtype, rtol=0.0, atol=1.0, magnitude=bound,
                             name="sum_j dK_j")


def _key_sum_problem(record):
    comparison = _key_sum_comparison(record.case, record.observed, record.expected)
    return None if comparison.passed else f"sum_j dK_j = {comparison.worst_actual:.3g}, not 0"


# -- finite differences


@check("bwd.finite_difference", fixed_dtype=torch.float64)
def finite_difference(run):
    """Central finite differences of <dO, out> on a tiny case (float64; float32 if unsupported)."""
    for dtype, step, tol in ((torch.float64, 1e-5, 1e-6), FLOAT32_STEP):
        case = run.random_case(f"tiny {str(dtype).removeprefix('torch.')}", shape(1, 2, 1, 5, 7, 4, 3),
                               causal="bottom_right", scale=0.7, incidental=("causal",), dtype=dtype)
        observed = run.observe(case, backward=True)
        if observed is not None:
            break
    else:
        return
    if dtype == torch.float64:
        error = _relative_forward_error(run, case, observed)
        if error > FLOAT64_FORWARD_ERROR:  # a step of 1e-5 would measure rounding noise, not the derivative
            step, tol = FLOAT32_STEP[1:]
            run.note(f"float64 inputs are computed in lower precision (forward error {error:.2g} of the output's "
                     f"size): finite differences use the float32 step {step:g}")
    problems = []
    for name, grad in zip("qkv", (observed.dq, observed.dk, observed.dv)):
        problems += _directional_checks(run, case, name, grad, step, tol)
    run.record(case, problems=problems, backward=True, observed=observed)


FLOAT32_STEP = (torch.float32, 1e-2, 2e-2)
FLOAT64_FORWARD_ERROR = 1e-10  # a float64 computation is ~1e-16; float32 arithmetic shows as ~1e-7


def _relative_forward_error(run, case, observed) -> float:
    reference = run.expected(case).values["out"]
    size = float(reference.abs().max()) or 1.0
    return float((observed.out.double().cpu() - reference).abs().max()) / size


def _directional_checks(run, case, name, grad, step, tol):
    gen = generator(run.seed("directions", name))
    x = getattr(case, name)
    own = grad / grad.norm() if grad.norm() > 0 else grad
    directions = [("its own gradient", own)] if bool(torch.isfinite(own).all()) else []  # no NaN step
    directions += [(f"random {i}", randn(gen, *x.shape).to(x)) for i in range(2)]
    problems = []
    for label, u in directions:
        u = u / u.norm()
        h = step * max(1.0, float(x.abs().max()))
        values = []
        for sign in (1, -1):
            observed = run.observe(case.with_(**{name: (x + sign * h * u).detach()}))
            if observed is None:
                return problems
            values.append(float((observed.out.double() * case.grad_out.double()).sum()))
        numeric = (values[0] - values[1]) / (2 * h)
        analytic = float((grad.double() * u.double()).sum())
        if not abs(numeric - analytic) <= tol * max(float(grad.norm()), 1e-12):  # NaN fails too
            problems.append(f"d{name} along {label}: autograd {analytic:.6g}, finite difference {numeric:.6g}")
            if label == "its own gradient" and numeric:
                _factor(run, case, f"d{name}", analytic / numeric)
    return problems


def _factor(run, case, name, ratio):
    label = name_factor(ratio, case)
    if label is not None:
        run.find("gradient_scale", STRONG, f"{name} = {ratio:.4g} x the finite difference (= {label})")
    elif math.isfinite(ratio):
        run.find("gradient_scale", PATTERN, f"{name} = {ratio:.4g} x the finite difference")
