"""Hand-computable cases: the exact answer follows from the construction, not from a reference.

The expected output is computed in closed form (a mean, one value, a geometric series) in
float64; the reference only supplies the error magnitude for the tolerance.
"""

from __future__ import annotations

import math

import torch

from attnformal.verify.cases import generator, make_case, randn, shape, value_offsets
from attnformal.verify.checks import check
from attnformal.verify.diagnosis import PATTERN, STRONG

DOMINANT = 32.0  # q0 = k0 = 32 with scale 1: a logit of 1024, so exp(other - dominant) underflows even in fp64


def _closed_form(run, case, out):
    """The reference for ``case`` with its output replaced by the closed-form ``out``."""
    expected = run.expected(case)
    expected.values["out"] = out
    return expected


def _mean_of_allowed(case, rows_allowed=None):
    """``out[b, h, i] = mean of v over the keys row i may attend`` (0 for a row with none)."""
    spec = case.spec
    allowed = (spec.allowed() if rows_allowed is None else rows_allowed).double().cpu()
    v = case.v.double().cpu()[:, spec.kv_heads()]
    count = allowed.sum(-1, keepdim=True)
    return torch.where(count > 0, (allowed @ v) / count.clamp(min=1), 0.0)


@check("hand.uniform_logits")
def uniform_logits(run):
    """q = 0 makes every logit equal: the output is the plain mean of the allowed values."""
    for name, sh, kw in [
        ("no mask", shape(2, 2, 2, 24, 37, 16), {}),
        ("causal bottom-right", shape(2, 2, 2, 20, 37, 16), {"causal": "bottom_right"}),
        ("kv_lens", shape(2, 2, 2, 24, 37, 16), {"kv_lens": [37, 5]}),
    ]:
        case = run.random_case(name, sh, grad=False, **kw)
        case.q.zero_()
        run.against_reference(case, expected=_closed_form(run, case, _mean_of_allowed(case)))


