"""Hypothesis strategies: composable, validated when built, and usable to fuzz a kernel."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from attnformal import strategies as attn
from attnformal.kernels.torch_tiled import attention
from attnformal.testing import assert_attention_close
from attnformal.verify.calls import call
from attnformal.verify.cases import Case, Shape
from attnformal.verify.reference import expected_for


def as_case(problem):
    return Case("hypothesis", problem.q, problem.k, problem.v, problem.kwargs, problem.grad_out, problem.seed)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attn.problems(dtype=st.sampled_from([torch.float32, torch.bfloat16]), values=st.sampled_from(attn.VALUE_KINDS),
                     dropout_p=st.sampled_from([0.0, 0.3])))
def test_torch_tiled_matches_the_reference_on_any_problem(problem):
    case = as_case(problem)
    expected = expected_for(case, backward=True, use_certified=False)
    observed = call(attention, case, lse=True, backward=True)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert_attention_close(observed.get(name), expected.values[name], **expected.tolerance(name), name=name)


@given(attn.shapes(batch=2, group=st.just(3), len_q=0))
def test_values_and_strategies_compose(sh):
    assert sh.batch == 2 and sh.heads_q == 3 * sh.heads_kv and sh.len_q == 0 and sh.head_dim_v == sh.head_dim


@given(attn.problems(causal="bottom_right", window=(4, 0), kv_lens=True, attn_mask=False, softcap=None))
def test_fixed_mask_arguments_are_passed_through(problem):
    kw = problem.kwargs
    assert kw["causal"] == "bottom_right" and kw["window"] == (4, 0) and len(kw["kv_lens"]) == problem.q.shape[0]
    assert "attn_mask" not in kw and "softcap" not in kw
    problem.spec  # a valid protocol call


@pytest.mark.parametrize("build, message", [
    (lambda: attn.shapes(batch=0), "shapes(batch=0): expected an int >= 1"),
    (lambda: attn.shapes(len_k=-1), "for example len_k=st.integers(0, 64)"),
    (lambda: attn.windows(left=1.5), "windows(left=1.5): expected an int"),
    (lambda: attn.masks(Shape(1, 1, 1, 4, 4, 8, 8), causal="diagonal"), "masks(causal='diagonal')"),
    (lambda: attn.problems(values="huge"), "problems(values='huge'): expected one of"),
    (lambda: attn.problems(dropout_p=1.0), "expected a float in [0, 1)"),
    (lambda: attn.problems(shapes=Shape(1, 1, 1, 4, 4, 8, 8)), "expected a strategy of Shape"),
    (lambda: attn.problems(dtype=torch.int8), "problems(dtype=torch.int8)"),
])
def test_bad_arguments_fail_when_the_strategy_is_built(build, message):
    with pytest.raises(InvalidArgument) as err:
        build()
    assert message in str(err.value)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attn.problems(dtype=st.sampled_from([torch.float32, torch.bfloat16]), values="large"))
def test_the_documented_pattern_passes_a_correct_kernel_on_large_logits(problem):
    """The module docstring's test, verbatim: with the battery's error model, logits in the thousands raise no
    false alarm on a correct tiled kernel (a bare atol did: 1.87x the tolerance in fp32)."""
    ref = problem.reference()
    assert_attention_close(problem.call(attention), ref.values["out"], **ref.tolerance("out"))


def test_other_mask_features_are_drawn_only_when_asked_and_refused_combinations_dropped():
    from hypothesis import given, settings

    from attnformal import strategies as attn
    from attnformal.verify.cases import Shape

    sh = Shape(2, 2, 1, 9, 13, 4, 4)
    seen = []

    @settings(max_examples=30, database=None, derandomize=True)
    @given(plain=attn.masks(sh), chunked=attn.masks(sh, chunk_size=True),
           prefixed=attn.masks(sh, prefix_lens=True, causal="top_left", window=None),
           refused=attn.masks(sh, prefix_lens=[3, 4], causal=None))
    def draw(plain, chunked, prefixed, refused):
        assert not {"chunk_size", "prefix_lens"} & set(plain)
        assert "prefix_lens" not in refused, "a prefix without causal is dropped"
        seen.extend([*chunked, *prefixed])

    draw()
    assert {"chunk_size", "prefix_lens"} <= set(seen), "asked for, both are drawn"
