"""Diagnosis pieces on hand-made evidence: each names its bug, and stays quiet on a correct result."""

import math

import pytest
import torch

from attnformal.oracle import attention_oracle
from attnformal.verify import diagnosis
from attnformal.verify.calls import Observed
from attnformal.verify.cases import random_case, shape
from attnformal.verify.reference import expected_for
from attnformal.verify.runner import CheckResult


def case_of(sh, **kwargs):
    return random_case("diagnosis", sh, torch.float64, "cpu", 7, **kwargs)


def probabilities(case, **override):
    eye = torch.eye(case.spec.len_k, dtype=torch.float64).expand(case.spec.batch, case.spec.heads_kv, -1, -1)
    return attention_oracle(case.q, case.k, eye, **{**case.kwargs, **override})


def test_ranges_are_compact():
    assert diagnosis._ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_support_of_the_right_mask_gives_no_finding():
    case = case_of(shape(2, 2, 2, 20, 30, 8), causal="bottom_right", window=(6, 2), kv_lens=[30, 11])
    assert diagnosis.support_findings(probabilities(case), case) == ([], [])


def test_support_one_key_past_the_diagonal_is_a_causal_off_by_one():
    case = case_of(shape(1, 2, 2, 12, 20, 8), causal="bottom_right")
    shifted = probabilities(case, causal=None, window=(-1, 1))  # j <= i + offset + 1
    _, found = diagnosis.support_findings(shifted, case)
    assert [f.bug for f in found] == ["causal_off_by_one"]


def test_support_of_the_other_alignment_is_named():
    case = case_of(shape(1, 2, 2, 12, 20, 8), causal="bottom_right")
    _, found = diagnosis.support_findings(probabilities(case, causal="top_left"), case)
    assert [f.bug for f in found] == ["causal_alignment"]


def test_support_one_key_wider_on_the_left_is_a_window_off_by_one():
    case = case_of(shape(1, 2, 2, 16, 16, 8), window=(3, 0))
    _, found = diagnosis.support_findings(probabilities(case, window=(4, 0)), case)
    assert [f.bug for f in found] == ["window_off_by_one"]


def test_constant_factors_are_named_and_other_errors_are_not():
    case = case_of(shape(1, 2, 2, 8, 8, 8), scale=0.25)
    r = torch.randn(1, 2, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert diagnosis.factor_finding("lse", r / math.log(2), r, case).bug == "lse_base2"
    assert diagnosis.factor_finding("dq", r * 4, r, case).evidence.endswith("(= 1/scale)")
    assert diagnosis.factor_finding("dq", r * 1.001, r, case) is None  # within 2%: not a factor bug
    assert diagnosis.factor_finding("dq", r + 1, r, case) is None  # not proportional


def test_localise_recognises_the_gqa_modulo_heads():
    case = case_of(shape(1, 4, 2, 6, 6, 8))
    over = torch.zeros(1, 4, 6, 8, dtype=torch.bool)
    over[:, [1, 2]] = True  # the heads where h % 2 differs from h // 2
    text, found = diagnosis.localise("out", over, case, expected_for(case, backward=False))
    assert "heads [1-2] of 4" in text and [f.bug for f in found] == ["gqa_head_mapping"]


def test_mutants_explain_a_gqa_modulo_result_and_not_a_correct_one():
    case = case_of(shape(2, 4, 2, 6, 9, 8))
    modulo = torch.arange(4) % 2
    wrong = attention_oracle(case.q, case.k[:, modulo], case.v[:, modulo])
    failing = {"out": float((wrong - attention_oracle(case.q, case.k, case.v)).abs().max())}
    found = diagnosis.mutant_findings(case, Observed(wrong), failing, backward=False)
    assert "gqa_head_mapping" in [f.bug for f in found]
    right = Observed(attention_oracle(case.q, case.k, case.v))
    assert diagnosis.mutant_findings(case, right, {"out": 1e-3}, backward=False) == []


def test_summary_ranks_definitive_over_strong_and_then_by_agreement():
    def failed(*findings):
        return CheckResult("c", "float32", "FAIL", findings=[diagnosis.finding(*f) for f in findings])

    ranked = diagnosis.summarise([
        failed(("mask_wrong", diagnosis.STRONG, "a"), ("nondeterminism", diagnosis.DEFINITIVE, "b")),
        failed(("mask_wrong", diagnosis.STRONG, "c")),
        CheckResult("d", "float32", "pass", findings=[diagnosis.finding("lse_base2", diagnosis.DEFINITIVE, "e")]),
    ])
    assert [r.bug for r in ranked] == ["nondeterminism", "mask_wrong"]


def test_localise_names_the_kv_heads_of_a_gqa_gradient_and_no_single_head():
    """dK of KV head 0 holds query heads 0 and 1: 'only head 0 fails' there would contradict 'only head 1' of out."""
    case = case_of(shape(1, 4, 2, 6, 6, 8))
    over = torch.zeros(1, 2, 6, 8, dtype=torch.bool)
    over[:, 0] = True
    text, found = diagnosis.localise("dk", over, case, expected_for(case, backward=True))
    assert "KV heads [0] of 2" in text and found == []
    out_over = torch.zeros(1, 4, 6, 8, dtype=torch.bool)
    out_over[:, 1] = True
    _, found = diagnosis.localise("out", out_over, case, expected_for(case, backward=False))
    assert [f.evidence for f in found] == ["only head 1 fails, in every batch"]


def test_float64_computed_in_float32_is_no_gradient_bug():
    """Finite differences at a float64 step would measure float32 rounding noise: the check notices the
    precision and uses a float32 step, and names no gradient bug."""
    import zoo
    from attnformal.verify import Settings, run_battery

    def float32_inside(q, k, v, **kwargs):
        return zoo.attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)

    report = run_battery(Settings(impl=float32_inside, impl_name="fp32 inside", dtypes=(torch.float32,),
                                  only=("bwd.finite_difference",)))
    (result,) = report.results
    assert result.status == "pass" and not result.findings
    assert any("computed in lower precision" in d for d in result.details)


