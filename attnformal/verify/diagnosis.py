"""Diagnosis: where a failure sits, and which bug most likely causes it, in plain words.

Evidence comes in three strengths:

* **localisation** (every failing comparison): which batches, heads, query rows or key
  columns fail, and whether they form a known pattern (every other head, all batches but
  the first, exactly the rows with no allowed key, the last partial key block);
* **explanations** (a failing case): the result equals the reference times a named
  constant (1/ln 2, the scale, 1 - p, the group size), or equals the reference of a
  *mutant* problem (heads mapped ``h % Hkv``, every batch reading batch 0, the other causal
  alignment, padding keys read as zeros, the group's gradient not summed);
* **targeted probes and controls** inside the checks (V = identity shows the probabilities
  and thus the mask actually used; increasing scores force the online softmax to rescale;
  a contiguous, MHA or dropout-free twin of a failing case that passes).

Each piece of evidence is a :class:`Finding` naming a :data:`BUG_CLASSES` entry (or none,
for a bare observation) with a weight; :func:`summarise` ranks the classes over a run.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass

import torch

from attnformal.features import FEATURES, mask_features, with_role
from attnformal.masks import MaskGeometry
from attnformal.oracle import oracle_from_spec
from attnformal.spec import AttentionSpec, SpecError

# Finding weights. DEFINITIVE: the observation rules every other class out (inputs changed by the
# call; identical calls that disagree). STRONG: a targeted probe, control or mutant names the class.
# PATTERN: the failure has the class's shape. HINT: consistent with it.
DEFINITIVE, STRONG, PATTERN, HINT = 4.0, 3.0, 2.0, 1.0
COMMON_BLOCKS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BugClass:
    id: str
    title: str


BUG_CLASSES = {c.id: c for c in (
    BugClass("acc_not_rescaled", "the output accumulator is not rescaled when the running maximum grows"),
    BugClass("denominator_not_rescaled", "the softmax denominator is not rescaled when the running maximum grows"),
    BugClass("mask_after_max", "masked scores take part in the row maximum (mask applied after the max), "
                               "so the allowed keys underflow"),
    BugClass("finite_mask_fill", "masked scores are filled with a finite value (like -1e4) instead of -inf"),
    BugClass("finite_mask_sentinel", "masked scores are lowered by a finite sentinel (s - 1e6) instead of set to "
                                     "-inf: masked keys win once they score that much above the allowed ones"),
    BugClass("nan_empty_rows", "rows with no allowed key give NaN/Inf (0/0) instead of output 0 and lse -inf"),
    BugClass("nan_first_block", "a row whose first key block is fully masked gives NaN although later keys are "
                                "allowed: exp(s - m) with m = -inf is not guarded in a block with no allowed key"),
    BugClass("ragged_block", "the last, partial block is mishandled (no bounds mask): keys past the end are read "
                             "as zeros that enter the softmax, or query rows past the last full block are never "
                             "written"),
    BugClass("causal_alignment", "the causal mask is aligned top-left where bottom-right was asked (or the reverse)"),
    *(BugClass(*f.edge_bug) for f in FEATURES if f.edge_bug is not None),  # a mask feature's edge
    BugClass("mask_wrong", "the mask admits or excludes keys it should not"),
    BugClass("gqa_head_mapping", "query heads read the wrong KV head (GQA mapping, e.g. h % Hkv instead of "
                                 "h // (Hq / Hkv))"),
    BugClass("gqa_backward_not_summed", "dK/dV of a shared KV head are not summed over its group of query heads"),
    BugClass("gradient_scale", "a gradient is off by a constant factor (a missing or extra scale)"),
    BugClass("backward_delta", "the backward's D = rowsum(dO * O) term is wrong"),
    BugClass("backward_wrong", "the backward is wrong while the forward is right"),
    BugClass("backward_mask", "the backward recomputes P without one of the forward's masks (e.g. the chunk or "
                              "the prefix): out and lse are right, the gradients are not"),
    BugClass("lse_base2", "lse is in base 2 instead of the natural log"),
    BugClass("lse_wrong", "lse is wrong while the output is right"),
    BugClass("dropout_scaling", "kept values are not rescaled by 1/(1-p)"),
    BugClass("dropout_rate", "the kept fraction is not 1 - p"),
    BugClass("dropout_backward", "the backward does not apply the forward's dropout mask"),
    BugClass("batch_indexing", "batches read or write the wrong batch's memory (e.g. all read batch 0, or a batch "
                               "offset that leaves batches >= 1 unwritten)"),
    BugClass("scale_ignored", "the scale argument is ignored or applied wrongly"),
    BugClass("keyword_ignored", "a keyword is accepted but ignored (e.g. window or softcap dropped): the result is "
                                "the reference of the problem without it"),
    BugClass("kv_lens_off_by_one", "kv_lens[b] is off by one key (one key too many or too few is read)"),
    BugClass("output_scaled", "the output is off by a uniform relative factor (out * c), and the gradients with it"),
    BugClass("dtype_wrong", "a result comes back in the wrong dtype"),
    BugClass("nan_output", "the output is NaN/Inf in rows that have keys, with no mask pattern explaining it "
                           "(e.g. an accumulator that starts as NaN)"),
    BugClass("softcap_wrong", "softcap is applied wrongly (e.g. before the scale)"),
    BugClass("sink_not_in_lse", "the attention sink is left out of lse (the output is normalised with it)"),
    BugClass("sink_value", "the attention sink carries a value into the output (it must only join the "
                           "denominator)"),
    BugClass("alibi_sign", "ALiBi's bias has the wrong sign (+slope * distance)"),
    BugClass("alibi_alignment", "ALiBi's distance is aligned top-left (|i - j|) instead of bottom-right "
                                "(|i + Sk - Sq - j|, flash-attention's convention)"),
    BugClass("packed_position", "a packed sequence's result depends on where it sits in the packed tensor "
                                "(positions or distances counted from the tensor's start, not the sequence's)"),
    BugClass("strides_mixed", "one tensor is read with another's strides (K with V's, or V with K's): wrong "
                              "whenever they have different layouts"),
    BugClass("strides_ignored", "non-contiguous inputs are read as if contiguous (strides ignored)"),
    BugClass("partials_overflow", "partial results are stored in a type of narrower range (bfloat16 partial "
                                  "outputs in float16): values past its finite maximum (65504) overflow"),
    BugClass("shape_regime", "one path the kernel chooses by shape (split-KV / flash-decoding for small Sq or many "
                             "key blocks, a block configuration) is wrong under one feature"),
    BugClass("low_precision_accumulation", "accumulation in low precision: the error grows with the sequence length"),
    BugClass("nondeterminism", "repeated identical calls disagree (a race or an uninitialised read)"),
    BugClass("unstable_softmax", "the softmax does not subtract the running maximum: exp overflows or "
                                 "underflows for large logits"),
    BugClass("head_specific", "one head computes differently from the others (e.g. a per-head parameter)"),
    BugClass("uninitialised_output", "part of the output is never written (uninitialised memory)"),
    BugClass("input_mutation", "the implementation modifies its inputs in place"),
    BugClass("contract", "the protocol's contract is broken (shape, dtype, missing gradient or a crash)"),
    BugClass("crash", "the implementation kills the process (segfault, abort, exit): often an out-of-bounds "
                      "access for the shapes named"),
    BugClass("hang", "a call of the implementation never returns (a deadlock, an endless loop, a wait on a "
                     "device that never finishes)"),
)}


@dataclass(frozen=True)
class Finding:
    bug: str | None  # a BUG_CLASSES id; None: an observation that names no class
    weight: float
    evidence: str

    def to_json(self) -> dict:
        return {"bug": self.bug, "weight": self.weight, "evidence": self.evidence}


def finding(bug, weight, evidence) -> Finding:
    assert bug is None or bug in BUG_CLASSES, f"unknown bug class {bug!r}"
    return Finding(bug, weight, evidence)


def contract_finding(message: str, case) -> tuple[str, float, str]:
    """``(bug, weight, evidence)`` of a broken contract: inputs changed in place and a wrong dtype are named."""
    if "in place" in message:
        return "input_mutation", DEFINITIVE, message
    wrong_dtype = re.fullmatch(r"(\w+) has dtype torch\.(\w+), expected torch\.(\w+)", message)
    if wrong_dtype:
        name, got, want = wrong_dtype.groups()
        return "dtype_wrong", DEFINITIVE, f"wrong dtype: expected {want}, got {got} ({name}, {case.name})"
    return "contract", PATTERN, message


# ---------------------------------------------------------------- localisation

def _ranges(indices) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    parts, start, prev = [], None, None
    for i in list(indices) + [None]:
        if start is None:
            start = prev = i
        elif i is not None and i == prev + 1:
            prev = i
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    return ", ".join(parts[:8]) + (", ..." if len(parts) > 8 else "")


def localise(name: str, over: torch.Tensor, case, expected) -> tuple[str, list[Finding]]:
    """Where ``over`` (elements of ``name`` beyond tolerance) sits, and the patterns it forms."""
    spec = case.spec
    per_axis = [over.transpose(0, a).reshape(over.shape[a], -1).any(1) for a in range(3)]
    batches, heads, rows = (torch.nonzero(x).flatten().tolist() for x in per_axis)
    nb, nh, nr = (over.shape[a] for a in range(3))
    kv_tensor = name in ("dk", "dv")  # indexed by KV head, not query head
    row_word = "key rows" if kv_tensor else "query rows"
    head_word = "KV heads" if kv_tensor and spec.group > 1 else "heads"
    text = (f"{name} fails at {int(over.sum())}/{over.numel()} elements in batches [{_ranges(batches)}] of {nb}, "
            f"{head_word} [{_ranges(heads)}] of {nh}, {row_word} [{_ranges(rows)}] of {nr}")
    found = []
    if nb > 1 and batches == list(range(1, nb)) and not _batch_zero_set_apart(name, over, case, expected):
        found.append(finding("batch_indexing", PATTERN, "every batch fails except batch 0, each nearly everywhere"))
    # A KV head of a GQA group holds the gradients of several query heads: "only KV head 0" would
    # contradict "only head 1" of the output, so only query-head tensors name a single head.
    if nh > 1 and len(heads) == 1 and len(batches) == nb and not (kv_tensor and spec.group > 1):
        found.append(finding("head_specific", PATTERN, f"only head {heads[0]} fails, in every batch"))
    if name not in ("dk", "dv") and spec.group > 1 and spec.heads_kv > 1:
        h = torch.arange(spec.heads_q)
        misread = torch.nonzero(h // spec.group != h % spec.heads_kv).flatten().tolist()
        if heads == misread:
            found.append(finding("gqa_head_mapping", PATTERN,
                                 f"exactly the heads whose h % Hkv differs from h // (Hq/Hkv) fail: {heads}"))
    if name in ("out", "lse", "dq") and expected.probabilities is not None:
        empty = expected.probabilities.sum(-1) == 0  # [B, Hq, Sq]
        failing_rows = over if name == "lse" else over.any(-1)
        if failing_rows.any() and bool((failing_rows <= empty).all()):
            found.append(_empty_row_finding(name, over, case))
    if name in ("dk", "dv") and spec.len_k % 16:
        tail = _ragged_tail_only(over, spec.len_k)
        if tail:
            found.append(finding("ragged_block", PATTERN, f"only keys of the last partial block of {tail} fail"))
    if name in ("out", "lse", "dq"):  # query rows: a partial last block of any size a kernel may use
        tail = _ragged_tail_only(over, spec.len_q)
        if tail:
            found.append(finding("ragged_block", PATTERN, f"only query rows past the last multiple of {tail} "
                                                          f"fail"))
    return text, found


MODERATE_SCORE = 20.0  # |scores| up to this: exp overflows in no accumulator, so a NaN is no overflow


def nan_output_finding(actual, expected, case) -> Finding | None:
    """NaN/Inf in nearly every row that has keys, on scores too small for exp to overflow: no mask pattern or
    empty row explains it (an accumulator that starts as NaN, an uninitialised denominator)."""
    if actual is None or expected.probabilities is None or 0 in actual.shape:
        return None
    has_keys = expected.probabilities.sum(-1) > 0  # [B, Hq, Sq]
    bad = (~torch.isfinite(actual.detach().cpu())).any(-1) & has_keys
    if not has_keys.any() or float(bad.sum()) < 0.9 * float(has_keys.sum()) or _largest_score(case) > MODERATE_SCORE:
        return None
    return finding("nan_output", STRONG, f"out is NaN/Inf in {int(bad.sum())} of the {int(has_keys.sum())} rows that "
                                         f"have keys, on scores of at most {_largest_score(case):.3g}")


def _largest_score(case) -> float:
    spec = case.spec
    q, k = case.q.detach().double().cpu(), case.k.detach().double().cpu()[:, spec.kv_heads()]
    s = spec.scale * q @ k.transpose(-1, -2)
    return float(s.abs().max()) if s.numel() else 0.0


def rotated_batches(case):
    """``case`` with its batches rotated (new batch b is old batch b + 1; old batch 0 goes last), per-batch lists
    with them; None when a keyword tensor has a batch dimension (its rotation is not attempted here)."""
    spec = case.spec
    if any(isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[0] == spec.batch for v in case.kwargs.values()):
        return None
    order = torch.roll(torch.arange(spec.batch), -1).to(case.q.device)
    kw = dict(case.kwargs)
    for f in _per_batch(spec):
        kw[f.name] = [kw[f.name][b] for b in order.tolist()]
    grad_out = None if case.grad_out is None else case.grad_out[order].contiguous()
    return case.with_(name=f"{case.name}, batches rotated", q=case.q[order].contiguous(),
                      k=case.k[order].contiguous(), v=case.v[order].contiguous(), grad_out=grad_out, kwargs=kw)


def rotation_finding(failing_before: list[int], failing_after: list[int], nb: int) -> Finding | None:
    """What rotating the batches says of "every batch fails except batch 0": the failure stays with the batch
    positions (a batch offset), or follows the data (batch 0's data, now last, is still right)."""
    if failing_after == failing_before:
        return finding("batch_indexing", STRONG, "with the batches rotated (batch 0's data now last) batch 0 is still "
                                                 "right and the others fail: the failure goes with the batch index, "
                                                 "not with the data")
    if failing_after == list(range(0, nb - 1)):
        return finding(None, HINT, "with the batches rotated the failure follows the data of batches 1.. (batch "
                                   "0's data, now last, is right): something in those batches' data, no batch offset")
    return None


def _batch_zero_set_apart(name, over, case, expected) -> bool:
    """Whether something other than a batch offset explains that only batch 0 is right: batch 0 has no key
    (nothing to get wrong), a per-batch feature gives it a value no failing batch has (kv_lens = Sk),
    the failing rows are exactly the rows without a key, or the failing batches fail only in a few rows
    (a batch offset makes a whole batch wrong; a few rows, or one head of two, in batch 1 are a coincidence)."""
    spec = case.spec
    rows = over if name == "lse" else over.any(-1)  # [B, heads, rows]
    if any(float(rows[b].float().mean()) <= 0.5 for b in range(1, rows.shape[0])):
        return True
    for f in _per_batch(spec):
        values = list(getattr(spec, f.name))
        if values[0] not in values[1:]:
            return True
    if name in ("out", "lse", "dq") and expected.probabilities is not None:
        has_keys = expected.probabilities.sum(-1) > 0  # [B, Hq, Sq]
        if not bool(has_keys[0].any()) or not bool((rows & has_keys).any()):
            return True
    return False


def _empty_row_finding(name, over, case) -> Finding:
    return finding(None, HINT, f"{name} fails only on rows with no allowed key")


def _ragged_tail_only(over, len_k):
    failing = torch.nonzero(over.transpose(0, 2).reshape(len_k, -1).any(1)).flatten()
    for block in COMMON_BLOCKS:
        start = len_k - len_k % block
        if start > 0 and len_k % block and failing.numel() and int(failing.min()) >= start:
            return block
    return None


# ---------------------------------------------------------------- explanations: constant factors

def named_constants(case) -> dict[str, float]:
    """Constants a wrong factor is likely to be, the case's own first (they win ties)."""
    spec = case.spec
    consts = {"the scale": spec.scale, "1/scale": 1 / spec.scale}
    if spec.dropout_p > 0:
        consts.update({"1-p": 1 - spec.dropout_p, "1/(1-p)": 1 / (1 - spec.dropout_p)})
    if spec.group > 1:
        consts.update({"Hq/Hkv": float(spec.group), "Hkv/Hq": 1 / spec.group})
    consts.update({"1/ln 2": 1 / math.log(2), "ln 2": math.log(2), "2": 2.0, "1/2": 0.5, "-1": -1.0})
    return consts


def name_factor(c: float, case, within=0.01) -> str | None:
    """The named constant closest to ``c`` (relative difference below ``within``), if any."""
    close = [(abs(c / value - 1), label) for label, value in named_constants(case).items()
             if abs(c / value - 1) < within]
    return min(close)[1] if close else None


def constant_factor(actual, reference) -> float | None:
    """``c`` when ``actual`` is ``c * reference`` for a constant ``c != 1`` (within 1% of the reference's norm,
    and explaining nearly all of the difference), else None."""
    a, r = actual.detach().double().cpu(), reference.double()
    keep = torch.isfinite(r) & torch.isfinite(a)
    a, r = a[keep], r[keep]
    norm = float(r.norm())
    if not norm or not torch.isfinite(a).all():
        return None
    c = float((a * r).sum() / (r * r).sum())
    residual = float((a - c * r).norm())
    if c == 0 or abs(c - 1) < 1e-3 or residual > 0.01 * norm or residual > 0.1 * float((a - r).norm()):
        return None  # (c = 0: a zero result, no scaling)
    return c


def factor_finding(name: str, actual, reference, case, *, out_factor: float | None = None) -> Finding | None:
    """If ``actual`` is ``c * reference`` for a constant ``c != 1``, say so (and name ``c``). ``out_factor``:
    the output's own factor in the same case; a gradient with that factor inherits it from the output."""
    c = constant_factor(actual, reference)
    if c is None:
        return None
    label = name_factor(c, case)
    what = f"{name} = {c:.4g} x the reference" + (f" (= {label})" if label else "")
    if name in ("dq", "dk", "dv") and out_factor is not None and abs(c / out_factor - 1) < 0.01:
        return finding("output_scaled", PATTERN, f"{what}, as the output is: the gradients of c * out")
    if name != "out" and abs(c - 1) < 0.02:
        return None  # a gradient within 2% of a factor: rounding of a scale, not a missing one
    return finding(_factor_bug(name, label), STRONG if label else PATTERN, what)


def _factor_bug(name, label):
    if name == "lse":
        return "lse_base2" if label == "1/ln 2" else "lse_wrong"
    if label in ("1-p", "1/(1-p)"):  # the forward's missing (or doubled) 1/(1-p), carried into the backward
        return "dropout_scaling"
    if name == "out":
        return "output_scaled"
    if label in ("Hq/Hkv", "Hkv/Hq") and name in ("dk", "dv"):
        return "gqa_backward_not_summed"
    return "gradient_scale"


# ---------------------------------------------------------------- explanations: mutant problems

def _reference_of(q, k, v, grad_out, **kwargs):
    spec = AttentionSpec.from_inputs(q, k, v, **kwargs)
    leaves = [t.detach().cpu().double().requires_grad_(grad_out is not None) for t in (q, k, v)]
    out, lse = oracle_from_spec(spec, *leaves)
    values = {"out": out.detach(), "lse": lse.detach()}
    if grad_out is not None:
        values.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, grad_out.double().cpu())))
    return values


