"""Coverage that adapts to the kernel: limited kernels still get a real run, and the report says what was left out."""

import functools

import torch

import zoo
from attnformal.verify import Settings, run_battery
from attnformal.verify.capabilities import Capabilities
from attnformal.verify.cases import shape
from attnformal.verify.report import render


def tutorial_like(q, k, v, *, causal=None, scale=None, return_lse=False, window=None, attn_mask=None, kv_lens=None,
                  softcap=None, dropout_p=0.0, dropout_mask=None, bug=None):
    """The Triton tutorial's limits: float16, Sq == Sk, lengths a multiple of 128, D in 16..256 and Dv = D,
    no GQA, no lse, plain or causal attention only."""
    if q.dtype != torch.float16:
        raise NotImplementedError("float16 only")
    if q.shape[2] != k.shape[2] or q.shape[2] % 128:
        raise NotImplementedError("Sq == Sk, a multiple of 128")
    if q.shape[3] not in (16, 32, 64, 128, 256) or v.shape[3] != q.shape[3] or q.shape[1] != k.shape[1]:
        raise NotImplementedError("head dims 16 ... 256, Dv = D, no GQA")
    if return_lse or dropout_p or any(x is not None for x in (window, attn_mask, kv_lens, softcap, dropout_mask)):
        raise NotImplementedError("plain or causal attention only")
    return zoo.attention(q, k, v, causal=causal, scale=scale, bug=bug)


def test_a_kernel_limited_like_the_triton_tutorial_gets_a_real_full_run():
    report = run_battery(Settings(impl=tutorial_like, impl_name="tutorial-like", dtypes=(torch.float16,),
                                  profile="full"))
    text = render(report)
    assert report.passed, text
    caps = report.capabilities["float16"]
    assert caps.square and caps.multiple_q == caps.multiple_k == 128 and {"gqa", "lse", "window"} <= set(caps.refused)
    assert report.coverage["run"] >= 30, text
    assert "not exercised: Sq < Sk, Sq > Sk, ragged lengths" in text and "WARNING: coverage is thin" in text
    assert "pass* " in text  # cells run on adapted cases are marked


def test_adapted_cases_still_catch_a_bug():
    """Negative control: the same limited kernel without rescaling its accumulator fails."""
    buggy = functools.partial(tutorial_like, bug="acc_not_rescaled")
    report = run_battery(Settings(impl=buggy, impl_name="tutorial-like, buggy", dtypes=(torch.float16,),
                                  only=("hand.*", "fwd.random")))
    assert not report.passed and report.diagnosis[0].bug == "acc_not_rescaled", render(report)


def without_gqa_or_bottom_right(q, k, v, *, causal=None, **kwargs):
    if q.shape[1] != k.shape[1] or causal == "bottom_right":
        raise NotImplementedError("no GQA, causal top-left only")
    return zoo.attention(q, k, v, causal=causal, **kwargs)


def test_generic_checks_do_not_need_gqa_or_bottom_right_causal():
    generic = ("fwd.noncontiguous", "bwd.noncontiguous", "bwd.key_sum", "bwd.finite_difference", "dropout.p0",
               "repeat.calls")
    report = run_battery(Settings(impl=without_gqa_or_bottom_right, impl_name="no gqa", dtypes=(torch.float32,),
                                  only=generic))
    assert report.passed and {r.check for r in report.results if r.status == "pass"} == set(generic), render(report)


def test_adaptation_keeps_the_point_of_a_case():
    caps = Capabilities("float16", square=True, multiple_q=128, multiple_k=128, refused={"gqa": "no"})
    mask = torch.rand(2, 4, 24, 300) < 0.5
    sh, kw, notes = caps.adapt(shape(2, 4, 2, 24, 300, 32), {"attn_mask": mask, "kv_lens": [300, 7]})
    assert sh == shape(2, 4, 4, 384, 384, 32) and set(notes) == {"MHA for GQA", "Sq = Sk",
                                                                 "lengths rounded up to a multiple of 128"}
    assert kw["attn_mask"].shape == (2, 4, 384, 384) and torch.equal(kw["attn_mask"][..., :24, :300], mask)
    # A single key rounded up to 128 would not be a single key any more: such a case stays as it is (refused).
    assert caps.adapt(shape(2, 2, 2, 5, 1, 16), {}, keep=("len_k",)) == (shape(2, 2, 2, 5, 1, 16), {}, ())
    # A long sequence made square keeps about the same number of scores.
    assert caps.adapt(shape(1, 2, 2, 64, 8209, 64), {})[0].len_k == 768


def test_the_feature_by_check_matrix_says_which_pairs_ran_with_lse_and_backward():
    """Each (feature, check) pair that ran, with the cases that judged lse and went through the backward: the
    new bwd.features takes chunk and prefix through both; a kernel refusing the backward leaves no B there."""
    from attnformal.verify.report import to_json

    checks = ("bwd.features", "mask.chunk")
    report = run_battery(Settings(impl=zoo.attention, impl_name="zoo", dtypes=(torch.float32,), only=checks))
    matrix = to_json(report)["coverage"]["matrix"]
    assert matrix["chunk_size"]["bwd.features"]["lse"] >= 1 and matrix["chunk_size"]["bwd.features"]["backward"] >= 1
    assert matrix["chunk_size"]["mask.chunk"]["backward"] == 0 and matrix["chunk_size"]["mask.chunk"]["cases"] >= 7
    assert {"prefix_lens", "alibi_slopes", "kv_lens"} <= set(matrix)
    assert "chunk_size" in render(report).split("feature x check")[1]

    def forward_only(q, k, v, **kwargs):
        if q.requires_grad:
            raise NotImplementedError("no backward")
        return zoo.attention(q, k, v, **kwargs)

    refused = run_battery(Settings(impl=forward_only, impl_name="forward only", dtypes=(torch.float32,), only=checks))
    matrix = to_json(refused)["coverage"]["matrix"]
    assert all(row["backward"] == 0 for rows in matrix.values() for row in rows.values())
    assert "never through the backward: " in render(refused)
