"""From measurements to a mechanism: fitted exponents beside the schedule's prediction.

Time is compared with three work models (:data:`attnformal.scale.work.MODELS`), each
fitted over exactly the points the measured exponent was fitted over, so a clipped window
or ragged tiles predict what they really cost in that range. When the exponent is off the
schedule's, a cost model says whether the tile counts still explain it: least squares of
``time = c + a * full tiles + b * partial tiles`` prices a call and a masked tile against a
full one (the diagonal of a causal mask is linear in N, so a costly masked tile or a large
per-call cost pulls the exponent under 2). Memory is compared with the
state the spec makes live (outputs and lse; gradients with ``--backward``) and with one
``Sq x Sk`` buffer -- the difference between a tiled kernel and a dense one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from attnformal.scale.fit import (OVERHEAD_FACTOR, TOLERANCE, ExponentFit, FitRefused, fit_exponent, flag_overhead,
                                  least_squares, local_exponents)
from attnformal.scale.problem import Problem
from attnformal.scale.sweep import MaskRun, Series
from attnformal.scale.work import MODELS

MEMORY_MODELS = {
    "state": "outputs, lse and (with backward) gradients: what the spec makes live",
    "scores": "one Sq x Sk buffer per (batch, head): what a dense kernel materialises",
}


@dataclass
class Analysis:
    """A series' time and memory fits, the predictions over the same range, and the verdicts."""

    local: dict[int, float] = field(default_factory=dict)  # x -> local time exponent (every point)
    flagged: set[int] = field(default_factory=set)  # x of points under the overhead threshold
    time: ExponentFit | None = None
    time_refused: str | None = None
    predicted: dict[str, float] = field(default_factory=dict)
    verdict: str = ""
    memory: ExponentFit | None = None
    memory_refused: str | None = None
    memory_predicted: dict[str, float] = field(default_factory=dict)
    memory_verdict: str = ""
    costs: TileCosts | None = None


@dataclass(frozen=True)
class TileCosts:
    """Seconds per call, per full tile and per partial (masked) tile, by least squares."""

    per_call: float
    per_tile: float  # per full tile; per visited tile when ``per_partial`` is None
    per_partial: float | None  # None: no partial tiles, or they grow in step with the full ones

    def predict(self, full: int, partial: int) -> float:
        if self.per_partial is None:
            return self.per_call + self.per_tile * (full + partial)
        return self.per_call + self.per_tile * full + self.per_partial * partial


def tile_costs(full, partial, times) -> TileCosts | None:
    """Fit ``time = c + a * full + b * partial`` in relative error (every point weighs alike).

    None when fewer than two points per unknown remain, the tile counts do not vary (a head
    dim sweep), or a cost comes out negative (the counts do not explain the times).
    """
    t = np.asarray(times, float)
    ones, full, partial = np.ones_like(t), np.asarray(full, float), np.asarray(partial, float)
    separable = np.linalg.matrix_rank(np.stack([ones, full, partial], 1)) == 3
    design = np.stack([ones, full, partial] if separable else [ones, full + partial], 1)
    if len(t) < 2 * design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
        return None
    cost, *_ = np.linalg.lstsq(design / t[:, None], ones, rcond=None)
    if (cost < 0).any():
        return None
    return TileCosts(float(cost[0]), float(cost[1]), float(cost[2]) if separable else None)


def analyse(series: Series, backward: bool, tolerance: float = TOLERANCE,
            overhead_factor: float = OVERHEAD_FACTOR, seed: int = 0) -> Analysis:
    """Fit time and memory of ``series``, compare them with the models, and attach the result."""
    points = series.measured()
    xs, medians = [p.x for p in points], [p.samples.median for p in points]
    result = series.analysis = Analysis()
    if points:
        result.local = dict(zip(xs, local_exponents(xs, medians)))
        result.flagged = {xs[i] for i in flag_overhead(medians, series.floor, overhead_factor)}
    try:
        result.time = fit_exponent(xs, medians, floor=series.floor,
                                   samples=[p.samples.values for p in points],
                                   overhead_factor=overhead_factor, seed=seed, what="time")
    except FitRefused as err:
        result.time_refused = str(err)
    unflagged = [p for p in points if p.x not in result.flagged]
    result.costs = tile_costs([p.work.tiles_full for p in unflagged], [p.work.tiles_partial for p in unflagged],
                              [p.samples.median for p in unflagged])
    if result.time is not None:
        used = [points[i] for i in result.time.used]
        result.predicted = {m: _exponent([p.x for p in used], [p.work.flops(m) for p in used]) for m in MODELS}
        costed = None if result.costs is None else _exponent([p.x for p in used], [
            result.costs.predict(p.work.tiles_full, p.work.tiles_partial) for p in used])
        result.verdict = time_verdict(result.time, result.predicted, tolerance, costed)
    try:
        result.memory = fit_exponent(xs, [p.memory.allocated for p in points], floor=series.floor_memory,
                                     overhead_factor=overhead_factor, what="memory")
    except FitRefused as err:
        result.memory_refused = str(err)
    else:
        used = [points[i] for i in result.memory.used]
        result.memory_predicted = {m: _exponent([p.x for p in used], [memory_model(p.problem, m, backward)
                                                                     for p in used]) for m in MEMORY_MODELS}
        result.memory_verdict = memory_verdict(result.memory, result.memory_predicted, tolerance)
    return result