def _cpu_kwargs(case):
    return {key: (v.cpu() if isinstance(v, torch.Tensor) else v) for key, v in case.kwargs.items()}


def _mutants(case, backward: bool):
    """``(bug, description, compute)`` for each mutant problem that differs from the case."""
    spec = case.spec
    q, k, v = (t.detach().cpu().double() for t in (case.q, case.k, case.v))
    grad_out = case.grad_out.detach().cpu().double() if backward else None
    kw = _cpu_kwargs(case)
    if spec.group > 1 and spec.heads_kv > 1:
        modulo = torch.arange(spec.heads_q) % spec.heads_kv
        yield ("gqa_head_mapping", "query head h reads KV head h % Hkv",
               lambda: _reference_of(q, k[:, modulo], v[:, modulo], grad_out, **kw))
    if spec.batch > 1:
        first = torch.zeros(spec.batch, dtype=torch.long)
        kw0 = {**kw, **{f.name: [getattr(spec, f.name)[0]] * spec.batch for f in _per_batch(spec)}}
        yield ("batch_indexing", "every batch reads K and V of batch 0",
               lambda: _reference_of(q, k[first], v[first], grad_out, **kw0))
        if kw0 != kw:
            yield ("batch_indexing", "every batch reads K and V of batch 0 (with its own per-batch lengths)",
                   lambda: _reference_of(q, k[first], v[first], grad_out, **kw))
        yield ("batch_indexing", "every batch reads Q, K and V of batch 0",
               lambda: _reference_of(q[first], k[first], v[first], grad_out, **kw0))
    if spec.causal and spec.len_q != spec.len_k:
        other = "top_left" if spec.causal == "bottom_right" else "bottom_right"
        yield ("causal_alignment", f"causal={other!r} was used instead of {spec.causal!r}",
               lambda: _reference_of(q, k, v, grad_out, **{**kw, "causal": other}))
    for dropped in _droppable_subsets(kw):
        bug = {("scale",): "scale_ignored", ("kv_lens",): "kv_lens_ignored"}.get(dropped, "keyword_ignored")
        yield (bug, f"{_and(dropped)} {'was' if len(dropped) == 1 else 'were'} ignored",
               functools.partial(_reference_of, q, k, v, grad_out, **{**kw, **dict.fromkeys(dropped)}))
    if spec.kv_lens is not None and any(n < spec.len_k for n in spec.kv_lens):
        longer = [min(n + 1, spec.len_k) for n in spec.kv_lens]
        yield ("kv_lens_off_by_one", "batch b reads kv_lens[b] + 1 keys",
               lambda: _reference_of(q, k, v, grad_out, **{**kw, "kv_lens": longer}))
    for f in _per_batch(spec) if spec.batch > 1 else ():
        rolled = [*getattr(spec, f.name)[1:], getattr(spec, f.name)[0]]
        if f.edge_bug is not None and rolled != list(getattr(spec, f.name)):
            yield (f.edge_bug[0], f"batch b was given {f.name} of batch b + 1",
                   functools.partial(_reference_of, q, k, v, grad_out, **{**kw, f.name: rolled}))
    yield from _score_state_mutants(spec, q, k, v, grad_out, kw)
    yield from _prefix_after_kv_lens(spec, q, k, v, grad_out, kw)
    if _mask_free(kw) and all(kw.get(n) is None for n in ("bias", "alibi_slopes", "dropout_mask")):  # zero keys
        for block in COMMON_BLOCKS:  # appended would need bias and keep-mask columns, and move ALiBi's alignment
            if spec.len_k % block and spec.len_k > block // 2:
                yield ("ragged_block", f"the last key block (block size {block}) is padded with zero keys "
                                       f"that enter the softmax",
                       _padded_reference(q, k, v, grad_out, kw, block))
    if backward and spec.group > 1:
        for pick in ("first", "last"):
            yield ("gqa_backward_not_summed", f"dK/dV of each KV head come from the {pick} query head of its "
                                              f"group only", _one_head_gradients(q, k, v, grad_out, kw, spec, pick))


