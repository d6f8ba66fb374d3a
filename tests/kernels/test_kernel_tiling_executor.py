"""A tiling class run as an implementation: the torch tiled loop with the tiling's own decisions.

Where the prover proves a tiling, the executor must equal the fp64 oracle; where it refutes one,
the executor must differ at the refuting shape (that is what the battery case reproduces).
"""

from __future__ import annotations

import pytest
import torch

from attnformal.masks import MaskGeometry
from attnformal.oracle import attention_oracle
from attnformal.tiling import OutOfBoundsRead
from attnformal.tilings import EXAMPLES
from attnformal.tilings.fa2 import FA2Forward
from attnformal.tilings.fa3 import FA3PackGQA, FA3TopLeftNBlockMax
from attnformal.tilings.flash_attn_triton import FlashAttnTritonAsBottomRight
from attnformal.tilings.triton_tutorial import TritonTutorialStages64x128

MASKS = {"dense": {}, "top_left": {"causal": "top_left"}, "bottom_right": {"causal": "bottom_right"},
         "window": {"window": (70, 9)}, "bottom_right+window_left": {"causal": "bottom_right", "window": (100, -1)}}
SHAPES = ((1, 1), (128, 128), (257, 130), (70, 300))  # (Sq, Sk): one query, square, ragged both ways


@pytest.fixture(autouse=True)
def one_thread():
    """Tiles this small cost more in thread start-up than they gain (2 shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def inputs(len_q, len_k, heads_q=1, heads_kv=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads_q, len_q, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, heads_kv, len_k, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v


def close_to_oracle(impl, q, k, v, **kwargs):
    out, lse = impl(q, k, v, return_lse=True, **kwargs)
    ref_out, ref_lse = attention_oracle(q, k, v, return_lse=True, **kwargs)
    return torch.allclose(out, ref_out, rtol=0, atol=1e-12) and torch.allclose(lse, ref_lse, rtol=0, atol=1e-12)


PROVED = [(cls, mask) for cls in EXAMPLES for mask in MASKS if mask in cls.masks
          and cls not in (TritonTutorialStages64x128, FlashAttnTritonAsBottomRight)
          and not (cls.__name__.startswith("FA2") and "window" == mask)]


@pytest.mark.parametrize("cls, mask", PROVED, ids=[f"{c.__name__}-{m}" for c, m in PROVED])
def test_a_proved_tiling_computes_the_spec(cls, mask):
    tiling, kwargs = cls(), MASKS[mask]
    accepted = [(len_q, len_k) for len_q, len_k in SHAPES
                if tiling.requires(MaskGeometry(len_q, len_k, kwargs.get("causal"), kwargs.get("window")))]
    assert accepted, "no shape the kernel accepts"
    for len_q, len_k in accepted:
        q, k, v = inputs(len_q, len_k, heads_q=tiling.qhead_per_kvhead)
        assert close_to_oracle(cls, q, k, v, **kwargs), (len_q, len_k)


def test_the_executor_is_differentiable():
    q, k, v = (t.requires_grad_() for t in inputs(40, 70, heads_q=6, heads_kv=2))
    FA3PackGQA(q, k, v, causal="bottom_right").square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention_oracle(q, k, v, causal="bottom_right").square().sum().backward()
    assert all(torch.allclose(a, t.grad, rtol=0, atol=1e-10) for a, t in zip(grads, (q, k, v)))


@pytest.mark.parametrize("cls, len_q, len_k, kwargs", [
    (FA3TopLeftNBlockMax, 1, 129, {"causal": "bottom_right"}),  # the prover's smallest counterexamples
    (FA2Forward, 130, 1, {"window": (0, -1)}),
    (FA2Forward, 68, 65, {"window": (65, 65)}),
    (FlashAttnTritonAsBottomRight, 1, 129, {"causal": "bottom_right"}),
])
def test_a_refuted_tiling_computes_a_wrong_answer_at_the_refuting_shape(cls, len_q, len_k, kwargs):
    assert not close_to_oracle(cls, *inputs(len_q, len_k), **kwargs)


def test_a_read_outside_the_keys_is_refused_by_the_executor():
    # in bounds is refuted for these stages (stage 1 loads whole 128-key tiles): the read itself shows
    with pytest.raises(OutOfBoundsRead, match=r"query block 1 reads keys \[64, 192\) outside \[0, 128\)"):
        TritonTutorialStages64x128(*inputs(128, 128), causal="top_left")


def test_what_a_tiling_does_not_declare_is_unsupported():
    q, k, v = inputs(8, 8)
    with pytest.raises(NotImplementedError, match="mask family 'top_left'"):
        FA2Forward(q, k, v, causal="top_left")
    with pytest.raises(NotImplementedError, match="no attn_mask"):
        FA2Forward(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="packs 3 query heads"):
        FA3PackGQA(*inputs(8, 8, heads_q=2, heads_kv=1))
