"""assert_attention_close: what it accepts, what it rejects, and what its message says."""

import math

import pytest
import torch

from attnformal.testing import TOLERANCES, assert_attention_close, compare_attention, format_ratio, reference_attention


def test_close_tensors_pass_and_report_their_errors():
    r = torch.linspace(-1, 1, 100, dtype=torch.float64).reshape(1, 1, 10, 10)
    c = compare_attention(r + 1e-7, r, dtype=torch.float32)
    assert c.passed and c.mismatched == 0 and c.max_abs == pytest.approx(1e-7)
    assert_attention_close(r.float(), r, dtype=torch.float32)


def test_message_names_count_fraction_worst_index_and_tolerance():
    r = torch.zeros(2, 2, 3, 4, dtype=torch.float64)
    a = r.clone()
    a[1, 0, 2, 3] = 0.5
    a[0, 1, 0, 0] = 0.1
    with pytest.raises(AssertionError) as err:
        assert_attention_close(a, r, dtype=torch.bfloat16, name="out")
    text = str(err.value)
    assert "mismatched elements: 2 / 48 (4.17%)" in text
    assert "greatest absolute difference: 0.5 at index (1, 0, 2, 3)" in text
    rtol, atol = TOLERANCES[torch.bfloat16]
    assert f"{rtol:.3g} * |r| + {atol:.3g} * magnitude" in text


def test_magnitude_and_reference_error_widen_the_tolerance():
    r = torch.ones(1, 1, 1, 4, dtype=torch.float64)
    a = r + 1e-3
    assert not compare_attention(a, r, dtype=torch.float32).passed
    assert compare_attention(a, r, dtype=torch.float32, magnitude=1e3).passed
    assert compare_attention(a, r, dtype=torch.float32, reference_error=2e-3).passed


def test_nan_and_inf_fail_where_the_reference_is_finite_but_equal_infinities_pass():
    r = torch.tensor([[[[0.0, -math.inf, 1.0]]]], dtype=torch.float64)
    assert compare_attention(r.clone(), r, dtype=torch.float32).passed  # -inf == -inf (an empty row's lse)
    for bad in (math.nan, math.inf):
        a = r.clone()
        a[..., 0] = bad
        c = compare_attention(a, r, dtype=torch.float32)
        assert not c.passed and c.nonfinite == 1
    finite_for_inf = r.clone()
    finite_for_inf[..., 1] = -1e4  # a finite lse where the row has no key
    assert not compare_attention(finite_for_inf, r, dtype=torch.float32).passed


def test_rtol_and_atol_come_together_and_dtype_must_be_known():
    r = torch.zeros(1, 1, 1, 1)
    with pytest.raises(ValueError, match="argument 'atol'"):
        compare_attention(r, r, dtype=torch.float32, rtol=1e-3)
    with pytest.raises(ValueError, match="argument 'dtype'"):
        compare_attention(r, r, dtype=torch.int32)


def test_shape_mismatch_is_one_clear_failure():
    c = compare_attention(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 3, 2), dtype=torch.float32)
    assert not c.passed and "shape [1, 1, 2, 3] differs from the expected [1, 1, 3, 2]" in c.message()


@pytest.mark.parametrize("argument, value", [("rtol", -1.0), ("rtol", math.nan), ("atol", math.inf),
                                             ("magnitude", math.nan), ("magnitude", -2.0),
                                             ("reference_error", math.nan), ("reference_error", math.inf)])
def test_a_tolerance_term_that_would_pass_anything_is_an_error(argument, value):
    r = torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    kwargs = {"rtol": 1e-3, "atol": 1e-3} if argument in ("rtol", "atol") else {}
    kwargs[argument] = value
    with pytest.raises(ValueError, match=f"argument '{argument}': expected"):
        assert_attention_close(r + 1e6, r, dtype=torch.float32, **kwargs)
    as_tensor = {**kwargs, argument: torch.full((1, 1, 2, 2), value, dtype=torch.float64)}
    with pytest.raises(ValueError, match=f"argument '{argument}': expected finite values >= 0"):
        compare_attention(r, r, dtype=torch.float32, **as_tensor)


def test_a_miss_on_an_exact_zero_reads_as_such_not_as_a_huge_multiple():
    r = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    text = compare_attention(r + 3.0, r, dtype=torch.float32, magnitude=1e-30).message()
    assert "over 10^4 x the tolerance: the reference is exactly 0 there" in text and "e+" not in text
    assert format_ratio(0.25) == "0.25" and format_ratio(37.4) == "37" and format_ratio(1.1e36) == ">1e4"


def test_reference_attention_is_the_battery_error_model_and_catches_a_bug():
    from attnformal.verify.cases import random_case, shape

    case = random_case("large", shape(1, 2, 2, 16, 40, 16), torch.float32, "cpu", 5, grad=False)
    q, k = 30 * case.q, 30 * case.k  # logits in the thousands
    ref = reference_attention(q, k, case.v, causal="bottom_right")
    assert set(ref.tolerance("out")) == {"dtype", "magnitude", "reference_error"}
    right = torch.nn.functional.scaled_dot_product_attention(q, k, case.v, attn_mask=ref_mask(q, k))
    assert_attention_close(right, ref.values["out"], **ref.tolerance("out"))
    with pytest.raises(AssertionError):  # the negative control: the other causal alignment
        wrong = torch.nn.functional.scaled_dot_product_attention(q, k, case.v, is_causal=True)
        assert_attention_close(wrong, ref.values["out"], **ref.tolerance("out"))


def ref_mask(q, k):
    from attnformal.spec import AttentionSpec

    return AttentionSpec.from_inputs(q, k, k, causal="bottom_right").allowed()


def test_an_all_nan_result_does_not_read_as_a_mean_difference_of_zero():
    r = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    message = compare_attention(torch.full_like(r, math.nan), r, dtype=torch.float32).message()
    assert "mean absolute / relative difference: undefined (every element is NaN/Inf)" in message
    assert "/ 0\n" not in message and "/ 0 " not in message
    half = r.clone()
    half[0, 0] = math.nan  # half NaN: the means are over the finite half, and say so
    message = compare_attention(half, r, dtype=torch.float32).message()
    assert "over the 32 finite elements" in message and "(32 NaN/Inf left out)" in message