IGNORABLE = ("scale", "causal", "window", "softcap", "attn_mask", "kv_lens", "chunk_size", "prefix_lens", "sinks",
             "alibi_slopes", "bias")  # keywords a kernel may take and then drop (dropout is judged by its own checks)
MAX_DROPPED = 3


def _droppable_subsets(kw):
    """Every set of up to MAX_DROPPED of the case's active keywords a kernel could silently ignore."""
    active = [n for n in IGNORABLE if kw.get(n) is not None and n in _ACTIVE_TEST and _ACTIVE_TEST[n](kw[n])]
    return [c for size in range(1, min(MAX_DROPPED, len(active)) + 1) for c in itertools.combinations(active, size)]


def _and(names) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


_ACTIVE_TEST = {"scale": lambda value: True, **{f.name: f.active for f in FEATURES}}


def _score_state_mutants(spec, q, k, v, grad_out, kw):
    """Mutants of sinks and ALiBi: the sink missing from lse only, ALiBi's sign or alignment wrong."""
    if spec.sinks is not None and bool(torch.isfinite(spec.sinks).any()):
        yield ("sink_not_in_lse", "lse leaves the sinks out (the output keeps them)",
               lambda: {"lse": _reference_of(q, k, v, None, **{**kw, "sinks": None})["lse"]})
    if spec.alibi_slopes is not None and bool(spec.alibi_slopes.any()):
        yield ("alibi_sign", "ALiBi's bias is +slope * distance",
               lambda: _reference_of(q, k, v, grad_out, **{**kw, "alibi_slopes": -kw["alibi_slopes"]}))
        if spec.len_q != spec.len_k or spec.kv_lens is not None:
            yield ("alibi_alignment", "ALiBi's distance is |i - j| (aligned top-left)",
                   lambda: _reference_of(q, k, v, grad_out, **_aligned_alibi(spec, kw, spec.len_q)))
        if spec.kv_lens is not None and any(n != spec.len_k for n in spec.kv_lens):
            yield ("alibi_alignment", "ALiBi's distance is aligned with Sk, not kv_lens[b]",
                   lambda: _reference_of(q, k, v, grad_out, **_aligned_alibi(spec, kw, spec.len_k)))


