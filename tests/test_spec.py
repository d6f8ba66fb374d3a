"""Validation: every bad call gets one error that names the argument and what was expected."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnformal.spec import AttentionSpec, SpecError, kv_head_of

q = torch.zeros(2, 4, 5, 8)
k = torch.zeros(2, 2, 7, 8)
v = torch.zeros(2, 2, 7, 3)

BAD_CALLS = [
    ("q", dict(q=q[0]), "a 4-D tensor"),
    ("q", dict(q=q.int()), "a floating dtype"),
    ("k", dict(k=k.double()), "the dtype of q"),
    ("k", dict(k=torch.zeros(2, 2, 7, 6)), "batch and head dim of q"),
    ("k", dict(k=torch.zeros(2, 3, 7, 8), v=torch.zeros(2, 3, 7, 3)), "divides Hq=4"),
    ("v", dict(v=torch.zeros(2, 2, 6, 3)), "as k"),
    ("v", dict(v=torch.zeros(2, 2, 7, 0)), "Dv>=1"),
    ("scale", dict(scale=math.nan), "a finite float"),
    ("scale", dict(scale="0.5"), "a finite float"),
    ("causal", dict(causal=True), "None, 'top_left' or 'bottom_right'"),
    ("causal", dict(causal="lower"), "None, 'top_left' or 'bottom_right'"),
    ("window", dict(window=(1,)), "a pair of ints"),
    ("window", dict(window=(1.5, 2)), "a pair of ints"),
    ("kv_lens", dict(kv_lens=[7]), "2 ints"),
    ("kv_lens", dict(kv_lens=[7, 8]), "lengths in [0, Sk=7]"),
    ("kv_lens", dict(kv_lens=[7, -1]), "lengths in [0, Sk=7]"),
    ("softcap", dict(softcap=0.0), "a finite float > 0"),
    ("dropout_p", dict(dropout_p=1.0), "a float in [0, 1)"),
    ("attn_mask", dict(attn_mask=torch.ones(5, 7)), "a bool tensor"),
    ("attn_mask", dict(attn_mask=torch.ones(3, 5, 7, dtype=torch.bool)), "broadcastable to [B, Hq, Sq, Sk]"),
    ("dropout_mask", dict(dropout_p=0.1, dropout_mask=torch.ones(2, 4, 5, 6, dtype=torch.bool)), "keep-mask of shape"),
    ("dropout_mask", dict(dropout_mask=torch.ones(2, 4, 5, 7, dtype=torch.bool)), "needs dropout_p > 0"),
    ("chunk_size", dict(chunk_size=0), "an int >= 1"),
    ("chunk_size", dict(chunk_size=2.0), "an int >= 1"),
    ("chunk_size", dict(chunk_size=True), "an int >= 1"),
    ("prefix_lens", dict(prefix_lens=[3], causal="top_left"), "2 ints"),
    ("prefix_lens", dict(prefix_lens=[3, 8], causal="top_left"), "lengths in [0, Sk=7]"),
    ("prefix_lens", dict(prefix_lens=[3, 2]), "a causal mode with it"),
    ("prefix_lens", dict(prefix_lens=[3, 2], causal="top_left", window=(2, 0)), "no window and no chunk_size"),
    ("prefix_lens", dict(prefix_lens=[3, 2], causal="bottom_right", chunk_size=4), "no window and no chunk_size"),
]


@pytest.mark.parametrize("argument,change,expected", BAD_CALLS, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD_CALLS)])
def test_bad_input_names_the_argument(argument, change, expected):
    call = dict(q=q, k=k, v=v) | change
    with pytest.raises(SpecError) as err:
        AttentionSpec.from_inputs(call.pop("q"), call.pop("k"), call.pop("v"), **call)
    assert err.value.argument == argument
    assert str(err.value).startswith(f"argument '{argument}': expected ")
    assert expected in str(err.value)


def test_valid_call_is_described_completely():
    mask = torch.rand(5, 7) > 0.5
    spec = AttentionSpec.from_inputs(q, k, v, causal="bottom_right", window=(3, -1), kv_lens=torch.tensor([7, 0]),
                                     softcap=30, attn_mask=mask)
    assert (spec.batch, spec.heads_q, spec.heads_kv, spec.len_q, spec.len_k) == (2, 4, 2, 5, 7)
    assert (spec.head_dim, spec.head_dim_v, spec.group) == (8, 3, 2)
    assert spec.scale == 1 / math.sqrt(8)
    assert spec.kv_lens == (7, 0) and spec.softcap == 30.0
    assert spec.attn_mask.shape == (2, 4, 5, 7)
    assert spec.geometry(1).len_k == 0 and spec.geometry(0).has_attn_mask
    doc = json.loads(json.dumps(spec.to_json()))
    assert doc["window"] == [3, -1] and doc["has_attn_mask"] and not doc["has_dropout_mask"]


def test_allowed_is_per_batch_and_masked():
    mask = torch.zeros(2, 1, 5, 7, dtype=torch.bool)
    mask[0, 0, 4, 6] = True
    spec = AttentionSpec.from_inputs(q, k, v, kv_lens=[7, 3], attn_mask=mask)
    allowed = spec.allowed()
    assert allowed.shape == (2, 4, 5, 7)
    assert allowed.sum() == 4 and allowed[0, :, 4, 6].all()  # one pair, every head of batch 0
    unmasked = AttentionSpec.from_inputs(q, k, v, kv_lens=[7, 3]).allowed()
    assert unmasked[1, :, :, 3:].sum() == 0 and unmasked[1, :, :, :3].all() and unmasked[0].all()


@pytest.mark.parametrize("heads_q,heads_kv", [(8, 8), (8, 2), (8, 1), (6, 3)])
def test_gqa_map_gives_each_kv_head_one_contiguous_group(heads_q, heads_kv):
    owners = [kv_head_of(h, heads_q, heads_kv) for h in range(heads_q)]
    group = heads_q // heads_kv
    assert owners == [h for h in range(heads_kv) for _ in range(group)]
    # The same map as torch.repeat_interleave, which "explicitly repeat K/V" references use.
    assert torch.equal(torch.arange(heads_kv).repeat_interleave(group), torch.tensor(owners))
