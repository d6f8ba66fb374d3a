"""Structure that holds exactly, whatever the tolerance.

* With ``V = I`` (``Dv = Sk``) the output *is* the probability matrix P: masked positions
  must be exactly 0, entries non-negative, non-empty rows sum to 1, and the largest logit
  gets the largest weight. Where P is non-zero tells which mask the kernel really used.
* Metamorphic relations compare the implementation with itself: adding a constant to
  every logit of a row, permuting keys with their values and mask columns, permuting
  batches and heads. Inputs lie on a coarse grid, so the transformed inputs are exact.
* Repeated identical calls must agree, with freed NaN-filled memory in between so that
  an uninitialised read shows.
"""

from __future__ import annotations

import torch

from attnformal.testing import compare_attention, tolerance_for
from attnformal.verify.cases import generator, make_case, randn, random_attn_mask, shape, value_offsets
from attnformal.verify.checks import check
from attnformal.verify.diagnosis import DEFINITIVE, STRONG, support_findings

CLEAR_WINNER = 1.1  # the top probability exceeds the runner-up by 10%: rounding cannot swap them
NEGATIVE = "logits ~ -2e4, causal + attn_mask"  # a finite mask fill (-1e4) would outweigh every allowed key


# -- the probabilities themselves


def _with_identity_values(case):
    sk = case.spec.len_k
    eye = torch.eye(sk, dtype=case.dtype, device=case.q.device)
    v = eye.expand(case.spec.batch, case.spec.heads_kv, sk, sk).clone()
    return case.with_(v=v)


def probability_cases(run):
    gen = generator(run.seed("masks"))
    sh = shape(2, 2, 2, 30, 70, 70)

    def identity_case(name, sh, **kw):
        return run.random_case(name, sh, grad=False, identity_values=True, **kw)

    negative = identity_case(NEGATIVE, shape(2, 2, 2, 30, 45, 45), scale=1.0, causal="bottom_right",
                             attn_mask=random_attn_mask(gen, shape(2, 2, 2, 30, 45, 45), 0.7))
    negative.q[..., 0], negative.k[..., 0] = 1.0, -2e4
    cases = [
        identity_case("no mask (ragged Sk)", shape(2, 2, 2, 20, 100, 100)),
        identity_case("causal top-left Sq < Sk", sh, causal="top_left"),
        identity_case("causal bottom-right Sq < Sk", sh, causal="bottom_right"),
        identity_case("causal bottom-right Sq > Sk", shape(2, 2, 2, 70, 30, 30), causal="bottom_right"),
        identity_case("causal top-left Sq > Sk", shape(2, 2, 2, 70, 30, 30), causal="top_left"),
        identity_case("window (5, 2)", sh, window=(5, 2)),
        identity_case("window (0, 3) + causal", sh, window=(4, 0), causal="bottom_right"),
        identity_case("kv_lens", sh, kv_lens=[70, 23]),
        identity_case("chunk 8 (Sq < Sk)", sh, chunk_size=8),
        identity_case("prefix per batch + causal", sh, causal="bottom_right", prefix_lens=[50, 9]),
        identity_case("attn_mask", sh, attn_mask=random_attn_mask(gen, sh, 0.5)),
        negative,
    ]
    return [_with_identity_values(c) for c in cases]


@check("softmax.probabilities", names_causes=True)
def probabilities(run):
    """V = I: P itself -- masked entries exactly 0, rows sum to 1, >= 0, argmax = largest logit."""
    leaked = {}
    for case in probability_cases(run):
        record = run.against_reference(case)
        if record is None:
            continue
        p = record.observed.out.double().cpu()
        problems = _probability_problems(case, p, record.expected)
        leaked[case.name] = any("masked positions" in problem for problem in problems)
        if problems:
            run.fail(record, problems)
            if case.name != NEGATIVE:
                texts, found = support_findings(p.nan_to_num(nan=0.0), case)
                run.notes.extend(f"{case.name}: {t}" for t in texts)
                run.findings.extend(found)
    if leaked.get(NEGATIVE) and not any(v for name, v in leaked.items() if name != NEGATIVE):
        run.find("finite_mask_fill", STRONG, "masked keys get weight only when every allowed logit is below -1e4: "
                                             "the mask is a finite fill, not -inf")


def _probability_problems(case, p, expected):
    allowed = case.spec.allowed().cpu()
    reference = expected.probabilities
    problems = []
    if not torch.isfinite(p).all():
        problems.append(f"{int((~torch.isfinite(p)).sum())} probabilities are NaN/Inf")
        p = p.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    leaked = (p != 0) & ~allowed
    if leaked.any():
        problems.append(f"{int(leaked.sum())} masked positions have non-zero probability "
                        f"(largest {float(p[leaked].abs().max()):.3g})")
    if (p < 0).any():
        problems.append(f"{int((p < 0).sum())} negative probabilities (smallest {float(p.min()):.3g})")
    nonempty = allowed.any(-1)
    sums = compare_attention(p.sum(-1)[nonempty], torch.ones(int(nonempty.sum()), dtype=torch.float64),
                             dtype=case.dtype, name="row sums")
    if not sums.passed:
        problems.append(f"non-empty rows do not sum to 1: worst {sums.worst_actual:.6g} "
                        f"({sums.mismatched} of {sums.numel} rows)")
    top2 = reference.topk(2, dim=-1).values if reference.shape[-1] > 1 else None
    if top2 is not None:
        clear = nonempty & (top2[..., 0] > CLEAR_WINNER * top2[..., 1])
        wrong = clear & (p.argmax(-1) != reference.argmax(-1))
        if wrong.any():
            problems.append(f"{int(wrong.sum())} rows give the largest weight to a key other than the top logit")
    return problems


# -- metamorphic relations


def _grid(gen, *size, step=0.125, bound=4.0):
    """Values on a grid of ``step`` within +-bound: sums and shifts of them stay exact in bf16."""
    return (randn(gen, *size) * 1.5 / step).round().clamp(-bound / step, bound / step) * step


def _relation(run, case, transformed_case, map_back):
    """Run both, map the transformed output back, and record whether they agree."""
    base = run.observe(case)
    moved = run.observe(transformed_case)
    if base is None or moved is None:
        return None
    rtol, atol = tolerance_for(run.dtype)
    reference = run.expected(case)
    comparison = compare_attention(map_back(moved.out), base.out, dtype=run.dtype, rtol=2 * rtol, atol=2 * atol,
                                   magnitude=reference.magnitude["out"], name="out")
    return run.record(transformed_case, comparisons=[comparison], observed=moved, expected=reference)


def _grid_case(run, name, sh, **kw):
    sh, kw, notes = run.adapt(sh, kw)
    gen = generator(run.seed(name))
    q = _grid(gen, sh.batch, sh.heads_q, sh.len_q, sh.head_dim)
    k = _grid(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim)
    v = randn(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim_v) + value_offsets(sh.batch, sh.heads_kv)
    return make_case(name, q, k, v, run.dtype, run.device, run.seed(name), scale=0.125, **kw).with_(adapted=notes)


@check("metamorphic.row_shift")
def row_shift(run):
    """Adding the same vector c to every key adds scale * q_i . c to all logits of row i: output unchanged."""
    for kw in ({}, {"causal": "bottom_right", "kv_lens": [50, 31]}):
        sh = shape(2, 2, 2, 24, 50, 32)
        case = _grid_case(run, "grid values" + (" + causal + kv_lens" if kw else ""), sh, **kw)
        gen = generator(run.seed("shift"))
        c = 8.0 * torch.sign(randn(gen, 1, 1, 1, case.spec.head_dim))  # per-row shifts of up to ~+-30 logits
        shifted = case.with_(name=f"{case.name}, keys + c", k=(case.k.double().cpu() + c).to(case.k))
        _relation(run, case, shifted, lambda out: out)


@check("metamorphic.key_permutation")
def key_permutation(run):
    """Permuting keys, values and mask columns together leaves every (non-causal) row unchanged."""
    sh = shape(2, 2, 2, 24, 77, 32)
    mask = random_attn_mask(generator(run.seed("mask")), sh, 0.6)
    for kw in ({}, {"attn_mask": mask}):
        case = run.random_case("permuted keys" + (" + attn_mask" if kw else ""), sh, grad=False, **kw)
        perm = torch.randperm(case.spec.len_k, generator=generator(run.seed("perm")))
        moved_kw = {"attn_mask": case.kwargs["attn_mask"][..., perm.to(run.device)]} if kw else {}
        moved = case.with_(k=case.k[:, :, perm.to(run.device)].contiguous(),
                           v=case.v[:, :, perm.to(run.device)].contiguous(), kwargs={**case.kwargs, **moved_kw})
        _relation(run, case, moved, lambda out: out)


@check("metamorphic.batch_head_permutation")
def batch_head_permutation(run):
    """Rotating batches and KV heads (with their query-head groups) rotates the output the same way."""
    for sh, kw in [(shape(3, 4, 2, 20, 37, 32), {"causal": "bottom_right", "kv_lens": [37, 20, 9]}),
                   (shape(2, 3, 3, 20, 37, 32), {"attn_mask": True})]:
        if kw.get("attn_mask") is True:
            kw = {"attn_mask": random_attn_mask(generator(run.seed("mask")), sh, 0.7)}
        case = run.random_case("rotated batches and heads + " + " + ".join(kw), sh, grad=False, **kw)
        spec = case.spec
        batches = torch.roll(torch.arange(spec.batch), -1)  # new batch b is old batch b + 1: no fixed point
        kv_heads = torch.roll(torch.arange(spec.heads_kv), -1)
        group = spec.group
        q_heads = (kv_heads[:, None] * group + torch.arange(group)).flatten()
        moved = _rotate(case, batches, q_heads, kv_heads)
        _relation(run, case, moved, lambda out: _unrotate(out, batches, q_heads))


def _rotate(case, batches, q_heads, kv_heads):
    dev = case.q.device
    b, hq, hkv = batches.to(dev), q_heads.to(dev), kv_heads.to(dev)
    kw = dict(case.kwargs)
    if "kv_lens" in kw:
        kw["kv_lens"] = [kw["kv_lens"][i] for i in batches.tolist()]
    if "attn_mask" in kw:
        kw["attn_mask"] = kw["attn_mask"][b][:, hq]
    return case.with_(q=case.q[b][:, hq].contiguous(), k=case.k[b][:, hkv].contiguous(),
                      v=case.v[b][:, hkv].contiguous(), kwargs=kw)


def _unrotate(out, batches, q_heads):
    restored = torch.empty_like(out)
    restored[batches.to(out.device)[:, None], q_heads.to(out.device)[None, :]] = out
    return restored


# -- repeatability


def _same_nans(a, b):
    """NaN where both calls gave NaN agrees (other checks judge the NaN itself)."""
    both = torch.isnan(a) & torch.isnan(b)
    return a.masked_fill(both, 0.0), b.masked_fill(both, 0.0)


POISONS = ("nan", "max")  # NaN, then the largest finite value: an uninitialised read changes with the fill


def _poison(t: torch.Tensor, fill, copies=4):
    """Fill and free buffers like ``t``, so the allocator hands back dirty memory."""
    value = float("nan") if fill == "nan" else torch.finfo(t.dtype).max
    for _ in range(copies):
        junk = torch.full_like(t, value)
        del junk


@check("repeat.calls", names_causes=True)
def repeat_calls(run):
    """Three identical calls agree (dirty memory freed between them): no race, no uninitialised read."""
    sh = shape(2, 2, 2, 24, 40, 32)
    mask = random_attn_mask(generator(run.seed("mask")), sh, 0.6)
    mask[:, :, ::4] = False
    cases = [(run.random_case("rows without keys", sh, grad=False, attn_mask=mask), False),
             (run.random_case("gqa causal, backward", shape(2, 4, 2, 33, 47, 32), causal="bottom_right",
                              incidental=("causal",)), True)]
    for case, backward in cases:
        first = run.observe(case, backward=backward)
        if first is None:
            continue
        expected = run.expected(case, backward=backward)
        names = ("out", "dq", "dk", "dv") if backward else ("out",)
        rtol, atol = tolerance_for(run.dtype)
        comparisons, identical = [], True
        for value in POISONS:
            for n in names:
                _poison(first.get(n), value)
            again = run.observe(case, backward=backward)
            if again is None:
                break
            for n in names:
                now, before = _same_nans(again.get(n), first.get(n))
                identical &= torch.equal(now, before)
                comparisons.append(compare_attention(now, before, dtype=run.dtype, rtol=rtol, atol=atol,
                                                     magnitude=expected.magnitude[n], name=f"{n} (repeat)"))
        record = run.record(case, comparisons=comparisons, backward=backward, observed=first, expected=expected)
        run.note(f"{case.name}: repeated calls {'bitwise identical' if identical else 'differ in the last bits'}")
        if record.status == "FAIL":
            run.find(*_repeat_finding(case, expected, comparisons))
            unwritten = _unwritten_batches(comparisons)
            if unwritten:
                run.find("batch_indexing", STRONG, f"{case.name}: identical calls differ in every output row of "
                                                   f"{unwritten} and nowhere in batch 0: those batches are never "
                                                   "written (a batch offset), they hold whatever the memory held")


def _repeat_finding(case, expected, comparisons):
    """Identical calls disagree: uninitialised memory if only rows without keys differ, else a race."""
    out_diffs = [c for c in comparisons if c.name.startswith("out") and not c.passed]
    empty = expected.probabilities.sum(-1) == 0
    if out_diffs and empty.any() and all(bool(((c.ratio > 1).any(-1) <= empty).all()) for c in out_diffs):
        return ("uninitialised_output", DEFINITIVE, f"{case.name}: identical calls differ only on rows with no "
                                                    "allowed key, with whatever the memory held")
    return ("nondeterminism", DEFINITIVE, f"{case.name}: identical calls disagree beyond the tolerance")


def _unwritten_batches(comparisons) -> str | None:
    """"batches 1-N" when repeated outputs differ in (nearly) every row of every batch but the first and in no
    row of batch 0: what a batch offset leaves unwritten; a race loses a block here and there."""
    rows = [(c.ratio > 1).any(-1) for c in comparisons if c.name.startswith("out") and not c.passed]
    if not rows or rows[0].shape[0] < 2:
        return None
    differ = torch.stack(rows).any(0)  # [B, Hq, Sq]
    if differ[0].any() or any(float(differ[b].float().mean()) < 0.9 for b in range(1, differ.shape[0])):
        return None
    return f"batches 1-{differ.shape[0] - 1}" if differ.shape[0] > 2 else "batch 1"
