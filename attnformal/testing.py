"""``assert_attention_close``: compare an attention result with a reference, elementwise.

In the spirit of :func:`torch.testing.assert_close`, with the tolerance model that
attention needs. An element passes when::

    |actual - expected| <= rtol * |expected| + atol * magnitude * growth(accumulation) + reference_error

* ``rtol`` covers the final rounding to the output dtype;
* ``atol * magnitude`` covers the computation: ``magnitude`` is the elementwise size of the
  terms that were summed (the battery passes a first-order error bound such as
  ``P @ |V|``; the default 1 makes ``atol`` absolute, as in torch.testing);
* ``growth(n)`` widens it for long accumulations (``sqrt(n / 256)``, at least 1);
* ``reference_error`` is the reference's own accuracy (a certified radius, or 0).

``rtol`` and ``atol`` come from one per-dtype table (:data:`TOLERANCES`) and are always
given together; every tolerance term must be finite and >= 0 (a NaN or negative one would
pass anything, so it is an error). :func:`compare_attention` returns a structured
:class:`Comparison`; only :func:`assert_attention_close` turns it into an exception. NaN or
Inf in ``actual`` where the reference is finite always fails; infinities equal to the
reference's (``lse = -inf`` on an empty row) pass.

What to compare against, and with which ``magnitude``: :func:`reference_attention` returns
the float64 reference of a protocol call together with the battery's error model, so that

    ref = reference_attention(q, k, v, **kwargs)
    assert_attention_close(my_kernel(q, k, v, **kwargs), ref.values["out"], **ref.tolerance("out"))

judges a kernel exactly as ``python -m attnformal.verify`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


class Tolerance(NamedTuple):
    rtol: float  # relative: final rounding to the output dtype
    atol: float  # per unit of magnitude: the computation's own error


# The one table. rtol is about two units of the dtype's rounding; atol, multiplied by the
# first-order error magnitude, allows a few roundings of the computation in that dtype
# (a kernel may round P to bf16 before P @ V). Calibrated against SDPA (math and flash),
# flex_attention and torch_tiled on the battery; see docs/verify.md, "Tolerances".
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-12, atol=1e-12),
    torch.float32: Tolerance(rtol=2e-6, atol=2e-6),
    torch.float16: Tolerance(rtol=1e-3, atol=2e-3),
    torch.bfloat16: Tolerance(rtol=8e-3, atol=1.6e-2),
}


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The table's (rtol, atol) for ``dtype``; a clear error for a dtype it does not know."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d).removeprefix("torch.") for d in TOLERANCES)
        raise ValueError(f"argument 'dtype': expected one of {known}, got {dtype}") from None


# A worst error above this multiple of the tolerance is shown as "over 10^4 x": past it the
# number says how small the allowed difference was (often a reference that is exactly 0),
# not how wrong the result is.
RATIO_SHOWN_UP_TO = 1e4


def format_ratio(ratio: float) -> str:
    """A worst-error ratio a person can read: ``0.25``, ``37``, ``>1e4`` (or ``inf`` for NaN/Inf)."""
    if not math.isfinite(ratio):
        return "inf"
    return f"{ratio:.2g}" if ratio < RATIO_SHOWN_UP_TO else ">1e4"


def accumulation_growth(n: int | None) -> float:
    """How much a sum of ``n`` terms widens the tolerance: rounding errors grow like sqrt(n)."""
    return 1.0 if not n else max(1.0, math.sqrt(n / 256))


@dataclass
class Comparison:
    """The result of comparing one tensor with its reference (no exception raised)."""

    name: str
    shape: tuple[int, ...]
    rtol: float
    atol: float
    numel: int = 0
    mismatched: int = 0
    nonfinite: int = 0  # NaN/Inf in actual where the reference is finite
    max_abs: float = 0.0
    max_abs_index: tuple[int, ...] | None = None
    mean_abs: float = 0.0
    max_rel: float = 0.0
    max_rel_index: tuple[int, ...] | None = None
    mean_rel: float = 0.0
    worst_ratio: float = 0.0  # max of |a - r| / allowed: above 1 fails
    worst_index: tuple[int, ...] | None = None
    worst_actual: float = 0.0
    worst_expected: float = 0.0
    worst_allowed: float = 0.0
    problem: str | None = None  # a failure beyond the elementwise test (a shape mismatch, a mean criterion)
    ratio: Any = field(default=None, repr=False)  # elementwise |a - r| / allowed (inf where it fails outright)

    @property
    def passed(self) -> bool:
        return self.problem is None and self.mismatched == 0

    @property
    def fraction(self) -> float:
        return self.mismatched / self.numel if self.numel else 0.0

    def to_json(self) -> dict:
        skip = {"ratio"}
        out = {k: v for k, v in self.__dict__.items() if k not in skip}
        out["passed"], out["fraction"] = self.passed, self.fraction
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}

    def _times(self) -> str:
        if not math.isfinite(self.worst_actual):
            return "NaN/Inf where a finite value is expected"
        if not math.isfinite(self.worst_ratio):
            return "no difference is allowed there"
        if self.worst_ratio < RATIO_SHOWN_UP_TO:
            return f"{self.worst_ratio:.3g}x the tolerance"
        why = "the reference is exactly 0 there, so only rounding noise is allowed" if self.worst_expected == 0 \
            else "far outside it"
        return f"over 10^4 x the tolerance: {why}"

    def _means(self) -> str:
        """The mean differences; NaN/Inf are left out of them, so say how many were (an all-NaN result must not
        read as a mean difference of 0)."""
        means = f"{self.mean_abs:.3g} / {self.mean_rel:.3g}"
        if not self.nonfinite:
            return f"  mean absolute / relative difference: {means}"
        finite = self.numel - self.nonfinite
        if not finite:
            return "  mean absolute / relative difference: undefined (every element is NaN/Inf)"
        return (f"  mean absolute / relative difference over the {finite} finite elements: {means} "
                f"({self.nonfinite} NaN/Inf left out)")

    def message(self) -> str:
        """What differs, how much, where, and what was allowed."""
        if self.problem is not None and not self.numel:
            return f"{self.name}: {self.problem}"
        lines = [
            f"{self.name}: mismatched elements: {self.mismatched} / {self.numel} ({100 * self.fraction:.3g}%)",
            f"  greatest absolute difference: {self.max_abs:.4g} at index {self.max_abs_index}",
            f"  greatest relative difference: {self.max_rel:.4g} at index {self.max_rel_index}",
            self._means(),
            f"  worst element {self.worst_index}: got {self.worst_actual:.6g}, expected "
            f"{self.worst_expected:.6g}, allowed difference {self.worst_allowed:.3g} ({self._times()})",
            f"  tolerance: |a - r| <= {self.rtol:.3g} * |r| + {self.atol:.3g} * magnitude (+ reference error)",
        ]
        if self.nonfinite:
            lines.insert(1, f"  NaN/Inf where the reference is finite: {self.nonfinite}")
        if self.problem is not None:
            lines.insert(1, f"  {self.problem}")
        return "\n".join(lines)


def _resolve_tolerance(dtype, rtol, atol) -> Tolerance:
    if (rtol is None) != (atol is None):
        given, missing = ("rtol", "atol") if atol is None else ("atol", "rtol")
        raise ValueError(f"argument '{missing}': expected it together with '{given}' (both or neither)")
    if rtol is None:
        return tolerance_for(dtype)
    return Tolerance(check_term("rtol", rtol), check_term("atol", atol))


def check_term(name: str, value, *, tensors: bool = True):
    """A tolerance term (rtol, atol, a magnitude, a reference's error): a finite number >= 0 or, with
    ``tensors``, a tensor of them -- NaN, an infinity or a negative one would pass anything. A
    ``ValueError`` names the argument ``name``."""
    if tensors and isinstance(value, torch.Tensor):
        bad = ~torch.isfinite(value) | (value < 0) if value.is_floating_point() else value < 0
        if bool(bad.any()):
            raise ValueError(f"argument '{name}': expected finite values >= 0, got "
                             f"{float(value[bad].flatten()[0])} at {int(bad.sum())} elements")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        either = " (or a tensor of them)" if tensors else ""
        raise ValueError(f"argument '{name}': expected a finite number >= 0{either}, got {value!r}")
    return float(value)


def _index(flat: int, shape) -> tuple[int, ...]:
    index = []
    for size in reversed(tuple(shape)):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def compare_attention(actual, expected, *, dtype, rtol=None, atol=None, magnitude=1.0, accumulation=None,
                      reference_error=0.0, name="output") -> Comparison:
    """Compare ``actual`` with ``expected`` elementwise; return a :class:`Comparison`.

    ``dtype`` is the dtype of the computation being judged (it selects the table row);
    ``magnitude`` and ``reference_error`` are numbers or tensors broadcastable to the shape.
    """
    tol = _resolve_tolerance(dtype, rtol, atol)
    magnitude, reference_error = check_term("magnitude", magnitude), check_term("reference_error", reference_error)
    if accumulation is not None and (isinstance(accumulation, bool) or not isinstance(accumulation, int)
                                     or accumulation < 0):
        raise ValueError(f"argument 'accumulation': expected None or an int >= 0, got {accumulation!r}")
    result = Comparison(name=name, shape=tuple(expected.shape), rtol=tol.rtol, atol=tol.atol)
    if tuple(actual.shape) != tuple(expected.shape):
        result.problem = f"shape {list(actual.shape)} differs from the expected {list(expected.shape)}"
        return result
    a, r = actual.detach().double().cpu(), expected.detach().double().cpu()
    allowed = (tol.rtol * r.abs().nan_to_num(posinf=0.0)
               + tol.atol * accumulation_growth(accumulation) * _as_double(magnitude)
               + _as_double(reference_error))
    same_inf = torch.isinf(r) & (a == r)
    diff = torch.where(same_inf, 0.0, (a - r).abs())
    nonfinite = ~torch.isfinite(a) & torch.isfinite(r)
    diff = torch.where(torch.isnan(diff), math.inf, diff)
    ratio = torch.where(diff == 0, 0.0, diff / allowed)  # 0/0 is a match; x/0 (x > 0) is inf
    has_rel = r != 0  # a relative difference to 0 says nothing; those elements count in the absolute one
    rel = torch.where(diff == 0, 0.0, diff / r.abs())[has_rel]
    result.ratio = ratio
    result.numel = r.numel()
    if not result.numel:
        return result
    over = ratio > 1
    result.mismatched, result.nonfinite = int(over.sum()), int(nonfinite.sum())
    result.max_abs, at = _max_with_index(diff)
    result.max_abs_index = _index(at, r.shape)
    if rel.numel():
        result.max_rel, at = _max_with_index(rel)
        result.max_rel_index = _index(int(torch.nonzero(has_rel.flatten())[at]), r.shape)
    result.mean_abs = float(diff[torch.isfinite(diff)].mean()) if torch.isfinite(diff).any() else math.inf
    # no finite difference at all (an all-NaN result): the mean is infinite, never a reassuring 0
    result.mean_rel = float(rel[torch.isfinite(rel)].mean()) if torch.isfinite(rel).any() else \
        (math.inf if rel.numel() and bool((rel != 0).any()) else 0.0)
    result.worst_ratio, at = _max_with_index(ratio)
    result.worst_index = _index(at, r.shape)
    result.worst_actual, result.worst_expected = float(a.flatten()[at]), float(r.flatten()[at])
    result.worst_allowed = float(allowed.expand_as(r).flatten()[at])
    return result


def _as_double(x):
    return x.detach().double().cpu() if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=torch.float64)


def _max_with_index(t) -> tuple[float, int]:
    flat = t.flatten()
    at = int(flat.argmax())
    return float(flat[at]), at


def assert_attention_close(actual, expected, *, dtype, reference_error=0.0, rtol=None, atol=None, magnitude=1.0,
                           accumulation=None, name="output", msg=None):
    """Raise ``AssertionError`` with a full account unless ``actual`` is close to ``expected``.

    Arguments as :func:`compare_attention`; ``msg`` is prepended to the account. For the
    battery's error model pass ``**reference_attention(q, k, v, **kwargs).tolerance(name)``.
    """
    comparison = compare_attention(actual, expected, dtype=dtype, rtol=rtol, atol=atol, magnitude=magnitude,
                                   accumulation=accumulation, reference_error=reference_error, name=name)
    if not comparison.passed:
        header = "Attention results are not close!"
        raise AssertionError("\n".join(filter(None, [msg, header, comparison.message()])))


def reference_attention(q, k, v, grad_out=None, *, certified: bool = False, **protocol):
    """The float64 reference of one protocol call, with the error model the battery judges by.

    Returns an :class:`attnformal.verify.reference.Expected`: ``values`` (out, lse and, given
    ``grad_out``, dq, dk, dv; float64 on the CPU), ``magnitude`` (per element: how large the
    rounding errors of a correct kernel in ``q.dtype`` can be -- the root-sum-square of the
    summed terms, widened by the float32 accumulation and the scores' own rounding),
    ``radius`` (the reference's own error) and ``tolerance(name)``, the keyword arguments of
    :func:`assert_attention_close` for that tensor. ``certified=True`` uses the certified
    ball-arithmetic reference (rigorous radius; slower) for problems of up to 2^17 scores.
    ``protocol`` is the implementation protocol's keyword arguments (``causal=``, ``kv_lens=``...);
    ``dropout_p > 0`` needs its ``dropout_mask`` (else :class:`~attnformal.spec.SpecError`).
    """
    from attnformal.spec import require_dropout_mask
    from attnformal.verify.cases import Case
    from attnformal.verify.reference import expected_for

    case = Case("reference", q, k, v, dict(protocol), grad_out)
    require_dropout_mask(case.spec)
    return expected_for(case, backward=grad_out is not None, use_certified=certified)
