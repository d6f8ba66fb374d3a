"""Running the whole battery for one implementation: probe it, run every selected check per dtype, judge.

1. **Probe** (:mod:`.capabilities`): in each dtype, what the implementation accepts. With
   the default dtypes, one it refuses altogether is replaced by one it accepts (float16,
   bfloat16, float32); with ``--dtypes`` given, it stays and the verdict says so.
2. **Run** every selected (check, dtype) as a task of an executor (:mod:`.execute`: in this
   process, isolated in a worker process, or on a Dask cluster), in order; each result is handed to
   ``on_result`` as it completes (the CLI writes ``results.json`` then). Ctrl-C stops the
   run and keeps what finished.
3. **Judge** (:func:`judge`): the verdict of the run, never a PASS for a run that verified
   nothing.

With ``--fail-fast`` the run stops at the first failing check. When that check's findings name no bug
class (it saw a symptom: a wrong value, a NaN), the selected checks that name causes
(``Check.names_causes``) then run in its dtype, for the diagnosis only: they are the report's
``probes``, outside the verdict and the counts.

Verdicts: ``PASS`` -- every check that ran passed, and enough ran: in every dtype at least
one check passed, and a forward accuracy check (groups :data:`FORWARD_GROUPS`) when any was
selected; ``FAIL`` -- a check failed (crash and hang included) or a required feature is
refused; ``INTERNAL ERROR`` -- no check failed, but the battery itself raised in one;
``NOTHING VERIFIED`` -- no check passed; ``INCOMPLETE`` -- some passed, but not the minimum
above; ``INTERRUPTED``.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnformal.cli import DTYPES
from attnformal.pictures.errors import write_error_map
from attnformal.verify.checks import CHECKS, Check
from attnformal.verify.coverage import run_coverage
from attnformal.verify.diagnosis import Ranked, summarise
from attnformal.verify.execute import Distributed, InProcess, Isolated, Task
from attnformal.verify.runner import CheckResult, Settings, dtype_name

FORWARD_GROUPS = ("hand", "fwd", "mask", "structured", "extreme")
SUBSTITUTES = ("float16", "bfloat16", "float32")  # tried, in order, for default dtypes the implementation refuses


@dataclass
class BatteryReport:
    settings: Settings
    results: list[CheckResult] = field(default_factory=list)
    probes: list[CheckResult] = field(default_factory=list)  # run after a --fail-fast stop, for the diagnosis only
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    diagnosis: list[Ranked] = field(default_factory=list)
    stopped_early: bool = False
    state: str = "running"  # "running" | "complete" | "interrupted"
    dtypes: tuple[str, ...] = ()  # the dtypes the checks ran in (after substitution)
    replaced: tuple[str, ...] = ()  # default dtypes the implementation refuses (others run in their place)
    capabilities: dict = field(default_factory=dict)  # dtype name -> Capabilities (None: probing crashed)
    notes: list[str] = field(default_factory=list)
    coverage: dict = field(default_factory=dict)
    planned: int = 0
    machine: str = field(default_factory=lambda: f"{platform.machine()}, {os.cpu_count()} CPUs, torch "
                                                  f"{torch.__version__}, {torch.get_num_threads()} torch threads")

    @property
    def verdict(self) -> str:
        return judge(self)[0]

    @property
    def reasons(self) -> list[str]:
        return judge(self)[1]

    @property
    def passed(self) -> bool:
        """The verdict is PASS: every check that ran passed, and enough was verified."""
        return self.verdict == "PASS"

    @property
    def examined(self) -> list[CheckResult]:
        """The verdict's results, then those run for the diagnosis only."""
        return self.results + self.probes

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)


def selected(settings: Settings) -> list[Check]:
    return [c for c in CHECKS if not (c.full_only and settings.profile != "full") and settings.selects(c.name)]


def planned(settings: Settings, dtypes=None) -> list[tuple[Check, torch.dtype]]:
    """The (check, dtype) pairs a run will execute, in order."""
    dtypes = settings.dtypes if dtypes is None else [DTYPES[d] for d in dtypes]
    return [(chk, dtype) for chk in selected(settings)
            for dtype in ([chk.fixed_dtype] if chk.fixed_dtype is not None else dtypes)]


