"""The zoo: attention implementations with exactly one bug each, to test the battery.

:func:`attention` is a compact FlashAttention-2 in plain torch: the forward folds key
blocks of ``BLOCK_N`` keys into an online-softmax state (m, l, acc); the backward applies
the FA2 formulas, recomputing P from the saved lse. It is written here from the paper on
purpose instead of reusing attnformal's merge and mask code: every bug is a small edit of
these lines, and a mutated copy of shared code would mutate the battery's oracle as well.
With ``bug=None`` it is correct (the zoo's own control).

:data:`ZOO` lists each specimen with the bug class the battery must name first.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from attnformal.spec import AttentionSpec

BLOCK_N = 32
FLASH_ATTN_TRITON_BLOCK_N = 128  # the block of the first_block_nan specimen, as in flash_attn_triton.py
FINITE_FILL = -1e4
SENTINEL = -1e6  # the triton-ascend tutorial's mask: qk + where(mask, 0, -1e6)
SPLIT_KV_ROWS, SPLIT_KV_BLOCKS = 16, 4  # the split_kv_dropout specimen splits Sq <= 16 over > 4 key blocks
TAIL_BLOCK_M, TAIL_MULTIPLE = 64, 16  # the ragged_tail_rows specimen's query block and accepted multiple


@dataclass(frozen=True)
class Specimen:
    bug: str
    diagnosis: str  # the attnformal.verify.diagnosis.BUG_CLASSES id the battery must rank first
    description: str
    dtype: str = "float32"  # the dtype the bug shows in


ZOO = [
    Specimen("acc_not_rescaled", "acc_not_rescaled", "the accumulator is not rescaled by alpha"),
    Specimen("denominator_not_rescaled", "denominator_not_rescaled", "l is not rescaled by alpha"),
    Specimen("mask_after_max", "mask_after_max", "the row max is taken before masking"),
    Specimen("finite_fill", "finite_mask_fill", "masked scores are filled with -1e4"),
    Specimen("nan_empty_rows", "nan_empty_rows", "out = acc / l without a guard for l = 0"),
    Specimen("ragged_block", "ragged_block", "the last key block is padded with zero keys and not masked"),
    Specimen("causal_alignment", "causal_alignment", "bottom-right causal computed as top-left"),
    Specimen("causal_off_by_one", "causal_off_by_one", "causal admits key i + 1"),
    Specimen("window_off_by_one", "window_off_by_one", "the window's left edge admits one key too many"),
    Specimen("gqa_modulo", "gqa_head_mapping", "query head h reads KV head h % Hkv"),
    Specimen("gqa_backward_not_summed", "gqa_backward_not_summed", "dK/dV overwritten by each head of a group"),
    Specimen("dq_scale", "gradient_scale", "dQ misses the softmax scale"),
    Specimen("lse_base2", "lse_base2", "lse returned in base 2"),
    Specimen("dropout_scaling", "dropout_scaling", "kept values not divided by 1 - p"),
    Specimen("dropout_backward", "dropout_backward", "the backward ignores the dropout mask"),
    Specimen("batch0", "batch_indexing", "every batch reads K and V of batch 0"),
    Specimen("backward_delta", "backward_delta", "D = rowsum(dO) instead of rowsum(dO * O)"),
    # beyond the list
    Specimen("scale_ignored", "scale_ignored", "the scale argument is ignored (1/sqrt(D) always)"),
    Specimen("kv_lens_ignored", "kv_lens_ignored", "kv_lens is ignored"),
    Specimen("packed_leak", "packed_boundary_leak", "each packed sequence also reads the next sequence's first key"),
    Specimen("packed_slopes_row0", "batch_indexing", "every packed sequence reads row 0 of [B, Hq] ALiBi slopes"),
    Specimen("chunk_off_by_one", "chunk_off_by_one", "chunks start one key late (key j in chunk (j - 1) // C)"),
    Specimen("prefix_wrong_batch", "prefix_wrong", "batch b uses the prefix length of batch b + 1"),
    Specimen("strides_ignored", "strides_ignored", "inputs are read as if contiguous"),
    # FlagAttention flash.py's bug (issue 25): K read with V's strides
    Specimen("strides_mixed", "strides_mixed", "K is read with V's strides (right when they share a layout)"),
    Specimen("input_mutation", "input_mutation", "q is pre-scaled in place"),
    Specimen("dropout_rate", "dropout_rate", "keeps with probability p instead of 1 - p"),
    Specimen("lse_without_max", "lse_wrong", "lse = log(l), the running max forgotten"),
    Specimen("low_precision", "low_precision_accumulation", "m, l and acc kept in the input dtype",
             dtype="bfloat16"),
    Specimen("no_max_subtraction", "unstable_softmax", "exp(s) without subtracting the running max"),
    Specimen("softcap_before_scale", "softcap_wrong", "softcap applied to the unscaled scores"),
    Specimen("race", "nondeterminism", "each call loses one random key block of one head (a lost update)"),
    Specimen("one_head_scale", "head_specific", "head 0 uses a scale 1.6% too large", dtype="bfloat16"),
    # flash_attn_triton.py's bug: 128-key blocks, exp(s - m) unguarded while m = -inf
    Specimen("first_block_nan", "nan_first_block", "NaN for a row whose first 128 keys are all masked although "
             "later keys are allowed (rows with no key at all are handled)", dtype="float16"),
    # sinks and ALiBi (issue 12)
    Specimen("sink_not_in_lse", "sink_not_in_lse", "lse leaves the sink out (the output is normalised with it)"),
    Specimen("sink_value", "sink_value", "the sink enters the accumulator with value 1"),
    Specimen("alibi_sign", "alibi_sign", "ALiBi adds +slope * |distance|"),
    Specimen("alibi_top_left", "alibi_alignment", "ALiBi's distance is |i - j| (top-left), not bottom-right"),
    # issue 25: bugs of public Triton kernels the battery did not reach
    # (with --fail-fast three of these stop at an earlier check's symptom: their names come from the sweeps of
    # their own checks, extreme.masked_dominant, extreme.value_range and fwd.lengths' rows)
    Specimen("finite_sentinel", "finite_mask_sentinel", "masked scores get s - 1e6 instead of -inf (the triton-ascend "
             "tutorial's fill)"),
    Specimen("fp16_partials", "partials_overflow", "bfloat16 partial outputs stored in float16 (FlagAttention's "
             "split-KV partials): Inf past 65504", dtype="bfloat16"),
    Specimen("split_kv_dropout", "shape_regime", "the split-KV path (Sq <= 16, more than 4 key blocks) ignores "
             "dropout"),
    Specimen("ragged_tail_rows", "ragged_block", "refuses lengths that are not multiples of 16, and never writes "
             "the query rows past the last multiple of 64 (triton-ascend tutorial)"),
    # the diagnosis mistakes of issue 25: each must be named by its cause, not by a symptom
    Specimen("batch_offset", "batch_indexing", "the Triton tutorial's batch offset bug (batches >= 1 are never "
             "written: whatever the memory held) and a non-causal backward that applies the causal mask"),
    Specimen("drops_window_softcap", "keyword_ignored", "window and softcap are accepted but ignored"),
    Specimen("ignores_causal_mask_scale", "keyword_ignored", "causal, attn_mask and scale are accepted but ignored"),
    Specimen("out_scaled", "output_scaled", "the output is 1.02 x the right one (and so are the gradients)"),
    Specimen("wrong_dtype", "dtype_wrong", "the output comes back in float32 for bfloat16 inputs",
             dtype="bfloat16"),
    Specimen("all_nan", "nan_output", "every output is NaN (the accumulator starts as NaN)"),
    # features through every path (issue 25): bugs that only a backward, an lse or an unusual combination shows
    Specimen("alibi_sk_aligned", "alibi_alignment", "ALiBi's distance is aligned with Sk, not kv_lens[b]"),
    Specimen("bwd_no_chunk", "backward_mask", "the backward recomputes P without the chunk mask (FA2-style)"),
    Specimen("bwd_no_prefix", "backward_mask", "the backward recomputes P without the prefix"),
    Specimen("prefix_after_kv_lens", "prefix_wrong", "the prefix is ORed in after kv_lens: keys past kv_lens[b] "
             "inside the prefix are read"),
    Specimen("dsinks_scaled", "gradient_scale", "d sinks is 1.2 x the right one", dtype="bfloat16"),
    Specimen("sink_value_mean_v", "sink_value", "the sink carries the mean of V as its value (0 when V = 0)"),
    Specimen("kv_lens_off_by_one", "kv_lens_off_by_one", "kv_lens[b] admits one key too many (j <= kv_lens[b]): "
             "only batches shorter than Sk fail, batch 0 often not"),
]

_RACE = torch.Generator().manual_seed(0)  # the "race" specimen's lost update: a different block each call
_UNWRITTEN = torch.Generator().manual_seed(1)  # what memory the "batch_offset" specimen never writes holds


def specimen_impl(bug: str):
    """The protocol function of one specimen (named after its bug, for reports)."""
    fn = functools.partial(attention, bug=bug)
    fn.__name__ = f"zoo_{bug}"
    return fn


def attention(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None, softcap=None,
              dropout_p=0.0, dropout_mask=None, chunk_size=None, prefix_lens=None, sinks=None, alibi_slopes=None,
              bias=None, cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, bug=None):
    features = {"chunk_size": chunk_size, "prefix_lens": prefix_lens}
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        AttentionSpec.from_inputs(q, k, v, scale=scale, causal=causal, window=window, kv_lens=kv_lens, softcap=softcap,
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, sinks=sinks,
                                  alibi_slopes=alibi_slopes, bias=bias, **features)  # refuses what packing lacks
        keywords = dict(scale=scale, causal=causal, window=window, softcap=softcap, chunk_size=chunk_size, sinks=sinks)
        per_batch = {"kv_lens": kv_lens, "prefix_lens": prefix_lens}
        return _packed(q, k, v, list(cu_seqlens_q), list(cu_seqlens_k), per_batch, alibi_slopes, keywords,
                       return_lse, bug)
    spec = AttentionSpec.from_inputs(q, k, v, scale=scale, causal=causal, window=window, attn_mask=attn_mask,
                                     kv_lens=kv_lens, softcap=softcap, dropout_p=dropout_p, dropout_mask=dropout_mask,
                                     chunk_size=chunk_size, prefix_lens=prefix_lens, sinks=sinks,
                                     alibi_slopes=alibi_slopes, bias=bias)
    if bug == "ragged_tail_rows" and (q.shape[2] % TAIL_MULTIPLE or k.shape[2] % TAIL_MULTIPLE):
        raise NotImplementedError(f"lengths must be multiples of {TAIL_MULTIPLE}")
    if bug == "strides_ignored":
        q, k, v = (t.as_strided(t.shape, torch.empty(t.shape).stride()) for t in (q, k, v))
    if bug == "strides_mixed" and k.shape == v.shape:
        k = _read_with(k, v.stride())
    if bug == "input_mutation":
        with torch.no_grad():
            q.mul_(spec.scale)
        spec = spec.replace(scale=1.0)
    if bug == "scale_ignored":
        spec = spec.replace(scale=1.0 / math.sqrt(spec.head_dim))
    spec = _dropped_keywords(spec, bug)
    out, lse = _Flash.apply(q, k, v, sinks, bias, spec, _keep_weights(spec, q, bug), bug)
    if bug == "out_scaled":
        out = out * 1.02
    elif bug == "wrong_dtype" and q.dtype != torch.float32:
        out = out.float()
    return (out, lse) if return_lse else out


def _dropped_keywords(spec, bug):
    """The keywords a kernel takes and then ignores."""
    if bug == "drops_window_softcap":
        return spec.replace(window=None, softcap=None)
    if bug == "ignores_causal_mask_scale":
        return spec.replace(causal=None, attn_mask=None, scale=1.0 / math.sqrt(spec.head_dim))
    return spec


def _read_with(t, stride):
    """``t``'s storage seen through ``stride``, as a kernel given the wrong tensor's strides reads it (its own
    strides where the other's would leave the storage)."""
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, stride))
    if last >= t.untyped_storage().nbytes() // t.element_size():
        return t
    return t.as_strided(t.shape, stride, t.storage_offset())


