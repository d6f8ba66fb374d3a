"""The Triton kernel (kernels/triton_flash.py), run by Triton's CPU interpreter.

Three kinds of checks:

* the spec pieces restated in Triton (mask predicate, merge, GQA head map) against their
  Python definitions, through tiny probe kernels that call the very same ``@triton.jit``
  helpers the attention kernels call;
* forward and backward against the fp64 oracle over the feature matrix; each case is
  seeded by its position in ``FEATURES`` and named by its test id;
* that the kernels are driven by the schedule: every accepted block size is correct, and
  a schedule that lies (wrong tile classes, loop bounds) makes the output wrong.

The interpreter runs each tile operation through numpy, so shapes are small and blocks
are 16/32 wide: many tiles, ragged edges everywhere.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy
import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from kernel_checks import assert_matches, make_problem  # noqa: E402
from attnformal import SpecError  # noqa: E402
from attnformal.kernels import triton_flash  # noqa: E402
from attnformal.kernels.triton_flash import _first_query_head, _kv_head_of, _merge  # noqa: E402
from attnformal.masks import CAUSAL_MODES, MaskGeometry, may_attend  # noqa: E402
from attnformal.merge import SoftmaxState, merge  # noqa: E402
from attnformal.oracle import attention_oracle, forward_backward  # noqa: E402
from attnformal.schedule import FULL, PARTIAL, SKIP, TileSchedule  # noqa: E402
from attnformal.spec import AttentionSpec, kv_head_of  # noqa: E402

SMALL = TileSchedule(block_m=16, block_n=16)
OUTPUTS = ("out", "lse", "dq", "dk", "dv")


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------

def make_inputs(seed, *, batch=2, heads_q=1, heads_kv=1, len_q=37, len_k=29, head_dim=16, dtype=torch.float64,
                **shape):
    """kernel_checks' seeded problem, at a size the interpreter gets through quickly."""
    return make_problem(seed=seed, batch=batch, heads_q=heads_q, heads_kv=heads_kv, len_q=len_q, len_k=len_k,
                        head_dim=head_dim, dtype=dtype, **shape)


def make_spec(inputs, **kwargs):
    return AttentionSpec.from_inputs(*inputs[:3], **kwargs)


def kernel(schedule):
    def run(*args, **kwargs):
        return triton_flash.attention(*args, schedule=schedule, **kwargs)
    return run


def assert_matches_oracle(inputs, schedule=SMALL, **kwargs):
    """out, lse, dq, dk, dv of the kernel against the fp64 oracle on the same (rounded) inputs."""
    dtype = inputs[0].dtype
    got = forward_backward(kernel(schedule), *inputs, **kwargs)
    ref = forward_backward(attention_oracle, *inputs, **kwargs)
    for name, g, r in zip(OUTPUTS, got, ref):
        assert g.dtype == (torch.float32 if name == "lse" and dtype != torch.float64 else dtype), name
        assert_matches(name, g, r, dtype)
    return got


def max_error(inputs, schedule, **kwargs):
    """Largest |kernel - oracle| over out and the three gradients."""
    got = forward_backward(kernel(schedule), *inputs, **kwargs)
    ref = forward_backward(attention_oracle, *inputs, **kwargs)
    return max((g.double() - r).abs().max().item() for name, g, r in zip(OUTPUTS, got, ref) if name != "lse")


# ----------------------------------------------------------------------------------------
# The spec restated in Triton equals the spec
# ----------------------------------------------------------------------------------------

WINDOWS = (None, (0, 0), (3, -1), (-1, 2), (4, 7), (-3, -5), (0, -1), (2**40, 1), (1, 2**40), (2**40, 2**40))


def _kept_by_tables(spec, pad=2):
    """``[B, Sq, Sk + 2 pad]``: the keys ``j`` (from ``-pad``) each row keeps under the host's row tables."""
    lo, hi = triton_flash._row_interval_tables(spec)
    j = torch.arange(-pad, spec.len_k + pad)
    return (lo[..., None] <= j) & (j <= hi[..., None])


