"""Comparisons with the reference: shapes, masks, structured and extreme inputs, lse, length.

Every case draws distinct random values per batch and head (see :mod:`..cases`) and is
judged elementwise under the selected tolerance profile.
"""

from __future__ import annotations

import math

import torch

from attnformal.verify.cases import (bshd, cache_slice, generator, make_case, non_contiguous, packed_kv, randn,
                                    random_attn_mask, shape, strided_features, value_offsets)
from attnformal.verify.checks import check
from attnformal.verify.diagnosis import COMMON_BLOCKS, PATTERN, STRONG, strides_mixed_findings

# -- shapes


@check("fwd.random")
def random(run):
    """Random inputs, distinct per batch and head, against the reference."""
    cases = [(shape(2, 4, 4, 33, 47, 32), {}), (shape(3, 2, 2, 64, 64, 64), {"scale": 0.3}),
             (shape(1, 3, 3, 100, 17, 16), {})]
    cases += run.pick([], [(shape(2, 8, 8, 512, 512, 128), {}), (shape(2, 2, 2, 1000, 1000, 64), {"scale": 0.05})])
    for n, (sh, kw) in enumerate(cases):
        run.against_reference(run.random_case(f"random #{n}", sh, grad=False, **kw))


@check("fwd.lengths", names_causes=True)
def lengths(run):
    """Sequence lengths around block multiples (16 ... 256, +-1), Sq != Sk both ways, query lengths past one
    and two query blocks; lengths an adaptation rounds up are also tried as asked (expected refusals)."""
    sks = [1, 15, 16, 17, 32, 63, 64, 65, 127, 128, 129, 255, 256, 257]
    sks += run.pick([], [31, 33, 95, 96, 97, 191, 192, 193, 511, 512, 513])
    shapes = [(f"Sk={sk}", shape(2, 2, 2, (13, 40, sk)[n % 3] if sk <= 64 else (13, 40)[n % 2], sk, 32))
              for n, sk in enumerate(sks)]
    shapes += [(f"Sq={sq}", shape(1, 2, 2, sq, sk, 32)) for sq, sk in ((100, 77), (200, 45))]
    results, records = {}, []
    for name, sh in shapes:
        case = run.random_case(name, sh, grad=False)
        for one in (case, run.as_asked(case, sh, grad=False)):
            record = None if one is None else run.against_reference(one, expect_refusal=one is not case)
            if record is not None:
                records.append(record)
                if name.startswith("Sk="):
                    results[one.spec.len_k] = record.status
    if not _explain_tail_rows(run, records):
        _explain_ragged(run, results)


def _explain_tail_rows(run, records) -> bool:
    """If exactly the query rows past the last multiple of some block fail (in every case, none elsewhere),
    name that block: the rows of the last, partial query block are never written or computed."""
    failing = [r for r in records if r.status == "FAIL" and r.comparisons and r.comparisons[0].ratio is not None]
    if not failing or len(failing) < len([r for r in records if r.status == "FAIL"]):
        return False
    rows = {id(r): (r.comparisons[0].ratio > 1).any(-1).any(0).any(0) if r.status == "FAIL" else None
            for r in records}  # [Sq]: the query rows that fail in some batch and head
    for block in COMMON_BLOCKS:
        def tail(n):
            return torch.arange(n) >= n - n % block if n % block else torch.zeros(n, dtype=torch.bool)
        if not any(r.case.spec.len_q > block for r in failing):
            continue  # every failing case lies within one block: its rows are no tail, and no block is named
        if all(torch.equal(rows[id(r)], tail(r.case.spec.len_q)) if r.status == "FAIL"
               else not tail(r.case.spec.len_q).any() for r in records):
            run.find("ragged_block", STRONG, f"exactly the query rows past the last multiple of {block} fail, in "
                                             f"each of the {len(failing)} failing cases (query lengths "
                                             f"{sorted({r.case.spec.len_q for r in failing})}): the last, partial "
                                             f"query block of {block} rows is not written")
            return True
    return False


