"""Packed variable-length batches (``cu_seqlens_q``, ``cu_seqlens_k``; :mod:`attnformal.features.varlen`).

A packed case holds sequences of 0, 1, block - 1, block and block + 1 tokens (queries and keys of
different lengths), under each mask family that applies per sequence, and with sinks (shared by every
sequence: d sinks sums over them) and ALiBi slopes ``[B, Hq]`` (row ``b`` for sequence ``b``); an
implementation that refuses those leaves their cases unsupported. It is judged against the reference
element by element (each sequence's own reference, on its packed rows), and by a metamorphic relation:
packing the same sequences in reverse order (per-sequence values with them) must give every sequence
the same result. A sequence whose output changes with its neighbours reads a key of another sequence
-- or, when its output is what every sequence reading sequence 0's slopes gives, the wrong row of slopes.

An implementation that refuses ``cu_seqlens_q`` (``NotImplementedError``, or no such keyword) makes
the check unsupported: the call is its own capability probe (a padded probe cannot carry the layout).
"""

from __future__ import annotations

import itertools

import torch

from attnformal.testing import compare_attention, tolerance_for
from attnformal.verify.cases import Shape, generator, make_case, randn
from attnformal.verify.checks import check
from attnformal.verify.checks.score_state import alibi_slopes_for, sink_logits
from attnformal.verify.diagnosis import DEFINITIVE, STRONG

HEADS_Q, HEADS_KV, HEAD_DIM = 2, 1, 32
FAMILIES = {  # name -> (keywords, lengths block-relative: the key lengths differ from the query lengths)
    "no mask": {},
    "causal bottom-right": {"causal": "bottom_right"},
    "window (5, 2)": {"window": (5, 2)},
    "causal + kv_lens": {"causal": "bottom_right", "kv_lens": "half"},
    "causal + sinks": {"causal": "bottom_right", "sinks": "per head"},
    "window (5, 2) + ALiBi per sequence": {"window": (5, 2), "alibi_slopes": "per sequence"},
}


def lengths(block: int) -> tuple[list[int], list[int]]:
    """Queries and keys per sequence: 0, 1, block - 1, block, block + 1 (Sq != Sk in most sequences)."""
    return [0, 1, block - 1, block, block + 1, 7], [3, 0, block, block + 1, block - 1, 7]


