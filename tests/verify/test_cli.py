"""python -m attnformal.verify: exit codes, reports, reproducers, baselines, usage errors."""

import json
import xml.etree.ElementTree as ET

import pytest

from attnformal.verify.__main__ import main

ZOO = __import__("zoo").__file__


def buggy_file(tmp_path, bug):
    path = tmp_path / f"{bug}.py"
    path.write_text(f"import functools\nimport zoo\n\nattention = functools.partial(zoo.attention, bug={bug!r})\n")
    return f"{path}:attention"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().out


def test_a_correct_implementation_exits_0_with_a_table(capsys, tmp_path):
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "hand.*", "--repro-dir", tmp_path)
    assert code == 0
    assert "hand.uniform_logits" in out and "verdict: PASS" in out and "seed 0" in out


def test_a_bug_exits_1_with_diagnosis_json_junit_and_a_replayable_reproducer(capsys, tmp_path):
    impl = buggy_file(tmp_path, "causal_off_by_one")
    code, out = run(capsys, "--impl", impl, "--dtypes", "float32", "--only", "mask.causal*", "softmax.*",
                    "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml", "--repro-dir", tmp_path / "repro")
    assert code == 1
    assert "most likely: the causal boundary is off by one key [causal_off_by_one]" in out
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["diagnosis"][0]["bug"] == "causal_off_by_one" and not results["passed"]
    suite = ET.fromstring((tmp_path / "r.xml").read_text())
    assert int(suite.get("failures")) == sum(r["status"] == "FAIL" for r in results["results"]) > 0
    reproducers = sorted((tmp_path / "repro").glob("*.pt"))
    assert reproducers and f"--replay {reproducers[0]}" in out
    code, out = run(capsys, "--impl", impl, "--replay", reproducers[0])
    assert code == 1 and "replaying" in out and "FAIL" in out


def test_baseline_flags_a_regression(capsys, tmp_path):
    baseline = tmp_path / "base.json"
    code, _ = run(capsys, "--impl", f"{ZOO}:attention", "--dtypes", "float32", "--only", "lse.*",
                  "--save-baseline", baseline, "--repro-dir", tmp_path)
    assert code == 0
    code, out = run(capsys, "--impl", buggy_file(tmp_path, "lse_base2"), "--dtypes", "float32", "--only", "lse.*",
                    "--baseline", baseline, "--repro-dir", tmp_path)
    assert code == 1 and "REGRESSION  lse.values[float32]: pass -> FAIL" in out


def test_unsupported_is_neither_pass_nor_fail_unless_required(capsys, tmp_path):
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "lse.values", "--repro-dir", tmp_path)
    assert code == 0 and "unsupported: lse.values" in out
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "lse.values", "--require", "lse", "--repro-dir", tmp_path)
    assert code == 1 and "required feature unsupported: ['lse']" in out


def test_fail_fast_stops_at_the_first_failure(capsys, tmp_path):
    code, out = run(capsys, "--impl", buggy_file(tmp_path, "batch0"), "--fail-fast", "--repro-dir", tmp_path)
    assert code == 1 and "stopped at the first failure" in out and out.count("FAIL ") == 1


@pytest.mark.parametrize("argv, message", [
    (["--impl", "sdpa-math", "--dtypes", "float8"], "argument --dtypes"),
    (["--impl", "sdpa-math", "--require", "telepathy"], "argument --require"),
    (["--impl", "no_such_module:f"], "argument '--impl'"),
    (["--impl", "nonsense"], "argument '--impl'"),
    (["--only", "hand.*"], "argument --impl is required"),
])
def test_usage_errors_exit_2_naming_the_argument(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_list_names_every_check_and_feature(capsys):
    code, out = run(capsys, "--list")
    assert code == 0 and "softmax.probabilities" in out and "dropout_replay" in out