def _explain_ragged(run, status_by_len):
    """If exactly the lengths that are not multiples of some block size fail, name that block."""
    failing = {n for n, s in status_by_len.items() if s == "FAIL"}
    if not failing:
        return
    for block in COMMON_BLOCKS:
        if all((n % block != 0) == (n in failing) for n in status_by_len):
            run.find("ragged_block", STRONG, f"exactly the key lengths that are not a multiple of {block} fail "
                                             f"({len(failing)} of {len(status_by_len)})")
            return


@check("fwd.empty")
def empty(run):
    """Zero-length queries or keys: an empty output, or zeros (no key to attend)."""
    for n, sh in enumerate([shape(2, 2, 2, 0, 5, 16), shape(2, 2, 2, 5, 0, 16), shape(2, 2, 2, 0, 0, 16)]):
        run.against_reference(run.random_case(f"empty #{n}", sh, grad=False))


@check("fwd.head_dims")
def head_dims(run):
    """Odd head dims (59, 111) and a value dim different from the key dim."""
    shapes = [shape(2, 2, 2, 40, 40, 59), shape(1, 2, 2, 33, 65, 111), shape(2, 2, 2, 30, 50, 32, 48)]
    shapes += run.pick([], [shape(2, 2, 2, 64, 64, 64, 16), shape(1, 2, 2, 64, 80, 1), shape(1, 2, 2, 64, 64, 256)])
    for n, sh in enumerate(shapes):
        run.against_reference(run.random_case(f"head dims #{n}", sh, grad=False))


@check("fwd.noncontiguous")
def noncontiguous(run):
    """Non-contiguous q, k, v ([B, S, H, D] buffers seen through a transpose, strided features)."""
    sh = shape(2, 4, 2, 37, 53, 32)
    control = run.random_case("contiguous twin", sh, grad=False, causal="bottom_right", incidental=("causal",))
    twin = control.with_(name="non-contiguous", q=non_contiguous(control.q), k=non_contiguous(control.k),
                         v=non_contiguous(control.v))
    passed_control = run.against_reference(control)
    record = run.against_reference(twin)
    if record is not None and record.status == "FAIL" and passed_control is not None \
            and passed_control.status == "pass":
        run.find("strides_ignored", STRONG, "the same values fail only when passed as non-contiguous views")


LAYOUTS = {  # name -> (q, k, v) -> (q, k, v) views of the same values, each tensor in its own layout
    "q [B, S, H, D], k a KV-cache slice, v contiguous": lambda q, k, v: (bshd(q), cache_slice(k), v),
    "k [B, S, H, D], v a KV-cache slice": lambda q, k, v: (q, bshd(k), cache_slice(v)),
    "k contiguous, v [B, S, H, D]": lambda q, k, v: (q, k, bshd(v)),
    "q head-dim stride 2, k and v one packed [B, S, 2, H, D] buffer": lambda q, k, v: (strided_features(q),
                                                                                        *packed_kv(k, v)),
    "q a KV-cache slice, k head-dim stride 2, v [B, S, H, D]": lambda q, k, v: (cache_slice(q), strided_features(k),
                                                                               bshd(v)),
}


@check("fwd.layouts")
def layouts(run):
    """q, k and v each in its own layout ([B, S, H, D], a KV-cache slice, head-dim stride 2, one packed KV
    buffer), against their contiguous twin."""
    sh = shape(2, 4, 2, 37, 53, 32)
    control = run.random_case("contiguous twin", sh, grad=False, causal="bottom_right", incidental=("causal",))
    expected = run.expected(control)  # the same values in every layout: one reference
    passed = run.against_reference(control, expected=expected)
    for name, lay_out in LAYOUTS.items():
        q, k, v = lay_out(control.q, control.k, control.v)
        record = run.against_reference(control.with_(name=name, q=q, k=k, v=v), expected=expected)
        if record is None or record.status != "FAIL" or passed is None or passed.status != "pass":
            continue
        found = strides_mixed_findings(record)
        for f in found:
            run.find(f.bug, f.weight, f"{name}: {f.evidence}")
        if not found:
            run.find("strides_ignored", PATTERN, f"{name}: the same values fail only in these layouts")


