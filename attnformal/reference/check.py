"""Running an implementation against a golden file, and reporting its error.

Each element's error is ``|impl - value|`` against the golden value. It is reported

* in ulps of the implementation's output dtype at the tensor's largest magnitude
  (``ulp(x) = eps * 2^floor(log2 max(|x|, tiny))`` at ``x = max(max|value|, max|impl|)``):
  the scale ``atol`` judges by, so a near-zero element's small absolute error does not read
  as millions of ulps while it is well within tolerance, and
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

from attnformal.execution import Exited, guarded
from attnformal.reference.golden import Golden, allowance, index_text
from attnformal.testing import check_term, tolerance_for

@dataclass(frozen=True)
class TensorReport:
    """The error of one output tensor; indices are of the worst element."""

    name: str
    dtype: torch.dtype
    max_error: float
    max_error_at: tuple
    max_ulps: float  # max_error in ulps of the dtype at the tensor's largest magnitude
    worst_ratio: float  # error / tolerance
    worst_ratio_at: tuple
    failing: int
    total: int
    rtol: float
    atol: float

    @property
    def passed(self) -> bool:
        return self.failing == 0


GRADIENTS = ("dq", "dk", "dv", "dsinks", "dbias")


@dataclass(frozen=True)
class CheckReport:
    tensors: list
    skipped: list  # (name, why)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors)

    def verdict(self, *, forward_only: bool = False, no_lse: bool = False) -> str:
        """PASS, FAIL, or INCOMPLETE when a tensor the user did not waive (``forward_only``: the
        gradients; ``no_lse``: the lse) was never checked: what was not checked did not pass."""
        if not self.passed:
            return "FAIL"
        waived = (GRADIENTS if forward_only else ()) + (("lse",) if no_lse else ())
        return "INCOMPLETE" if any(name not in waived for name, _ in self.skipped) else "PASS"


class ImplementationError(Exception):
    """The implementation raised, or broke the protocol, on the golden inputs (a FAIL, not a usage error)."""


def run_check(golden: Golden, impl, *, rtol: float | None = None, atol: float | None = None,
              device: str = "cpu", channel=None) -> CheckReport:
    """Run ``impl`` (forward and, if its output is differentiable, backward) on the golden inputs
    and compare every output; :class:`ImplementationError` when it raises, exits or breaks the
    protocol, ``NotImplementedError`` (from ``impl``) when it does not support the case.
    ``channel`` (in a worker, :class:`attnformal.execution.Channel`) is told when each call starts and ends."""
    produced, skipped = _forward_backward(golden, impl, device, channel)
    tensors = [compare(name, value.detach().cpu(), *golden.reference[name], rtol=rtol, atol=atol)
               for name, value in produced.items()]
    return CheckReport(tensors=tensors, skipped=skipped)


def _forward_backward(golden: Golden, impl, device: str, channel) -> tuple[dict, list]:
    """``({name: tensor}, [(name, why skipped)])`` of ``impl`` on the golden case."""
    x = {name: t.to(device) for name, t in golden.inputs.items()}
    kwargs = {name: (value.to(device) if isinstance(value, torch.Tensor) else value)
              for name, value in golden.protocol_kwargs().items()}
    leaves = [x[name].detach().clone().requires_grad_(True) for name in ("q", "k", "v")]
    parameters = {name: kwargs[name].detach().clone().requires_grad_(True) for name in ("sinks", "bias")
                  if f"d{name}" in golden.reference}  # their gradients are judged too
    kwargs.update(parameters)
    try:
        result, no_lse = _call(channel, "the implementation", impl, *leaves, return_lse=True, **kwargs), None
    except NotImplementedError as err:  # perhaps only the lse: try without it
        result, no_lse = _call(channel, "the implementation", impl, *leaves, **kwargs), f"not supported ({err})"
    out, lse = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    produced, skipped = {"out": _expect_tensor("out", out, golden)}, []
    if lse is None:
        skipped.append(("lse", no_lse or "the implementation returned none"))
    else:
        produced["lse"] = _expect_tensor("lse", lse, golden)
    if not out.requires_grad:
        return produced, skipped + [(name, "the output is not differentiable (forward only)")
                                    for name in ("dq", "dk", "dv", *(f"d{n}" for n in parameters))]
    _call(channel, "its backward", out.backward, x["grad_out"].to(out.dtype))
    named = {**dict(zip(("dq", "dk", "dv"), leaves)), **{f"d{name}": t for name, t in parameters.items()}}
    for name, leaf in named.items():
        if leaf.grad is None:
            skipped.append((name, f"the output does not depend on {name[1:]}"))
        else:  # d sinks, d bias are judged in the inputs' dtype (their leaves hold the stored float64 values)
            produced[name] = _expect_tensor(name, leaf.grad.to(golden.dtype), golden)
    return produced, skipped


def _call(channel, what: str, fn, *args, **kwargs):
    if channel is not None:
        channel.calling(what)
    try:
        return guarded(fn, *args, **kwargs)
    except NotImplementedError:
        raise
    except Exited as err:  # a kernel that exits has not produced a result: a FAIL, never exit 0
        raise ImplementationError(str(err)) from None
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise ImplementationError(f"{what} raised {type(err).__name__}: {first}") from err
    finally:
        if channel is not None:
            channel.returned()


def checked(golden: Golden, impl, *, rtol=None, atol=None, device="cpu", channel=None) -> tuple[str, object]:
    """:func:`run_check` as a value: ``("report", CheckReport)``, ``("FAIL", message)`` or
    ``("unsupported", message)``."""
    try:
        return "report", run_check(golden, impl, rtol=rtol, atol=atol, device=device, channel=channel)
    except NotImplementedError as err:
        return "unsupported", str(err)
    except ImplementationError as err:
        return "FAIL", str(err)


def check_in_worker(state: tuple, golden: Golden, channel) -> tuple[str, object]:
    """:func:`checked` in a worker process (:class:`attnformal.execution.Worker`'s handler); ``state``
    is ``(target, rtol, atol, device)``."""
    from attnformal.adapters import resolve

    target, rtol, atol, device = state
    channel.calling(f"loading {target}")
    impl = resolve(target)  # resolved in the parent already: an import that exits is a usage error there
    channel.returned()
    return checked(golden, impl, rtol=rtol, atol=atol, device=device, channel=channel)


def _expect_tensor(name: str, value, golden: Golden) -> torch.Tensor:
    expected = tuple(golden.reference[name][0].shape)
    if not isinstance(value, torch.Tensor):
        raise ImplementationError(f"the implementation's {name} is {type(value).__name__}, expected a tensor of "
                                  f"shape {list(expected)} (protocol: out, or (out, lse) with return_lse=True)")
    if tuple(value.shape) != expected:
        raise ImplementationError(f"the implementation's {name} has shape {list(value.shape)}, expected {list(expected)}")
    return value


def compare(name: str, value: torch.Tensor, ref: torch.Tensor, radius: torch.Tensor, *,
            rtol: float | None = None, atol: float | None = None) -> TensorReport:
    """Error of ``value`` (its own dtype) against the golden ``ref +- radius``."""
    default_rtol, default_atol = tolerance_for(value.dtype)
    rtol = default_rtol if rtol is None else check_term("rtol", rtol, tensors=False)
    atol = default_atol if atol is None else check_term("atol", atol, tensors=False)
    x = value.to(torch.float64)
    same_inf = torch.isinf(ref) & (x == ref)  # lse of an empty row: -inf on both sides is exact
    error = torch.where(same_inf, 0.0, (x - ref).abs()).nan_to_num(nan=math.inf)
    finite_ref = torch.where(torch.isfinite(ref), ref, 0.0)
    ratio = torch.where(error == 0, 0.0, error / (radius + allowance(ref, rtol, atol)))
    worst = _worst("max_error", error)
    largest = torch.maximum(finite_ref.abs(), x.abs().nan_to_num(posinf=0.0)).max() if ref.numel() else 0.0
    ulps = worst["max_error"] / float(ulp(torch.as_tensor(largest, dtype=torch.float64), value.dtype))
    return TensorReport(name=name, dtype=value.dtype, **worst, max_ulps=ulps,
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


def format_report(report: CheckReport, verdict: str | None = None) -> str:
    """A table: one line per tensor with its worst error, ulps and error/tolerance, then ``verdict``
    (by default :meth:`CheckReport.verdict`'s)."""
    head = f"{'tensor':6} {'dtype':9} {'max |err|':>10} {'in ulps':>9} {'at':16} " \
           f"{'err/tol':>8} {'at':16} {'failing':>14}"
    lines = [head]
    for t in report.tensors:
        lines.append(f"{t.name:6} {str(t.dtype).removeprefix('torch.'):9} {t.max_error:10.3e} {t.max_ulps:9.3g} "
                     f"{index_text(t.max_error_at):16} {t.worst_ratio:8.3g} {index_text(t.worst_ratio_at):16} "
                     f"{f'{t.failing}/{t.total}':>14}")
    for name, why in report.skipped:
        lines.append(f"{name:6} skipped: {why}")
    tolerances = sorted({(str(t.dtype).removeprefix("torch."), t.rtol, t.atol) for t in report.tensors})
    lines.append("tolerance: |err| <= radius + rtol*|ref| + atol*max|ref| with "
                 + "; ".join(f"{d}: rtol={r:.3g} atol={a:.3g}" for d, r, a in tolerances)
                 + "; ulps of the dtype at the tensor's largest |ref|")
    verdict = verdict or report.verdict()
    if verdict == "INCOMPLETE":
        unchecked = ", ".join(name for name, _ in report.skipped)
        lines.append(f"INCOMPLETE: {unchecked} not checked (pass --forward-only or --no-lse to check less "
                     "on purpose)")
    else:
        lines.append(verdict)
    return "\n".join(lines)
