"""The torch tiled executor against the fp64 oracle: outputs, lse and gradients, every feature."""

from __future__ import annotations

import pytest
import torch

from kernel_checks import assert_matches, make_problem
from attnformal import merge as merge_module
from attnformal.kernels import split_kv, torch_tiled
from attnformal.oracle import attention_oracle, forward_backward
from attnformal.schedule import FULL, TileSchedule
from attnformal.spec import SpecError

SMALL = TileSchedule(block_m=16, block_n=16)


def check(*, seed=0, schedule=SMALL, dtype=torch.float64, shape=(2, 4, 2, 37, 53, 8, None), **kwargs):
    batch, heads_q, heads_kv, len_q, len_k, dim, dim_v = shape
    q, k, v, grad_out = make_problem(seed=seed, batch=batch, heads_q=heads_q, heads_kv=heads_kv, len_q=len_q,
                                     len_k=len_k, head_dim=dim, head_dim_v=dim_v, dtype=dtype)
    kwargs = {key: value(batch, heads_q, len_q, len_k) if callable(value) else value
              for key, value in kwargs.items()}
    ref = forward_backward(attention_oracle, q, k, v, grad_out, **kwargs)
    got = forward_backward(lambda *t, **kw: torch_tiled.attention(*t, schedule=schedule, **kw),
                           q, k, v, grad_out, **kwargs)
    for name, a, r in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        assert a.dtype == (torch.float32 if name == "lse" and dtype != torch.float64 else dtype)
        assert_matches(name, a, r, dtype)


def random_mask(density, seed=1):
    def build(batch, heads_q, len_q, len_k):
        gen = torch.Generator().manual_seed(seed)
        return torch.rand(batch, 1, len_q, len_k, generator=gen) < density
    return build


MASKS = {
    "dense": {},
    "top_left": dict(causal="top_left"),
    "bottom_right": dict(causal="bottom_right"),
    "window": dict(window=(5, 3)),
    "window_left_only": dict(window=(7, -1)),
    "window_right_only": dict(window=(-1, 0)),
    "bottom_right+window": dict(causal="bottom_right", window=(9, 0)),
    "top_left+window": dict(causal="top_left", window=(4, 4)),
    "kv_lens": dict(kv_lens=lambda batch, heads_q, len_q, len_k: [len_k, 17]),
    "kv_lens_zero": dict(kv_lens=lambda batch, heads_q, len_q, len_k: [0, len_k - 3], causal="bottom_right"),
    "attn_mask": dict(attn_mask=random_mask(0.6)),
    "attn_mask_sparse+causal": dict(attn_mask=random_mask(0.1), causal="top_left"),
    "chunk": dict(chunk_size=16),  # chunk edges on the tile edges
    "chunk_odd+causal": dict(chunk_size=7, causal="bottom_right"),
    "chunk+window+kv_lens": dict(chunk_size=11, window=(4, 3),
                                 kv_lens=lambda batch, heads_q, len_q, len_k: [len_k, 20]),
    "prefix+top_left": dict(prefix_lens=lambda batch, heads_q, len_q, len_k: [0, 20], causal="top_left"),
    "prefix+bottom_right+kv_lens": dict(prefix_lens=lambda batch, heads_q, len_q, len_k: [len_k, 17],
                                        causal="bottom_right",
                                        kv_lens=lambda batch, heads_q, len_q, len_k: [30, len_k]),
    "everything": dict(causal="bottom_right", window=(20, 2), kv_lens=lambda batch, heads_q, len_q, len_k: [30, len_k],
                       attn_mask=random_mask(0.8)),
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("lengths", [(37, 53), (53, 37)], ids=["Sq<Sk", "Sq>Sk"])
def test_every_mask_family(mask, lengths):
    check(shape=(2, 4, 2, *lengths, 8, None), **MASKS[mask])


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 31, 32, 33])
@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_lengths_around_block_multiples(length, causal):
    check(shape=(1, 2, 1, length, length, 8, None), causal=causal)
    check(shape=(1, 2, 1, length, 17, 8, None), causal=causal)


@pytest.mark.parametrize("dims", [(59, 59), (111, 7), (4, 32)])
def test_odd_head_dims_and_dv_not_d(dims):
    check(shape=(1, 2, 2, 19, 23, *dims), causal="top_left")


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1), (6, 3)], ids=["MHA", "GQA", "MQA", "GQA3"])
def test_gqa_and_mqa(heads):
    check(shape=(2, *heads, 21, 21, 8, None), causal="bottom_right")


