"""Running an implementation against a golden file, and reporting its error.

Each element's error is ``|impl - value|`` against the golden value. It is reported

* in ulps of the implementation's output dtype at the larger of the two magnitudes
  (``ulp(x) = eps * 2^floor(log2 max(|x|, tiny))``; the larger, so that a near-zero
  reference does not turn a small absolute error into billions of ulps), and
* relative to the tolerance ``radius + rtol |value| + atol max|value|``: the golden's
  own rigorous radius plus a per-dtype allowance (``atol`` scales with the tensor's largest
  magnitude, so near-zero elements of a large tensor are judged on the tensor's scale).

The default (rtol, atol) per dtype are the project's one table
(:data:`attnformal.testing.TOLERANCES`), with ``atol`` scaled by the tensor's largest magnitude:
a quick check of a kernel that accumulates in float32; the conformance battery derives per-case
tolerances from the same table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnformal.oracle import forward_backward
from attnformal.reference.golden import Golden
from attnformal.testing import tolerance_for

@dataclass(frozen=True)
class TensorReport:
    """The error of one output tensor; indices are of the worst element."""

    name: str
    dtype: torch.dtype
    max_error: float
    max_error_at: tuple
    max_ulps: float
    max_ulps_at: tuple
    worst_ratio: float  # error / tolerance
    worst_ratio_at: tuple
    failing: int
    total: int
    rtol: float
    atol: float

    @property
    def passed(self) -> bool:
        return self.failing == 0


@dataclass(frozen=True)
class CheckReport:
    tensors: list
    skipped: list  # (name, why)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors)


def run_check(golden: Golden, impl, *, rtol: float | None = None, atol: float | None = None,
              device: str = "cpu") -> CheckReport:
    """Run ``impl`` (forward and backward) on the golden inputs and compare every output."""
    x = {name: t.to(device) for name, t in golden.inputs.items()}
    kwargs = {name: (value.to(device) if isinstance(value, torch.Tensor) else value)
              for name, value in golden.protocol_kwargs().items()}
    out, lse, dq, dk, dv = forward_backward(impl, x["q"], x["k"], x["v"], x["grad_out"], **kwargs)
    produced = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    tensors, skipped = [], []
    for name, value in produced.items():
        if value is None:
            skipped.append((name, "the implementation returned none"))
            continue
        ref, radius = golden.reference[name]
        if tuple(value.shape) != tuple(ref.shape):
            raise ValueError(f"the implementation's {name} has shape {list(value.shape)}, "
                             f"expected {list(ref.shape)}")
        tensors.append(compare(name, value.detach().cpu(), ref, radius, rtol=rtol, atol=atol))
    return CheckReport(tensors=tensors, skipped=skipped)


def compare(name: str, value: torch.Tensor, ref: torch.Tensor, radius: torch.Tensor, *,
            rtol: float | None = None, atol: float | None = None) -> TensorReport:
    """Error of ``value`` (its own dtype) against the golden ``ref +- radius``."""
    default_rtol, default_atol = tolerance_for(value.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    x = value.to(torch.float64)
    same_inf = torch.isinf(ref) & (x == ref)  # lse of an empty row: -inf on both sides is exact
    error = torch.where(same_inf, 0.0, (x - ref).abs()).nan_to_num(nan=math.inf)
    finite_ref = torch.where(torch.isfinite(ref), ref, 0.0)
    scale = float(finite_ref.abs().max()) if ref.numel() else 0.0
    tolerance = radius + rtol * finite_ref.abs() + atol * scale
    ratio = torch.where(error == 0, 0.0, error / tolerance)
    ulps = error / ulp(torch.maximum(finite_ref.abs(), x.abs().nan_to_num(posinf=0.0)), value.dtype)
    return TensorReport(name=name, dtype=value.dtype, **_worst("max_error", error), **_worst("max_ulps", ulps),
                        **_worst("worst_ratio", ratio), failing=int((ratio > 1).sum()), total=ref.numel(),
                        rtol=rtol, atol=atol)


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at ``|x|`` (subnormal spacing below the smallest normal)."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(x.abs().clamp_min(info.tiny))  # |x| = m 2^e, m in [0.5, 1)
    return info.eps * torch.pow(2.0, (exponent - 1).to(torch.float64))


def _worst(label: str, values: torch.Tensor) -> dict:
    if values.numel() == 0:
        return {label: 0.0, f"{label}_at": ()}
    flat = int(torch.argmax(values))
    at = tuple(int(i) for i in np.unravel_index(flat, tuple(values.shape)))
    return {label: float(values.flatten()[flat]), f"{label}_at": at}


def format_report(report: CheckReport) -> str:
    """A table: one line per tensor with its worst error, ulps and error/tolerance."""
    head = f"{'tensor':6} {'dtype':9} {'max |err|':>10} {'at':16} {'max ulp':>9} {'at':16} " \
           f"{'err/tol':>8} {'at':16} {'failing':>14}"
    lines = [head]
    for t in report.tensors:
        lines.append(f"{t.name:6} {str(t.dtype).removeprefix('torch.'):9} {t.max_error:10.3e} "
                     f"{_index(t.max_error_at):16} {t.max_ulps:9.3g} {_index(t.max_ulps_at):16} "
                     f"{t.worst_ratio:8.3g} {_index(t.worst_ratio_at):16} {f'{t.failing}/{t.total}':>14}")
    for name, why in report.skipped:
        lines.append(f"{name:6} skipped: {why}")
    tolerances = sorted({(str(t.dtype).removeprefix("torch."), t.rtol, t.atol) for t in report.tensors})
    lines.append("tolerance: |err| <= radius + rtol*|ref| + atol*max|ref| with "
                 + "; ".join(f"{d}: rtol={r:.3g} atol={a:.3g}" for d, r, a in tolerances))
    lines.append("PASS" if report.passed else "FAIL")
    return "\n".join(lines)


def _index(at: tuple) -> str:
    return "[" + ",".join(map(str, at)) + "]"