def test_an_implementation_that_does_not_take_a_feature_keyword_is_unsupported_not_broken():
    """Written before sinks existed, a kernel rejects the keyword with TypeError: the case is unsupported.
    Any other TypeError stays a broken contract (the negative control)."""
    from attnformal.verify.calls import ContractError, Unsupported, call

    case = random_case("sinks", shape(1, 2, 2, 4, 5, 8), torch.float32, "cpu", 0,
                       sinks=torch.zeros(2, dtype=torch.float32))

    def old_kernel(q, k, v, *, return_lse=False, causal=None):
        return q

    def typo_kernel(q, k, v, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    with pytest.raises(Unsupported, match="takes no keyword 'sinks'"):
        call(old_kernel, case)
    with pytest.raises(ContractError, match="raised TypeError: unsupported operand"):
        call(typo_kernel, case)


# -- naming causes before symptoms (issue 25)

def _failed(label, *findings):
    return CheckResult(label, "float32", "FAIL", findings=[diagnosis.finding(*f) for f in findings])


def test_a_batch_offset_explains_the_nondeterminism_and_mask_findings_of_its_checks():
    """The Triton tutorial's batch offset: batches >= 1 never written. In the checks where the batch pattern is
    found, the race and the wrong mask it causes are its symptoms, and it explains the most checks."""
    ranked = diagnosis.summarise([
        _failed("repeat", ("nondeterminism", diagnosis.DEFINITIVE, "calls differ"),
                ("batch_indexing", diagnosis.STRONG, "batch 1 never written")),
        _failed("probabilities", ("mask_wrong", diagnosis.PATTERN, "masked keys"),
                ("batch_indexing", diagnosis.PATTERN, "all but batch 0")),
        _failed("lengths", ("batch_indexing", diagnosis.PATTERN, "all but batch 0")),
        _failed("bwd", ("backward_wrong", diagnosis.HINT, "forward right"),
                ("batch_indexing", diagnosis.PATTERN, "all but batch 0")),
    ])
    assert [r.bug for r in ranked] == ["batch_indexing", "backward_wrong"]  # backward_wrong: its forward was right
    assert ranked[0].checks == ["repeat[float32]", "probabilities[float32]", "lengths[float32]", "bwd[float32]"]


def test_a_symptom_class_alone_still_counts_and_a_specific_class_explains_it():
    ranked = diagnosis.summarise([_failed("a", ("mask_wrong", diagnosis.PATTERN, "x")),
                                  _failed("b", ("mask_wrong", diagnosis.PATTERN, "y"),
                                          ("causal_off_by_one", diagnosis.STRONG, "z"))])
    assert [(r.bug, r.checks) for r in ranked] == [("causal_off_by_one", ["b[float32]"]),
                                                   ("mask_wrong", ["a[float32]"])]


def _over_batches(case, failing_rows):
    """``over`` for ``out``: every element of the given (batch, rows) pairs fails."""
    s = case.spec
    over = torch.zeros(s.batch, s.heads_q, s.len_q, s.head_dim_v, dtype=torch.bool)
    for b, rows in failing_rows.items():
        over[b, :, rows] = True
    return over


def _batch_bugs(case, over):
    _, found = diagnosis.localise("out", over, case, expected_for(case, backward=False))
    return [f.bug for f in found if f.bug == "batch_indexing"]


def test_all_but_batch_zero_is_a_batch_pattern_only_when_nothing_else_sets_batch_zero_apart():
    plain = case_of(shape(3, 2, 2, 10, 12, 8))
    assert _batch_bugs(plain, _over_batches(plain, {1: slice(None), 2: slice(None)})) == ["batch_indexing"]
    # a few rows that happen to sit in batches 1 and 2: a coincidence
    assert _batch_bugs(plain, _over_batches(plain, {1: [3], 2: [4]})) == []
    # batch 0 has kv_lens = Sk and the others not: the key length explains it
    lengths = case_of(shape(3, 2, 2, 10, 12, 8), kv_lens=[12, 5, 7])
    assert _batch_bugs(lengths, _over_batches(lengths, {1: slice(None), 2: slice(None)})) == []
    # batch 0 has no key: right by doing nothing
    keyless = case_of(shape(3, 2, 2, 10, 12, 8), kv_lens=[0, 5, 0])
    assert _batch_bugs(keyless, _over_batches(keyless, {1: slice(None), 2: slice(None)})) == []


def test_rotating_the_batches_confirms_or_refutes_a_batch_pattern():
    assert diagnosis.rotation_finding([1, 2], [1, 2], 3).bug == "batch_indexing"  # stays with the index
    assert diagnosis.rotation_finding([1, 2], [0, 1], 3).bug is None  # follows the data
    rotated = diagnosis.rotated_batches(case_of(shape(3, 2, 2, 4, 6, 8), kv_lens=[6, 2, 4]))
    assert rotated.kwargs["kv_lens"] == [2, 4, 6]


def test_a_uniformly_scaled_output_is_named_and_its_gradients_inherit_the_factor():
    case = case_of(shape(1, 2, 2, 8, 8, 8))
    r = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = diagnosis.factor_finding("out", r * 1.02, r, case)
    assert out.bug == "output_scaled" and "1.02" in out.evidence
    assert diagnosis.factor_finding("dq", r * 1.02, r, case, out_factor=1.02).bug == "output_scaled"
    assert diagnosis.factor_finding("dq", r * 4, r, case, out_factor=1.02).bug == "gradient_scale"
    assert diagnosis.factor_finding("out", r + 0.02, r, case) is None  # not proportional: no factor


def test_a_wrong_dtype_is_named_as_such():
    case = case_of(shape(1, 2, 2, 4, 4, 8))
    bug, weight, text = diagnosis.contract_finding("out has dtype torch.float32, expected torch.bfloat16", case)
    assert (bug, weight) == ("dtype_wrong", diagnosis.DEFINITIVE)
    assert text.startswith("wrong dtype: expected bfloat16, got float32")
    assert diagnosis.contract_finding("out has shape [1], expected [2]", case)[0] == "contract"


def test_nan_everywhere_is_named_but_nan_on_large_scores_is_left_to_the_overflow_checks():
    case = case_of(shape(1, 2, 2, 6, 9, 8))
    expected = expected_for(case, backward=False)
    nan = torch.full_like(expected.values["out"], math.nan)
    assert diagnosis.nan_output_finding(nan, expected, case).bug == "nan_output"
    assert diagnosis.nan_output_finding(expected.values["out"], expected, case) is None
    loud = case.with_(q=case.q * 100)
    assert diagnosis.nan_output_finding(nan, expected_for(loud, backward=False), loud) is None


def test_an_ignored_keyword_is_named_by_its_mutant_and_a_right_result_by_none():
    case = case_of(shape(2, 2, 2, 12, 20, 8), window=(3, 1), softcap=4.0)
    no_window = attention_oracle(case.q, case.k, case.v, softcap=4.0)
    failing = {"out": float((no_window - attention_oracle(case.q, case.k, case.v, **case.kwargs)).abs().max())}
    found = diagnosis.mutant_findings(case, Observed(no_window), failing, backward=False)
    assert [f.evidence for f in found if f.bug == "keyword_ignored"] == [
        "the result matches a problem where window was ignored"]
    right = Observed(attention_oracle(case.q, case.k, case.v, **case.kwargs))
    assert diagnosis.mutant_findings(case, right, {"out": 1e-3}, backward=False) == []
