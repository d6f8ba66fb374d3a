"""pytest plugin: ``pytest --attn-impl MODULE:FUNC`` runs the battery as tests.

Every (check, dtype) of the battery becomes one test, ``attnformal-verify::<check>[<dtype>]``:
it passes, fails with the battery's account (worst errors, where they sit, the likely bug,
a reproducer), or is skipped when the implementation does not support it (a failure for a
feature named by ``--attn-require``). Without ``--attn-impl`` the plugin adds nothing.

Installed through the ``pytest11`` entry point; without it, ``-p attnformal.verify.pytest_plugin``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attnformal.verify.battery import planned
from attnformal.verify.runner import DTYPE_NAMES, Settings, dtype_name, run_check
from attnformal.verify.tolerances import PROFILES

COLLECTOR_NAME = "attnformal-verify"


def pytest_addoption(parser):
    group = parser.getgroup("attnformal", "attention conformance battery (attnformal.verify)")
    group.addoption("--attn-impl", metavar="MODULE:FUNC", help="run the battery on this implementation or alias")
    group.addoption("--attn-dtypes", default="float32,bfloat16", help="comma-separated dtypes (default: %(default)s)")
    group.addoption("--attn-device", default="cpu", help="device of the inputs (default: %(default)s)")
    group.addoption("--attn-profile", default="quick", choices=("quick", "full"), help="case sizes")
    group.addoption("--attn-tolerance", default="default", choices=PROFILES, help="tolerance profile")
    group.addoption("--attn-seed", type=int, default=0, help="run seed")
    group.addoption("--attn-require", default="", help="comma-separated features that must be supported")
    group.addoption("--attn-only", default="", help="comma-separated glob patterns of checks to run")


def _settings(config) -> Settings:
    from attnformal.adapters import resolve

    def split(option):
        return tuple(part for part in config.getoption(option).split(",") if part)

    target = config.getoption("--attn-impl")
    try:
        impl = resolve(target)
        dtypes = tuple(DTYPE_NAMES[name] for name in split("--attn-dtypes"))
    except (ValueError, KeyError) as err:
        raise pytest.UsageError(f"attnformal.verify: {err}") from None
    return Settings(impl=impl, impl_name=target, dtypes=dtypes, device=config.getoption("--attn-device"),
                    profile=config.getoption("--attn-profile"), tolerance=config.getoption("--attn-tolerance"),
                    seed=config.getoption("--attn-seed"), require=frozenset(split("--attn-require")),
                    only=split("--attn-only"), repro_dir=Path(str(config.rootpath)) / "verify-repro")


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, which then applies to these items too
def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--attn-impl"):
        return
    battery = Battery.from_parent(session, name=COLLECTOR_NAME)
    battery.settings = _settings(config)
    items.extend(battery.collect())


class Battery(pytest.Collector):
    settings: Settings

    def collect(self):
        return [CheckItem.from_parent(self, name=f"{chk.name}[{dtype_name(dtype)}]", check=chk, dtype=dtype)
                for chk, dtype in planned(self.settings)]


class CheckFailed(Exception):
    def __init__(self, result):
        self.result = result
        super().__init__(result.summary)


class CheckItem(pytest.Item):
    def __init__(self, *, check, dtype, **kwargs):
        super().__init__(**kwargs)
        self.check, self.dtype = check, dtype

    def runtest(self):
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(self.parent.settings.threads or threads)
        try:
            result = run_check(self.parent.settings, self.check, self.dtype)
        finally:
            torch.set_num_threads(threads)
        if result.failed:
            raise CheckFailed(result)
        if result.status == "unsupported":
            pytest.skip(f"unsupported: {result.summary}")

    def repr_failure(self, excinfo, style=None):
        if not isinstance(excinfo.value, CheckFailed):
            return super().repr_failure(excinfo, style)
        r = excinfo.value.result
        lines = [f"{r.label}: {r.status} -- {r.summary}", *r.details]
        lines += [f"-> [{f.bug}] {f.evidence}" for f in r.findings]
        if r.command:
            lines.append(f"reproduce: {r.command}")
        return "\n".join(lines)

    def reportinfo(self):
        return self.path, None, f"{COLLECTOR_NAME}::{self.name}"