def test_softcap_and_dropout_replay():
    check(softcap=3.0, causal="top_left")
    keep = lambda batch, heads_q, len_q, len_k: torch.rand(  # noqa: E731
        batch, heads_q, len_q, len_k, generator=torch.Generator().manual_seed(5)) > 0.3
    check(dropout_p=0.3, dropout_mask=keep, window=(10, 10))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", ["dense", "bottom_right+window", "kv_lens_zero", "chunk_odd+causal",
                                  "prefix+bottom_right+kv_lens"])
def test_lower_precision_inputs(dtype, mask):
    check(dtype=dtype, **MASKS[mask])


@pytest.mark.parametrize("schedule", [TileSchedule(1, 1), TileSchedule(3, 5), TileSchedule(16, 32),
                                      TileSchedule(32, 16), TileSchedule(64, 64), TileSchedule(16, 8, num_splits=3),
                                      TileSchedule(128, 128, num_splits=2)], ids=str)
def test_every_block_size_gives_correct_results(schedule):
    check(schedule=schedule, shape=(1, 2, 1, 23, 29, 4, None), causal="bottom_right", window=(11, 1),
          kv_lens=None)


def count_merges(monkeypatch, schedule):
    calls = []
    monkeypatch.setattr(split_kv, "merge",  # the fold the kernel calls (one part: combine merges nothing)
                        lambda a, b: calls.append(1) or merge_module.merge(a, b))
    q, k, v, _ = make_problem(seed=0, len_q=64, len_k=64)
    torch_tiled.attention(q, k, v, causal="top_left", schedule=schedule)
    return len(calls)


def test_the_kernel_reads_the_schedule(monkeypatch):
    # 4 x 4 tiles of 16, causal: 10 non-skip tiles; 2 x 2 tiles of 32: 3. The kernel visits exactly those.
    assert count_merges(monkeypatch, TileSchedule(16, 16)) == 10
    assert count_merges(monkeypatch, TileSchedule(32, 32)) == 3


def test_a_wrong_tile_class_changes_the_output(monkeypatch):
    # Negative control: if the schedule calls every tile FULL, the diagonal tiles go unmasked.
    q, k, v, _ = make_problem(seed=0, len_q=32, len_k=32)
    right = torch_tiled.attention(q, k, v, causal="top_left", schedule=SMALL)
    monkeypatch.setattr(TileSchedule, "tile_class", lambda self, bm, bn, g: FULL)
    wrong = torch_tiled.attention(q, k, v, causal="top_left", schedule=SMALL)
    reference = attention_oracle(q, k, v, causal="top_left")
    torch.testing.assert_close(right, reference.to(right.dtype))
    assert not torch.allclose(wrong[:, :, :15], reference[:, :, :15])  # rows of the first diagonal tile


def test_lse_gradient_flows():
    q, k, v, _ = make_problem(seed=2, len_q=20, len_k=30)
    grads = []
    for impl in (attention_oracle, lambda *t, **kw: torch_tiled.attention(*t, schedule=SMALL, **kw)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = impl(*leaves, causal="bottom_right", return_lse=True)
        (out.sum() + torch.where(torch.isinf(lse), 0.0, lse).square().sum()).backward()
        grads.append([t.grad for t in leaves])
    for name, a, r in zip(("dq", "dk", "dv"), *grads):
        assert_matches(name, a, r, torch.float64)


def test_non_contiguous_inputs_and_grad_out():
    q, k, v, grad_out = make_problem(seed=3, len_q=24, len_k=24, head_dim=8)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, grad_out)]
    assert not any(t.is_contiguous() for t in views)
    ref = forward_backward(attention_oracle, q, k, v, grad_out, causal="top_left")
    got = forward_backward(lambda *t, **kw: torch_tiled.attention(*t, schedule=SMALL, **kw), *views,
                           causal="top_left")
    for name, a, r in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        assert_matches(name, a, r, torch.float64)


def test_bad_input_is_reported_by_argument():
    q, k, v, _ = make_problem(seed=0)
    with pytest.raises(SpecError, match="argument 'window'"):
        torch_tiled.attention(q, k, v, window=3)
    with pytest.raises(NotImplementedError, match="dropout_mask"):
        torch_tiled.attention(q, k, v, dropout_p=0.1)