@dataclass
class RatioAnalysis:
    """The exponent of the paired A/B time ratio: exponent(A) - exponent(B), noise shared."""

    fit: ExponentFit | None = None
    refused: str | None = None
    verdict: str = ""


def analyse_ratio(run: MaskRun, tolerance: float = TOLERANCE, seed: int = 0) -> RatioAnalysis:
    """Fit the per-point A/B ratio over the points where neither side is overhead-dominated.

    Both calls of a repeat ran back to back, so a slow spell of the machine scales both
    and cancels in their ratio: this difference of exponents survives noise that blurs
    each exponent on its own.
    """
    a, b = run.series
    kept = [(p.x, r) for p, q, r in zip(a.points, b.points, run.ratios)
            if r is not None and p.x not in a.analysis.flagged and q.x not in b.analysis.flagged]
    result = run.ratio_analysis = RatioAnalysis()
    try:
        result.fit = fit_exponent([x for x, _ in kept], [r.median for _, r in kept],
                                  samples=[r.values for _, r in kept], seed=seed,
                                  what="time ratio (points where neither side is overhead-dominated)")
    except FitRefused as err:
        result.refused = str(err)
        return result
    slope = result.fit.slope
    if abs(slope) <= tolerance + result.fit.half_width():
        result.verdict = f"{a.candidate.label} and {b.candidate.label} scale alike"
    else:
        steeper = a if slope > 0 else b
        result.verdict = f"{steeper.candidate.label}'s time grows faster by a factor of x^{abs(slope):.2f}"
    return result


def memory_model(problem: Problem, model: str, backward: bool) -> float:
    """Elements live under a memory model (the exponent, not the constant, is compared)."""
    b, hq, hkv, n, d = problem.batch, problem.heads, problem.heads_kv, problem.seq, problem.head_dim
    if model == "scores":
        return float(b * hq * n * n)
    outputs = b * hq * n * (d + 1)  # out and lse
    return float(outputs + (b * n * d * (hq + 2 * hkv) if backward else 0))  # dq, dk, dv


def _exponent(xs, ys) -> float:
    return least_squares(xs, ys)[0] if min(ys) > 0 else math.nan


def _matches(fit: ExponentFit, predicted: dict[str, float], tolerance: float) -> list[str]:
    allowance = tolerance + fit.half_width()
    return [m for m, p in predicted.items() if abs(fit.slope - p) <= allowance]


def time_verdict(fit: ExponentFit, predicted: dict[str, float], tolerance: float,
                 costed: float | None = None) -> str:
    """How the measured exponent relates to the work models; ``costed`` is the exponent of the
    fitted tile-cost model over the same range (an explanation fitted to these times, not a
    prediction)."""
    matches = _matches(fit, predicted, tolerance)
    if "schedule" in matches:
        return f"consistent with the schedule's visited tiles (predicted {predicted['schedule']:.2f})"
    if matches:
        alternatives = "; ".join(f"{m} {predicted[m]:.2f}: {MODELS[m]}" for m in matches)
        return f"NOT the schedule's {predicted['schedule']:.2f}; matches {alternatives}"
    if costed is not None and _matches(fit, {"costed": costed}, tolerance):
        return (f"off the schedule's {predicted['schedule']:.2f}, but its tile counts explain the times once "
                f"a per-call, per-full-tile and per-masked-tile cost are fitted (cost model exponent {costed:.2f})")
    return (f"matches no work model (schedule {predicted['schedule']:.2f}): the time is not set by the "
            f"work here -- look at the local exponents (overhead, caches, parallelism)")


def memory_verdict(fit: ExponentFit, predicted: dict[str, float], tolerance: float) -> str:
    state, scores = predicted["state"], predicted["scores"]
    if not scores > state + tolerance:
        return f"this parameter does not tell the state ({state:.2f}) from an Sq x Sk buffer ({scores:.2f})"
    matches = _matches(fit, predicted, tolerance)
    if "scores" in matches and "state" not in matches:
        return f"grows like an Sq x Sk buffer ({scores:.2f}): scores or a mask are materialised"
    if "state" in matches:
        return f"grows like the spec's state ({state:.2f}): no Sq x Sk buffer is live"
    if fit.slope < state:
        return (f"grows slower than the state ({state:.2f}): a fixed working set (tile buffers) still "
                f"weighs at these sizes; no Sq x Sk buffer is live")
    return "between the state and an Sq x Sk buffer: see the per-point peaks"