@check("fwd.long", full_only=True)
def long(run):
    """Long key sequences (8k and 16k keys), with and without a causal mask."""
    for sh, kw in [(shape(1, 2, 1, 64, 8192 + 17, 64), {}), (shape(1, 2, 2, 128, 16384, 64),
                                                             {"causal": "bottom_right"}),
                   (shape(1, 2, 2, 2048, 2048, 64), {"causal": "bottom_right"})]:
        run.against_reference(run.random_case(f"long Sk={sh.len_k}", sh, grad=False, **kw))


@check("fwd.gqa")
def gqa(run):
    """GQA and MQA against a reference that repeats K and V explicitly."""
    shapes = [shape(2, 8, 2, 40, 56, 32), shape(1, 6, 3, 17, 33, 16), shape(2, 4, 1, 33, 47, 32)]
    for n, sh in enumerate(shapes):
        run.against_reference(run.random_case(f"gqa #{n}", sh, grad=False, causal="bottom_right",
                                              incidental=("causal",)))


# -- masks

def _mask_cases(run, kwargs_list, shapes, name="mask"):
    for n, (kw, sh) in enumerate((kw, sh) for kw in kwargs_list for sh in shapes):
        run.against_reference(run.random_case(f"{name} #{n}", sh, grad=False, **kw))


@check("mask.causal_top_left")
def causal_top_left(run):
    """Causal mask aligned top-left (key j <= query i), Sq < Sk, Sq = Sk, Sq > Sk."""
    _mask_cases(run, [{"causal": "top_left"}], [shape(2, 2, 2, 33, 65, 32), shape(2, 2, 2, 64, 64, 32),
                                               shape(2, 2, 2, 70, 17, 32)])


@check("mask.causal_bottom_right")
def causal_bottom_right(run):
    """Causal mask aligned bottom-right (the last query sees the last key), Sq < Sk, = and >."""
    _mask_cases(run, [{"causal": "bottom_right"}], [shape(2, 2, 2, 33, 65, 32), shape(2, 2, 2, 64, 64, 32),
                                                   shape(2, 2, 2, 70, 17, 32)])


@check("mask.window")
def window(run):
    """Sliding windows (left, right), one-sided and zero-width, Sq != Sk."""
    windows = [(8, 0), (4, 4), (0, 0), (-1, 3), (16, -1)]
    _mask_cases(run, [{"window": w} for w in windows], [shape(2, 2, 2, 40, 57, 32), shape(1, 2, 2, 50, 30, 16)])
    _mask_cases(run, [{"window": (5, 2), "causal": "bottom_right"}], [shape(2, 2, 2, 40, 57, 32)], "window + causal")


@check("mask.chunk")
def chunk(run):
    """Chunked local attention: chunk edges on and off the key blocks (16, 7), one-key chunks, Sq < Sk and
    Sq > Sk (the query's chunk comes from its bottom-right-aligned position), with causal and kv_lens."""
    _mask_cases(run, [{"chunk_size": c} for c in (16, 7, 1)], [shape(2, 2, 2, 40, 57, 32), shape(1, 2, 2, 50, 30, 16)])
    _mask_cases(run, [{"chunk_size": 9, "causal": "bottom_right", "kv_lens": [57, 31]}], [shape(2, 2, 2, 40, 57, 32)],
                "chunk + causal + kv_lens")


@check("mask.prefix")
def prefix(run):
    """Prefix-LM: prefixes of 0 keys, inside, across key blocks and of every key, one per batch element, under
    both causal alignments, Sq < Sk and Sq > Sk, with kv_lens."""
    sh = shape(3, 2, 2, 40, 57, 32)
    _mask_cases(run, [{"prefix_lens": [0, 23, 57], "causal": "bottom_right"},
                      {"prefix_lens": [57, 0, 9], "causal": "top_left"}], [sh])
    _mask_cases(run, [{"prefix_lens": [30, 12, 0], "causal": "bottom_right", "kv_lens": [57, 20, 33]}], [sh],
                "prefix + kv_lens")
    _mask_cases(run, [{"prefix_lens": [10, 60], "causal": "bottom_right"}], [shape(2, 2, 2, 70, 60, 16)],
                "prefix, Sq > Sk")


