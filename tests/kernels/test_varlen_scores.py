"""Packed batches with sinks and ALiBi: both kernels against each sequence run unpacked through the oracle.

The expected values are built here without the packing code (no ``run_packed``, ``pack`` or
``spec.sequence``): each sequence is sliced from the packed tensors, run padded (batch 1) through the
fp64 oracle with its own row of the slopes and the shared sinks, and the results are concatenated; d
sinks is the sum of the sequences' own. Negative controls: a kernel whose sequences all read row 0
of the slopes (the bug ``Feature.sequence_value`` prevents), and one returning the last sequence's d
sinks only, both fail the same comparison.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from kernel_checks import available_kernels
from attnformal.features import alibi
from attnformal.features.base import Feature
from attnformal.kernels import torch_tiled
from attnformal.oracle import attention_oracle
from attnformal.schedule import TileSchedule

LEN_Q, LEN_K = [3, 0, 6, 2, 5], [4, 2, 5, 0, 7]  # empty query and key sequences, Sq != Sk
HEADS_Q, HEADS_KV, DIM = 4, 2, 8
SMALL = TileSchedule(block_m=4, block_n=4)  # several tiles per sequence
SCHEDULES = {"torch-tiled": SMALL, "triton-flash": TileSchedule(block_m=16, block_n=16)}  # Triton's smallest
NAMES = ("out", "lse", "dq", "dk", "dv", "dsinks")


def cumulative(lengths):
    return [0, *itertools.accumulate(lengths)]


def problem(seed=11):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    tq, tk = sum(LEN_Q), sum(LEN_K)
    return draw(tq, HEADS_Q, DIM), draw(tk, HEADS_KV, DIM), draw(tk, HEADS_KV, DIM), draw(tq, HEADS_Q, DIM)


SINKS = torch.tensor([0.5, -1.0, float("-inf"), 2.0], dtype=torch.float64)  # one head without a sink
ROWS = 2.0 ** -torch.arange(1, 1 + len(LEN_Q) * HEADS_Q, dtype=torch.float64).reshape(len(LEN_Q), HEADS_Q)
FEATURES = {  # every row of the [B, Hq] slopes different
    "sinks": {"sinks": SINKS},
    "alibi [Hq]": {"alibi_slopes": ROWS[2]},
    "alibi [B, Hq]": {"alibi_slopes": ROWS},
    "sinks + alibi [B, Hq]": {"sinks": SINKS, "alibi_slopes": ROWS},
}
MASKS = {"none": {}, "causal": {"causal": "bottom_right"}}


def run(impl, q, k, v, grad_out, **keywords):
    """``{name: value}`` of out, lse and the gradients of q, k, v and sinks (loss ``<dO, out>``)."""
    leaves = {name: t.detach().clone().requires_grad_(True) for name, t in (("q", q), ("k", k), ("v", v))}
    sinks = keywords.get("sinks")
    if sinks is not None:
        keywords = {**keywords, "sinks": sinks.detach().clone().requires_grad_(True)}
    out, lse = impl(leaves["q"], leaves["k"], leaves["v"], return_lse=True, **keywords)
    out.backward(grad_out)
    found = {"out": out.detach(), "lse": lse.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}
    if sinks is not None:
        found["dsinks"] = keywords["sinks"].grad
    return found


def sequences(q, k, v, grad_out):
    """Each sequence's q, k, v, dO sliced from the packed tensors into the padded layout ``[1, H, S, D]``."""
    cq, ck = cumulative(LEN_Q), cumulative(LEN_K)
    for b in range(len(LEN_Q)):
        queries, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        yield b, [t[rows].transpose(0, 1)[None] for t, rows in ((q, queries), (k, keys), (v, keys),
                                                               (grad_out, queries))]


def slopes_of(features, b):
    """Sequence ``b``'s slopes ``[Hq]``: its row of ``[B, Hq]`` slopes, or the ``[Hq]`` ones."""
    slopes = features.get("alibi_slopes")
    if slopes is None or slopes.dim() == 1:
        return slopes
    return slopes[b]


