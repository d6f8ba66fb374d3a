"""The profiles nest: every case the quick profile runs is in the full profile, unchanged.

A failure in quick must never become a pass in full because full drew the same shape differently.
Each check is enumerated in both profiles with an implementation that refuses every call: a watch
sees each call's case (name, layout, values, keywords; lse and backward) before the refusal. A case
reached only after an accepted call is not enumerated; every check keeps building its cases after a
refusal, which the count below confirms.
"""

import hashlib

import pytest
import torch

from attnformal.verify.cases import shape
from attnformal.verify.checks import CHECKS, Check
from attnformal.verify.runner import Settings, run_check


def _fingerprint(case, lse, backward):
    digest = hashlib.sha1()
    tensors = [case.q, case.k, case.v, case.grad_out] + [v for _, v in sorted(case.kwargs.items())]
    for key, value in sorted(case.kwargs.items()):
        digest.update(key.encode() + (b"" if isinstance(value, torch.Tensor) else repr(value).encode()))
    for t in tensors:
        if isinstance(t, torch.Tensor):
            digest.update(repr((tuple(t.shape), t.stride(), t.dtype)).encode())
            digest.update(t.detach().contiguous().to(torch.float64).numpy().tobytes())
    return case.name, lse, backward, digest.hexdigest()


class _Seen:
    """A call watch that records every case the check calls the implementation on."""

    def __init__(self):
        self.cases = set()

    def before(self, case, lse, backward):
        self.cases.add(_fingerprint(case, lse, backward))

    def after(self):
        pass


def _refuse(q, k, v, **kwargs):
    raise NotImplementedError("enumerating the cases")


def _cases(chk, dtype, profile):
    seen = _Seen()
    result = run_check(Settings(_refuse, "enumerate", profile=profile), chk, dtype, watch=seen)
    assert result.status != "ERROR", result.details
    return seen.cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_quick_case_is_in_full(dtype):
    enumerated = 0
    for chk in CHECKS:
        if chk.full_only or (chk.fixed_dtype is not None and dtype != torch.float32):
            continue
        quick = _cases(chk, chk.fixed_dtype or dtype, "quick")
        missing = quick - _cases(chk, chk.fixed_dtype or dtype, "full")
        assert not missing, f"{chk.name}: quick cases missing from full: {sorted(c[0] for c in missing)}"
        enumerated += len(quick)
    assert enumerated > 150  # the enumeration reached the checks' cases (it is not vacuous)


def test_a_case_full_draws_differently_is_noticed():
    """The negative control: a check whose full profile makes quick's case non-causal (issue 25's
    bwd.lengths) leaves that case out of full's set."""
    def lengths(run):
        run.observe(run.random_case("Sk=129", shape(2, 2, 2, 13, 129, 32), **run.pick({"causal": "bottom_right"}, {})))

    chk = Check("bwd.example", lengths, "")
    assert _cases(chk, torch.float32, "quick") - _cases(chk, torch.float32, "full")