@check("mask.kv_lens")
def kv_lens(run):
    """Per-batch key lengths: full, partial, one key and none."""
    sh = shape(4, 2, 2, 24, 45, 32)
    _mask_cases(run, [{"kv_lens": [45, 20, 1, 0]}, {"kv_lens": [7, 45, 33, 44], "causal": "bottom_right"}], [sh])


@check("mask.attn_mask")
def attn_mask(run):
    """Explicit boolean masks (True = attend), per head and broadcast over heads and batches."""
    sh = shape(2, 2, 2, 30, 45, 32)
    gen = generator(run.seed("masks"))
    for name, mask in [("per head", random_attn_mask(gen, sh)), ("[B, 1, Sq, Sk]", random_attn_mask(gen, sh, per_head=False)),
                       ("[1, 1, Sq, Sk]", random_attn_mask(gen, sh, per_head=False)[:1]),
                       ("sparse 10%", random_attn_mask(gen, sh, 0.1))]:
        run.against_reference(run.random_case(name, sh, grad=False, attn_mask=mask))


PREFIXES = (64, 128, 192, 256, 384, 512)  # masked leading keys: one, two, ... blocks of 64, 128 and 256


def prefix_masked(gen, sh, *, per_head=True, reverse=False):
    """A random mask (70% allowed) whose row ``i`` also masks its first ``PREFIXES[i % 6]`` keys,
    and one row that may attend only the last 3 keys (the ragged last block)."""
    mask = random_attn_mask(gen, sh, 0.7, per_head=per_head)
    prefixes = PREFIXES[::-1] if reverse else PREFIXES
    for i in range(sh.len_q):
        mask[:, :, i, :min(prefixes[i % len(prefixes)], sh.len_k - 1)] = False
        mask[:, :, i, -1] = True  # every row keeps a key: the point is the masked prefix, not an empty row
    if sh.len_q > 1:
        mask[:, :, 1, : sh.len_k - 3] = False
    return mask


@check("mask.across_blocks")
def across_blocks(run):
    """Rows whose first key blocks (64 ... 512 keys) are all masked and later keys are not: attn_mask,
    a broadcast -inf bias pattern, windows, kv_lens with a window; several 128- and 256-key blocks."""
    records = _masked_prefix_cases(run, shape(2, 2, 2, 24, 520, 32), "")
    records.append(run.against_reference(run.random_case("window (48, 16), Sq = Sk = 300", shape(1, 2, 2, 300, 300, 32),
                                                         grad=False, window=(48, 16))))
    if not run.quick:  # full adds the same patterns over 1100 keys (the profiles nest: quick's cases stay)
        records += _masked_prefix_cases(run, shape(2, 2, 2, 64, 1100, 32), ", Sk = 1100")
    for record in records:
        if record is not None and record.status == "FAIL":
            _explain_first_blocks(run, record)


def _masked_prefix_cases(run, sh, suffix):
    """The masked-prefix patterns of :func:`across_blocks` on one shape (their records)."""
    gen, sk = generator(run.seed("prefix" + suffix)), sh.len_k
    return [
        run.against_reference(run.random_case("attn_mask, masked prefixes per row" + suffix, sh, grad=False,
                                              attn_mask=prefix_masked(gen, sh))),
        run.against_reference(run.random_case("-inf bias pattern [1, 1, Sq, Sk], masked prefixes" + suffix, sh,
                                              grad=False,
                                              attn_mask=prefix_masked(gen, sh, per_head=False, reverse=True)[:1])),
        run.against_reference(run.random_case("window (40, 0), the last keys only" + suffix, sh, grad=False,
                                              window=(40, 0))),
        run.against_reference(run.random_case("kv_lens with a window (30, 0)" + suffix, sh, grad=False,
                                              kv_lens=[sk - 120, sk - 250], window=(30, 0))),
    ]