def _aligned_alibi(spec, kw, len_k) -> dict:
    """The keywords with ALiBi replaced by the bias ``-slope |i + len_k - Sq - j|`` of one key length for every
    batch (``len_k = Sq``: top-left, ``|i - j|``), added to any bias."""
    from attnformal.features.alibi import alibi_bias

    i, j = torch.arange(spec.len_q)[:, None], torch.arange(spec.len_k)[None, :]
    slopes = spec.alibi_slopes.double().cpu()[:, :, None, None]
    aligned = alibi_bias(i, j, slopes, spec.len_q, len_k)
    bias = aligned if kw.get("bias") is None else aligned + kw["bias"].double()
    return {**kw, "alibi_slopes": None, "bias": bias}


def _prefix_after_kv_lens(spec, q, k, v, grad_out, kw):
    """The mutant whose prefix is ORed in after kv_lens (keys past kv_lens[b] inside the prefix are read), as an
    explicit mask; only where some prefix is longer than its kv_lens and no ALiBi needs kv_lens's alignment."""
    prefix, lengths = spec.prefix_lens, spec.kv_lens
    if prefix is None or lengths is None or spec.alibi_slopes is not None or \
            not any(p > n for p, n in zip(prefix, lengths)):
        return
    j = torch.arange(spec.len_k)
    inside = torch.stack([j < min(p, spec.len_k) for p in prefix])[:, None, None, :]
    mask = spec.allowed().cpu() | inside
    dropped = dict.fromkeys(("causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask"))
    yield ("prefix_wrong", "the prefix is ORed in after kv_lens (keys past kv_lens[b] inside the prefix are read)",
           lambda: _reference_of(q, k, v, grad_out, **{**kw, **dropped, "attn_mask": mask}))