def _packed(q, k, v, cu_q, cu_k, per_batch, slopes, keywords, return_lse, bug):
    """Sequence by sequence, sliced here from the offsets (packed [T, H, D] -> [1, H, S, D] and back); every
    sequence takes the sinks, and its own row of [B, Hq] ALiBi slopes."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        end_k = cu_k[b + 1] + (1 if bug == "packed_leak" and cu_k[b + 1] < k.shape[0] else 0)  # next sequence's key
        one = [t.transpose(0, 1)[None] for t in (q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:end_k], v[cu_k[b]:end_k])]
        entries = {name: None if value is None else [value[b]] for name, value in per_batch.items()}
        if slopes is not None:
            entries["alibi_slopes"] = slopes if slopes.dim() == 1 else slopes[0 if bug == "packed_slopes_row0" else b]
        out, lse = attention(*one, return_lse=True, **entries, **keywords)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0].transpose(0, 1))
    return (torch.cat(outs), torch.cat(lses)) if return_lse else torch.cat(outs)


def _keep_weights(spec, q, bug):
    """Dropout weights: the keep-mask (given, or drawn here) times 1/(1-p); None without dropout."""
    if spec.dropout_p == 0:
        return None
    p = spec.dropout_p
    keep = spec.dropout_mask
    if keep is None:
        draw = torch.rand(spec.batch, spec.heads_q, spec.len_q, spec.len_k, device=q.device)
        keep = draw < p if bug == "dropout_rate" else draw >= p
    return keep.float() if bug == "dropout_scaling" else keep.float() / (1 - p)


def _compute_dtype(dtype, bug):
    if bug == "low_precision" or dtype == torch.float64:
        return dtype
    return torch.float32


def _heads_and_batches(spec, bug, device):
    """The KV head each query head reads and the batch each batch element reads."""
    h = torch.arange(spec.heads_q, device=device)
    heads = h % spec.heads_kv if bug == "gqa_modulo" else h // spec.group
    batches = torch.arange(spec.batch, device=device)
    return heads, torch.zeros_like(batches) if bug == "batch0" else batches


def _allowed(spec, bug, width, device):
    """``[B, Hq, Sq, width]`` allowed pairs, with this specimen's mask bug."""
    i = torch.arange(spec.len_q, device=device)[:, None]
    j = torch.arange(width, device=device)[None, :]
    rows = []
    for b in range(spec.batch):
        n = spec.len_k if spec.kv_lens is None or bug == "kv_lens_ignored" else spec.kv_lens[b]
        offset = n - spec.len_q
        ok = torch.ones(spec.len_q, width, dtype=torch.bool, device=device)
        if bug == "kv_lens_off_by_one" and n < spec.len_k:
            n += 1
        if bug != "ragged_block" or spec.kv_lens is not None:
            ok &= j < n
        extra = 1 if bug == "causal_off_by_one" else 0
        prefix = 0 if spec.prefix_lens is None else \
            spec.prefix_lens[(b + 1) % spec.batch if bug == "prefix_wrong_batch" else b]  # keys everyone sees
        if spec.causal == "top_left" or (spec.causal == "bottom_right" and bug == "causal_alignment"):
            ok &= (j <= i + extra) | (j < prefix)
        elif spec.causal == "bottom_right":
            ok &= (j <= i + offset + extra) | (j < prefix)
        if bug == "prefix_after_kv_lens":
            ok |= j < min(prefix, spec.len_k)  # the prefix wins over the key length
        if spec.window is not None:
            left, right = spec.window
            if left >= 0:
                ok &= j >= i + offset - left - (1 if bug == "window_off_by_one" else 0)
            if right >= 0:
                ok &= j <= i + offset + right
        if spec.chunk_size is not None:
            c = spec.chunk_size
            key_chunk = torch.div(j - 1 if bug == "chunk_off_by_one" else j, c, rounding_mode="floor")
            ok &= torch.div(i + offset, c, rounding_mode="floor") == key_chunk
        rows.append(ok)
    allowed = torch.stack(rows)[:, None].expand(spec.batch, spec.heads_q, spec.len_q, width)
    if spec.attn_mask is not None:
        mask = spec.attn_mask
        if width > spec.len_k:
            mask = torch.cat([mask, mask.new_ones(*mask.shape[:3], width - spec.len_k)], -1)
        allowed = allowed & mask
    return allowed


