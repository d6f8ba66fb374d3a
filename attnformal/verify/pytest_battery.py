"""The pytest plugin's battery (:mod:`.pytest_plugin` registers this module only when ``--attn-impl`` is
given, so a pytest run without it imports neither torch nor the battery): the collector, the tests, the
verdict and, under pytest-xdist, the controller's verdict."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from attnformal import cli
from attnformal.distributed import EngineMissing
from attnformal.pictures.errors import write_error_map
from attnformal.verify.battery import BatteryReport, judge, make_executor, planned
from attnformal.verify.coverage import run_coverage
from attnformal.verify.execute import Task
from attnformal.verify.options import check_campaign, parse_dtypes, parse_features, parse_patterns
from attnformal.verify.outputs import start_folder
from attnformal.verify.runner import CheckResult, Settings, dtype_name

COLLECTOR_NAME = "attnformal-verify"


def _settings(config) -> Settings:
    from attnformal.adapters import ALIASES, resolve

    def option(name):
        return config.getoption(name)

    target = option("--attn-impl")
    try:
        impl = resolve(target)
        dtypes = parse_dtypes(option("--attn-dtypes"), "--attn-dtypes")
        require = parse_features(option("--attn-require"), "--attn-require")
        only = parse_patterns(option("--attn-only"), option("--attn-profile"), "--attn-only")
        cli.check_device(option("--attn-device"), "--attn-device")
        workers, cluster = option("--attn-workers"), option("--attn-cluster")
        check_campaign(workers, cluster, ("--attn-workers", "--attn-cluster"))
        if (workers or cluster) and _xdist_worker(config):
            raise cli.UsageError("--attn-workers", "spreads the checks over a Dask cluster; under pytest-xdist "
                                                   "(-n) they are spread already: expected one or the other")
    except (ValueError, EngineMissing) as err:
        raise pytest.UsageError(f"attnformal.verify: {err}") from None
    isolate = option("attn_isolate")
    return Settings(impl=impl, impl_name=target, dtypes=dtypes, device=option("--attn-device"),
                    profile=option("--attn-profile"), tolerance=option("--attn-tolerance"), seed=option("--attn-seed"),
                    require=require, only=only, target=target,
                    repro_dir=Path(str(config.rootpath)) / "verify-repro" / cli.impl_slug(target),
                    isolate=target not in ALIASES if isolate is None else isolate,
                    case_timeout=option("--attn-case-timeout"), workers=workers, cluster=cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(session, config, items):
    """The checks join the items before -k / -m deselection, which then applies to them; the verdict
    after it: it is kept whenever a check is, so a selection never reads as a PASS without a verdict."""
    if not config.getoption("--attn-impl"):
        yield
        return
    battery = Battery.from_parent(session, name=COLLECTOR_NAME)
    battery.prepare(_settings(config))
    config.add_cleanup(battery.close)
    items.extend(battery.collect())
    yield
    if not _xdist_worker(config) and any(isinstance(item, CheckItem) for item in items):
        items.append(VerdictItem.from_parent(battery, name="verdict"))


def _xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_controller(config) -> bool:
    return config.pluginmanager.hasplugin("dsession")


@pytest.hookimpl(trylast=True)  # after xdist has registered its controller (dsession)
def pytest_configure(config):
    if config.getoption("--attn-impl") and _xdist_controller(config):
        config.pluginmanager.register(XdistVerdict(config), "attnformal-verify-xdist-verdict")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A check's (result, capabilities) rides on its report, which xdist carries to the controller."""
    outcome = yield
    if call.when == "call" and hasattr(item, "battery_result"):
        outcome.get_result().battery_result = item.battery_result


class XdistVerdict:
    """On xdist's controller: the verdict on every worker's results, at the end of the session."""

    def __init__(self, config):
        self.config, self.seen = config, []

    def pytest_sessionstart(self, session):
        start_folder(_settings(self.config).repro_dir)  # before any worker writes a reproducer

    def pytest_runtest_logreport(self, report):
        if getattr(report, "battery_result", None) is not None:
            self.seen.append(pickle.loads(report.battery_result))

    def pytest_sessionfinish(self, session):
        if not self.seen:
            return
        capabilities = {name: caps for _, found in self.seen for name, caps in found.items()}
        verdict, reasons = _judge(_settings(self.config), [result for result, _ in self.seen], capabilities)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("\n".join([f"{COLLECTOR_NAME} verdict: {verdict}", *reasons]))
        if verdict != "PASS":
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _judge(settings, results, capabilities):
    report = BatteryReport(settings, results=results, state="complete",
                           dtypes=tuple(dtype_name(d) for d in settings.dtypes), capabilities=capabilities)
    report.coverage = run_coverage(report.results, selected_all=not settings.only)
    verdict, reasons = judge(report)
    failed = sum(r.failed for r in report.results)
    return verdict, reasons + ([f"{failed} checks failed (above)"] if failed and verdict != "PASS" else [])