def _explain_first_blocks(run, record):
    """NaN/Inf on exactly the rows whose first ``block`` keys are all masked (and that have keys):
    the kernel computes exp(s - m) with m = -inf in a first block with no allowed key."""
    bad = (~torch.isfinite(record.observed.out.double().cpu())).any(-1)  # [B, Hq, Sq]
    if not bad.any():
        return
    allowed = record.case.spec.allowed().cpu()
    has_keys = allowed.any(-1)
    fits = [block for block in COMMON_BLOCKS
            if torch.equal(bad, has_keys & ~allowed[..., :block].any(-1))]  # the rows that block size would break
    if fits:
        blocks = f"{fits[0]}" if len(fits) == 1 else f"{fits[0]} (or up to {fits[-1]})"
        run.find("nan_first_block", STRONG, f"{record.case.name}: exactly the rows whose first {blocks} keys are all "
                                            f"masked ({int(bad.sum())} rows, each with later keys) are NaN/Inf")


@check("mask.combined")
def combined(run):
    """Every mask family at once: causal, window, kv_lens and an explicit mask."""
    sh = shape(3, 4, 2, 40, 70, 32)
    mask = random_attn_mask(generator(run.seed("mask")), sh, 0.8)
    for causal in ("top_left", "bottom_right"):
        run.against_reference(run.random_case(f"causal={causal}", sh, grad=False, causal=causal, window=(20, 3),
                                              kv_lens=[70, 41, 5], attn_mask=mask))


def empty_row_cases(run, *, grad):
    """Cases with rows that may attend no key, built four ways."""
    sh = shape(2, 2, 2, 24, 40, 32)
    mask = random_attn_mask(generator(run.seed("rows")), sh, 0.7)
    mask[:, :, ::3] = False  # every third row fully masked
    return [
        run.random_case("attn_mask rows all False", sh, grad=grad, attn_mask=mask),
        run.random_case("kv_lens = 0", sh, grad=grad, kv_lens=[40, 0]),
        run.random_case("bottom-right causal with Sq > Sk", shape(2, 2, 2, 40, 24, 32), grad=grad,
                        causal="bottom_right"),
        run.random_case("window beyond the keys", shape(2, 2, 2, 40, 24, 32), grad=grad, window=(2, 0)),
    ]


@check("mask.fully_masked_rows", names_causes=True)
def fully_masked_rows(run):
    """Rows with no allowed key: output exactly 0, never NaN."""
    for case in empty_row_cases(run, grad=False):
        record = run.against_reference(case)
        if record is not None and record.status == "FAIL":
            _explain_empty_rows(run, record)


def _explain_empty_rows(run, record):
    """NaN on the rows without keys, or a finite fill: then every key gets the same score, so the
    row's output is the plain mean of the values (all Sk keys, or the first kv_lens[b])."""
    empty = record.expected.probabilities.sum(-1) == 0  # [B, Hq, Sq]
    rows = record.observed.out.double().cpu()[empty]
    if not rows.numel():
        return
    if not torch.isfinite(rows).all():
        run.find("nan_empty_rows", STRONG, f"{int((~torch.isfinite(rows)).any(-1).sum())} rows with no allowed key "
                                           f"are NaN/Inf")
        return
    if not rows.abs().max() > 0:
        return
    case = record.case
    v = case.v.double().cpu()[:, case.spec.kv_heads()]
    lens = case.spec.kv_lens or (case.spec.len_k,) * case.spec.batch
    means = [v.mean(2, keepdim=True), torch.stack([v[b, :, :max(n, 1)].mean(1) for b, n in enumerate(lens)])[:, :, None]]
    for mean in means:
        if torch.allclose(rows, mean.expand_as(record.observed.out)[empty], rtol=0.05, atol=0.05):
            run.find("finite_mask_fill", STRONG, "rows with no allowed key return the plain mean of the values: "
                                                 "every masked score got the same finite fill")
            return
    run.find("mask_wrong", PATTERN, "rows with no allowed key return a non-zero output")


@check("fwd.softcap")
def softcap(run):
    """Logit softcapping cap * tanh(s / cap), after the scale, with logits well past the cap."""
    sh = shape(2, 2, 2, 33, 47, 32)
    control = run.against_reference(run.random_case("no softcap (control)", sh, grad=False, scale=2.0,
                                                    causal="bottom_right").with_(role="control"))
    failed = False
    for cap, scale in [(20.0, 2.0), (5.0, None)]:
        record = run.against_reference(run.random_case(f"softcap={cap}", sh, grad=False, softcap=cap, scale=scale,
                                                       causal="bottom_right"))
        failed |= record is not None and record.status == "FAIL"
    if failed and control is not None and control.status == "pass":
        run.find("softcap_wrong", STRONG, "the same case passes without softcap and fails with it")