def packed_case(run, name, len_q, len_k, keywords):
    """A seeded packed case: q ``[Tq, Hq, D]``, k and v ``[Tk, Hkv, D]`` (values offset per sequence)."""
    gen = generator(run.seed(name))
    tq, tk = sum(len_q), sum(len_k)
    q, k = randn(gen, tq, HEADS_Q, HEAD_DIM), randn(gen, tk, HEADS_KV, HEAD_DIM)
    v = randn(gen, tk, HEADS_KV, HEAD_DIM) + torch.repeat_interleave(torch.linspace(-1, 1, len(len_k)),
                                                                      torch.tensor(len_k))[:, None, None]
    keywords = dict(keywords)
    if keywords.get("kv_lens") == "half":
        keywords["kv_lens"] = [(n + 1) // 2 for n in len_k]
    sequences = Shape(len(len_q), HEADS_Q, HEADS_KV, max(len_q), max(len_k), HEAD_DIM, HEAD_DIM)
    scores = generator(run.seed(name, "tensors"))
    if keywords.get("sinks") == "per head":  # in the case's dtype, as the padded checks pass them
        keywords["sinks"] = sink_logits(sequences, scores).to(run.dtype)
    if keywords.get("alibi_slopes") == "per sequence":  # a different row per sequence
        keywords["alibi_slopes"] = alibi_slopes_for(sequences, scores, per_batch=True)
    cu = {"cu_seqlens_q": [0, *itertools.accumulate(len_q)], "cu_seqlens_k": [0, *itertools.accumulate(len_k)]}
    return make_case(name, q, k, v, run.dtype, run.device, run.seed(name), grad_out=randn(gen, tq, HEADS_Q, HEAD_DIM),
                     **cu, **keywords)


def reversed_packing(case, len_q, len_k):
    """The same sequences packed in reverse order, and the map of its output rows back to the case's."""
    def blocks(t, sizes):
        return list(torch.split(t, sizes))

    kw = dict(case.kwargs)
    kw["cu_seqlens_q"] = [0, *itertools.accumulate(len_q[::-1])]
    kw["cu_seqlens_k"] = [0, *itertools.accumulate(len_k[::-1])]
    if "kv_lens" in kw:
        kw["kv_lens"] = list(kw["kv_lens"])[::-1]
    if "alibi_slopes" in kw:  # [B, Hq]: the rows go with their sequences
        kw["alibi_slopes"] = kw["alibi_slopes"].flip(0)
    moved = case.with_(name=f"{case.name}, sequences in reverse order", kwargs=kw,
                       q=torch.cat(blocks(case.q, len_q)[::-1]), k=torch.cat(blocks(case.k, len_k)[::-1]),
                       v=torch.cat(blocks(case.v, len_k)[::-1]))

    def back(out):
        return torch.cat(blocks(out, len_q[::-1])[::-1])

    return moved, back


@check("mask.packed")
def packed_sequences(run):
    """Packed sequences (cu_seqlens; lengths 0, 1, block +- 1): each as if alone, whatever its neighbours."""
    for block in run.pick([32], [32, 128]):  # full adds 128-key blocks to quick's 32 (the profiles nest)
        for name, keywords in FAMILIES.items():
            _packed_family(run, f"packed, {name}" + ("" if block == 32 else f", {block}-key blocks"), block,
                           keywords)


def _packed_family(run, name, block, keywords):
    """One packed case against the reference and packed in reverse order."""
    len_q, len_k = lengths(block)
    case = packed_case(run, name, len_q, len_k, keywords)
    record = run.against_reference(case, lse=_has(run, "lse"), backward=_has(run, "backward"))
    if record is None:
        return
    if _reads_first_slopes(run, case, record):
        run.find("batch_indexing", DEFINITIVE, f"{case.name}: every packed sequence reads sequence 0's ALiBi "
                                               "slopes (its output is that reference's)")
        return
    moved, back = reversed_packing(case, len_q, len_k)
    observed = run.observe(moved)
    if observed is None:
        return
    comparison = _same_output(run, back(observed.out), record)
    run.record(moved, comparisons=[comparison], observed=observed, expected=record.expected)
    if comparison.passed or not torch.isfinite(record.observed.out).all():
        return  # NaN: the checks of NaN name it; it says nothing about the neighbours
    leak = _neighbour_leak(run, case, record, len_k)
    if leak:
        run.find("packed_boundary_leak", DEFINITIVE, f"{case.name}: {leak} (it reads a key of another sequence)")
    elif leak is not None:
        run.find("packed_position", STRONG, f"{case.name}: a sequence's output changes when it is packed elsewhere, "
                                            "but not when its neighbours' keys change: it depends on its position")


def _same_output(run, out, record, rows=None):
    rtol, atol = tolerance_for(run.dtype)
    reference = record.observed.out if rows is None else record.observed.out[rows]
    out = out if rows is None else out[rows]
    return compare_attention(out, reference, dtype=run.dtype, rtol=2 * rtol, atol=2 * atol,
                             magnitude=record.expected.magnitude["out"][rows] if rows is not None else
                             record.expected.magnitude["out"], name="out")


def _neighbour_leak(run, case, record, len_k) -> str | None:
    """What changes when the keys and values of every other sequence are redrawn, positions kept: "" when no
    sequence's output changes, a sentence when one does, None when the implementation refused the call."""
    cu_q, cu_k = case.kwargs["cu_seqlens_q"], case.kwargs["cu_seqlens_k"]
    gen = generator(run.seed(case.name, "neighbours"))
    for parity in (0, 1):
        redrawn = [b for b in range(len(len_k)) if b % 2 != parity]
        k, v = case.k.clone(), case.v.clone()
        for b in redrawn:
            for t in (k, v):
                t[cu_k[b]:cu_k[b + 1]] = randn(gen, cu_k[b + 1] - cu_k[b], *t.shape[1:]).to(t)
        observed = run.observe(case.with_(name=f"{case.name}, neighbours redrawn", k=k, v=v))
        if observed is None:
            return None
        kept = torch.cat([torch.arange(cu_q[b], cu_q[b + 1]) for b in range(len(cu_q) - 1) if b % 2 == parity])
        if not _same_output(run, observed.out.cpu(), record, kept).passed:
            return f"the outputs of sequences {parity}, {parity + 2}, ... change when only their neighbours' keys " \
                   "and values are redrawn"
    return ""


def _reads_first_slopes(run, case, record) -> bool:
    """Whether a failing case's output is the reference of every sequence reading row 0 of the slopes."""
    slopes = case.kwargs.get("alibi_slopes")
    if record.status != "FAIL" or slopes is None:
        return False
    first = run.expected(case.with_(kwargs={**case.kwargs, "alibi_slopes": slopes[:1].expand_as(slopes)}))
    return compare_attention(record.observed.out, first.values["out"], dtype=run.dtype,
                             magnitude=first.magnitude["out"], name="out").passed


def _has(run, feature: str) -> bool:
    """Whether the implementation was not seen refusing ``feature`` (lse, backward) when probed."""
    return run.caps is None or not run.caps.refuses(feature)