def _per_batch(spec: AttentionSpec):
    """The active features with one value per batch element (kv_lens, prefix_lens, ...)."""
    return [f for f in FEATURES if f.per_batch and f.active(getattr(spec, f.name))]


def _mask_free(kw) -> bool:
    return not any(f.active(kw.get(f.name)) for f in mask_features())


def _padded_reference(q, k, v, grad_out, kw, block):
    def run():
        pad = block - k.shape[2] % block
        k_pad = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], 2)
        v_pad = torch.cat([v, v.new_zeros(*v.shape[:2], pad, v.shape[3])], 2)
        values = _reference_of(q, k_pad, v_pad, grad_out, **kw)
        for name in ("dk", "dv"):
            if name in values:
                values[name] = values[name][:, :, : k.shape[2]]
        return values
    return run


def _one_head_gradients(q, k, v, grad_out, kw, spec, pick):
    def run():
        heads = spec.kv_heads()
        values = _reference_of(q, k[:, heads], v[:, heads], grad_out, **kw)  # one KV head per query head
        member = 0 if pick == "first" else spec.group - 1
        for name in ("dk", "dv"):
            values[name] = values[name].unflatten(1, (spec.heads_kv, spec.group))[:, :, member]
        return values
    return run


def mutant_findings(case, observed, failing: dict[str, float], *, backward: bool,
                    passing: dict[str, float] | None = None) -> list[Finding]:
    """Mutant problems whose reference explains the failing tensors far better than the true one.

    ``failing`` maps each failing tensor name to its largest error against the true reference;
    a mutant explains the result when its own largest error is below 5% of that for every
    failing tensor, and it does not contradict a tensor that passed (``passing``, the same errors):
    there its error stays within 20 times the true reference's or 5% of the smallest failing error.
    """
    passing = passing or {}
    agree = min(failing.values(), default=0.0) * 0.05
    if not all(math.isfinite(e) for e in failing.values()):
        return []  # NaN or Inf in the result: no mutant's finite values can explain it
    found = []
    for bug, description, compute in _mutants(case, backward):
        try:
            values = compute()
        except SpecError:  # the problem without that keyword does not exist (a prefix needs a causal mode)
            continue
        if all(name in values and values[name].shape == observed.get(name).shape
               and _max_error(observed.get(name), values[name]) <= 0.05 * error for name, error in failing.items()) \
                and all(_max_error(observed.get(name), values[name]) <= max(20 * error, agree)
                        for name, error in passing.items() if name in values and observed.get(name) is not None
                        and values[name].shape == observed.get(name).shape):
            found.append(finding(bug, STRONG, f"the result matches a problem where {description}"))
    return found


