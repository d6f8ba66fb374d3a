"""pytest --attn-impl: the battery as tests (pass, fail with the account, skip when unsupported, a verdict)."""

import importlib.metadata
from pathlib import Path

import pytest

# Imported here, before pytester's in-process runs snapshot sys.modules: else each run would import the battery
# afresh (pytester removes what a run imported) and pickle one run's classes against the next run's modules.
import attnformal.verify.pytest_battery  # noqa: F401

ZOO = __import__("zoo").__file__

pytest_plugins = ["pytester"]
PLUGIN = "attnformal.verify.pytest_plugin"


def load_plugin() -> list[str]:
    """``-p PLUGIN`` unless the installed ``pytest11`` entry point loads it already (twice is an error)."""
    installed = any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", PLUGIN]


@pytest.fixture
def battery(pytester):
    def run(*args, dtypes="float32", isolate=False):
        return pytester.runpytest_inprocess(*load_plugin(), "-p", "no:cacheprovider", "--attn-dtypes", dtypes,
                                            *([] if isolate else ["--attn-no-isolate"]), *args)
    return run


def test_each_check_is_a_test_that_passes_for_a_correct_kernel(battery):
    result = battery("--attn-impl", f"{ZOO}:attention", "--attn-only", "hand.uniform_logits, hand.single_token",
                     dtypes="float32 bfloat16")  # list options take spaces, commas or both
    result.assert_outcomes(passed=5)  # two checks in two dtypes, and the verdict


def test_a_failing_check_shows_the_diagnosis_and_the_reproducer(battery, pytester):
    pytester.makepyfile(buggy=f"import functools, sys\nsys.path.insert(0, {str(Path(ZOO).parent)!r})\n"
                              "import zoo\nattention = functools.partial(zoo.attention, bug='lse_base2')\n")
    result = battery("--attn-impl", "buggy.py:attention", "--attn-only", "lse.values", isolate=True)  # its default
    result.assert_outcomes(failed=2)  # the check, and the verdict
    text = result.stdout.str()
    for expected in ("lse.values[float32]: FAIL", "-> [lse_base2] lse = 1.443 x the reference (= 1/ln 2)",
                     "reproduce: python -m attnformal.verify --impl buggy.py:attention --replay",
                     "verify-repro/buggy.attention/lse.values-float32.pt", "verdict: FAIL",
                     f"error map: {pytester.path / 'verify-repro/buggy.attention/lse.values-float32.png'}"):
        assert expected in text


def test_unsupported_checks_are_skipped_unless_required_and_nothing_verified_fails(battery):
    result = battery("--attn-impl", "sdpa-math", "--attn-only", "lse.values")
    result.assert_outcomes(skipped=1, failed=1)
    assert "verdict: NOTHING VERIFIED" in result.stdout.str()
    battery("--attn-impl", "sdpa-math", "--attn-only", "lse.values hand.single_token",
            "--attn-require", "lse").assert_outcomes(passed=1, failed=2)


def test_unknown_names_are_usage_errors(battery):
    """The same vocabulary as the command line (tested there name by name): here, the plugin's path."""
    result = battery("--attn-impl", "sdpa-math", "--attn-require", "bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "argument --attn-require: unknown features bogus" in result.stderr.str()


def test_without_the_option_the_plugin_adds_nothing(battery, pytester):
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    battery().assert_outcomes(passed=1)


NO_TORCH = '''
import sys


def test_the_plugin_loaded_and_imported_neither_torch_nor_the_battery():
    assert "attnformal.verify.pytest_plugin" in sys.modules  # the control: it is loaded (its options exist)
    assert "torch" not in sys.modules and "attnformal.verify.pytest_battery" not in sys.modules
'''


def test_an_unrelated_pytest_run_imports_no_torch(pytester):
    """Another project's tests in the same environment: the plugin adds its options and nothing else."""
    pytester.makepyfile(test_unrelated=NO_TORCH)
    pytester.runpytest_subprocess(*load_plugin(), "-p", "no:cacheprovider").assert_outcomes(passed=1)
    # the control: with --attn-impl the battery's hooks join and its checks run (and would break that test)
    result = pytester.runpytest_subprocess(*load_plugin(), "-p", "no:cacheprovider", "--attn-impl", "sdpa-math",
                                           "--attn-only", "hand.uniform_logits", "--attn-dtypes", "float32", "-v")
    result.assert_outcomes(passed=2, failed=1)  # the check and the verdict pass; the test above sees torch
    result.stdout.fnmatch_lines(["*attnformal-verify::hand::uniform_logits?float32? PASSED*", "*verdict PASSED*"])
