"""Packed variable-length batches (cu_seqlens_q/k): oracle against a hand-built dense mask, kernels
against the oracle in every dtype, forward and backward; validation; the index map."""

import itertools

import pytest
import torch

from attnformal.features import varlen
from attnformal.oracle import attention_oracle, forward_backward
from attnformal.schedule import TileSchedule
from attnformal.spec import AttentionSpec, SpecError
from kernel_checks import assert_matches, available_kernels

BLOCK = 16
# Sequences of length 0, 1, block-1, block, block+1 (queries and keys differ per sequence).
LEN_Q = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 5, 3]
LEN_K = [3, 0, BLOCK, BLOCK - 1, BLOCK + 1, 9, 1]
MASKS = {
    "none": {},
    "causal bottom-right": {"causal": "bottom_right"},
    "causal top-left": {"causal": "top_left"},
    "window": {"window": (4, 2)},
    "kv_lens + causal": {"kv_lens": [2, 0, 7, 15, 1, 9, 0], "causal": "bottom_right"},
    "chunk": {"chunk_size": 4},
    "prefix + causal": {"prefix_lens": [1, 0, 5, 0, 17, 3, 1], "causal": "bottom_right"},
}


def cumulative(lengths):
    return [0, *itertools.accumulate(lengths)]


def packed_problem(seed, dtype=torch.float64, heads_q=4, heads_kv=2, dim=8):
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(LEN_Q), sum(LEN_K)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return draw(tq, heads_q, dim), draw(tk, heads_kv, dim), draw(tk, heads_kv, dim), draw(tq, heads_q, dim)


def cu_keywords():
    return {"cu_seqlens_q": torch.tensor(cumulative(LEN_Q), dtype=torch.int32), "cu_seqlens_k": cumulative(LEN_K)}


def hand_allowed(mask):
    """Dense [Tq, Tk] mask written out here from the definitions: same sequence, and the family
    on that sequence's own positions (bottom-right offset len_k(b) - len_q(b))."""
    cq, ck = cumulative(LEN_Q), cumulative(LEN_K)
    allowed = torch.zeros(cq[-1], ck[-1], dtype=torch.bool)
    for b, (lq, lk) in enumerate(zip(LEN_Q, LEN_K)):
        keys = mask.get("kv_lens", LEN_K)[b]
        for i, j in itertools.product(range(lq), range(keys)):
            offset = keys - lq
            ok = {"bottom_right": j <= i + offset, "top_left": j <= i, None: True}[mask.get("causal")]
            if "window" in mask:
                left, right = mask["window"]
                ok = ok and i + offset - left <= j <= i + offset + right
            if "chunk_size" in mask:
                ok = ok and i + offset >= 0 and (i + offset) // mask["chunk_size"] == j // mask["chunk_size"]
            if "prefix_lens" in mask:
                ok = ok or j < mask["prefix_lens"][b]
            allowed[cq[b] + i, ck[b] + j] = ok
    return allowed


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_packed_oracle_is_the_dense_problem_under_the_block_diagonal_mask(mask):
    q, k, v, _ = packed_problem(seed=1)
    out, lse = attention_oracle(q, k, v, return_lse=True, **cu_keywords(), **MASKS[mask])
    allowed = hand_allowed(MASKS[mask])
    # The same tokens as one batch-1 padded problem with the hand-built mask (an independent path).
    dense = [t.transpose(0, 1)[None] for t in (q, k, v)]
    k_rep = dense[1].repeat_interleave(2, dim=1)
    ref_out, ref_lse = attention_oracle(dense[0], k_rep, dense[2].repeat_interleave(2, dim=1), return_lse=True,
                                        attn_mask=allowed.expand(1, 4, *allowed.shape))
    assert out.shape == (sum(LEN_Q), 4, 8) and lse.shape == (sum(LEN_Q), 4)
    torch.testing.assert_close(out, ref_out[0].transpose(0, 1), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse[0].transpose(0, 1), rtol=0, atol=1e-12)


def test_a_query_with_no_key_in_its_sequence_gives_zero_and_minus_infinity():
    q, k, v, _ = packed_problem(seed=2)
    out, lse = attention_oracle(q, k, v, return_lse=True, **cu_keywords())
    row = cumulative(LEN_Q)[1]  # sequence 1: one query, zero keys
    assert torch.all(out[row] == 0) and torch.all(lse[row] == float("-inf"))
    assert torch.all(torch.isfinite(lse[:row]))  # control: sequence 0's queries do see keys


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("kernel", sorted(available_kernels()))
def test_kernel_matches_the_oracle_forward_and_backward(kernel, mask, dtype):
    q, k, v, dout = packed_problem(seed=3, dtype=dtype)
    keywords = {**cu_keywords(), **MASKS[mask]}
    ref = forward_backward(attention_oracle, q.double(), k.double(), v.double(), dout.double(), **keywords)
    got = forward_backward(available_kernels()[kernel], q, k, v, dout,
                           schedule=TileSchedule(block_m=BLOCK, block_n=BLOCK), **keywords)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        if dtype == torch.float64:
            finite = torch.isfinite(b)
            assert torch.equal(torch.isfinite(a), finite), name
            assert (a[finite] - b[finite]).abs().max() <= 1e-12, name
        else:
            assert_matches(name, a, b, dtype)


