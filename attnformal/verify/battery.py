"""Running the whole battery for one implementation: every selected check, for every dtype."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnformal.verify.checks import CHECKS, Check
from attnformal.verify.diagnosis import Ranked, summarise
from attnformal.verify.runner import CheckResult, Settings, dtype_name, run_check


@dataclass
class BatteryReport:
    settings: Settings
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    diagnosis: list[Ranked] = field(default_factory=list)
    stopped_early: bool = False
    machine: str = field(default_factory=lambda: f"{platform.machine()}, {os.cpu_count()} CPUs, torch "
                                                  f"{torch.__version__}, {torch.get_num_threads()} torch threads")

    @property
    def passed(self) -> bool:
        """Every supported check passed (unsupported checks neither pass nor fail)."""
        return not any(r.failed for r in self.results)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)


def planned(settings: Settings) -> list[tuple[Check, torch.dtype]]:
    """The (check, dtype) pairs a run will execute, in order."""
    pairs = []
    for chk in CHECKS:
        if (chk.full_only and settings.profile != "full") or not settings.selects(chk.name):
            continue
        for dtype in ([chk.fixed_dtype] if chk.fixed_dtype is not None else settings.dtypes):
            pairs.append((chk, dtype))
    return pairs


def run_battery(settings: Settings, progress: Callable[[int, int, str], None] | None = None) -> BatteryReport:
    """Run every planned check; torch uses ``settings.threads`` CPU threads meanwhile (restored after)."""
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        return _run(settings, progress)
    finally:
        torch.set_num_threads(threads)


def _run(settings: Settings, progress) -> BatteryReport:
    report = BatteryReport(settings)
    pairs = planned(settings)
    start, cpu_start = time.perf_counter(), time.process_time()
    for n, (chk, dtype) in enumerate(pairs):
        if progress is not None:
            progress(n, len(pairs), f"{chk.name}[{dtype_name(dtype)}]")
        result = run_check(settings, chk, dtype)
        report.results.append(result)
        if result.failed and settings.fail_fast:
            report.stopped_early = n + 1 < len(pairs)
            break
    if progress is not None:
        progress(len(pairs), len(pairs), "done")
    report.seconds, report.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    report.diagnosis = summarise(report.results)
    return report
