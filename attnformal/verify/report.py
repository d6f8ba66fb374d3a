"""Reports: the terminal table, failure details with diagnosis, JSON, JUnit XML, a progress bar."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

from attnformal.verify.battery import BatteryReport
from attnformal.verify.runner import dtype_name

BAR_WIDTH = 30


class ProgressBar:
    """``[#####.....] 12/80 mask.window[float32]`` on stderr, redrawn in place (only on a terminal)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()

    def __call__(self, done: int, total: int, label: str):
        if not self.enabled:
            return
        filled = BAR_WIDTH * done // max(total, 1)
        line = f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {label}"
        self.stream.write(line[:120].ljust(120))
        if done == total:
            self.stream.write("\r" + " " * 120 + "\r")
        self.stream.flush()


def _cell(result) -> str:
    if result is None:
        return ""
    if result.status == "pass":
        ratio = result.metrics.get("worst_ratio")
        partial = (f" {result.cases - result.unsupported_cases}/{result.cases}" if result.unsupported_cases else "")
        return "pass" + (f" {ratio:.2g}" if ratio is not None else "") + partial
    if result.status == "FAIL":
        ratio = result.metrics.get("worst_ratio")
        return "FAIL" + (f" {ratio:.2g}" if ratio is not None and ratio != float("inf") else "")
    return result.status


def render(report: BatteryReport) -> str:
    return "\n".join([_header(report), "", _table(report), "", _summary(report), _failures(report),
                      _diagnosis(report)]).rstrip() + "\n"


def _header(report: BatteryReport) -> str:
    s = report.settings
    sources = sorted({r.reference for r in report.results if r.reference})
    return "\n".join([
        f"attnformal.verify -- impl {s.impl_name}",
        f"dtypes {', '.join(dtype_name(d) for d in s.dtypes)} | device {s.device} | profile {s.profile} | "
        f"tolerance {s.tolerance} | seed {s.seed}",
        f"reference: {'; '.join(sources) or 'none used'} | {report.machine}",
        "cells: status and the worst error as a multiple of the tolerance; 'n/m': cases supported",
    ])


def _table(report: BatteryReport) -> str:
    columns = []
    for r in report.results:
        if r.dtype not in columns:
            columns.append(r.dtype)
    names = []
    for r in report.results:
        if r.check not in names:
            names.append(r.check)
    by_key = {(r.check, r.dtype): r for r in report.results}
    width = max([len(n) for n in names] + [5]) + 2
    lines = ["check".ljust(width) + "".join(c.ljust(18) for c in columns)]
    for name in names:
        lines.append(name.ljust(width) + "".join(_cell(by_key.get((name, c))).ljust(18) for c in columns))
    return "\n".join(line.rstrip() for line in lines)


def _summary(report: BatteryReport) -> str:
    unsupported = sorted({r.check for r in report.results if r.status == "unsupported"})
    text = (f"{report.count('pass')} pass, {report.count('FAIL')} FAIL, {report.count('unsupported')} unsupported"
            + (f", {report.count('ERROR')} ERROR (battery defect)" if report.count("ERROR") else "")
            + f" in {report.seconds:.1f} s ({report.cpu_seconds:.1f} s CPU)")
    if report.stopped_early:
        text += " (stopped at the first failure: --fail-fast)"
    if unsupported:
        text += "\nunsupported: " + ", ".join(unsupported)
    return text + f"\nverdict: {'PASS' if report.passed else 'FAIL'}"


def _failures(report: BatteryReport) -> str:
    failed = [r for r in report.results if r.failed]
    if not failed:
        return ""
    out = ["", "Failures", "--------"]
    for r in failed:
        out.append(f"{r.label}: {r.summary}")
        out += [f"    {line}" for d in r.details for line in d.splitlines()]
        for f in r.findings:
            name = f"[{f.bug}] " if f.bug else ""
            out.append(f"    -> {name}{f.evidence}")
        if r.command:
            out.append(f"    reproduce: {r.command}")
        out.append("")
    return "\n".join(out)


def _diagnosis(report: BatteryReport) -> str:
    if report.passed:
        return ""
    if not report.diagnosis:
        return "\nDiagnosis: no known bug class matches; see the localisation above.\n"
    top, *others = report.diagnosis
    out = ["", "Diagnosis", "---------", f"most likely: {top.title} [{top.bug}]"]
    out += [f"    {e}" for e in top.evidence[:4]]
    if len(top.evidence) > 4:
        out.append(f"    ... and {len(top.evidence) - 4} more")
    for other in others[:3]:
        out.append(f"also consistent: {other.title} [{other.bug}] ({len(other.evidence)} findings)")
    return "\n".join(out)


def to_json(report: BatteryReport) -> dict:
    s = report.settings
    return {
        "impl": s.impl_name, "dtypes": [dtype_name(d) for d in s.dtypes], "device": s.device, "profile": s.profile,
        "tolerance": s.tolerance, "seed": s.seed, "machine": report.machine, "seconds": report.seconds,
        "cpu_seconds": report.cpu_seconds,
        "passed": report.passed, "results": [r.to_json() for r in report.results],
        "diagnosis": [{"bug": d.bug, "title": d.title, "score": d.score, "evidence": d.evidence}
                      for d in report.diagnosis],
    }


def to_junit(report: BatteryReport) -> str:
    suite = ET.Element("testsuite", name=f"attnformal.verify[{report.settings.impl_name}]",
                       tests=str(len(report.results)), failures=str(report.count("FAIL")),
                       errors=str(report.count("ERROR")), skipped=str(report.count("unsupported")),
                       time=f"{report.seconds:.3f}")
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname=f"attnformal.verify.{r.dtype}", name=r.check,
                             time=f"{r.seconds:.3f}")
        body = "\n".join(r.details + [f"-> {f.evidence}" for f in r.findings] + ([r.command] if r.command else []))
        if r.status == "FAIL":
            ET.SubElement(case, "failure", message=r.summary).text = body
        elif r.status == "ERROR":
            ET.SubElement(case, "error", message=r.summary).text = body
        elif r.status == "unsupported":
            ET.SubElement(case, "skipped", message=r.summary)
    return ET.tostring(suite, encoding="unicode")