def _max_error(actual, reference) -> float:
    diff = (actual.detach().double().cpu() - reference.double()).abs()
    same = torch.isinf(reference) & (actual.detach().double().cpu() == reference)
    diff = torch.where(same, 0.0, diff).nan_to_num(nan=math.inf)
    return float(diff.max()) if diff.numel() else 0.0


def strides_mixed_findings(record) -> list[Finding]:
    """Whether a failing case's output is what reading K with V's strides (or V with K's) gives.

    Each mutant reads the tensor's own storage through the other's strides, where that stays inside
    the storage; it explains the result when its error is below 5% of the true reference's."""
    case, observed = record.case, record.observed
    error = _max_error(observed.out, record.expected.values["out"])
    if not math.isfinite(error) or case.k.shape != case.v.shape or case.k.stride() == case.v.stride():
        return []
    found = []
    for reader, other, label in ((case.k, case.v, "K is read with V's strides"),
                                 (case.v, case.k, "V is read with K's strides")):
        misread = _read_with(reader, other.stride())
        if misread is None:
            continue
        k, v = (misread, case.v) if reader is case.k else (case.k, misread)
        mutant = _reference_of(case.q, k, v, None, **_cpu_kwargs(case))["out"]
        if _max_error(observed.out, mutant) <= 0.05 * error:
            found.append(finding("strides_mixed", STRONG, f"the result matches a problem where {label} "
                                                          f"({list(other.stride())} for {list(reader.stride())})"))
    return found