def expected(q, k, v, grad_out, features, mask, *, slopes=slopes_of, summed=True):
    """Every sequence through the oracle on its own, results concatenated; d sinks summed (or, with
    ``summed=False``, the last sequence's alone: a control)."""
    parts = []
    for b, one in sequences(q, k, v, grad_out):
        keywords = {**mask, **features, "alibi_slopes": slopes(features, b)}
        parts.append({name: value[0].transpose(0, 1) if value.dim() > 1 else value
                      for name, value in run(attention_oracle, *one, **keywords).items()})
    result = {name: torch.cat([p[name] for p in parts]) for name in NAMES[:5]}
    if "sinks" in features:
        result["dsinks"] = sum(p["dsinks"] for p in parts) if summed else parts[-1]["dsinks"]
    return result


def mismatches(got, want) -> list[str]:
    """The names whose values differ beyond 1e-12 (or whose infinities differ)."""
    wrong = []
    for name, value in want.items():
        finite = torch.isfinite(value)
        if not torch.equal(torch.isfinite(got[name]), finite) or not torch.equal(got[name][~finite],
                                                                                 value[~finite]):
            wrong.append(name)
        elif finite.any() and (got[name][finite] - value[finite]).abs().max() > 1e-12:
            wrong.append(name)
    return wrong


def packed_keywords(features, mask):
    return {"cu_seqlens_q": cumulative(LEN_Q), "cu_seqlens_k": cumulative(LEN_K), **mask, **features}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("features", list(FEATURES))
@pytest.mark.parametrize("kernel", sorted(available_kernels()))
def test_packed_sinks_and_alibi_are_each_sequence_alone(kernel, features, mask):
    q, k, v, grad_out = problem()
    got = run(available_kernels()[kernel], q, k, v, grad_out, schedule=SCHEDULES[kernel],
              **packed_keywords(FEATURES[features], MASKS[mask]))
    want = expected(q, k, v, grad_out, FEATURES[features], MASKS[mask])
    assert set(got) == set(want)
    assert mismatches(got, want) == []


def test_the_oracle_packed_is_each_sequence_alone():
    q, k, v, grad_out = problem()
    features = FEATURES["sinks + alibi [B, Hq]"]
    got = run(attention_oracle, q, k, v, grad_out, **packed_keywords(features, MASKS["causal"]))
    assert mismatches(got, expected(q, k, v, grad_out, features, MASKS["causal"])) == []


def test_a_kernel_whose_sequences_read_slopes_row_0_fails(monkeypatch):
    """Without ALiBi's ``sequence_value`` every batch-1 sequence indexes row 0 of the ``[B, Hq]`` slopes."""
    q, k, v, grad_out = problem()
    features, keywords = FEATURES["alibi [B, Hq]"], packed_keywords(FEATURES["alibi [B, Hq]"], {})
    want = expected(q, k, v, grad_out, features, {})
    assert mismatches(run(torch_tiled.attention, q, k, v, grad_out, schedule=SMALL, **keywords), want) == []
    monkeypatch.setattr(type(alibi.FEATURE), "sequence_value", Feature.sequence_value)
    broken = run(torch_tiled.attention, q, k, v, grad_out, schedule=SMALL, **keywords)
    assert {"out", "lse"} <= set(mismatches(broken, want))
    # The broken kernel is what row 0 for every sequence gives (so the comparison above names the bug).
    row0 = expected(q, k, v, grad_out, features, {}, slopes=lambda f, b: f["alibi_slopes"][0])
    assert mismatches(broken, row0) == []


def test_the_last_sequence_d_sinks_alone_fails_the_comparison():
    q, k, v, grad_out = problem()
    features = FEATURES["sinks"]
    got = run(torch_tiled.attention, q, k, v, grad_out, schedule=SMALL, **packed_keywords(features, {}))
    last_only = expected(q, k, v, grad_out, features, {}, summed=False)
    assert mismatches(got, last_only) == ["dsinks"]
