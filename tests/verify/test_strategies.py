"""Hypothesis strategies: composable, validated when built, and usable to fuzz a kernel."""

import functools

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from attnformal import strategies as attn
from attnformal.kernels.torch_tiled import attention
from attnformal.schedule import TileSchedule
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
    (lambda: attn.problems(packed="yes"), "problems(packed='yes'): expected a bool"),
    (lambda: attn.problems(sinks=torch.zeros(2)), "problems(sinks=...): expected True"),
    (lambda: attn.problems(sink=True), "problems(sink=...): no feature of that name"),
    (lambda: attn.masks(Shape(1, 1, 1, 4, 4, 8, 8), sinks=True), "masks(sinks=...): no mask feature"),
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


# ---- the score features and packed batches: drawn by their declarations, computed by the torch tiled kernel

SMALL = attn.shapes(batch=st.integers(1, 3), heads_kv=st.integers(1, 2), group=st.integers(1, 2),
                    len_q=st.integers(0, 12), len_k=st.integers(0, 12), head_dim=st.sampled_from([4, 8]))
TILED = functools.partial(attention, schedule=TileSchedule(block_m=4, block_n=4))  # several tiles a row and column
ASKED = {"sinks": {"sinks": True}, "alibi_slopes": {"alibi_slopes": True}, "bias": {"bias": True},
         "packed": {"packed": True, "attn_mask": False},  # an explicit mask has no packed shape: never packed
         "packed scores": {"packed": True, "attn_mask": False, "sinks": True, "alibi_slopes": True}}
FEW = settings(max_examples=15, derandomize=True, database=None, deadline=None,
               suppress_health_check=[HealthCheck.too_slow])
# Packed [B, Hq] slopes of several sequences are one draw in about six (slopes, 2-D, B > 1); how many of 50
# examples had them depended on the Hypothesis version (0 in one CI run): those draws are filtered for, and a
# strategy that could not draw them fails (Unsatisfiable) instead of passing on problems without them.
FILTERED = {"packed scores"}


def feature_problems(name, dtype=st.sampled_from([torch.float32, torch.bfloat16]), **narrowed):
    drawing = attn.problems(dtype=dtype, shapes=SMALL, values="normal", **{**ASKED[name], **narrowed})
    return drawing.filter(functools.partial(drawn, name)) if name in FILTERED else drawing


def drawn(name, problem) -> bool:
    if name == "packed scores":  # a packed batch with [B, Hq] slopes of several sequences
        slopes = problem.kwargs.get("alibi_slopes")
        return drawn("packed", problem) and slopes is not None and slopes.dim() == 2 and len(slopes) > 1
    keyword = "cu_seqlens_q" if name == "packed" else name
    return problem.kwargs.get(keyword) is not None


def assert_matches_reference(impl, problem, *, backward=True):
    """out, lse (with ``backward``: dQ, dK, dV, d sinks, d bias) of ``impl`` against the float64 reference's
    error model."""
    expected = problem.reference(backward=backward)
    observed = call(impl, as_case(problem), lse=True, backward=backward)
    for name, value in expected.values.items():
        assert_attention_close(observed.get(name), value, **expected.tolerance(name), name=name)


@pytest.mark.parametrize("name", ASKED)
def test_torch_tiled_matches_the_reference_on_each_drawn_feature(name):
    seen = []

    @FEW
    @given(feature_problems(name))
    def matches(problem):
        seen.append(drawn(name, problem))
        assert_matches_reference(TILED, problem)

    matches()
    assert sum(seen) >= 3, f"{name} was drawn in {sum(seen)} of {len(seen)} problems"


def ignoring(name):
    """A broken kernel: the torch tiled kernel with ``name`` left out of the call."""
    def kernel(q, k, v, **kwargs):
        kwargs.pop(name)
        return TILED(q, k, v, **kwargs)
    return kernel


