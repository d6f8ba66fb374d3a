"""Regression tracking: store a run's results, compare a later run with them.

A **regression** is a check that passed and now fails (or is now unsupported), or an error
that grew beyond run-to-run noise: the worst error, as a multiple of the tolerance, more
than doubled and grew by at least 0.05 of the tolerance. An **improvement** is the reverse.
With fixed seeds a deterministic kernel reproduces its errors exactly; the noise margin
absorbs thread-count and BLAS differences between machines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnformal.cli import write_atomic
from attnformal.verify.battery import BatteryReport
from attnformal.verify.runner import dtype_name

NOISE_FACTOR = 2.0
NOISE_FLOOR = 0.05
FORMAT = "attnformal.verify baseline v1"


@dataclass
class BaselineDiff:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = ["", "Baseline comparison", "-------------------"]
        lines += [f"REGRESSION  {r}" for r in self.regressions] or ["no regressions"]
        lines += [f"improved    {i}" for i in self.improvements]
        lines += [f"note        {n}" for n in self.notes]
        return "\n".join(lines)


def save_baseline(report: BatteryReport, path) -> None:
    s = report.settings
    data = {
        "format": FORMAT,
        "meta": {"impl": s.impl_name, "profile": s.profile, "tolerance": s.tolerance, "seed": s.seed,
                 "dtypes": [dtype_name(d) for d in s.dtypes], "machine": report.machine},
        "results": {r.label: {"status": r.status, "worst_ratio": r.metrics.get("worst_ratio"),
                              "max_abs": r.metrics.get("max_abs")} for r in report.results},
    }
    write_atomic(path, json.dumps(data, indent=1, default=_json_number))


def _json_number(x):
    return float(x)


def load_baseline(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"argument '--baseline': cannot read {path}: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"argument '--baseline': {path} is not a baseline written by --save-baseline")
    return data


def compare_baseline(report: BatteryReport, baseline: dict) -> BaselineDiff:
    diff = BaselineDiff()
    meta, s = baseline["meta"], report.settings
    for key, now in (("profile", s.profile), ("tolerance", s.tolerance), ("seed", s.seed)):
        if meta.get(key) != now:
            diff.notes.append(f"baseline was run with {key}={meta.get(key)}, this run with {key}={now}")
    old_results = baseline["results"]
    for r in report.results:
        old = old_results.get(r.label)
        if old is None:
            diff.notes.append(f"{r.label}: new check, not in the baseline")
            continue
        _compare_one(r.label, old, r.status, r.metrics.get("worst_ratio"), diff)
    missing = set(old_results) - {r.label for r in report.results}
    if missing:
        diff.notes.append(f"{len(missing)} checks of the baseline did not run: {', '.join(sorted(missing)[:5])}")
    return diff


def _compare_one(label, old, status, ratio, diff: BaselineDiff):
    was = old["status"]
    if was == "pass" and status in ("FAIL", "ERROR", "unsupported"):
        diff.regressions.append(f"{label}: pass -> {status}")
    elif was in ("FAIL", "ERROR") and status == "pass":
        diff.improvements.append(f"{label}: {was} -> pass")
    elif was == "unsupported" and status != "unsupported":
        diff.notes.append(f"{label}: unsupported -> {status}")
    elif was == status == "pass" and ratio is not None and old.get("worst_ratio") is not None:
        before = old["worst_ratio"]
        if ratio > NOISE_FACTOR * before and ratio - before >= NOISE_FLOOR:
            diff.regressions.append(f"{label}: error grew from {before:.3g}x to {ratio:.3g}x the tolerance")
        elif before > NOISE_FACTOR * ratio and before - ratio >= NOISE_FLOOR:
            diff.improvements.append(f"{label}: error shrank from {before:.3g}x to {ratio:.3g}x the tolerance")