def _read_with(t: torch.Tensor, stride) -> torch.Tensor | None:
    """``t``'s storage read through ``stride`` (from its own offset), or None when that leaves the storage."""
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, stride))
    if last >= t.untyped_storage().nbytes() // t.element_size():
        return None
    return t.as_strided(t.shape, stride, t.storage_offset())


# ---------------------------------------------------------------- probabilities: the mask actually used

def support_findings(p_impl: torch.Tensor, case) -> tuple[list[str], list[Finding]]:
    """Compare where the implementation's probabilities are non-zero with the allowed pairs.

    ``p_impl`` is ``[B, Hq, Sq, Sk]`` (the output with V = identity). Extra or missing keys
    are attributed to the boundary they sit next to: the causal edge, a window edge, kv_lens.
    """
    spec = case.spec
    allowed = spec.allowed().cpu()
    p_impl = p_impl.detach().cpu()
    nonzero = p_impl != 0
    # Rows whose probabilities vanished altogether underflowed or were never normalised: that is
    # not a mask the kernel used, so only rows that kept most of their mass are compared. Rows with no
    # allowed key are the empty-row checks' to judge: a finite fill spreads them over every key, which
    # reads as a boundary (kv_lens = 0 as "keys beyond the kv_lens edge") that is not the kernel's bug.
    normalised = (p_impl.sum(-1, keepdim=True) > 0.5) & allowed.any(-1, keepdim=True)
    extra, missing = nonzero & ~allowed & normalised, ~nonzero & allowed & normalised
    if not extra.any() and not missing.any():
        return [], []
    texts = [f"probabilities non-zero at {int(extra.sum())} masked positions and zero at {int(missing.sum())} "
             f"allowed ones"]
    if spec.causal and spec.len_q != spec.len_k:
        other = "top_left" if spec.causal == "bottom_right" else "bottom_right"
        other_allowed = AttentionSpec.from_inputs(case.q.cpu(), case.k.cpu(), case.v.cpu(),
                                                  **{**_cpu_kwargs(case), "causal": other}).allowed()
        if torch.equal(nonzero, other_allowed):
            return texts, [finding("causal_alignment", STRONG,
                                   f"the probabilities follow causal={other!r} exactly, not {spec.causal!r}")]
    counts = _edge_counts(extra, missing, spec)
    total = int(extra.sum() + missing.sum())
    edge, n = max(counts.items(), key=lambda item: item[1])
    texts.append("violations by boundary: " + ", ".join(f"{k}: {v}" for k, v in counts.items() if v))
    if n >= 0.9 * total and edge != "elsewhere":
        bug = next(f.edge_bug[0] for f in FEATURES if f"{f.name} edge" == edge)
        if edge == "kv_lens edge" and extra.any() and _one_past_the_length(extra, spec):
            return texts, [finding("kv_lens_off_by_one", STRONG, f"the mask admits exactly one key past kv_lens[b] "
                                                                 f"({n} positions), nowhere else")]
        how = "admits keys beyond" if extra.sum() >= missing.sum() else "drops the last keys inside"
        return texts, [finding(bug, STRONG, f"the mask {how} the {edge} ({n} positions), nowhere else")]
    return texts, [finding("mask_wrong", PATTERN, f"{texts[0]}, not next to one boundary")]


def _one_past_the_length(extra, spec: AttentionSpec) -> bool:
    """Whether every key a batch admits past its key length is the one key just past it."""
    for b in range(spec.batch):
        n = spec.geometry(b).len_k
        if bool(extra[b][..., n + 1:].any()):
            return False
    return True


def _edge_counts(extra, missing, spec: AttentionSpec) -> dict[str, int]:
    """How many violations sit one key past / on each boundary of each row's allowed interval, by the
    mask feature that sets that boundary (:func:`_edge_owners`); keys past the length count for it."""
    owners = [f.name for f in FEATURES if f.edge_bug is not None]
    length = next(f.name for f in with_role("length") if f.edge_bug is not None)
    counts = {**{f"{name} edge": 0 for name in owners}, "elsewhere": 0}
    j = torch.arange(spec.len_k)
    i = torch.arange(spec.len_q)[:, None]
    for b in range(spec.batch):
        g = spec.geometry(b)
        (lo, lo_owner), (hi, hi_owner) = _edge_owners(i, g, owners, owners.index(length))
        bad_extra, bad_missing = extra[b], missing[b]  # [Hq, Sq, Sk]
        beyond = j[None, :] >= g.len_k
        near_hi = ((j[None, :] == hi + 1) & bad_extra) | ((j[None, :] == hi) & bad_missing)
        near_lo = (((j[None, :] == lo - 1) & bad_extra) | ((j[None, :] == lo) & bad_missing)) & ~near_hi
        kv = bad_extra & beyond
        for code, name in enumerate(owners):
            counts[f"{name} edge"] += int((near_hi & (hi_owner == code) & ~kv).sum())
            counts[f"{name} edge"] += int((near_lo & (lo_owner == code) & ~kv).sum())
        counts[f"{length} edge"] += int(kv.sum())
        counts["elsewhere"] += int(((bad_extra | bad_missing) & ~near_hi & ~near_lo & ~kv).sum())
    return counts