def _scores(spec, q, k, bug, cols=None):
    """Scores of the key columns ``cols`` (all by default): scaled, capped, then ALiBi and bias added."""
    cols = slice(0, k.shape[2]) if cols is None else cols
    s = q @ k[:, :, cols].transpose(-1, -2)
    if spec.softcap is not None and bug == "softcap_before_scale":
        return spec.scale * spec.softcap * torch.tanh(s / spec.softcap)
    s = spec.scale * s
    if bug == "one_head_scale":
        s[:, 0] *= 1 + 2.0**-6
    if spec.softcap is not None:
        s = spec.softcap * torch.tanh(s / spec.softcap)
    return s + _bias(spec, bug, cols, s.shape[-1]).to(s)


def _bias(spec, bug, cols, width):
    """ALiBi's -slope |i + Sk_b - Sq - j| (bottom-right, the batch's own key length) plus ``bias``."""
    total = torch.zeros(())
    if spec.alibi_slopes is not None:
        i = torch.arange(spec.len_q)[:, None]
        j = torch.arange(cols.start, cols.start + width)[None, :]
        lengths = spec.kv_lens if spec.kv_lens is not None and bug != "alibi_sk_aligned" else [spec.len_k] * spec.batch
        n = torch.tensor(lengths)[:, None, None, None]
        distance = (i - j).abs() if bug == "alibi_top_left" else (i + n - spec.len_q - j).abs()
        sign = 1.0 if bug == "alibi_sign" else -1.0
        total = sign * spec.alibi_slopes.double().cpu()[:, :, None, None] * distance
    if spec.bias is not None:
        full = spec.bias.detach().double().cpu().expand(spec.batch, spec.heads_q, spec.len_q, spec.len_k)
        padded = torch.cat([full, full.new_zeros(*full.shape[:3], max(0, cols.start + width - spec.len_k))], -1)
        total = total + padded[..., cols.start:cols.start + width]
    return total