# -- structured inputs


@check("structured.symmetric_qk")
def symmetric_qk(run):
    """q = k: symmetric scores with the largest on the diagonal."""
    sh = shape(2, 2, 2, 48, 48, 32)
    for kw in ({}, {"causal": "top_left"}):
        case = run.random_case("q = k" + (" causal" if kw else ""), sh, grad=False, **kw)
        case.k.copy_(case.q)
        run.against_reference(case)


@check("structured.sparse_keys")
def sparse_keys(run):
    """Mostly-zero keys: only every fourth key is non-zero."""
    case = run.random_case("every 4th key non-zero", shape(2, 2, 2, 40, 128, 32), grad=False)
    keep = torch.zeros(case.spec.len_k, dtype=torch.bool)
    keep[::4] = True
    case.k.mul_(keep[:, None].to(case.k.dtype))
    run.against_reference(case)


@check("structured.tied_max")
def tied_max(run):
    """Duplicated keys whose scores tie the running maximum, within a tile and across tiles."""
    sh = shape(2, 2, 2, 24, 300, 32)
    case = run.random_case("tied maxima at keys 3, 4, 70, 200, 299; keys 0-31 repeated at 128-159", sh,
                           grad=False, scale=0.25)
    case.q[..., 0] = 4.0
    for j in (3, 4, 70, 200, 299):  # the same key, so every row scores it identically (8 + noise-free)
        case.k[:, :, j] = 0.0
        case.k[:, :, j, 0] = 8.0
    case.k[:, :, 128:160] = case.k[:, :, :32].clone()
    run.against_reference(case)


# -- extreme values


def _scaled_case(run, name, sh, q_scale, k_scale, v_scale=1.0, **kw):
    sh, kw, notes = run.adapt(sh, kw)
    gen = generator(run.seed(name))
    q = q_scale * randn(gen, sh.batch, sh.heads_q, sh.len_q, sh.head_dim)
    k = k_scale * randn(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim)
    v = v_scale * (randn(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim_v) + value_offsets(sh.batch, sh.heads_kv))
    return make_case(name, q, k, v, run.dtype, run.device, run.seed(name), **kw).with_(adapted=notes)


@check("extreme.large_logits", names_causes=True)
def large_logits(run):
    """Logits in the thousands, positive and negative: nearly one-hot rows, no overflow."""
    sh = shape(2, 2, 2, 32, 77, 32)
    record = run.against_reference(_scaled_case(run, "|logits| ~ 5e3", sh, 30.0, 30.0, scale=1.0))
    if record is not None and not torch.isfinite(record.observed.out).all():
        run.find("unstable_softmax", STRONG, "large logits without any mask give NaN/Inf: exp overflowed")
    run.against_reference(_scaled_case(run, "|logits| ~ 5e3, causal", sh, 30.0, 30.0, scale=1.0,
                                       causal="bottom_right"))


@check("extreme.large_negative")
def large_negative(run):
    """Every allowed logit near -2e4, with masks: a finite mask fill (-1e4) would win."""
    sh = shape(2, 2, 2, 32, 60, 16)
    mask = random_attn_mask(generator(run.seed("mask")), sh, 0.6)
    for kw in ({"causal": "bottom_right"}, {"attn_mask": mask}):
        case = _scaled_case(run, f"logits ~ -2e4 {list(kw)}", sh, 1.0, 1.0, scale=1.0, **kw)
        case.q[..., 0] = 1.0
        case.k[..., 0] = -2e4
        record = run.against_reference(case)
        if record is not None and record.status == "FAIL":
            _explain_vanished_rows(run, record)