UNBOUNDED = 2**62  # an interval end no feature reaches: what a feature's narrowing of it leaves is its own bound


def _edge_owners(i, g: MaskGeometry, owners: list[str], length: int):
    """``((lo, owner), (hi, owner))`` per row ``i`` (``[Sq, 1]``; owner: an index into ``owners``, -1 for
    none): the key interval narrowed by the spec's own mask features one at a time, as
    :func:`attnformal.masks.key_interval` does, and the feature whose own bound is each end. The upper
    end starts as the key length's (``length``) and the lower end as nobody's; on a tie an end stays with
    the earlier feature, except that the first feature to reach the start value takes it over."""
    lo, hi = torch.zeros_like(i), torch.full_like(i, g.len_k - 1)
    lo_owner, hi_owner = torch.full_like(i, -1), torch.full_like(i, length)
    start_lo, start_hi = lo_owner.clone(), hi_owner.clone()
    for f in with_role("interval"):
        value = g.values.get(f.name)
        if not f.active(value):
            continue
        new_lo, new_hi = (torch.as_tensor(x).expand_as(i) for x in f.narrow(i, lo, hi, value, g))
        if f.name not in owners:  # a feature with no edge of its own: the ends move, their owners stay
            lo, hi = new_lo, new_hi
            continue
        own_lo = torch.as_tensor(f.narrow(i, torch.full_like(i, -UNBOUNDED), hi, value, g)[0]).expand_as(i)
        own_hi = torch.as_tensor(f.narrow(i, lo, torch.full_like(i, UNBOUNDED), value, g)[1]).expand_as(i)
        code = owners.index(f.name)
        takes_hi = (new_hi > hi) | ((own_hi == new_hi) & ((new_hi < hi) | (hi_owner == start_hi)))
        takes_lo = (own_lo == new_lo) & ((new_lo > lo) | (lo_owner == start_lo))
        hi_owner, lo_owner = torch.where(takes_hi, code, hi_owner), torch.where(takes_lo, code, lo_owner)
        lo, hi = new_lo, new_hi
    return (lo, lo_owner), (hi, hi_owner)


# ---------------------------------------------------------------- the verdict of a run

# How one finding explains another in the same failing check. A DOMINANT class, once found in a check, explains
# every other finding there (earlier entries explain later ones): a result of the wrong dtype is no result, and a
# batch never written makes any probe of that batch fail somehow (a wrong mask, a race, a dropout rate). A GENERIC
# class is a symptom that any specific class beside it explains; EXPLAINS lists the symptoms a class produces.
DOMINANT = ("dtype_wrong", "batch_indexing")
GENERIC = ("mask_wrong", "backward_wrong", "contract")  # backward_mask is specific: it names the mask
EXPLAINS = {"output_scaled": ("gradient_scale",), "keyword_ignored": ("softcap_wrong",),
            "prefix_wrong": ("kv_lens_ignored",),  # the keys past kv_lens a wrong prefix admits
            "nan_output": ("nan_first_block", "nan_empty_rows", "mask_after_max", "unstable_softmax")}
BACKWARD_CAUSES = ("gradient_scale", "backward_delta", "backward_mask", "gqa_backward_not_summed", "dropout_backward",
                   "output_scaled", "nan_empty_rows")
BREADTH = 0.2  # score per further failing check a class explains ...
MAX_BREADTH = 7  # ... counted up to this many: breadth lifts a class by at most 1.4, less than two weight steps


def explained_by(bug: str, present) -> str | None:
    """The class among ``present`` (the classes found in the same check) that explains ``bug``, if any."""
    for other in present:
        if other == bug:
            continue
        if bug == "backward_wrong":  # found on a case whose forward is right: only a backward's cause explains it
            if other in BACKWARD_CAUSES:
                return other
            continue
        if other in DOMINANT and (bug not in DOMINANT or DOMINANT.index(other) < DOMINANT.index(bug)):
            return other
        if (bug in GENERIC and other not in GENERIC) or bug in EXPLAINS.get(other, ()):
            return other
    return None


@dataclass
class Ranked:
    bug: str
    title: str
    score: float
    evidence: list[str]
    checks: list[str]  # the failing checks this class explains


def summarise(results) -> list[Ranked]:
    """Rank the bug classes that explain the failing checks: a class's strongest finding, lifted by how many
    failing checks it explains (:data:`BREADTH`); a finding another one in its check explains
    (:func:`explained_by`) counts for that one only."""
    ranked: dict[str, Ranked] = {}
    weight: dict[str, float] = {}
    for result in results:
        if result.status != "FAIL":
            continue
        present = list(dict.fromkeys(f.bug for f in result.findings if f.bug is not None))
        for f in result.findings:
            if f.bug is None or explained_by(f.bug, present):
                continue
            entry = ranked.setdefault(f.bug, Ranked(f.bug, BUG_CLASSES[f.bug].title, 0.0, [], []))
            weight[f.bug] = max(weight.get(f.bug, 0.0), f.weight)
            entry.evidence.append(f"{result.label}: {f.evidence}")
            if result.label not in entry.checks:
                entry.checks.append(result.label)
    for bug, entry in ranked.items():
        entry.score = weight[bug] + BREADTH * min(len(entry.checks) - 1, MAX_BREADTH) \
            + 0.001 * min(len(entry.evidence), 50)
    return sorted(ranked.values(), key=lambda r: -r.score)