def _forward(spec, weights, bug, q, k, v):
    cd = _compute_dtype(q.dtype, bug)
    heads, batches = _heads_and_batches(spec, bug, q.device)
    q, k, v = q.to(cd), k.to(cd)[batches][:, heads], v.to(cd)[batches][:, heads]
    width = spec.len_k
    if bug == "ragged_block" and spec.len_k % BLOCK_N:
        width = spec.len_k + BLOCK_N - spec.len_k % BLOCK_N  # read past the end: zeros, and not masked
        k, v = (torch.cat([t, t.new_zeros(*t.shape[:2], width - spec.len_k, t.shape[3])], 2) for t in (k, v))
    allowed = _allowed(spec, bug, width, q.device)
    block_n = FLASH_ATTN_TRITON_BLOCK_N if bug == "first_block_nan" else BLOCK_N
    rows = (spec.batch, spec.heads_q, spec.len_q, 1)
    m = torch.full(rows, -math.inf, dtype=cd, device=q.device)
    l = torch.zeros(rows, dtype=cd, device=q.device)
    acc = torch.full((*rows[:3], spec.head_dim_v), math.nan if bug == "all_nan" else 0.0, dtype=cd, device=q.device)
    sink = _sink_logits(spec, cd, q.device)
    if sink is not None:  # the sink is the first "key": score sink, value 0 (1 for the sink_value bug)
        m = sink.expand(rows).clone()
        l = torch.where(torch.isfinite(m), 1.0, 0.0).to(cd)
        acc = acc + (l if bug == "sink_value" else 0.0)
        if bug == "sink_value_mean_v":
            acc = acc + l * v.mean(2, keepdim=True)
    lost = _lost_update(spec, width) if bug == "race" else None
    split_kv_dropout = bug == "split_kv_dropout" and spec.len_q <= SPLIT_KV_ROWS and width > SPLIT_KV_BLOCKS * BLOCK_N
    for start in range(0, width, block_n):
        cols = slice(start, start + block_n)
        s, ok = _scores(spec, q, k, bug, cols), allowed[..., cols]
        if bug == "mask_after_max":
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        else:
            s = s + torch.where(ok, 0.0, SENTINEL) if bug == "finite_sentinel" else \
                s.masked_fill(~ok, FINITE_FILL if bug == "finite_fill" else -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(m_new == -math.inf, 0.0, m_new)  # exp(-inf - (-inf)) would be NaN
        if bug == "no_max_subtraction":
            shift = torch.zeros_like(m_new)
        alpha = torch.exp(torch.where(m == -math.inf, -math.inf, m - shift)) if bug != "no_max_subtraction" \
            else torch.ones_like(m)
        if bug == "first_block_nan":  # no guard: NaN while every key so far was masked
            shift, alpha = m_new, torch.exp(m - m_new)
        p = torch.exp(s - shift)
        if bug == "mask_after_max":
            p = torch.where(ok, p, 0.0)
        if lost is not None and lost[2] == start:
            p[lost[0], lost[1]] = 0.0
        l = (l if bug == "denominator_not_rescaled" else alpha * l) + p.sum(-1, keepdim=True)
        pw = p if weights is None or split_kv_dropout else p * weights[..., cols].to(cd)
        acc = (acc if bug == "acc_not_rescaled" else alpha * acc) + pw @ v[:, :, cols]
        m = m_new
    has_terms = allowed.any(-1, keepdim=True)  # a key, or a finite sink, in the denominator
    if sink is not None:
        has_terms = has_terms | torch.isfinite(sink)
    out, lse, reported = _finalize(m, l, acc, bug, q.dtype, has_terms, sink)
    if bug == "batch_offset" and spec.batch > 1:  # batches >= 1 are written past the output: never here
        out[1:] = torch.randn(out[1:].shape, generator=_UNWRITTEN, dtype=out.dtype).to(out.device) * 10
    return out, lse, reported


def _sink_logits(spec, dtype, device):
    """``[1, Hq, 1, 1]`` sink logits, or None."""
    return None if spec.sinks is None else spec.sinks.detach().to(device=device, dtype=dtype)[None, :, None, None]


def _lost_update(spec, width):
    """(batch, head, block start) whose contribution this call loses."""
    blocks = max(1, math.ceil(width / BLOCK_N))
    b, h, n = (int(torch.randint(0, size, (), generator=_RACE)) for size in (spec.batch, spec.heads_q, blocks))
    return b, h, n * BLOCK_N


def _finalize(m, l, acc, bug, dtype, has_keys, sink):
    """``(out, lse, lse as reported)``: the kernel keeps the true lse for its backward."""
    seen = has_keys if bug == "first_block_nan" else l > 0
    l_safe = torch.where(seen, l, 1.0)
    out = acc / l if bug == "nan_empty_rows" else torch.where(seen, acc / l_safe, 0.0)
    if bug == "fp16_partials":  # the partial output kept in float16 on its way to bfloat16
        out = out.to(torch.float16).to(out.dtype)
    if bug == "ragged_tail_rows":  # no program for the last, partial block of query rows: never written
        out[:, :, out.shape[2] - out.shape[2] % TAIL_BLOCK_M:] = 0.0
    lse = torch.where(seen, m + torch.log(l_safe), -math.inf).squeeze(-1)
    reported = lse
    if bug == "lse_base2":
        reported = lse / math.log(2)
    elif bug == "lse_without_max":
        reported = torch.where(seen, torch.log(l_safe), -math.inf).squeeze(-1)
    elif bug == "sink_not_in_lse" and sink is not None:  # log(Z - e^sink): the keys' own log-sum-exp
        reported = lse + torch.log1p(-torch.exp(sink[..., 0] - lse))
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return out, lse.to(lse_dtype), reported.to(lse_dtype)


def _backward(spec, weights, bug, q, k, v, out, lse, dout):
    cd = _compute_dtype(q.dtype, bug)
    heads, batches = _heads_and_batches(spec, bug, q.device)
    q, out, dout = q.to(cd), out.to(cd), dout.to(cd)
    kx, vx = k.to(cd)[batches][:, heads], v.to(cd)[batches][:, heads]
    s = q @ kx.transpose(-1, -2) * spec.scale
    slope = 1.0
    if spec.softcap is not None:
        t = torch.tanh(s / spec.softcap)
        s, slope = spec.softcap * t, 1 - t * t
    s = s + _bias(spec, bug, slice(0, spec.len_k), spec.len_k).to(s)
    allowed = _allowed(_backward_spec(spec, bug), bug, spec.len_k, q.device)
    p = torch.where(allowed, torch.exp(s - torch.where(lse == -math.inf, 0.0, lse.to(cd))[..., None]), 0.0)
    w = 1.0 if weights is None or bug == "dropout_backward" else weights.to(cd)
    dv_heads = (p * w).transpose(-1, -2) @ dout
    dp = (dout @ vx.transpose(-1, -2)) * w
    delta = dout.sum(-1, keepdim=True) if bug == "backward_delta" else (dout * out).sum(-1, keepdim=True)
    dbias = p * (dp - delta)  # the gradient of the final (biased) scores
    ds = dbias * slope
    dq = ds @ kx if bug == "dq_scale" else spec.scale * (ds @ kx)
    dk_heads = spec.scale * (ds.transpose(-1, -2) @ q)
    dk, dv = (_to_kv_heads(t, spec, heads, batches, bug) for t in (dk_heads, dv_heads))
    sink = _sink_logits(spec, cd, q.device)
    dsinks = None
    if sink is not None:  # d sink = -sum_{b, i} exp(sink - lse) D
        p_sink = torch.where(torch.isfinite(sink[..., 0]), torch.exp(sink[..., 0] - lse.to(cd)), 0.0)
        dsinks = -(p_sink * delta[..., 0]).sum(dim=(0, 2)) * (1.2 if bug == "dsinks_scaled" else 1.0)
    return dq, dk, dv, dsinks, None if spec.bias is None else dbias.sum_to_size(spec.bias.shape)


def _backward_spec(spec, bug):
    """The problem the backward recomputes P for (the forward's, but for these specimens)."""
    if bug == "batch_offset" and not spec.causal:
        return spec.replace(causal="top_left")  # the tutorial's backward always applies its causal mask
    if bug == "bwd_no_chunk":
        return spec.replace(chunk_size=None)
    if bug == "bwd_no_prefix":
        return spec.replace(prefix_lens=None)
    return spec


def _to_kv_heads(per_head, spec, heads, batches, bug):
    """Sum each query head's gradient into the KV head (and batch) it read."""
    out = torch.zeros(spec.batch, spec.heads_kv, *per_head.shape[2:], dtype=per_head.dtype, device=per_head.device)
    if bug == "gqa_backward_not_summed":
        out[:, heads] = per_head  # each head of a group overwrites the previous one's gradient
        return out
    by_head = torch.zeros_like(out).index_add_(1, heads, per_head)
    return torch.zeros_like(out).index_add_(0, batches, by_head)


class _Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, spec, weights, bug):
        out, lse, reported_lse = _forward(spec, weights, bug, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.weights, ctx.bug = spec, weights, bug
        ctx.mark_non_differentiable(reported_lse)
        return out.to(q.dtype), reported_lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        spec = ctx.spec
        dq, dk, dv, dsinks, dbias = _backward(spec, ctx.weights, ctx.bug, q, k, v, out, lse, dout)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None if dsinks is None else dsinks.to(spec.sinks.dtype),
                None if dbias is None else dbias.to(spec.bias.dtype), None, None, None)