class Battery(pytest.Collector):
    """The battery's tests, the executor they run on, and what they found so far."""

    def prepare(self, settings: Settings):
        self.settings = settings
        self.executor = None
        self.capabilities: dict = {}
        self.results: list = []
        self.ahead = iter(())  # (task, result) of the checks sent ahead to a cluster, in test order
        self.arrived: dict = {}  # label -> result, of those taken from ``ahead`` before their test ran

    def collect(self):
        return [CheckItem.from_parent(self, name=f"{chk.name}[{dtype_name(dtype)}]", check=chk, dtype=dtype)
                for chk, dtype in planned(self.settings)]

    def run(self, check, dtype):
        import torch

        if self.executor is None:  # the first test that runs: an earlier run's files move aside now, not at collection
            if not _xdist_worker(self.config):  # under xdist the controller moves them, once, for every worker
                start_folder(self.settings.repro_dir)
            self.executor = make_executor(self.settings)
            if self.settings.distributed:  # every selected check at once: the workers run them side by side
                mine = [i for i in self.session.items if isinstance(i, CheckItem) and i.parent is self]
                self.ahead = self.executor.map([self._task(i.check, i.dtype) for i in mine])
        label = f"{check.name}[{dtype_name(dtype)}]"
        threads = torch.get_num_threads()
        torch.set_num_threads(self.settings.threads or threads)
        try:
            for task, result in self.ahead:
                self.arrived[task.label] = result
                if task.label == label:
                    break
            result = self.arrived.pop(label, None) or next(self.executor.map([self._task(check, dtype)]))[1]
        finally:
            torch.set_num_threads(threads)
        write_error_map(self.settings, result)
        self.results.append(result)
        return result

    def _task(self, check, dtype) -> Task:
        """The task of one check, with what the implementation accepts (its dtype probed first)."""
        for name in {dtype_name(dtype)} - set(self.capabilities):
            _, caps = next(self.executor.map([Task("probe", dtype=name)]))
            self.capabilities[name] = None if isinstance(caps, CheckResult) else caps  # None: probing crashed
        known = {name: caps for name, caps in self.capabilities.items() if caps is not None}
        return Task("check", check.name, dtype_name(dtype), known)

    def close(self):
        if getattr(self, "executor", None) is not None:
            self.ahead = iter(())  # the checks still ahead (pytest -x stopped early) are dropped first
            self.executor.close()


class CheckFailed(Exception):
    def __init__(self, result):
        self.result = result
        super().__init__(result.summary)


class CheckItem(pytest.Item):
    def __init__(self, *, check, dtype, **kwargs):
        super().__init__(**kwargs)
        self.check, self.dtype = check, dtype

    def runtest(self):
        result = self.parent.run(self.check, self.dtype)
        caps = {name: c for name, c in self.parent.capabilities.items() if name == dtype_name(self.dtype)}
        self.battery_result = pickle.dumps((result, caps))
        if result.failed:
            raise CheckFailed(result)
        if result.status == "unsupported":
            pytest.skip(f"unsupported: {result.summary}")

    def repr_failure(self, excinfo, style=None):
        if not isinstance(excinfo.value, CheckFailed):
            return super().repr_failure(excinfo, style)
        r = excinfo.value.result
        lines = [f"{r.label}: {r.status} -- {r.summary}", *r.details]
        lines += [f"-> {'[' + f.bug + '] ' if f.bug else ''}{f.evidence}" for f in r.findings]
        if r.command:
            lines.append(f"reproduce: {r.command}")
        if r.picture:
            lines.append(f"error map: {r.picture}")
        return "\n".join(lines)

    def reportinfo(self):
        return self.path, None, f"{COLLECTOR_NAME}::{self.name}"


class VerdictItem(pytest.Item):
    """The verdict on the battery's tests that ran: fails unless it is PASS (see :func:`.battery.judge`)."""

    def runtest(self):
        battery = self.parent
        if not battery.results:  # selected checks that never ran (pytest -x stopped first): nothing verified
            raise VerdictFailed("NOTHING VERIFIED", ["no check of the battery ran"])
        verdict, reasons = _judge(battery.settings, battery.results, battery.capabilities)
        if verdict != "PASS":
            raise VerdictFailed(verdict, reasons)

    def repr_failure(self, excinfo, style=None):
        if not isinstance(excinfo.value, VerdictFailed):
            return super().repr_failure(excinfo, style)
        return "\n".join([f"verdict: {excinfo.value.verdict}", *excinfo.value.reasons])

    def reportinfo(self):
        return self.path, None, f"{COLLECTOR_NAME}::verdict"


class VerdictFailed(Exception):
    def __init__(self, verdict, reasons):
        self.verdict, self.reasons = verdict, reasons
        super().__init__(verdict)