def make_executor(settings: Settings):
    """The executor ``settings`` ask for (``close`` it after use); ``ValueError`` or
    :class:`~attnformal.distributed.EngineMissing` when it cannot be had."""
    if settings.distributed:
        return Distributed(settings)
    return Isolated(settings, settings.jobs) if settings.isolate else InProcess(settings)


def run_battery(settings: Settings, progress: Callable | None = None, *, on_result: Callable | None = None,
                executor=None) -> BatteryReport:
    """Run every planned check; torch uses ``settings.threads`` CPU threads meanwhile (restored after).

    ``progress(done, total, label, result)`` and ``on_result(report)`` are called after each check.
    """
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    own = executor is None
    executor = executor or make_executor(settings)
    try:
        return _run(settings, executor, progress, on_result)
    finally:
        if own:
            executor.close()
        torch.set_num_threads(threads)


def _run(settings: Settings, executor, progress, on_result) -> BatteryReport:
    report = BatteryReport(settings, dtypes=tuple(dtype_name(d) for d in settings.dtypes))
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        _probe(settings, executor, report, progress)
        capabilities = {name: c for name, c in report.capabilities.items() if c is not None}
        pairs = planned(settings, report.dtypes)
        report.planned = len(pairs)
        tasks = [Task("check", chk.name, dtype_name(dtype), capabilities) for chk, dtype in pairs]
        clock = start, cpu_start
        stop = None
        for n, result in _perform(executor, tasks, report, report.results, clock, progress, on_result):
            if result.failed and settings.fail_fast:
                report.stopped_early, stop = n < len(tasks), result
                break
        if stop is not None and not summarise([stop]):
            _probe_causes(executor, report, stop, capabilities, clock, progress, on_result)
        report.state = "complete"
    except KeyboardInterrupt:
        report.state = "interrupted"
    _clock(report, start, cpu_start)
    report.diagnosis = summarise(report.examined)
    report.coverage = run_coverage(report.results, selected_all=not settings.only)
    return report


def _perform(executor, tasks, report: BatteryReport, into: list, clock, progress, on_result, prefix=""):
    """Run ``tasks``; yield ``(n, result)`` after adding each result to ``into`` and reporting it."""
    for n, (task, result) in enumerate(executor.map(tasks), start=1):
        write_error_map(report.settings, result)  # here, where the run's files go, whichever process ran the check
        into.append(result)
        _clock(report, *clock)
        if progress is not None:
            progress(n, len(tasks), prefix + task.label, result)
        if on_result is not None:
            on_result(report)
        yield n, result


def _probe_causes(executor, report: BatteryReport, stop: CheckResult, capabilities, clock, progress, on_result):
    """After a --fail-fast stop at a check whose findings name no class: the selected checks that name causes,
    not run yet, in its dtype, into ``report.probes``."""
    ran = {(r.check, r.dtype) for r in report.results}
    dtype = stop.dtype if stop.dtype in report.dtypes else report.dtypes[0]  # not a fixed-dtype check's float64
    tasks = [Task("check", chk.name, dtype_name(d), capabilities) for chk, d in planned(report.settings, [dtype])
             if chk.names_causes and (chk.name, dtype_name(d)) not in ran]
    for _ in _perform(executor, tasks, report, report.probes, clock, progress, on_result, "for the diagnosis: "):
        pass


def _clock(report: BatteryReport, start: float, cpu_start: float):
    """Wall time, and CPU time of this process plus, when they ran elsewhere, of the checks in the workers."""
    elsewhere = report.settings.isolate or report.settings.distributed
    worker = sum(r.cpu_seconds for r in report.examined) if elsewhere else 0.0
    report.seconds, report.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start + worker


def _probe(settings: Settings, executor, report: BatteryReport, progress):
    """Probe the run's dtypes (and float64/float32 for fixed-dtype checks); replace refused default dtypes."""
    wanted = list(report.dtypes)
    extra = {dtype_name(c.fixed_dtype) for c in selected(settings) if c.fixed_dtype is not None}
    extra |= {"float32"} if extra else set()  # the finite-difference check falls back to float32
    extra |= {"float64"} if "fp64" in settings.require else set()
    _probe_dtypes(executor, report, wanted + sorted(extra - set(wanted)), progress)
    refused = [d for d in wanted if not _accepted(report, d)]
    if not refused:
        return
    _probe_dtypes(executor, report, [d for d in SUBSTITUTES if d not in report.capabilities], progress)
    if settings.explicit_dtypes:
        return  # the verdict names the dtypes it accepts
    substitutes = [d for d in SUBSTITUTES if d not in wanted and _accepted(report, d)]
    report.replaced = tuple(refused)
    report.dtypes = tuple(d for d in wanted if d not in refused) + tuple(substitutes[:len(refused)])