def one_sequence(q, k, v, *, cu_seqlens_q, cu_seqlens_k, return_lse=False, **kwargs):
    """A broken kernel: a packed batch run as one sequence (each query reads every sequence's keys)."""
    def padded(t):
        return t.transpose(0, 1)[None]

    out, lse = TILED(padded(q), padded(k), padded(v), return_lse=True, **kwargs)
    out, lse = out[0].transpose(0, 1), lse[0].transpose(0, 1)
    return (out, lse) if return_lse else out


def slopes_row_0(q, k, v, *, alibi_slopes=None, **kwargs):
    """A broken kernel: every packed sequence reads row 0 of ``[B, Hq]`` ALiBi slopes."""
    if alibi_slopes is not None and alibi_slopes.dim() == 2:
        alibi_slopes = alibi_slopes[0]
    return TILED(q, k, v, alibi_slopes=alibi_slopes, **kwargs)


CONTROLS = {"sinks": (ignoring("sinks"), {}), "alibi_slopes": (ignoring("alibi_slopes"), {}),
            "bias": (ignoring("bias"), {}),
            "packed": (one_sequence, {"kv_lens": False, "prefix_lens": None}),  # per-batch values: one sequence
            "packed scores": (slopes_row_0, {})}


@pytest.mark.parametrize("name", ASKED)
def test_a_kernel_that_ignores_the_feature_fails_the_same_property(name):
    kernel, narrowed = CONTROLS[name]

    @settings(FEW, phases=[Phase.generate])  # no shrinking: the failure itself is the point
    @given(feature_problems(name, dtype=torch.float32, **narrowed))
    def matches(problem):
        # Forward: without the keyword the kernel has no gradient for sinks or bias, a contract error the
        # call reports before any comparison; the values must be what fails.
        if drawn(name, problem):
            assert_matches_reference(kernel, problem, backward=False)

    with pytest.raises(AssertionError, match="not close"):
        matches()


def forms(problem) -> set[str]:
    """What a drawn problem's score features and packing look like."""
    kw, found = problem.kwargs, set()
    if "sinks" in kw:
        found.add("sink -inf" if bool(torch.isinf(kw["sinks"]).any()) else "sinks finite")
    if "alibi_slopes" in kw:
        found.add(f"slopes {kw['alibi_slopes'].dim()}-D")
    if "bias" in kw:
        spec = problem.spec
        full = (spec.batch, spec.heads_q, spec.len_q, spec.len_k)
        found.add(f"bias {kw['bias'].dim()}-D")
        found.update(["bias broadcast [B, Hq, Sq, Sk]"] if kw["bias"].dim() == 4 and kw["bias"].shape != full else [])
    if "cu_seqlens_q" in kw:
        found.add(f"cu as {type(kw['cu_seqlens_k']).__name__}")
        found.update(f"packed with {name}" for name in ("sinks", "alibi_slopes") if name in kw)
        found.update(["an empty sequence"] if 0 in torch.as_tensor(kw["cu_seqlens_k"]).diff() else [])
    return found


def test_the_declarations_draw_every_form_of_their_values():
    seen = set()

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)  # no kernel: cheap
    @given(scores=attn.problems(shapes=SMALL, sinks=True, alibi_slopes=True, bias=True),
           packs=attn.problems(shapes=SMALL, attn_mask=False, packed=True, sinks=True, alibi_slopes=True))
    def draw(scores, packs):
        scores.spec, packs.spec  # valid protocol calls
        seen.update(forms(scores) | forms(packs))

    draw()
    expected = {"sink -inf", "sinks finite", "slopes 1-D", "slopes 2-D", *(f"bias {n}-D" for n in range(5)),
                "bias broadcast [B, Hq, Sq, Sk]", "cu as list", "cu as Tensor", "an empty sequence",
                "packed with sinks", "packed with alibi_slopes"}
    assert expected <= seen, f"never drawn: {sorted(expected - seen)}"