def test_a_kernel_that_does_not_declare_packed_batches_refuses_them():
    from attnformal.kernels.ring import attention as ring

    q, k, v, _ = packed_problem(seed=4)
    with pytest.raises(NotImplementedError, match="cu_seqlens_q"):
        ring(q, k, v, **cu_keywords())


def test_sequence_b_is_the_unpacked_problem_with_its_own_geometry():
    q, k, v, _ = packed_problem(seed=5)
    spec = AttentionSpec.from_inputs(q, k, v, **cu_keywords(), causal="bottom_right", kv_lens=MASKS[
        "kv_lens + causal"]["kv_lens"])
    for b, (lq, lk) in enumerate(zip(LEN_Q, LEN_K)):
        one = spec.sequence(b)
        assert (one.batch, one.len_q, one.len_k, one.kv_lens) == (1, lq, lk, (spec.kv_lens[b],))
        assert one.geometry(0) == spec.geometry(b)
        assert spec.geometry(b).len_k == spec.kv_lens[b]


@pytest.mark.parametrize("cu", [[0], [0, 3], [0, 0, 0, 5, 5], [0, 2, 2, 7, 9]])
def test_the_index_map_is_a_bijection_onto_the_packed_rows(cu):
    rows = [varlen.packed_index(cu, b, i) for b in range(len(cu) - 1) for i in range(varlen.sequence_length(cu, b))]
    assert sorted(rows) == list(range(cu[-1]))


CQ, CK = cumulative(LEN_Q), cumulative(LEN_K)  # Tq = 57, Tk = 61, B = 7
BAD = [
    ("cu_seqlens_q", dict(cu_seqlens_q=[0, 1, 16, 15, 49, 54, 57, 57]), "non-decreasing"),
    ("cu_seqlens_q", dict(cu_seqlens_q=[1, *CQ[1:]]), "from 0"),
    ("cu_seqlens_q", dict(cu_seqlens_q=[*CQ[:-1], 56]), "to 57"),
    ("cu_seqlens_q", dict(cu_seqlens_q=[0]), "B \\+ 1 >= 2"),
    ("cu_seqlens_k", dict(cu_seqlens_k=[0, 61]), "8 ints"),
    ("cu_seqlens_k", dict(cu_seqlens_k=None), "cumulative lengths too"),
    ("cu_seqlens_q", dict(cu_seqlens_q=torch.tensor(CQ, dtype=torch.float32)), "int32"),
    ("kv_lens", dict(kv_lens=[3, 1, 0, 0, 0, 0, 0]), "sequence 1 has 0"),
    ("cu_seqlens_q", dict(attn_mask=torch.ones(7, 4, 57, 61, dtype=torch.bool)), "attn_mask has the padded shape"),
    ("cu_seqlens_q", dict(bias=torch.zeros(4, 1, 1, dtype=torch.float64)),
     r"bias has the padded shape \[B, Hq, Sq, Sk\]; a packed batch has none"),
]


@pytest.mark.parametrize("argument, change, expected", BAD, ids=[f"{a}-{e}" for a, _, e in BAD])
def test_bad_packed_call_is_one_error_naming_the_argument(argument, change, expected):
    q, k, v, _ = packed_problem(seed=6)
    keywords = {**cu_keywords(), **change}
    with pytest.raises(SpecError, match=expected) as caught:
        AttentionSpec.from_inputs(q, k, v, **keywords)
    assert caught.value.argument == argument


def test_sequence_b_takes_its_row_of_the_slopes_and_the_shared_sinks():
    q, k, v, _ = packed_problem(seed=8)
    sinks = torch.tensor([0.5, -1.0, 0.0, 2.0], dtype=torch.float64)
    slopes = torch.arange(28, dtype=torch.float64).reshape(7, 4)  # a different row per sequence
    spec = AttentionSpec.from_inputs(q, k, v, **cu_keywords(), sinks=sinks, alibi_slopes=slopes)
    for b in range(7):
        one = spec.sequence(b)
        assert one.sinks is sinks  # the caller's tensor in every sequence: autograd sums d sinks
        assert torch.equal(one.alibi_slopes, slopes[b:b + 1])
    shared = AttentionSpec.from_inputs(q, k, v, **cu_keywords(), alibi_slopes=slopes[3])  # [Hq]: every sequence's
    assert all(torch.equal(shared.sequence(b).alibi_slopes, slopes[3:4]) for b in range(7))


def test_packed_tensors_must_be_three_dimensional():
    q, k, v, _ = packed_problem(seed=7)
    with pytest.raises(SpecError, match=r"argument 'q': expected a 3-D tensor \[T, H, D\]"):
        AttentionSpec.from_inputs(q[None], k, v, **cu_keywords())
    AttentionSpec.from_inputs(q, k, v, **cu_keywords())  # control: the same call, packed, is accepted
