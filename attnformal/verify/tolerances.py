"""Tolerance profiles: how a result is judged against the reference.

* ``default`` -- elementwise ``|a - r| <= rtol |r| + atol * magnitude + radius`` with the
  per-dtype table of :mod:`attnformal.testing`, the error magnitude of
  :mod:`attnformal.verify.reference` (term sizes, accumulation length, score errors) and
  the reference's own error ``radius``.
* ``naive`` -- flash-attention's criterion: the kernel's largest error is at most ``k``
  times that of the naive dense computation in the same dtype (``k = 2`` for the output,
  3 for gradients), plus a rounding floor: twice the rounding error of the dtype at the
  data's magnitude. Like flash-attention's tests it judges fp16 and bf16; in fp32 and
  fp64 the naive control is as accurate as any kernel and the ratio is rounding noise, so
  those dtypes (and lse, always fp32) are judged by ``default``.
* ``ascend`` -- the Ascend operator precision standard (threshold form): with
  ``rel = |a - r| / (|r| + 1e-7)``, MERE = mean(rel) < T and MARE = max(rel) < 10 T, for
  T = 2^-10 (float16), 2^-7 (bfloat16), 2^-13 (float32). lse is judged by ``default``.

Every profile fails NaN or Inf where the reference is finite. Structural checks (masked
probabilities exactly 0, equivariance, ...) do not go through a profile at all.
"""

from __future__ import annotations

import torch

from attnformal.testing import Comparison, compare_attention

LOW_PRECISION = (torch.float16, torch.bfloat16)
NAIVE_FACTOR = {"out": 2.0, "lse": 2.0, "dq": 3.0, "dk": 3.0, "dv": 3.0}
ASCEND_THRESHOLD = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-13,
                    torch.float64: 2.0**-13}
ASCEND_EPS = 1e-7


def judge(profile: str, name: str, actual, expected, dtype, *, naive=None) -> Comparison:
    """Compare one tensor (``name`` in out, lse, dq, dk, dv) under ``profile``."""
    reference = expected.values[name]
    if profile == "naive" and naive is not None and dtype in LOW_PRECISION and name in naive and name != "lse":
        return _naive(name, actual, reference, naive[name], dtype)
    if profile == "ascend" and name != "lse":
        return _ascend(name, actual, reference, dtype)
    return compare_attention(actual, reference, **expected.tolerance(name), name=name)


def _naive(name, actual, reference, naive, dtype) -> Comparison:
    finite = torch.isfinite(reference)
    naive_error = (naive.double() - reference).abs()[finite]
    worst_naive = float(naive_error.max()) if naive_error.numel() else 0.0
    allowed = NAIVE_FACTOR[name] * worst_naive + _rounding_floor(reference[finite], dtype)
    return compare_attention(actual, reference, dtype=dtype, rtol=0.0, atol=allowed, name=name)


def _rounding_floor(reference, dtype) -> float:
    """Twice the rounding error of ``dtype`` at the data's magnitude (flash-attention's ``+ 0.3 - 0.3``)."""
    if not reference.numel():
        return 0.0
    shifted = (reference + 0.3).to(dtype).double() - 0.3
    return 2.0 * float((shifted - reference).abs().max())


def _ascend(name, actual, reference, dtype) -> Comparison:
    threshold = ASCEND_THRESHOLD[dtype]
    # MARE < 10 T  <=>  |a - r| < 10 T |r| + 10 T eps: an elementwise test with rtol = atol / eps.
    result = compare_attention(actual, reference, dtype=dtype, rtol=10 * threshold, atol=10 * threshold * ASCEND_EPS,
                               name=name)
    if result.problem is None and result.numel:
        rel = (actual.detach().double().cpu() - reference).abs() / (reference.abs() + ASCEND_EPS)
        mere = float(rel.nan_to_num(nan=float("inf")).mean())
        if not mere < threshold:
            result.problem = f"MERE {mere:.3g} >= threshold {threshold:.3g} (Ascend standard, {dtype})"
    return result
