"""pytest plugin: ``pytest --attn-impl MODULE:FUNC`` runs the battery as tests.

Every (check, dtype) of the battery becomes one test, ``attnformal-verify::<check>[<dtype>]``:
it passes, fails with the battery's account (worst errors, where they sit, the likely bug,
a reproducer), or is skipped when the implementation does not support it (a failure for a
feature named by ``--attn-require``). A last test, ``attnformal-verify::verdict``, is the
battery's verdict on the tests that ran: it fails for a failing check, and when they
verified nothing or less than the battery's minimum (see :mod:`.battery`). It stays under
``-k`` / ``-m`` whenever one check does (``-k fwd.random`` for a kernel that supports nothing
fails as NOTHING VERIFIED, never "1 skipped" and exit 0). Under pytest-xdist (``-n N``) no worker sees every
result, so the controller judges them at the end instead: it prints the verdict and fails the
session unless it is PASS. Without ``--attn-impl`` the plugin adds nothing.

The options mean what the command line's do, through the same code (:mod:`attnformal.cli`,
:mod:`.options`; list options take spaces or commas, unknown names are usage errors);
reproducers go to ``<rootdir>/verify-repro/<impl>/``. With ``--attn-isolate`` (the default
for MODULE:FUNC and FILE.py:FUNC, as on the command line) each test runs in a worker
process, so a crash or a hang fails that test only. With ``--attn-workers N`` or
``--attn-cluster ADDRESS`` the checks run on a Dask cluster, as ``verify --workers`` /
``--cluster`` run them: all are sent when the first test runs, and each test takes its result.

Installed through the ``pytest11`` entry point; without it, ``-p attnformal.verify.pytest_plugin``.
It loads lazily: this module adds only the options (cheap: no torch, no battery), and the battery's hooks
(:mod:`.pytest_battery`) join the session only when ``--attn-impl`` is given, so another project's
pytest in the same environment pays nothing for it.
"""

from __future__ import annotations

import pytest

from attnformal import cli
from attnformal.verify import PROFILES

BATTERY_PLUGIN = "attnformal-verify-battery"


def pytest_addoption(parser):
    group = parser.getgroup("attnformal", "attention conformance battery (attnformal.verify)")
    group.addoption("--attn-impl", metavar="MODULE:FUNC", help="run the battery on this implementation or alias")
    group.addoption("--attn-dtypes", default="float32 bfloat16", help="dtypes, separated by spaces or commas "
                                                                      "(default: %(default)s)")
    group.addoption("--attn-device", default="cpu", help="device of the inputs (default: %(default)s)")
    group.addoption("--attn-profile", default="quick", choices=("quick", "full"), help="case sizes")
    group.addoption("--attn-tolerance", default="default", choices=PROFILES, help="tolerance profile")
    group.addoption("--attn-seed", type=int, default=0, help="run seed")
    group.addoption("--attn-require", default="", help="features that must be supported (spaces or commas)")
    group.addoption("--attn-only", default="", help="glob patterns of checks to run (spaces or commas)")
    group.addoption("--attn-isolate", action="store_true", default=None,
                    help="run each check in a worker process (default for MODULE:FUNC and FILE.py:FUNC)")
    group.addoption("--attn-no-isolate", action="store_false", dest="attn_isolate", help="run checks in pytest's process")
    group.addoption("--attn-case-timeout", type=cli.seconds, default=300.0,
                    help="with isolation: seconds one call may take before it is a hang (default: %(default)s)")
    group.addoption("--attn-workers", type=cli.integer(minimum=1), metavar="N",
                    help="run the checks on a local Dask cluster of N worker processes")
    group.addoption("--attn-cluster", metavar="ADDRESS", help="run the checks on the Dask scheduler at ADDRESS")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With ``--attn-impl`` (options are parsed, nothing is configured yet, in pytest's process as in an
    xdist worker) the battery's hooks join; without it nothing more is imported."""
    if config.getoption("--attn-impl") and not config.pluginmanager.has_plugin(BATTERY_PLUGIN):
        from attnformal.verify import pytest_battery

        config.pluginmanager.register(pytest_battery, BATTERY_PLUGIN)
