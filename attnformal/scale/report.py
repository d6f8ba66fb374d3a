"""The sweep as a table, a JSON record and a CSV file, and the folder they are written to.

The folder (``out/scale/<impl>`` by default) is checked before the first point is measured and
locked for the run (:func:`attnformal.cli.folder_lock`: a second run into it is refused). An
earlier run's :data:`OUTPUTS` stay until this run's are all written; then they are replaced
together and the ones this run did not write are removed (:func:`attnformal.cli.replace_together`),
so a Ctrl-C or a full disk keeps the earlier run's files and an output never outlives the run that wrote it.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from attnformal.cli import atomic_path, human_bytes, output_folder
from attnformal.scale.analysis import MEMORY_MODELS, Analysis
from attnformal.scale.fit import ExponentFit
from attnformal.scale.sweep import MaskRun, Series, Settings
from attnformal.scale.work import MODELS

OUTPUTS = ("sweep.json", "sweep.csv", "sweep.png")


def prepare_out(folder: Path):
    """Create ``folder``, or ``ValueError`` naming ``--out`` if it cannot be written."""
    output_folder(folder, "--out")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def _local(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2f}"


def series_table(series: Series, param: str, settings: Settings, overhead_factor: float) -> str:
    """One block: a header with what is fixed, a row per point, the fits and verdicts."""
    analysis: Analysis = series.analysis
    fixed = f"{series.points[0].problem.describe(param)} {settings.describe()}" if series.points else ""
    lines = [f"== {series.candidate.label} | mask {series.mask.label} | fixed: {fixed} | "
             f"{series.candidate.describe_schedule()}",
             f"   per-call floor {_ms(series.floor)} ms (1-token call); points under {overhead_factor:g}x it "
             f"are flagged 'ovh' and not fitted" if not math.isnan(series.floor) else
             "   per-call floor not measured: the 1-token call is unsupported"]
    header = (f"{param:>7} {'pairs':>12} {'tiles (full/part)':>19} {'time ms':>10} {'IQR ms':>19} {'local':>6} "
              f"{'flag':>4} {'peak alloc':>11} {'reserved':>10}  backend  [fixed]")
    lines.append(header)
    for p in series.points:
        w = p.work
        tiles = f"{w.tiles_visited} ({w.tiles_full}/{w.tiles_partial})"
        if p.samples is None:
            lines.append(f"{p.x:>7} {w.pairs:>12} {tiles:>19}  {p.failure}")
            continue
        q1, q3 = p.samples.iqr
        lines.append(
            f"{p.x:>7} {w.pairs:>12} {tiles:>19} {_ms(p.samples.median):>10} {_ms(q1) + '..' + _ms(q3):>19} "
            f"{_local(analysis.local[p.x]):>6} {'ovh' if p.x in analysis.flagged else '':>4} "
            f"{human_bytes(p.memory.allocated):>11} {human_bytes(p.memory.reserved):>10}  {p.backend}  "
            f"[{p.problem.describe(param)}]")
    lines += fit_lines("time", analysis.time, analysis.time_refused, analysis.predicted, analysis.verdict, param)
    lines.append(f"   cost model over the unflagged points: {cost_text(analysis.costs, series)}")
    lines += fit_lines("memory", analysis.memory, analysis.memory_refused, analysis.memory_predicted,
                       analysis.memory_verdict, param)
    return "\n".join(lines)


def fit_lines(what, fit: ExponentFit | None, refused, predicted, verdict, param) -> list[str]:
    if fit is None:
        return [f"   {what} exponent: fit refused -- {refused}"]
    lo, hi = (int(x) for x in fit.x_range())
    ci = f", 95% bootstrap [{fit.bootstrap_ci[0]:.2f}, {fit.bootstrap_ci[1]:.2f}]" if fit.bootstrap_ci else ""
    where = "valid over" if fit.stable else "fitted over (no range with a stable local exponent)"
    lines = [f"   {what} exponent {fit.slope:.2f} +/- {fit.stderr:.2f} (SE){ci}; {where} {param}={lo}..{hi} "
             f"({len(fit.used)} points)"]
    predictions = "predicted: " + " | ".join(f"{m} {v:.2f}" for m, v in predicted.items()) + "  ->  "
    lines.append(f"   {predictions if predicted else ''}{verdict}")
    lines += [f"   note: {note}" for note in fit.notes]
    return lines


def cost_text(costs, series: Series) -> str:
    if costs is None:
        return "not determined (too few points, tile counts that do not vary, or a negative cost)"
    text = f"{_ms(costs.per_call)} ms per call + {_ms(costs.per_tile)} ms per "
    if costs.per_partial is not None:
        return (text + f"full tile + {_ms(costs.per_partial)} ms per partial tile (a masked tile costs "
                f"{costs.per_partial / costs.per_tile:.2g}x a full one)")
    if all(p.work.tiles_partial == 0 for p in series.points):
        return text + "tile (all tiles full)"
    return text + "visited tile (partial tiles grow in step with full ones: not separable)"


def ratio_table(run: MaskRun, param: str) -> str:
    a, b = (s.candidate.label for s in run.series)
    lines = [f"== ratio {a} / {b} | mask {run.mask.label} (per-repeat ratios, interleaved)",
             f"{param:>7} {'median':>8} {'IQR':>17}"]
    for p, ratio in zip(run.series[0].points, run.ratios):
        if ratio is None:
            lines.append(f"{p.x:>7}  -")
            continue
        q1, q3 = ratio.iqr
        lines.append(f"{p.x:>7} {ratio.median:>8.3g} {f'{q1:.3g}..{q3:.3g}':>17}")
    analysis = run.ratio_analysis
    lines += fit_lines("ratio", analysis.fit, analysis.refused, {}, analysis.verdict, param)
    return "\n".join(lines)


def fit_json(fit: ExponentFit | None, refused, predicted, verdict) -> dict:
    if fit is None:
        return {"refused": refused}
    return {"exponent": fit.slope, "stderr": _finite(fit.stderr), "bootstrap_ci95": fit.bootstrap_ci,
            "used_points": list(fit.used), "stable": fit.stable, "local_exponents": [_finite(v) for v in fit.local],
            "flagged_overhead": list(fit.flagged), "notes": list(fit.notes), "predicted": predicted,
            "verdict": verdict}


def _finite(v: float):
    return None if math.isnan(v) else v


def to_json(runs: list[MaskRun], meta: dict) -> dict:
    out = {**meta, "work_models": MODELS, "memory_models": MEMORY_MODELS, "series": []}
    for run in runs:
        for s in run.series:
            a: Analysis = s.analysis
            out["series"].append({
                "impl": s.candidate.label, "mask": s.mask.label, "schedule": s.candidate.describe_schedule(),
                "floor_seconds": _finite(s.floor), "floor_memory_bytes": s.floor_memory,
                "time_fit": fit_json(a.time, a.time_refused, a.predicted, a.verdict),
                "tile_costs_seconds": None if a.costs is None else asdict(a.costs),
                "memory_fit": fit_json(a.memory, a.memory_refused, a.memory_predicted, a.memory_verdict),
                "points": [_point_json(p) for p in s.points],
            })
        if len(run.series) == 2:
            ratio = run.ratio_analysis
            out.setdefault("ratios", []).append({
                "mask": run.mask.label, "numerator": run.series[0].candidate.label,
                "denominator": run.series[1].candidate.label,
                "fit": fit_json(ratio.fit, ratio.refused, {}, ratio.verdict),
                "points": [{"x": p.x, "median": r.median, "iqr": r.iqr, "samples": r.values} if r else {"x": p.x}
                           for p, r in zip(run.series[0].points, run.ratios)]})
    return out


def _point_json(p) -> dict:
    record = {"x": p.x, "problem": p.problem.spec().to_json(), "work": p.work.to_json(), "failure": p.failure}
    if p.samples is not None:
        record.update(time_median=p.samples.median, time_iqr=p.samples.iqr, time_samples=p.samples.values,
                      peak_allocated_bytes=p.memory.allocated, peak_reserved_bytes=p.memory.reserved,
                      backend=p.backend, ops=list(p.memory.ops), kernels=list(p.memory.kernels))
    return record


CSV_FIELDS = ["impl", "mask", "param", "x", "batch", "heads_q", "heads_kv", "seq", "head_dim", "window",
              "dtype", "device", "mode", "pairs", "tiles_visited", "tiles_full", "tiles_partial", "tiles_total",
              "flops_schedule", "time_median_s", "time_q1_s", "time_q3_s", "repeats", "overhead_flag",
              "peak_allocated_bytes", "peak_reserved_bytes", "backend", "failure", "ratio_median"]


def write_csv(path: Path, runs: list[MaskRun], param: str, settings: Settings):
    with atomic_path(path) as partial, open(partial, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for run in runs:
            for s in run.series:
                for p, ratio in zip(s.points, run.ratios):
                    writer.writerow(_csv_row(s, p, param, settings, p.x in s.analysis.flagged,
                                             ratio if s is run.series[0] else None))


def _csv_row(s: Series, p, param, settings: Settings, flagged: bool, ratio) -> dict:
    spec = p.problem.spec()
    row = {"impl": s.candidate.label, "mask": s.mask.label, "param": param, "x": p.x, "batch": spec.batch,
           "heads_q": spec.heads_q, "heads_kv": spec.heads_kv, "seq": spec.len_q, "head_dim": spec.head_dim,
           "window": "" if spec.window is None else spec.window[0],
           "dtype": str(settings.dtype).removeprefix("torch."), "device": settings.device.name,
           "mode": "fwd+bwd" if settings.backward else "fwd", "pairs": p.work.pairs,
           "tiles_visited": p.work.tiles_visited, "tiles_full": p.work.tiles_full,
           "tiles_partial": p.work.tiles_partial, "tiles_total": p.work.tiles_total,
           "flops_schedule": p.work.flops("schedule"), "failure": p.failure or "",
           "ratio_median": "" if ratio is None else ratio.median}
    if p.samples is not None:
        q1, q3 = p.samples.iqr
        row.update(time_median_s=p.samples.median, time_q1_s=q1, time_q3_s=q3, repeats=len(p.samples.values),
                   overhead_flag=int(flagged), peak_allocated_bytes=p.memory.allocated,
                   peak_reserved_bytes="" if p.memory.reserved is None else p.memory.reserved, backend=p.backend)
    return row


def write_json(path: Path, record: dict):
    with atomic_path(path) as partial, open(partial, "w") as f:
        json.dump(record, f, indent=1)