@check("hand.dominant_score")
def dominant_score(run):
    """One key scores 1024 above the rest: the output is exactly that key's value."""
    sh, kw, notes = run.adapt(shape(3, 2, 2, 6, 300, 16), {"scale": 1.0}, keep=("heads_kv",))
    gen = generator(run.seed("dominant"))
    q, k = randn(gen, *sh[:2], sh.len_q, sh.head_dim), 0.5 * randn(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim)
    v = randn(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim_v) + value_offsets(sh.batch, sh.heads_kv)
    q[..., 0] = DOMINANT
    k[..., 0] = k[..., 0] / DOMINANT
    positions = [0, sh.len_k // 2, sh.len_k - 1]  # first key, a middle tile, the last (ragged) tile
    for b, j in enumerate(positions):
        k[b, :, j] = 0.0
        k[b, :, j, 0] = DOMINANT
    case = make_case("dominant key at 0 / middle / last", q, k, v, run.dtype, run.device, run.seed("dominant"),
                     **kw).with_(adapted=notes)
    out = torch.stack([case.v.double().cpu()[b, :, j] for b, j in enumerate(positions)])[:, :, None, :]
    run.against_reference(case, expected=_closed_form(run, case, out.expand(sh.batch, sh.heads_q, sh.len_q, -1)))


@check("hand.masked_dominant")
def masked_dominant(run):
    """A masked key scores 1024 above the rest: it must leave the max and the denominator."""
    for name, kw, last in [
        ("causal bottom-right, only the last row sees the dominant last key", {"causal": "bottom_right"}, True),
        ("dominant key in the kv_lens padding of batch 0", {"kv_lens": [150, 200]}, False),
    ]:
        sh, kw, notes = run.adapt(shape(2, 2, 2, 8, 200, 16), {**kw, "scale": 1.0}, keep=("heads_kv",))
        dominant_at = (sh.len_k - 1,) * 2 if last else (170, 170)
        gen = generator(run.seed(name))
        q = randn(gen, *sh[:2], sh.len_q, sh.head_dim)
        k = torch.zeros(sh.batch, sh.heads_kv, sh.len_k, sh.head_dim, dtype=torch.float64)
        v = randn(gen, sh.batch, sh.heads_kv, sh.len_k, sh.head_dim_v) + value_offsets(sh.batch, sh.heads_kv)
        q[..., 0] = DOMINANT
        for b, j in enumerate(dominant_at):
            k[b, :, j, 0] = DOMINANT
        case = make_case(name, q, k, v, run.dtype, run.device, run.seed(name), **kw).with_(adapted=notes)
        allowed = case.spec.allowed().cpu()
        sees = torch.stack([allowed[b, :, :, j] for b, j in enumerate(dominant_at)])  # [B, Hq, Sq]
        value = torch.stack([case.v.double().cpu()[b, :, j] for b, j in enumerate(dominant_at)])[:, :, None, :]
        out = torch.where(sees[..., None], value.expand(-1, sh.heads_q, sh.len_q, -1), _mean_of_allowed(case))
        record = run.against_reference(case, expected=_closed_form(run, case, out))
        if record is not None and record.status == "FAIL":
            _explain_masked_dominant(run, record, sees, value)


def _explain_masked_dominant(run, record, sees, value):
    got = record.observed.out.double().cpu()
    hidden = ~sees  # rows that must not see the dominant key
    if not hidden.any():
        return
    rows = got[hidden]
    if bool((~torch.isfinite(rows)).any() | (rows.abs().amax(-1) < 1e-3).any()):
        run.find("mask_after_max", STRONG, "rows that must not see the dominant key come out NaN or zero: "
                                           "their allowed keys underflowed against the masked maximum")
    elif torch.allclose(rows, value.expand_as(got)[hidden], rtol=1e-2, atol=1e-2):
        run.find("mask_wrong", PATTERN, "rows that must not see the dominant key return its value: the key is "
                                        "not masked")


@check("hand.single_token")
def single_token(run):
    """One key: every row's output is that key's value (whatever its score)."""
    for name, sh in [("Sq=1 Sk=1", shape(2, 2, 2, 1, 1, 16)), ("Sq=5 Sk=1", shape(2, 2, 2, 5, 1, 16))]:
        case = run.random_case(name, sh, grad=False, keep=("len_k",))
        out = case.v.double().cpu()[:, case.spec.kv_heads()].expand(-1, -1, case.spec.len_q, -1)
        run.against_reference(case, expected=_closed_form(run, case, out))


@check("hand.closed_form", names_causes=True)
def closed_form(run):
    """Geometric scores s_j = +-j/16 over 256 keys; with V = 1 the output is exactly 1.

    Head 0 has increasing scores (the running maximum grows at every key block), head 1
    decreasing ones (it never grows after the first block): a kernel that forgets to
    rescale fails head 0 only, above 1 if the accumulator is not rescaled and below 1 if
    the denominator is not.
    """
    sh, kw, notes = run.adapt(shape(1, 2, 2, 4, 256, 8), {"scale": 1.0}, keep=("len_k", "heads_kv"))
    n = sh.len_k
    k = torch.zeros(1, 2, n, sh.head_dim, dtype=torch.float64)
    k[..., 0] = torch.arange(n, dtype=torch.float64) / 16  # exact in bf16: 8 significant bits
    q = torch.zeros(1, 2, sh.len_q, sh.head_dim, dtype=torch.float64)
    q[:, 0, :, 0], q[:, 1, :, 0] = 1.0, -1.0
    gen = generator(run.seed("values"))
    for name, v in [("V = 1", torch.ones(1, 2, n, sh.head_dim_v, dtype=torch.float64)),
                    ("random V", randn(gen, 1, 2, n, sh.head_dim_v))]:
        case = make_case(name, q, k, v, run.dtype, run.device, run.seed(name), **kw).with_(adapted=notes)
        out = _geometric_output(case.v.double().cpu(), n, sh.len_q)
        record = run.against_reference(case, expected=_closed_form(run, case, out))
        if record is not None and record.status == "FAIL" and name == "V = 1":
            _explain_rescale(run, record)


def _geometric_output(v, n, rows):
    """``sum_j r^j v_j / sum_j r^j`` with ``r = e^{+-1/16}`` per head, from the series in closed form."""
    outs = []
    for head, sign in enumerate((1.0, -1.0)):
        r = math.exp(sign / 16)
        weights = r ** torch.arange(n, dtype=torch.float64) * (1 - r) / (1 - r**n)
        outs.append(weights @ v[0, head])
    return torch.stack(outs)[None, :, None, :].expand(1, 2, rows, -1)


def _explain_rescale(run, record):
    got = record.observed.out.double().cpu()
    increasing, decreasing = got[0, 0], got[0, 1]
    tol = 10 * record.comparisons[0].worst_allowed + 1e-6
    if (decreasing - 1).abs().max() > tol:
        return
    mean = float(increasing.mean())
    if mean > 1:
        run.find("acc_not_rescaled", STRONG, f"with V = 1 the output is {mean:.4g} > 1 exactly when the running "
                                             "maximum grows (increasing scores), and right when it never grows")
    else:
        run.find("denominator_not_rescaled", STRONG, f"with V = 1 the output is {mean:.4g} < 1 exactly when the "
                                                     "running maximum grows, and right when it never grows")
