"""The selectable tolerance profiles: naive (flash-attention's criterion) and ascend (MERE/MARE)."""

import torch

from attnformal.adapters import resolve
from attnformal.verify import Settings, run_battery
from attnformal.verify.cases import random_case, shape
from attnformal.verify.reference import expected_for, naive_for
from attnformal.verify.report import render
from attnformal.verify.tolerances import ASCEND_THRESHOLD, judge


def bf16_case():
    case = random_case("profiles", shape(2, 2, 2, 24, 40, 32), torch.bfloat16, "cpu", 3, grad=False)
    return case, expected_for(case, backward=False)


def test_naive_profile_accepts_a_correct_kernel_and_rejects_a_slightly_worse_one():
    case, expected = bf16_case()
    naive = naive_for(case, backward=False)
    good = judge("naive", "out", resolve("sdpa-math")(case.q, case.k, case.v), expected, torch.bfloat16, naive=naive)
    assert good.passed
    naive_error = float((naive["out"].double() - expected.values["out"]).abs().max())
    assert good.atol >= 2 * naive_error  # allowed: twice the naive control's worst error, plus a rounding floor
    worse = expected.values["out"] + 1.5 * good.atol
    assert not judge("naive", "out", worse, expected, torch.bfloat16, naive=naive).passed


def test_ascend_profile_checks_the_mean_and_the_maximum_relative_error():
    case, expected = bf16_case()
    reference = expected.values["out"]
    threshold = ASCEND_THRESHOLD[torch.bfloat16]
    assert judge("ascend", "out", reference * (1 + threshold / 2), expected, torch.bfloat16).passed
    mean_too_large = judge("ascend", "out", reference * (1 + 2 * threshold), expected, torch.bfloat16)
    assert not mean_too_large.passed and "MERE" in mean_too_large.problem
    one_far = reference.clone()
    one_far[0, 0, 0, 0] *= 1 + 20 * threshold
    assert judge("ascend", "out", one_far, expected, torch.bfloat16).mismatched == 1


def test_correct_kernels_pass_the_naive_profile():
    report = run_battery(Settings(impl=resolve("torch-tiled"), impl_name="torch-tiled", tolerance="naive"))
    assert report.passed, render(report)