@pytest.mark.parametrize("causal", CAUSAL_MODES)
@pytest.mark.parametrize("len_q, len_k", [(0, 5), (1, 1), (7, 19), (19, 7), (33, 33), (1, 40), (40, 1)])
def test_row_interval_tables_equal_may_attend(len_q, len_k, causal):
    """The kernels keep ``lo <= j <= hi`` of the host's tables: on every (b, i, j), 2 keys past each edge,
    for each key length and window (huge bounds included: the tables stay inside int32)."""
    pad = 2
    i = torch.arange(len_q)[:, None]
    j = torch.arange(-pad, len_k + pad)[None, :]
    for window in WINDOWS:
        kv_lens = sorted({len_k, len_k // 2, 0})
        q, k, v, _ = make_inputs(43, batch=len(kv_lens), len_q=len_q, len_k=len_k)
        spec = make_spec((q, k, v), causal=causal, window=window, kv_lens=kv_lens)
        kept = _kept_by_tables(spec, pad)
        for b in range(spec.batch):
            expected = may_attend(i, j, spec.geometry(b))
            differ = torch.nonzero(kept[b] != expected)
            assert differ.numel() == 0, (f"kv_len={kv_lens[b]}, window={window}: the tables differ at "
                                         f"(i, j) = {[(int(a), int(c) - pad) for a, c in differ[:5]]}")


def test_row_table_comparison_can_fail():
    """Negative control: the tables of a top-left causal spec are not the bottom-right mask."""
    q, k, v, _ = make_inputs(44, len_q=7, len_k=19)
    kept = _kept_by_tables(make_spec((q, k, v), causal="top_left"), pad=0)
    i, j = torch.arange(7)[:, None], torch.arange(19)[None, :]
    assert (kept[0] != may_attend(i, j, MaskGeometry(7, 19, "bottom_right"))).any()


@triton.jit
def _merge_probe(MA, LA, ACCA, MB, LB, ACCB, M, L, ACC, ROWS: tl.constexpr, DV: tl.constexpr):
    r = tl.arange(0, ROWS)
    tile = r[:, None] * DV + tl.arange(0, DV)[None, :]
    m, l, acc = _merge(tl.load(MA + r), tl.load(LA + r), tl.load(ACCA + tile),
                       tl.load(MB + r), tl.load(LB + r), tl.load(ACCB + tile))
    tl.store(M + r, m)
    tl.store(L + r, l)
    tl.store(ACC + tile, acc)


def random_states(gen, rows, dv, dtype):
    """Two states per row: random, with about a quarter of each side empty (m = -inf, l = 0, acc = 0)."""
    def one():
        m = (8 * torch.randn(rows, generator=gen, dtype=torch.float64)).to(dtype)
        l = (1 + 20 * torch.rand(rows, generator=gen, dtype=torch.float64)).to(dtype)
        acc = torch.randn(rows, dv, generator=gen, dtype=torch.float64).to(dtype)
        empty = torch.rand(rows, generator=gen) < 0.25
        m[empty], l[empty], acc[empty] = float("-inf"), 0.0, 0.0
        return m, l, acc
    return one(), one()


def merged_by_kernel_and_spec(a, b):
    rows, dv = a[2].shape
    got = [torch.empty_like(t) for t in a]
    _merge_probe[(1,)](*a, *b, *got, ROWS=rows, DV=dv)
    ref = merge(SoftmaxState(a[0][:, None], a[1][:, None], a[2]), SoftmaxState(b[0][:, None], b[1][:, None], b[2]))
    return got, [ref.m[:, 0], ref.l[:, 0], ref.acc]


EXP_GAP_ULPS = 2  # the premise: the interpreter's exp (numpy's) and the spec's (torch's) differ by <= 2 ulp


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_in_kernel_merge_equals_spec_merge_up_to_exp(dtype):
    """The kernel's merge equals the spec's: bitwise where exp is exact, else within a derived bound.

    The interpreter's exp is numpy's and the spec's is torch's: two math libraries, each with its
    own vector code per CPU (torch's default/AVX2/AVX-512 paths, numpy's AVX-512 exp), so they are
    never assumed bitwise equal. If they differ by at most ``d`` ulp, alpha and beta differ by
    ``d eps`` relatively, and each side's two roundings add ``eps`` each, so
    ``|kernel - spec| <= (d + 2) eps (alpha |x_a| + beta |x_b|)``.
    """
    a, b = random_states(torch.Generator().manual_seed(1), 512, 16, dtype)
    both_empty = torch.isinf(torch.maximum(a[0], b[0]))
    one_empty = torch.isinf(a[0]) ^ torch.isinf(b[0])
    assert both_empty.any() and one_empty.any() and not (both_empty | one_empty).all(), "every kind of row occurs"
    got, ref = merged_by_kernel_and_spec(a, b)
    assert torch.equal(got[0], ref[0]), "m: not equal"
    exact_exp = torch.isinf(a[0]) | torch.isinf(b[0])  # alpha, beta in {0, 1}: exp exact in both libraries
    for name, g, r in zip(("l", "acc"), got[1:], ref[1:]):
        assert torch.equal(g[exact_exp], r[exact_exp]), f"{name}: differs where one side is empty"
    m = torch.maximum(a[0], b[0]).double()
    shift = torch.where(torch.isinf(m), 0.0, m)
    alpha, beta = (a[0].double() - shift).exp()[:, None], (b[0].double() - shift).exp()[:, None]
    eps = torch.finfo(dtype).eps
    for name, g, r, xa, xb in (("l", got[1], ref[1], a[1], b[1]), ("acc", got[2], ref[2], a[2], b[2])):
        g, r, xa, xb = (t.double().reshape(len(m), -1) for t in (g, r, xa, xb))
        excess = (g - r).abs() - (EXP_GAP_ULPS + 2) * eps * (alpha * xa.abs() + beta * xb.abs())
        assert (excess <= 0).all(), f"{name}: off by more than the exp gap at {torch.nonzero(excess > 0)[:5].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_exp_libraries_differ_by_at_most_the_premised_gap(dtype):
    """The premise of the merge test, on this machine's vector paths (arguments <= 0, as in the merge)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[dtype]
    x = -(10 * torch.randn(100_000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)).abs().to(dtype)
    ulps = (torch.exp(x).view(ints) - torch.from_numpy(numpy.exp(x.numpy())).view(ints)).abs()
    assert ulps.max() <= EXP_GAP_ULPS, f"exp libraries differ by {ulps.max()} ulp"


@triton.jit
def _head_map_probe(KV_OF, GROUP_OF, heads_q, group, HQ: tl.constexpr, GROUP: tl.constexpr, HKV: tl.constexpr):
    h = tl.arange(0, HQ)
    tl.store(KV_OF + h, _kv_head_of(h, group), mask=h < heads_q)
    kv_head = tl.arange(0, HKV)[:, None]
    g = tl.arange(0, GROUP)[None, :]
    tl.store(GROUP_OF + kv_head * GROUP + g, _first_query_head(kv_head, group) + g)


@pytest.mark.parametrize("heads_q, heads_kv", [(1, 1), (4, 4), (4, 2), (4, 1), (6, 3), (8, 2), (6, 1)])
def test_in_kernel_head_map_equals_kv_head_of(heads_q, heads_kv):
    """Forward and dQ map query head -> KV head; dK/dV enumerate each KV head's query heads."""
    group = heads_q // heads_kv
    hq, hkv, grp = (triton.next_power_of_2(n) for n in (heads_q, heads_kv, group))
    kv_of = torch.full((hq,), -1, dtype=torch.int32)
    group_of = torch.full((hkv, grp), -1, dtype=torch.int32)
    _head_map_probe[(1,)](kv_of, group_of, heads_q, group, HQ=hq, GROUP=grp, HKV=hkv)
    expected = kv_head_of(torch.arange(heads_q), heads_q, heads_kv)
    assert torch.equal(kv_of[:heads_q].long(), expected), f"{kv_of[:heads_q].tolist()} != {expected.tolist()}"
    members = group_of[:heads_kv, :group]
    assert sorted(members.flatten().tolist()) == list(range(heads_q)), "each query head once"
    for kv_head, heads in enumerate(members.long()):
        assert (kv_head_of(heads, heads_q, heads_kv) == kv_head).all(), f"KV head {kv_head}: {heads.tolist()}"


# ----------------------------------------------------------------------------------------
# Against the fp64 oracle
# ----------------------------------------------------------------------------------------

def _mask(seed, shape, p_true=0.7):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p_true


def _dropout(seed, shape, p=0.3):
    return dict(dropout_p=p, dropout_mask=_mask(seed, shape, 1 - p))


# (id, make_inputs overrides, protocol kwargs). Defaults: B=2, Hq=Hkv=1, Sq=37, Sk=29, D=16;
# the cases about heads (GQA, MQA, per-head masks and dropout) have several.
TWO_HEADS = {"heads_q": 2}
FEATURES = [
    ("plain", {}, {}),
    ("sq_gt_sk", {"len_q": 45, "len_k": 17}, {}),
    ("sq_lt_sk", {"len_q": 17, "len_k": 45}, {}),
    ("causal_top_left", {}, {"causal": "top_left"}),
    ("causal_bottom_right_sq_gt_sk", {}, {"causal": "bottom_right"}),  # leading rows see nothing
    ("causal_bottom_right_sq_lt_sk", {"len_q": 20, "len_k": 47}, {"causal": "bottom_right"}),
    ("window", {"len_q": 40, "len_k": 40}, {"window": (5, 3)}),
    ("window_left_only", {}, {"window": (6, -1)}),
    ("window_right_only", {}, {"window": (-1, 0)}),
    ("window_and_causal", {"len_q": 33, "len_k": 48}, {"window": (9, 4), "causal": "bottom_right"}),
    ("window_and_top_left", {"len_q": 48, "len_k": 33}, {"window": (-1, 20), "causal": "top_left"}),
    ("kv_lens", {}, {"kv_lens": [29, 11]}),
    ("kv_lens_zero", {}, {"kv_lens": [0, 17]}),
    ("kv_lens_causal_window", {"len_q": 24, "len_k": 40}, {"kv_lens": [40, 21], "causal": "bottom_right",
                                                           "window": (7, 2)}),
    ("mask_full", TWO_HEADS, {"attn_mask": _mask(10, (2, 2, 37, 29))}),
    ("mask_broadcast_heads", TWO_HEADS, {"attn_mask": _mask(11, (2, 1, 37, 29))}),
    ("mask_broadcast_rows", TWO_HEADS, {"attn_mask": _mask(12, (2, 1, 1, 29), 0.5)}),
    ("mask_and_causal", TWO_HEADS, {"attn_mask": _mask(13, (1, 2, 37, 29)), "causal": "top_left"}),
    ("gqa", {"heads_q": 4, "heads_kv": 2, "batch": 1}, {"causal": "bottom_right"}),
    ("mqa", {"heads_q": 3, "heads_kv": 1}, {"window": (8, 8)}),
    ("softcap", {}, {"softcap": 1.5}),
    ("softcap_causal_gqa", {"heads_q": 4, "heads_kv": 2, "batch": 1}, {"softcap": 0.7, "causal": "top_left"}),
    ("dropout", TWO_HEADS, _dropout(14, (2, 2, 37, 29))),
    ("dropout_mask_window", TWO_HEADS, {**_dropout(15, (2, 2, 37, 29), 0.5), "attn_mask": _mask(16, (2, 1, 37, 29)),
                                 "window": (10, 10)}),
    ("scale", {}, {"scale": 0.9}),
    ("dv_ne_d", {"head_dim": 16, "head_dim_v": 40}, {}),
    ("odd_head_dims", {"head_dim": 59, "head_dim_v": 111, "len_q": 19, "len_k": 21}, {"causal": "bottom_right"}),
    ("block_multiples", {"len_q": 32, "len_k": 48}, {"causal": "bottom_right"}),
    ("block_multiples_minus_one", {"len_q": 31, "len_k": 47}, {"window": (16, 0)}),
    ("block_multiples_plus_one", {"len_q": 33, "len_k": 49}, {"causal": "top_left"}),
    ("len_q_0", {"len_q": 0}, {}),
    ("len_k_0", {"len_k": 0}, {}),
    ("len_1", {"len_q": 1, "len_k": 1}, {}),
    ("len_q_1", {"len_q": 1, "len_k": 40}, {"causal": "bottom_right"}),
    ("len_k_1", {"len_q": 40, "len_k": 1}, {"causal": "top_left"}),
    # chunked local attention: chunk edges inside and across the 16-wide tiles, with the other masks
    ("chunk", {"len_q": 40, "len_k": 53}, {"chunk_size": 16}),
    ("chunk_odd_causal_kv_lens", {"len_q": 37, "len_k": 45}, {"chunk_size": 7, "causal": "bottom_right",
                                                              "kv_lens": [45, 20]}),
    ("chunk_window_mask", TWO_HEADS, {"chunk_size": 9, "window": (5, 2), "attn_mask": _mask(17, (2, 1, 37, 29))}),
    ("chunk_1", {}, {"chunk_size": 1}),
    # prefix-LM: prefix 0, inside the first tile, across tiles, = Sk; each batch element its own
    ("prefix_bottom_right", {"len_q": 40, "len_k": 53}, {"prefix_lens": [0, 53], "causal": "bottom_right"}),
    ("prefix_top_left_kv_lens", {"len_q": 45, "len_k": 37}, {"prefix_lens": [20, 9], "causal": "top_left",
                                                             "kv_lens": [30, 37]}),
    ("prefix_mask_gqa", {"heads_q": 4, "heads_kv": 2}, {"prefix_lens": [17, 5], "causal": "bottom_right",
                                                        "attn_mask": _mask(18, (2, 1, 37, 29))}),
]
# A representative subset for the lower precisions (the interpreter is slow).
LOW_PRECISION = ["plain", "kv_lens_causal_window", "softcap_causal_gqa", "dropout_mask_window", "odd_head_dims",
                 "chunk_odd_causal_kv_lens", "prefix_top_left_kv_lens"]


@pytest.mark.parametrize("seed, shape, kwargs", [pytest.param(seed, shape, kwargs, id=name)
                                                 for seed, (name, shape, kwargs) in enumerate(FEATURES)])
def test_fp64_matches_oracle(seed, shape, kwargs):
    assert_matches_oracle(make_inputs(seed, **shape), **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("seed, shape, kwargs", [pytest.param(seed, shape, kwargs, id=name)
                                                 for seed, (name, shape, kwargs) in enumerate(FEATURES)
                                                 if name in LOW_PRECISION])
def test_low_precision_matches_oracle(seed, shape, kwargs, dtype):
    assert_matches_oracle(make_inputs(seed, dtype=dtype, **shape), **kwargs)


def test_fully_masked_rows_give_zero_output_minus_inf_lse_and_zero_grads():
    q, k, v, do = make_inputs(20, **TWO_HEADS)
    mask = _mask(21, (2, 2, 37, 29))
    mask[:, :, 5:9] = False  # rows 5..8 see nothing
    out, lse, dq, _, _ = assert_matches_oracle((q, k, v, do), attn_mask=mask)
    assert (out[:, :, 5:9] == 0).all() and (lse[:, :, 5:9] == float("-inf")).all() and (dq[:, :, 5:9] == 0).all()
    assert torch.isfinite(lse[:, :, 9:]).all(), "the other rows are unaffected"


def test_gradient_through_lse():
    """``lse`` is an output too: its gradient folds into the backward (``D - dlse``)."""
    q, k, v, do = make_inputs(22)
    weights = torch.randn(2, 1, 37, generator=torch.Generator().manual_seed(23), dtype=torch.float64)

    def grads(impl):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = impl(*leaves, causal="bottom_right", return_lse=True)
        finite = torch.isfinite(lse)
        ((out * do).sum() + (torch.where(finite, lse, 0.0) * weights).sum()).backward()
        return [t.grad for t in leaves]

    for name, g, r in zip(("dq", "dk", "dv"), grads(kernel(SMALL)), grads(attention_oracle)):
        assert_matches(name, g, r, torch.float64)


def test_non_contiguous_inputs():
    q, k, v, do = make_inputs(24, **TWO_HEADS)
    # The same values in a [B, S, H, D] memory layout, viewed as [B, H, S, D].
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not q.is_contiguous()
    assert_matches_oracle((q, k, v, do), causal="top_left")


# ----------------------------------------------------------------------------------------
# The kernels are driven by the schedule
# ----------------------------------------------------------------------------------------

# The block-size and split-KV cases (tools/ascend_check.py lowers these too): make_inputs
# overrides, then protocol kwargs; the causal block case needs block_m >= block_n.
ACCEPTED_BLOCKS = (16, 32, 64, 128)
BLOCK_SIZE_INPUTS = {"batch": 1, "len_q": 70, "len_k": 90}
BLOCK_SIZE_CASES = ({"window": (20, 5), "kv_lens": [83]}, {"causal": "bottom_right"})
SPLIT_KV_COUNTS = (3, 7)
SPLIT_KV_INPUTS = {"len_q": 35, "len_k": 45}
SPLIT_KV_CASE = {"causal": "bottom_right", "kv_lens": [45, 30]}


@pytest.mark.parametrize("block_n", ACCEPTED_BLOCKS)
@pytest.mark.parametrize("block_m", ACCEPTED_BLOCKS)
def test_every_accepted_block_size_is_correct(block_m, block_n):
    """Powers of two >= 16; causal also needs block_m >= block_n. Small blocks meet FULL, PARTIAL
    and SKIP tiles; at 128 one ragged tile holds everything."""
    inputs = make_inputs(30, **BLOCK_SIZE_INPUTS)
    schedule = TileSchedule(block_m, block_n)
    windowed, causal = BLOCK_SIZE_CASES
    assert_matches_oracle(inputs, schedule, **windowed)
    if block_m >= block_n:
        assert_matches_oracle(inputs, schedule, **causal)


@pytest.mark.parametrize("num_splits", SPLIT_KV_COUNTS)
def test_split_kv_partials_merge_to_the_answer(num_splits):
    """7 splits of at most 3 visited key blocks: some splits are empty (merge's identity)."""
    inputs = make_inputs(31, **SPLIT_KV_INPUTS)
    assert_matches_oracle(inputs, TileSchedule(16, 16, num_splits), **SPLIT_KV_CASE)


@pytest.mark.parametrize("block_m, block_n, causal, expected", [
    (8, 16, None, "block_m a power of two >= 16"),
    (16, 24, None, "block_n a power of two >= 16"),
    (48, 16, None, "block_m a power of two >= 16"),
    (16, 32, "top_left", "block_m >= block_n when causal"),
])
def test_block_sizes_the_kernel_cannot_take_are_refused(block_m, block_n, causal, expected):
    q, k, v, _ = make_inputs(32)
    with pytest.raises(SpecError, match=f"argument 'schedule': expected {expected}"):
        triton_flash.attention(q, k, v, causal=causal, schedule=TileSchedule(block_m, block_n))


class _AllFull(TileSchedule):
    """Lies: every visited tile is FULL, so the kernel skips the element-wise mask."""

    def class_table(self, spec, device=None):
        table = super().class_table(spec, device)
        return torch.where(table == SKIP, SKIP, FULL)


class _AllPartial(TileSchedule):
    """Overcautious: every visited tile is PARTIAL; masking a tile that needs none is harmless."""

    def class_table(self, spec, device=None):
        table = super().class_table(spec, device)
        return torch.where(table == SKIP, SKIP, PARTIAL)


class _VisitsNothing(TileSchedule):
    """Lies about the forward and dQ loop bounds: no query block visits any key block."""

    def kv_range(self, bm, g):
        return range(0)

    def split_ranges(self, bm, g):
        return [range(0)] * self.num_splits


class _SkipsEverything(TileSchedule):
    """Lies about the tile classes: all SKIP, so no key block meets a query block in dK/dV."""

    def class_table(self, spec, device=None):
        return torch.full_like(super().class_table(spec, device), SKIP)


class _HoleInColumn(TileSchedule):
    """A class table with a SKIP tile between two visited ones along the query axis."""

    def class_table(self, spec, device=None):
        table = super().class_table(spec, device).clone()
        table[:, 1, 0] = SKIP
        return table


def test_tile_classes_come_from_the_schedule():
    inputs = make_inputs(33, len_q=64, len_k=64)
    geometry = {"causal": "top_left", "window": (31, -1)}  # FULL tiles just below the diagonal
    assert (SMALL.class_table(make_spec(inputs, **geometry)) == FULL).any(), "the case has FULL tiles"
    assert_matches_oracle(inputs, _AllPartial(16, 16), **geometry)
    assert max_error(inputs, _AllFull(16, 16), **geometry) > 0.1, "an unmasked PARTIAL tile must show"


@pytest.mark.parametrize("block", [16, 32])
def test_block_sizes_come_from_the_schedule(block):
    """Told that every tile is FULL, a causal kernel leaves its diagonal tiles unmasked: exactly
    the rows that are not the last of a block of the schedule's size come out wrong."""
    q, k, v, _ = make_inputs(36, len_q=64, len_k=64)
    wrong = triton_flash.attention(q, k, v, causal="top_left", schedule=_AllFull(block, block))
    errors = (wrong - attention_oracle(q, k, v, causal="top_left")).abs().amax(dim=(0, 1, 3))
    rows = torch.arange(64)
    assert torch.equal(errors > 1e-9, rows % block != block - 1), f"wrong rows: {torch.nonzero(errors > 1e-9)}"


def test_loop_bounds_come_from_the_schedule():
    inputs = make_inputs(34)
    out, lse, dq, _, _ = forward_backward(kernel(_VisitsNothing(16, 16)), *inputs)
    assert (out == 0).all() and (lse == float("-inf")).all(), "no key visited: every row is empty"
    assert (dq == 0).all()
    # dK/dV loop over the query blocks the class table pairs with each key block.
    out, _, dq, dk, dv = forward_backward(kernel(_SkipsEverything(16, 16)), *inputs)
    assert (dk == 0).all() and (dv == 0).all()
    reference = attention_oracle(*inputs[:3])
    assert_matches("out", out, reference, torch.float64)  # the forward's bounds come from kv_range
    assert max_error(inputs, SMALL) < 1e-12, "while the real schedule is right"


def test_every_kernel_takes_the_launchers_groups_in_one_order():
    """Each kernel's parameters are its tensors, the runtime groups, its loop table, the compile-time
    groups, in the order the launcher builds them; it passes them by name, so a renamed, missing or
    reordered parameter fails here rather than launching with swapped integers."""
    q, k, v, _ = make_inputs(41)
    runtime = [name for group in triton_flash.RUNTIME_GROUPS for name in group._fields]
    compile_time = [name for group in triton_flash.COMPILE_TIME_GROUPS for name in group._fields]
    calls = triton_flash.Launch(make_spec((q, k, v)), SMALL, q).calls(q, k, v)
    assert [call.kernel for call in calls] == [triton_flash._attn_fwd, triton_flash._attn_bwd_dkdv,
                                               triton_flash._attn_bwd_dq]
    for call in calls:
        params = list(inspect.signature(call.kernel.fn).parameters)
        assert list(call.args) == params, call.kernel.fn.__name__
        first = params.index(runtime[0])
        assert all(name.isupper() for name in params[:first]), f"{params[:first]}: tensors come first"
        assert params[first:first + len(runtime)] == runtime, call.kernel.fn.__name__
        assert params[-len(compile_time):] == compile_time, call.kernel.fn.__name__


def test_class_table_must_be_contiguous_along_queries():
    q, k, v, _ = make_inputs(35, len_q=48)
    with pytest.raises(ValueError, match="not contiguous"):
        triton_flash.attention(q, k, v, schedule=_HoleInColumn(16, 16))


# ----------------------------------------------------------------------------------------
# Refusals and imports
# ----------------------------------------------------------------------------------------

def test_unsupported_features_raise_not_implemented():
    q, k, v, _ = make_inputs(40)
    with pytest.raises(NotImplementedError, match="dropout_mask"):
        triton_flash.attention(q, k, v, dropout_p=0.1)
    big_q, big_k, big_v, _ = make_inputs(37, head_dim=300, len_q=2, len_k=2)
    with pytest.raises(NotImplementedError, match="argument 'q': head dim 300"):
        triton_flash.attention(big_q, big_k, big_v)


def test_float64_is_refused_on_an_npu():
    """Ascend has no float64 (docs/ascend.md); the interpreter and CUDA do, so only an NPU refuses it."""
    spec = make_spec(make_inputs(42)[:3])
    with pytest.raises(NotImplementedError, match="argument 'q': Ascend NPUs have no float64"):
        triton_flash.check_launchable(spec, SMALL, torch.float64, "npu")
    triton_flash.check_launchable(spec, SMALL, torch.float32, "npu")
    triton_flash.check_launchable(spec, SMALL, torch.float64, "cuda")


def test_lengths_past_int32_tile_indices_are_refused():
    """Tile row indices are int32 in the kernels (prove --triton's no-wrap rests on it): a length whose
    padding to the block reaches 2**31 is refused, one block less is accepted."""
    from attnformal.spec import AttentionSpec

    def spec(len_q):
        return AttentionSpec(batch=1, heads_q=1, heads_kv=1, len_q=len_q, len_k=64, head_dim=16, head_dim_v=16,
                             scale=1.0)
    with pytest.raises(NotImplementedError, match="argument 'q': sequence length 2147483647"):
        triton_flash.check_launchable(spec(2 ** 31 - 1), SMALL, torch.float32, "cuda")
    triton_flash.check_launchable(spec(2 ** 31 - SMALL.block_m), SMALL, torch.float32, "cuda")


def test_bad_input_is_named():
    q, k, v, _ = make_inputs(38, heads_q=3, heads_kv=2)
    with pytest.raises(SpecError, match="argument 'k'"):
        triton_flash.attention(q, k, v)
    with pytest.raises(SpecError, match="argument 'schedule'"):
        triton_flash.attention(*make_inputs(39)[:3], schedule=(16, 16))


def test_attnformal_kernels_imports_without_triton():
    """CPU-only installs without triton: the package imports; the Triton module says what is missing."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import attnformal.kernels\n"
            "try:\n    import attnformal.kernels.triton_flash\n"
            "except ImportError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "triton" in done.stdout
