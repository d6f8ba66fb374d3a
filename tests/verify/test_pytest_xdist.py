"""pytest --attn-impl ... -n 2 (pytest-xdist): the same verdicts and the same accounts as a serial run.

Each case's seed is derived from the run seed and the check's and case's names, never from
the order in which a process meets them, so it does not matter which worker runs which check.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

from test_pytest_plugin import load_plugin

pytest_plugins = ["pytester"]
EXAMPLE = Path(__file__).parents[2] / "examples" / "causal_alignment_bug.py"


def verdicts(pytester, name: str, *args) -> tuple[dict, str]:
    """``{test name: (outcome, message)}`` from the JUnit XML of one run, and its output."""
    report = pytester.path / f"{name}.xml"
    result = pytester.runpytest_subprocess(*load_plugin(), "-p", "no:cacheprovider", "--attn-impl",
                                           f"{EXAMPLE}:attention", "--attn-only", "mask.*",
                                           f"--junitxml={report}", *args)
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        outcome = next(((child.tag, child.get("message", "") + (child.text or "")) for child in case), ("passed", ""))
        found[case.get("name")] = outcome
    return found, result.stdout.str()


def test_two_workers_give_the_serial_verdicts_and_accounts(pytester):
    serial, _ = verdicts(pytester, "serial")
    parallel, output = verdicts(pytester, "parallel", "-n", "2")
    assert "2 workers" in output
    assert {outcome for outcome, _ in serial.values()} == {"passed", "failure", "skipped"}  # nothing vacuous
    serial_verdict = serial.pop("verdict")
    assert parallel == serial  # every check, its outcome and its account
    # No worker sees every result, so the controller gives the verdict: the serial one, for all the checks.
    assert serial_verdict[0] == "failure" and serial_verdict[1].startswith("verdict: FAIL")
    assert "attnformal-verify verdict: FAIL" in output and "4 checks failed (above)" in output
    assert "4 checks failed (above)" in serial_verdict[1]


def test_two_workers_fail_a_run_that_verified_nothing(pytester):
    """Every check skipped: no test fails, yet the controller's verdict fails the session."""
    result = pytester.runpytest_subprocess(*load_plugin(), "-p", "no:cacheprovider", "-n", "2", "--attn-impl",
                                           f"{EXAMPLE}:attention", "--attn-only", "mask.window mask.kv_lens")
    assert "attnformal-verify verdict: NOTHING VERIFIED" in result.stdout.str()
    assert result.ret == 1 and "failed" not in result.parseoutcomes()
