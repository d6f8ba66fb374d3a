"""Reports: progress, the terminal table, coverage, failure details with diagnosis, JSON, JUnit XML."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

from attnformal.testing import format_ratio
from attnformal.verify.battery import BatteryReport, judge

BAR_WIDTH = 30
CELL = 18


class ProgressBar:
    """Progress on stderr: ``[#####.....] 12/80 mask.window[float32]`` redrawn in place on a terminal,
    one plain line per finished check otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def __call__(self, done: int, total: int, label: str, result=None):
        if not self.tty:
            text = label if result is None else f"[{done}/{total}] {label}: {_cell(result)} ({result.seconds:.1f} s)"
            self.stream.write(f"attnformal.verify: {text}\n")
        else:
            filled = BAR_WIDTH * done // max(total, 1)
            line = f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {label}"
            self.stream.write(line[:120].ljust(120))
            if total and done == total:
                self.stream.write("\r" + " " * 120 + "\r")
        self.stream.flush()


def _cell(result) -> str:
    if result is None:
        return ""
    ratio = result.metrics.get("worst_ratio")
    if result.status == "pass":
        adapted = "*" if result.coverage.get("adapted") else ""
        partial = (f" {result.cases - result.unsupported_cases}/{result.cases}" if result.unsupported_cases else "")
        return f"pass{adapted}" + (f" {format_ratio(ratio)}" if ratio is not None else "") + partial
    if result.status == "FAIL":
        if result.kind:
            return f"FAIL {result.kind}"
        return "FAIL" + (f" {format_ratio(ratio)}" if ratio is not None and ratio != float("inf") else "")
    return result.status


def render(report: BatteryReport, *, previous: str | None = None) -> str:
    """The whole terminal report; ``previous`` says where an earlier run's files went."""
    parts = [_header(report), "", _table(report), "", _summary(report, previous), _coverage(report),
             _failures(report), _diagnosis(report)]
    return "\n".join(parts).rstrip() + "\n"


def _columns(report: BatteryReport) -> list[str]:
    seen = list(report.dtypes)
    for r in report.results:
        if r.dtype not in seen:
            seen.append(r.dtype)
    return seen


def _header(report: BatteryReport) -> str:
    s = report.settings
    sources = sorted({r.reference for r in report.results if r.reference})
    dtypes = ", ".join(report.dtypes)
    if report.replaced:
        dtypes = (dtypes or "none") + f" (the implementation refuses {', '.join(report.replaced)} of the default dtypes)"
    lines = [
        f"attnformal.verify -- impl {s.impl_name}",
        f"dtypes {dtypes} | device {s.device} | profile {s.profile} | tolerance {s.tolerance} | seed {s.seed}",
        f"reference: {'; '.join(sources) or 'none used'} | {report.machine}",
        "run: " + _where(s),
    ]
    extra = [c for c in _columns(report) if c not in report.dtypes]
    for column in extra:
        checks = sorted({r.check for r in report.results if r.dtype == column})
        lines.append(f"{column} column: {', '.join(checks)} runs in {column} whatever --dtypes "
                     "(finite differences need double precision; float32 if the implementation refuses float64)")
    lines.append("cells: status and the worst error as a multiple of the tolerance (>1e4: far outside it); "
                 "'n/m': cases supported; '*': on cases adapted to what the implementation accepts (see Coverage)")
    return "\n".join(lines)


def _where(s) -> str:
    if not s.distributed:
        workers = "a worker process" if s.jobs == 1 else f"{s.jobs} worker processes side by side (--jobs)"
        return (f"isolated in {workers} (a crash or a call over {s.case_timeout:g} s fails its check)"
                if s.isolate else "in this process (--isolate to survive crashes and hangs)")
    cluster = f"a local Dask cluster of {s.workers} worker processes" if s.workers else \
        f"the Dask cluster at {s.cluster}"
    if s.isolate:
        return (f"on {cluster}, each check isolated in a child process of its worker (a crash or a call over "
                f"{s.case_timeout:g} s fails its check)")
    return f"on {cluster}, each check in a worker (one that dies fails its check; --isolate to survive hangs)"


def _table(report: BatteryReport) -> str:
    columns = _columns(report)
    names = list(dict.fromkeys(r.check for r in report.results))
    by_key = {(r.check, r.dtype): r for r in report.results}
    width = max([len(n) for n in names] + [5]) + 2
    lines = ["check".ljust(width) + "".join(c.ljust(CELL) for c in columns)]
    for name in names:
        lines.append(name.ljust(width) + "".join(_cell(by_key.get((name, c))).ljust(CELL) for c in columns))
    return "\n".join(line.rstrip() for line in lines)


def _unsupported(report: BatteryReport) -> str:
    """Checks unsupported in every dtype they ran in, by name; the others with their dtypes."""
    parts = []
    for name in dict.fromkeys(r.check for r in report.results):
        ran = [r for r in report.results if r.check == name]
        refused = [r.dtype for r in ran if r.status == "unsupported"]
        if refused:
            parts.append(name if len(refused) == len(ran) else f"{name} [{', '.join(refused)}]")
    return ", ".join(parts)


def _summary(report: BatteryReport, previous) -> str:
    text = (f"{report.count('pass')} pass, {report.count('FAIL')} FAIL, {report.count('unsupported')} unsupported"
            + (f", {report.count('ERROR')} ERROR (battery defect)" if report.count("ERROR") else "")
            + f" in {report.seconds:.1f} s ({report.cpu_seconds:.1f} s CPU)")
    if report.stopped_early:
        text += " (stopped at the first failure: --fail-fast)"
    if report.probes:
        failed = [r.label for r in report.probes if r.failed]
        text += (f"\nfor the diagnosis (the failure above names no cause; outside the verdict): {len(report.probes)} "
                 f"checks that name causes ran after it, {len(failed)} failed"
                 + (f": {', '.join(failed)}" if failed else ""))
    unsupported = _unsupported(report)
    if unsupported:
        text += "\nunsupported: " + unsupported
    for note in report.notes:
        text += f"\nnote: {note}"
    written = [r.reproducer for r in report.results if r.reproducer]
    if report.settings.repro_dir is not None and not written and previous:
        text += f"\nno reproducer written; {previous}"
    verdict, reasons = judge(report)
    return text + f"\nverdict: {verdict}" + "".join(f"\n  {line}" for line in reasons)


def _coverage(report: BatteryReport) -> str:
    cov = report.coverage
    if not cov:
        return ""
    lines = ["", "Coverage", "--------"]
    lines += [f"probed {caps.summary()}" for caps in report.capabilities.values() if caps is not None]
    adapted = ", ".join(f"{note} {n}" for note, n in cov["adaptations"].items())
    lines.append(f"cases: {cov['run']} ran" + (f" ({cov['adapted']} adapted: {adapted})" if cov["adapted"] else "")
                 + f", {cov['refused']} refused")
    lines.append(f"exercised: {', '.join(cov['classes'] + cov['features']) or 'nothing'}")
    missing = cov["missing_classes"] + cov["missing_features"]
    if missing:
        lines.append(f"not exercised: {', '.join(missing)}")
    if cov.get("regimes"):
        lines.append(f"shape regimes run: {len(cov['regimes'])} of {len(cov['regimes']) + len(cov['missing_regimes'])}"
                     + (f" (not run: {', '.join(cov['missing_regimes'])})" if cov["missing_regimes"] else ""))
    lines += _matrix(cov.get("matrix") or {})
    if cov["thin"] and report.state == "complete":
        lines.append(f"WARNING: coverage is thin: {cov['run']} cases ran, {len(missing)} of the shape classes and "
                     "features above were not exercised; a PASS says little beyond them")
    return "\n".join(lines)


def _matrix(matrix: dict) -> list[str]:
    """The feature x check matrix, one line per feature: the checks it ran in, those where lse was judged with it
    and those that took it through the backward (--json has the case counts)."""
    if not matrix:
        return []
    lines = ["feature x check (cases; L: with lse judged, B: through the backward):"]
    width = max(len(f) for f in matrix) + 2
    for feature, checks in matrix.items():
        cells = [f"{check} {row['cases']}" + ("L" if row["lse"] else "") + ("B" if row["backward"] else "")
                 for check, row in checks.items()]
        lse, backward = (sum(bool(row[p]) for row in checks.values()) for p in ("lse", "backward"))
        lines.append(f"  {feature.ljust(width)}{len(checks)} checks, lse in {lse}, backward in {backward}: "
                     + ", ".join(cells))
    never = [f for f, checks in matrix.items() if not any(row["backward"] for row in checks.values())]
    if never:
        lines.append(f"  never through the backward: {', '.join(never)}")
    return lines


def _failures(report: BatteryReport) -> str:
    failed = [(r, "") for r in report.results if r.failed] + [(r, " (run for the diagnosis)")
                                                                  for r in report.probes if r.failed]
    if not failed:
        return ""
    out = ["", "Failures", "--------"]
    for r, note in failed:
        out.append(f"{r.label}: {r.summary}{note}")
        out += [f"    {line}" for d in r.details for line in d.splitlines()]
        for f in r.findings:
            name = f"[{f.bug}] " if f.bug else ""
            out.append(f"    -> {name}{f.evidence}")
        if r.command:
            out.append(f"    reproduce: {r.command}")
        if r.picture:
            out.append(f"    error map: {r.picture}")
        out.append("")
    return "\n".join(out)


def _diagnosis(report: BatteryReport) -> str:
    if not any(r.failed for r in report.results):
        return ""
    if not report.diagnosis:
        return "\nDiagnosis: no known bug class matches; see the localisation above.\n"
    top, *others = report.diagnosis
    out = ["", "Diagnosis", "---------", f"most likely: {top.title} [{top.bug}] ({_explains(report, top)})"]
    out += [f"    {e}" for e in top.evidence[:4]]
    if len(top.evidence) > 4:
        out.append(f"    ... and {len(top.evidence) - 4} more")
    for other in others:  # every hypothesis that explains a failing check
        out.append(f"also: {other.title} [{other.bug}] ({_explains(report, other)}; {len(other.evidence)} findings)")
        out.append(f"    {other.evidence[0]}")
    explained = {label for d in report.diagnosis for label in d.checks}
    unexplained = [r.label for r in report.examined if r.status == "FAIL" and r.label not in explained]
    if unexplained:
        out.append(f"no class explains: {', '.join(unexplained)} (see the localisation above)")
    return "\n".join(out)


def _explains(report: BatteryReport, ranked) -> str:
    failing = sum(r.status == "FAIL" for r in report.examined)
    return f"explains {len(ranked.checks)} of {failing} failing checks"


def to_json(report: BatteryReport, *, results: bool = True) -> dict:
    """The run as JSON-able data (without the results with ``results=False``)."""
    s = report.settings
    verdict, reasons = judge(report)
    return {
        "impl": s.impl_name, "dtypes": list(report.dtypes), "replaced_dtypes": list(report.replaced), "device": s.device,
        "profile": s.profile, "tolerance": s.tolerance, "seed": s.seed, "isolated": s.isolate, "jobs": s.jobs,
        "workers": s.workers, "cluster": s.cluster,
        "machine": report.machine, "state": report.state, "seconds": report.seconds,
        "cpu_seconds": report.cpu_seconds, "verdict": verdict, "reasons": reasons, "passed": verdict == "PASS",
        "checks_planned": report.planned,
        "diagnosis": [{"bug": d.bug, "title": d.title, "score": d.score, "evidence": d.evidence, "checks": d.checks}
                      for d in report.diagnosis],
        "capabilities": {d: (None if c is None else c.__dict__) for d, c in report.capabilities.items()},
        "coverage": report.coverage, "notes": report.notes,
    } | ({"results": [r.to_json() for r in report.results],
          "diagnostic_results": [r.to_json() for r in report.probes]} if results else {})


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
            ET.SubElement(case, "failure", message=r.summary, type=r.kind or "FAIL").text = body
        elif r.status == "ERROR":
            ET.SubElement(case, "error", message=r.summary).text = body
        elif r.status == "unsupported":
            ET.SubElement(case, "skipped", message=r.summary)
    verdict, reasons = judge(report)
    if verdict not in ("PASS", "FAIL"):  # a run that verified too little fails in CI too
        case = ET.SubElement(suite, "testcase", classname="attnformal.verify", name="verdict")
        ET.SubElement(case, "failure", message=verdict, type=verdict).text = "\n".join(reasons)
        suite.set("tests", str(len(report.results) + 1))
        suite.set("failures", str(report.count("FAIL") + 1))
    return ET.tostring(suite, encoding="unicode")