def _accepted(report, dtype) -> bool:
    caps = report.capabilities.get(dtype)
    return caps is None or caps.accepted  # probing crashed: the checks will say more


def _probe_dtypes(executor, report: BatteryReport, dtypes, progress):
    for task, result in executor.map([Task("probe", dtype=d) for d in dtypes]):
        if isinstance(result, CheckResult):  # the worker crashed or hung while probing
            report.capabilities[task.dtype] = None
            report.notes.append(f"{task.label}: {result.summary}")
        else:
            report.capabilities[task.dtype] = result
        if progress is not None:
            progress(0, 0, task.label, None)


# ---------------------------------------------------------------- the verdict


def judge(report: BatteryReport) -> tuple[str, list[str]]:
    """``(verdict, reasons)``; see the module docstring."""
    if report.state == "interrupted":
        return "INTERRUPTED", [f"stopped by the user after {len(report.results)} of {report.planned} checks"]
    if report.state == "running":
        return "RUNNING", []
    results = report.results
    required = _required_refused(report)
    if required or any(r.status == "FAIL" for r in results):
        return "FAIL", required
    defects = [r.label for r in results if r.status == "ERROR"]
    if defects:  # the battery itself raised: attnformal's defect, not the implementation's FAIL
        return "INTERNAL ERROR", [f"the battery itself raised in {', '.join(defects)} (a defect of attnformal: "
                                  "please report it)"]
    if not any(r.status == "pass" for r in results):
        return "NOTHING VERIFIED", ["no check passed: every case was refused"] + _why_refused(
            report, report.dtypes or list(report.capabilities))
    missing = []
    forward_selected = any(c.group in FORWARD_GROUPS for c in selected(report.settings))
    for dtype in report.dtypes:
        own = [r for r in results if r.dtype == dtype and _per_dtype(r)]
        if not own:
            continue
        if not any(r.status == "pass" for r in own):
            missing.append(f"{dtype}: no check passed")
            missing += _why_refused(report, [dtype])
        elif forward_selected and not any(r.status == "pass" and r.check.partition(".")[0] in FORWARD_GROUPS
                                          for r in own):
            missing.append(f"{dtype}: no forward accuracy check ({', '.join(FORWARD_GROUPS)}) passed")
            missing += _why_refused(report, [dtype])
    return ("INCOMPLETE", missing) if missing else ("PASS", [])


def _per_dtype(result: CheckResult) -> bool:
    chk = next((c for c in CHECKS if c.name == result.check), None)
    return chk is None or chk.fixed_dtype is None


def _required_refused(report: BatteryReport) -> list[str]:
    reasons = []
    for feature in sorted(report.settings.require):
        for dtype, caps in report.capabilities.items():
            if caps is None or (dtype not in report.dtypes and feature != "fp64"):
                continue
            if feature == "fp64" and dtype == "float64" and not caps.accepted:
                reasons.append(f"required feature fp64 refused: {caps.refusal}")
            elif caps.accepted and feature in caps.refused:
                reasons.append(f"required feature {feature} refused in {dtype}: {caps.refused[feature]}")
    return reasons


def _why_refused(report: BatteryReport, dtypes) -> list[str]:
    """What the implementation refused in ``dtypes``, and what to change."""
    lines = []
    for dtype in dtypes:
        caps = report.capabilities.get(dtype)
        if caps is None:
            continue
        if not caps.accepted:
            others = [d for d, c in report.capabilities.items() if c is not None and c.accepted and d != dtype]
            hint = f"; it accepts {', '.join(others)}: use --dtypes {' '.join(others)}" if others else ""
            lines.append(f"- the implementation refuses {dtype} ({caps.refusal}){hint}")
        else:
            lines.append(f"- {caps.summary()}")
    refused = report.coverage.get("refused_features") or {}
    if refused:
        top = ", ".join(f"{f} ({n} cases)" for f, n in list(refused.items())[:6])
        lines.append(f"- refused features: {top}")
    return lines