def _explain_vanished_rows(run, record):
    """Rows that have keys but come out all zero or NaN: exp(s) underflowed (no max subtracted)."""
    has_keys = record.expected.probabilities.sum(-1) > 0
    out = record.observed.out.double().cpu()[has_keys]
    vanished = ~torch.isfinite(out).all(-1) | (out == 0).all(-1)
    if vanished.float().mean() > 0.5:
        run.find("unstable_softmax", STRONG, f"{int(vanished.sum())} rows with keys but logits near -2e4 come out "
                                             f"zero or NaN: exp(s) underflowed")


@check("extreme.equal_and_zero")
def equal_and_zero(run):
    """All-equal large logits (uniform rows), all-zero inputs (zero output), tiny values (1e-10)."""
    sh = shape(2, 2, 2, 16, 50, 8)
    equal = _scaled_case(run, "all logits 1024", sh, 1.0, 1.0, scale=1.0)
    equal.q.fill_(16.0)
    equal.k.fill_(8.0)
    zeros = _scaled_case(run, "q = k = v = 0", sh, 0.0, 0.0, 0.0)
    tiny = _scaled_case(run, "q, k, v ~ 1e-10", sh, 1e-10, 1e-10, 1e-10)
    mixed = _scaled_case(run, "q, k, v ~ 1e2", shape(1, 2, 2, 16, 50, 128), 1e2, 1e2, 1e2)
    for case in (equal, zeros, tiny, mixed):
        run.against_reference(case)


# -- lse


@check("lse.values")
def lse_values(run):
    """The log-sum-exp (natural log, fp32): random, GQA, masks, empty rows (-inf), extremes."""
    cases = [
        run.random_case("random", shape(2, 4, 4, 33, 47, 32), grad=False),
        run.random_case("gqa causal", shape(2, 4, 2, 40, 56, 32), grad=False, causal="bottom_right"),
        run.random_case("window kv_lens", shape(2, 2, 2, 24, 40, 32), grad=False, window=(6, 2), kv_lens=[40, 9]),
        _scaled_case(run, "large logits", shape(1, 2, 2, 16, 40, 16), 30.0, 30.0, scale=1.0),
    ]
    cases += empty_row_cases(run, grad=False)  # every empty-row kind: a kernel may take only some of them
    for case in cases:
        record = run.against_reference(case, lse=True)
        if record is not None and record.status == "FAIL":
            out_ok = record.comparisons[0].passed
            if out_ok:
                run.find("lse_wrong", PATTERN, "the output is right but lse is not")


# -- error growth with length


@check("errors.length_growth", names_causes=True)
def length_growth(run):
    """The error as the key length grows 64 -> 4k (16k in full): it must stay within tolerance."""
    lens = run.pick([64, 256, 1024, 4096], [64, 256, 1024, 4096, 16384])
    errors = []
    for sk in lens:
        case = run.random_case(f"Sk={sk}", shape(1, 1, 1, 16, sk, 64), grad=False)
        record = run.against_reference(case)
        if record is None:
            continue
        out = record.comparisons[0]
        errors.append((case.spec.len_k, out.max_abs, out.worst_ratio, record.status))
    if not errors:
        return
    run.note("Sk: max |error| (x tolerance): " + ", ".join(f"{n}: {e:.2g} ({r:.2g}x)" for n, e, r, _ in errors))
    slope = _log_slope(errors)
    if slope is not None:
        run.metrics["error_length_slope"] = slope
        run.note(f"error grows like Sk^{slope:.2f}")
    statuses = [s for *_, s in errors]
    ratio_slope = _log_slope([(n, r) for n, _, r, _ in errors])
    if statuses[-1] == "FAIL" and ratio_slope is not None and ratio_slope > 0.2:
        first = next(n for n, *_, s in errors if s == "FAIL")
        run.find("low_precision_accumulation", STRONG if statuses[0] == "pass" else PATTERN,
                 f"the error, relative to the tolerance, grows like Sk^{ratio_slope:.2f} and leaves the tolerance "
                 f"from Sk = {first} on")


def _log_slope(errors):
    """Least-squares slope of log(error) against log(Sk)."""
    points = [(math.log(n), math.log(e)) for n, e, *_ in errors if e > 0 and math.isfinite(e)]
    if len(points) < 3:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx
