"""The dtype's range: masked scores far above the allowed ones, values and dO past float16's range.

* **Dominant masked scores** (``extreme.masked_dominant``). For each mask kind, the keys of the
  first key block (dimension 0) and of the last (dimension 1) score ``spread`` above everything
  else, but only for the rows that may attend none of them: row ``i`` of such a block gets
  ``q_i = 1`` in that block's dimension, every other ``q`` and ``k`` entry there is 0. So the
  allowed scores are the ordinary O(1) ones (exact, however large the spread) and the masked
  ones exceed them by 1e2, 1e4, 1e6 ... up to a quarter of the dtype's finite maximum (scale 1).
  A kernel that adds a finite sentinel (``s - 1e6``, the triton-ascend tutorial) instead of
  ``-inf`` lets the masked keys win from a spread of about the sentinel on.
* **Large values** (``extreme.value_range``). V and dO scaled into the thousands, past float16's
  65504 (in the dtypes whose range allows it) and near the dtype's maximum: the output is a
  convex combination of V, so a correct kernel stays finite; one that stores partial results in
  float16 overflows.
"""

from __future__ import annotations

import torch

from attnformal.verify.cases import generator, randn, random_attn_mask, shape
from attnformal.verify.checks import check
from attnformal.verify.checks.accuracy import _scaled_case
from attnformal.verify.diagnosis import PATTERN, STRONG

BLOCK = 16  # the dominant key blocks: the first and the last 16 keys
FLOAT16_MAX = float(torch.finfo(torch.float16).max)
MASK_KINDS = {  # name -> (keyword arguments, given the shape and a generator)
    "causal bottom-right": lambda sh, gen: {"causal": "bottom_right"},
    "window (8, 4)": lambda sh, gen: {"window": (8, 4)},
    "kv_lens padding": lambda sh, gen: {"kv_lens": [sh.len_k - BLOCK, 20]},
    "attn_mask": lambda sh, gen: {"attn_mask": _blocks_masked(gen, sh)},
    "chunk 16": lambda sh, gen: {"chunk_size": 16},
}
FULL_MASK_KINDS = {  # full adds these
    "causal top-left": lambda sh, gen: {"causal": "top_left"},
    "prefix + causal": lambda sh, gen: {"prefix_lens": [8, 30], "causal": "bottom_right"},
}


def spreads(dtype, quick: bool) -> list[float]:
    """How far the masked scores exceed the allowed ones: powers of ten up to a quarter of the dtype's finite
    maximum (room for a kernel's log2(e) factor), and that quarter itself; full adds the powers between."""
    top = float(torch.finfo(dtype).max) / 4
    powers = (2, 4, 6) if quick else (2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
    return [10.0**e for e in powers if 10.0**e < top] + [top]


def _blocks_masked(gen, sh):
    """A random mask (70% allowed) with the first key block masked on even rows and the last on odd rows."""
    mask = random_attn_mask(gen, sh, 0.7)
    mask[:, :, ::2, :BLOCK] = False
    mask[:, :, 1::2, -BLOCK:] = False
    return mask


def dominant_case(run, name, sh, kw, spread):
    """The case described in the module docstring (adapted: the dominant rows follow the lengths it gets);
    ``None`` when no row has a masked dominant block."""
    case = _scaled_case(run, name, sh, 0.5, 0.5, scale=1.0, **kw)
    allowed = case.spec.allowed().cpu()
    has_keys = allowed.any(-1)
    first, last = has_keys & ~allowed[..., :BLOCK].any(-1), has_keys & ~allowed[..., -BLOCK:].any(-1)
    if not (first | last).any():
        return None
    q, k = torch.zeros(*case.q.shape[:3], 2), torch.zeros(*case.k.shape[:3], 2)
    q[..., 0] = first.double()
    q[..., 1] = (last & ~first).double()  # each row looks at one dominant block at most
    k[..., :BLOCK, 0] = spread
    k[..., -BLOCK:, 1] = spread
    case.q[..., :2] = q.to(case.q)
    case.k[..., :2] = k.to(case.k)
    return case


@check("extreme.masked_dominant", names_causes=True)
def masked_dominant(run):
    """Masked keys scoring 1e2, 1e4, 1e6 ... up to near the dtype's maximum above every allowed one, for each
    mask kind (causal, window, kv_lens padding, attn_mask, chunk; full adds top-left causal and prefix-LM):
    a finite mask sentinel loses."""
    sh = shape(2, 2, 2, 32, 64, 16)
    status = {}  # spread -> {mask kind: "pass" | "FAIL"}
    for kind, make_kw in {**MASK_KINDS, **run.pick({}, FULL_MASK_KINDS)}.items():
        kw = make_kw(sh, generator(run.seed("mask", kind)))
        for spread in spreads(run.dtype, run.quick):
            case = dominant_case(run, f"{kind}, masked keys {spread:.3g} above", sh, kw, spread)
            record = None if case is None else run.against_reference(case)
            if record is not None:
                status.setdefault(spread, {})[kind] = record.status
    _explain_sentinel(run, status)


def _explain_sentinel(run, status):
    """Every spread from some threshold on fails, every smaller one passes: the masked scores were lowered by
    a finite amount (a sentinel) of about the threshold, not set to -inf."""
    ordered = sorted(status.items())
    failing = [s for s, kinds in ordered if "FAIL" in kinds.values()]
    if not failing:
        return
    threshold = failing[0]
    below = [s for s, _ in ordered if s < threshold]
    if below and all("FAIL" in kinds.values() for s, kinds in ordered if s >= threshold):
        which = sorted({k for s, kinds in ordered for k, st in kinds.items() if st == "FAIL"})
        run.find("finite_mask_sentinel", STRONG,
                 f"masked keys win from a score spread of {threshold:.3g} on (spreads up to {below[-1]:.3g} pass; "
                 f"{', '.join(which)}): masked scores are lowered by a finite sentinel of about {threshold:.0e}, "
                 f"not set to -inf")


# -- large values


def magnitudes(dtype, sh) -> list[float]:
    """|V| (or |dO|) scales: within float16's range, past it, and near the dtype's maximum over the terms
    summed (a sum of Sk terms of that size, and a head dim of products for dO, must stay finite)."""
    top = float(torch.finfo(dtype).max) / (8 * max(sh.len_q, sh.len_k) * sh.head_dim_v)
    return sorted({m for m in (3e4, 1e5) if m < top} | {top})


def _large_case(run, name, sh, v_scale, do_scale, **kw):
    case = _scaled_case(run, name, sh, 1.0, 1.0, v_scale, **kw)
    grad_out = do_scale * randn(generator(run.seed(name, "dO")), *case.q.shape[:3], case.v.shape[3])
    return case.with_(grad_out=grad_out.to(case.q))


@check("extreme.value_range", names_causes=True)
def value_range(run):
    """V and dO past float16's range (3e4, 1e5) and near the dtype's maximum: finite outputs and gradients
    (bfloat16 partial results stored in float16 overflow)."""
    sh = shape(2, 2, 2, 24, 64, 16)
    status = {}
    for m in magnitudes(run.dtype, sh):
        forward = run.against_reference(_large_case(run, f"|V| ~ {m:.3g}", sh, m, 1.0, causal="bottom_right"))
        backward = run.against_reference(_large_case(run, f"|dO| ~ {m:.3g}", sh, 1.0, m), backward=True)
        status[m] = [r for r in (forward, backward) if r is not None]
    _explain_overflow(run, status)


def _explain_overflow(run, status):
    """Values within float16's range pass and values past it overflow: partial results kept in float16."""
    within = [r for m, records in status.items() if m <= FLOAT16_MAX for r in records]
    past = [r for m, records in status.items() if m > FLOAT16_MAX for r in records]
    failed = [r for r in past if r.status == "FAIL"]
    if not failed or not within or any(r.status == "FAIL" for r in within):
        return
    overflowed = [r for r in failed if r.observed is not None and not all(
        torch.isfinite(t).all() for t in (r.observed.get(n) for n in ("out", "dq", "dk", "dv")) if t is not None)]
    names = ", ".join(r.case.name for r in (overflowed or failed)[:3])
    if overflowed:
        run.find("partials_overflow", STRONG, f"values within float16's range pass, past its maximum 65504 the "
                                              f"results overflow to Inf/NaN ({names})")
    else:
        run.find("partials_overflow", PATTERN, f"values within float16's range pass, past its maximum 65504 "
                                               f"they fail ({names})")
