"""Dropout: deterministic at p = 0, exact replay of a given keep-mask, statistics of the kernel's own.

With uniform logits and ``V = I`` the output is ``keep / ((1 - p) * n_allowed)`` entry by
entry, so the kernel's own mask can be read off its output: the kept fraction must be
``1 - p`` (a binomial test at 5 sigma), kept entries must be scaled by ``1 / (1 - p)``,
and the backward of the same call must match the reference replaying that recovered mask.
"""

from __future__ import annotations

import math

from attnformal.testing import compare_attention
from attnformal.verify.cases import generator, random_dropout_mask, shape
from attnformal.verify.checks import check
from attnformal.verify.checks.gradients import _backward_case
from attnformal.verify.checks.structure import _with_identity_values
from attnformal.verify.diagnosis import HINT, STRONG
from attnformal.verify.tolerances import judge

P = 0.25
SIGMAS = 5.0


@check("dropout.p0")
def p0(run):
    """dropout_p = 0 given explicitly: exactly the deterministic attention, forward and backward."""
    _backward_case(run, run.random_case("p = 0", shape(2, 4, 2, 20, 37, 32), dropout_p=0.0, causal="bottom_right",
                                        incidental=("causal",)))


@check("dropout.replay")
def replay(run):
    """A given keep-mask (p = 0.3), replayed in forward and backward (a dropout-free twin as control)."""
    sh = shape(2, 4, 2, 30, 45, 32)
    control = _backward_case(run, run.random_case("no dropout (control)", sh, causal="bottom_right",
                                                  incidental=("causal",)).with_(role="control"))
    mask = random_dropout_mask(generator(run.seed("keep")), sh, 0.3)
    record = _backward_case(run, run.random_case("p = 0.3 with a keep-mask", sh, causal="bottom_right",
                                                 incidental=("causal",), dropout_p=0.3, dropout_mask=mask))
    if record is None or record.status == "pass" or control is None or control.status == "FAIL":
        return
    forward_ok = record.comparisons[0].passed
    if forward_ok:
        run.find("dropout_backward", STRONG, "the forward replays the mask and the dropout-free backward is "
                                             "right, but the backward with dropout is not")


def _own_mask_case(run, name, *, grad):
    return _with_identity_values(run.random_case(name, shape(2, 4, 4, 64, 64, 64), grad=grad, identity_values=True,
                                                 dropout_p=P))


def _recovered_keep(case, out):
    """The keep-mask the kernel drew, read off ``out = P * keep / (1 - p)`` (P > 0 wherever allowed)."""
    return (out != 0) & case.spec.allowed()


@check("dropout.statistics")
def statistics(run):
    """The kernel's own mask: kept fraction 1 - p (5 sigma), kept values scaled by 1/(1-p)."""
    case = _own_mask_case(run, "own mask, uniform logits, V = I", grad=False)
    case.q.zero_()
    observed = run.observe(case)
    if observed is None:
        return
    out = observed.out.double().cpu()
    allowed = case.spec.allowed().cpu()
    keep = (out != 0) & allowed
    n = int(allowed.sum())
    fraction = float(keep.sum()) / n
    sigma = math.sqrt(P * (1 - P) / n)
    problems = []
    run.note(f"kept fraction {fraction:.4f} (expected {1 - P} +- {SIGMAS * sigma:.4f}) over {n} entries")
    if abs(fraction - (1 - P)) > SIGMAS * sigma:
        problems.append(f"kept fraction {fraction:.4f}, expected {1 - P:.4f} +- {SIGMAS * sigma:.4f}")
        near_p = abs(fraction - P) <= SIGMAS * sigma
        run.find("dropout_rate", STRONG, f"the kernel keeps {fraction:.3f} of the entries"
                 + (" -- it keeps with probability p instead of 1 - p" if near_p else f", not 1 - p = {1 - P}"))
    expected_kept = 1.0 / ((1 - P) * allowed.sum(-1, keepdim=True).double())
    values = compare_attention(out[keep], expected_kept.expand_as(out)[keep], dtype=case.dtype, name="kept values")
    if not values.passed:
        problems.append("kept entries are not 1/((1-p) n): " + values.message().splitlines()[0])
        ratio = float((out[keep] / expected_kept.expand_as(out)[keep]).median())
        if abs(ratio - (1 - P)) < 0.01:
            run.find("dropout_scaling", STRONG, "kept probabilities are not rescaled by 1/(1-p)")
    if bool(((out != 0) & ~allowed).any()):
        problems.append("dropout made masked positions non-zero")
    same = float((keep[:, 0] == keep[:, 1]).double().mean())
    if same > 0.99:
        problems.append("every head drew the same dropout mask")
        run.find(None, HINT, "the dropout mask does not depend on the head")
    run.record(case, problems=problems, observed=observed)


@check("dropout.own_mask_backward")
def own_mask_backward(run):
    """The backward of a call that drew its own mask matches the reference replaying that mask."""
    case = _own_mask_case(run, "own mask, V = I", grad=True)
    observed = run.observe(case, backward=True)
    if observed is None:
        return
    control = _backward_case(run, case.with_(name="no dropout (control)", kwargs={}, role="control"))
    keep = _recovered_keep(case, observed.out.cpu())
    replay = case.with_(kwargs={**case.kwargs, "dropout_mask": keep.to(case.q.device)})
    expected = run.expected(replay, backward=True)
    comparisons = [judge(run.settings.tolerance, n, observed.get(n), expected, case.dtype)
                   for n in ("out", "dq", "dk", "dv")]
    record = run.record(replay, comparisons=comparisons, backward=True, observed=observed, expected=expected)
    if record.status == "FAIL" and comparisons[0].passed and control is not None and control.status == "pass":
        run.find("dropout_backward", STRONG, "the dropout-free backward is right, but the backward does not use "
                                             "the mask its own forward drew")
