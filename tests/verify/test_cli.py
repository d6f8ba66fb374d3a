"""python -m attnformal.verify: exit codes, verdicts, reports, reproducers, baselines, usage errors."""

import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from attnformal.verify.__main__ import main, parser

ZOO = __import__("zoo").__file__
FP16_ONLY = """
import torch, zoo

def attention(q, k, v, **kwargs):
    if q.dtype != torch.float16:
        raise NotImplementedError("float16 only")
    return zoo.attention(q, k, v, **kwargs)
"""


def buggy_file(tmp_path, bug):
    path = tmp_path / f"{bug}.py"
    path.write_text(f"import functools\nimport zoo\n\nattention = functools.partial(zoo.attention, bug={bug!r})\n")
    return f"{path}:attention"


def kernel_file(tmp_path, source, name="kernel"):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return f"{path}:attention"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().out


def test_a_correct_implementation_exits_0_with_a_table(capsys, tmp_path):
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "hand.*", "--repro-dir", tmp_path, "--jobs", "1")
    assert code == 0
    assert "hand.uniform_logits" in out and "verdict: PASS" in out and "seed 0" in out
    assert "in this process" in out  # a built-in adapter is not isolated when the checks run one at a time


def test_a_bug_exits_1_with_diagnosis_json_junit_and_a_replayable_reproducer(capsys, tmp_path):
    impl = buggy_file(tmp_path, "causal_off_by_one")
    code, out = run(capsys, "--impl", impl, "--dtypes", "float32", "--only", "mask.causal*", "softmax.*",
                    "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml", "--repro-dir", tmp_path / "repro",
                    "--no-isolate")
    assert code == 1
    assert "most likely: the causal boundary is off by one key [causal_off_by_one]" in out
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["diagnosis"][0]["bug"] == "causal_off_by_one" and results["verdict"] == "FAIL"
    assert results["state"] == "complete"
    suite = ET.fromstring((tmp_path / "r.xml").read_text())
    assert int(suite.get("failures")) == sum(r["status"] == "FAIL" for r in results["results"]) > 0
    folder = tmp_path / "repro" / "causal_off_by_one.attention"  # one folder per implementation
    reproducers = sorted(folder.glob("*.pt"))
    assert reproducers and f"--replay {reproducers[0]}" in out
    assert json.loads((folder / "results.json").read_text())["verdict"] == "FAIL"
    code, out = run(capsys, "--impl", impl, "--replay", reproducers[0], "--no-isolate")
    assert code == 1 and "replaying" in out and "FAIL" in out and "[None]" not in out


def test_a_passing_run_moves_old_reproducers_aside_and_says_where(capsys, tmp_path):
    folder = tmp_path / "sdpa-math"
    folder.mkdir()
    (folder / "mask.window-float32.pt").write_bytes(b"from an earlier run")
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "hand.uniform_logits", "--repro-dir", tmp_path)
    assert code == 0
    assert f"the previous run's 1 file moved to {folder / 'previous'}/" in out
    assert (folder / "previous" / "mask.window-float32.pt").exists() and not (folder / "mask.window-float32.pt").exists()


def test_baseline_flags_a_regression(capsys, tmp_path):
    baseline = tmp_path / "base.json"
    code, _ = run(capsys, "--impl", f"{ZOO}:attention", "--dtypes", "float32", "--only", "lse.*",
                  "--save-baseline", baseline, "--repro-dir", tmp_path, "--no-isolate")
    assert code == 0
    code, out = run(capsys, "--impl", buggy_file(tmp_path, "lse_base2"), "--dtypes", "float32", "--only", "lse.*",
                    "--baseline", baseline, "--repro-dir", tmp_path, "--no-isolate")
    assert code == 1 and "REGRESSION  lse.values[float32]: pass -> FAIL" in out


def test_unsupported_is_neither_pass_nor_fail_unless_required(capsys, tmp_path):
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "lse.values", "hand.uniform_logits", "--repro-dir",
                    tmp_path)
    assert code == 0 and "unsupported: lse.values" in out
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "lse.values", "hand.uniform_logits", "--require", "lse",
                    "--repro-dir", tmp_path)
    assert code == 1 and "required feature unsupported: ['lse']" in out
    assert "required feature lse refused in float32: torch SDPA does not return the log-sum-exp" in out


def test_a_repeated_list_option_adds_to_the_list(capsys, tmp_path):
    """``--only a --only b`` runs both (argparse's default would silently keep the last)."""
    code, out = run(capsys, "--impl", "sdpa-math", "--only", "hand.uniform_logits", "--only", "hand.single_token",
                    "--dtypes", "float32", "--dtypes", "bfloat16", "--repro-dir", tmp_path)
    assert code == 0, out
    assert "hand.uniform_logits" in out and "hand.single_token" in out
    assert "bfloat16" in out and "float32" in out


def test_require_blames_the_feature_the_kernel_refuses_not_the_others_of_the_case(capsys, tmp_path):
    """Own-mask dropout with a backward is refused because of the dropout: --require backward holds."""
    argv = ("--impl", "torch-tiled", "--dtypes", "float32", "--only", "dropout.*", "--repro-dir", tmp_path)
    code, out = run(capsys, *argv, "--require", "lse", "backward")
    assert code == 0 and "dropout.own_mask_backward" in out and "required feature" not in out
    code, out = run(capsys, *argv, "--require", "dropout")
    assert code == 1 and "required feature dropout refused in float32" in out


def test_fail_fast_stops_at_the_first_failure(capsys, tmp_path):
    code, out = run(capsys, "--impl", buggy_file(tmp_path, "batch0"), "--fail-fast", "--repro-dir", tmp_path,
                    "--no-isolate")
    assert code == 1 and "stopped at the first failure" in out and out.count("FAIL ") == 1


def test_fail_fast_names_a_symptom_only_stop_through_the_checks_that_name_causes(capsys, tmp_path):
    """hand.sinks sees lse = -inf and stops the run; in the isolated worker fwd.sinks then names the cause."""
    code, out = run(capsys, "--impl", buggy_file(tmp_path, "sink_not_in_lse"), "--dtypes", "float32", "--fail-fast",
                    "--repro-dir", tmp_path)
    assert code == 1 and "1 FAIL" in out and "checks that name causes ran after it, 1 failed: fwd.sinks" in out
    assert "most likely: the attention sink is left out of lse" in out


def test_a_kernel_refusing_every_case_is_never_a_pass(capsys, tmp_path):
    refuses = kernel_file(tmp_path, "def attention(q, k, v, **kwargs):\n    raise NotImplementedError('nothing')\n")
    code, out = run(capsys, "--impl", refuses, "--only", "hand.*", "--repro-dir", tmp_path, "--no-isolate")
    assert code == 3 and "verdict: NOTHING VERIFIED" in out and "refuses float32 (nothing)" in out


def test_default_dtypes_the_kernel_refuses_are_replaced_and_explicit_ones_are_not(capsys, tmp_path):
    impl = kernel_file(tmp_path, FP16_ONLY)
    argv = ("--impl", impl, "--only", "hand.uniform_logits", "--repro-dir", tmp_path, "--no-isolate")
    code, out = run(capsys, *argv)
    assert code == 0 and "dtypes float16 (the implementation refuses float32, bfloat16 of the default dtypes)" in out
    code, out = run(capsys, *argv, "--dtypes", "float32 bfloat16")  # one argument, space-separated, as in the plugin
    assert code == 3 and "verdict: NOTHING VERIFIED" in out and "use --dtypes float16" in out
    code, out = run(capsys, *argv, "--dtypes", "float16,float32")
    assert code == 3 and "verdict: INCOMPLETE" in out and "float32: no check passed" in out


@pytest.mark.parametrize("body, message", [
    ("return None", "returned NoneType as the output, expected a tensor"),
    ("import sys; sys.exit(3)", "the implementation exited the process (status 3: sys.exit(3))"),
    ("import os; os._exit(0)", "the implementation exited the process (status 0: os._exit(0))"),
])
def test_a_broken_contract_is_a_failure_of_the_implementation_not_of_the_battery(capsys, tmp_path, body, message):
    impl = kernel_file(tmp_path, f"def attention(q, k, v, **kwargs):\n    {body}\n")
    code, out = run(capsys, "--impl", impl, "--only", "hand.uniform_logits", "--dtypes", "float32",
                    "--repro-dir", tmp_path, "--no-isolate")
    assert code == 1 and message in out and "battery defect" not in out and "[contract]" in out


def usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    return err


@pytest.mark.parametrize("argv, message", [
    (["--impl", "sdpa-math", "--dtypes", "float8"], "argument --dtypes"),
    (["--impl", "sdpa-math", "--require", "telepathy"], "argument --require: unknown features telepathy"),
    (["--impl", "sdpa-math", "--only", "nomatch*"], "argument --only: 'nomatch*' matches no check"),
    (["--impl", "sdpa-math", "--only", "fwd.long"], "matches only checks of --profile full"),
    (["--impl", "sdpa-math", "--threads", "-3"], "argument --threads: expected an int >= 0, got '-3'"),
    (["--impl", "sdpa-math", "--case-timeout", "nan"], "argument --case-timeout"),
    (["--impl", "sdpa-math", "--json", "/no/such/folder/run.json"],
     "argument --json: the folder '/no/such/folder' does not exist"),
    (["--impl", "sdpa-math", "--baseline", "/no/such/base.json"], "argument '--baseline': cannot read"),
    (["--impl", "no_such_module:f"], "argument '--impl'"),
    (["--impl", "nonsense"], "argument '--impl'"),
    (["--only", "hand.*"], "argument --impl is required"),
])
def test_usage_errors_exit_2_naming_the_argument(capsys, argv, message):
    assert message in usage_error(capsys, argv)


def test_usage_errors_for_the_machine_and_the_files(capsys, tmp_path):
    if not torch.cuda.is_available():
        assert "argument --device: 'cuda' is not usable here" in usage_error(capsys, ["--impl", "sdpa-math",
                                                                                      "--device", "cuda"])
    if "flash_attn" not in __import__("sys").modules and __import__("importlib").util.find_spec("flash_attn") is None:
        assert "flash-attn needs the package flash_attn" in usage_error(capsys, ["--impl", "flash-attn"])
    broken = kernel_file(tmp_path, "def attention(q, k, v:\n", name="broken")
    assert "broken.py failed to import: SyntaxError" in usage_error(capsys, ["--impl", broken])
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert "argument --repro-dir: cannot create" in usage_error(capsys, ["--impl", "sdpa-math",
                                                                        "--repro-dir", a_file / "sub"])
    assert "argument --junit" in usage_error(capsys, ["--impl", "sdpa-math", "--junit", tmp_path])


def test_list_names_every_check_and_feature(capsys):
    code, out = run(capsys, "--list")
    assert code == 0 and "softmax.probabilities" in out and "dropout_replay" in out


def test_report_lines_say_what_they_mean():
    """'unsupported:' names the dtypes of a check that ran in another; a finding without a bug class has no
    '[None]' label; a float64 column says why it is there."""
    from attnformal.verify.battery import BatteryReport
    from attnformal.verify.diagnosis import HINT, finding
    from attnformal.verify.report import render
    from attnformal.verify.runner import CheckResult, Settings

    results = [CheckResult("lse.values", "float32", "FAIL", findings=[finding(None, HINT, "an observation")]),
               CheckResult("lse.values", "bfloat16", "unsupported"),
               CheckResult("fwd.softcap", "float32", "unsupported"), CheckResult("fwd.softcap", "bfloat16", "unsupported"),
               CheckResult("bwd.finite_difference", "float64", "pass")]
    text = render(BatteryReport(Settings(impl=None, impl_name="x"), results, state="complete",
                                dtypes=("float32", "bfloat16")))
    assert "unsupported: lse.values [bfloat16], fwd.softcap\n" in text
    assert "    -> an observation" in text and "[None]" not in text
    assert "float64 column: bwd.finite_difference runs in float64 whatever --dtypes" in text


def test_replay_labels_findings_without_a_bug_class_plainly(tmp_path):
    from attnformal.verify.cases import random_case, shape
    from attnformal.verify.diagnosis import HINT, finding
    from attnformal.verify.replay import describe_replay
    from attnformal.verify.runner import CheckResult, Settings, reproducer_data

    case = random_case("c", shape(1, 1, 1, 4, 4, 8), torch.float32, "cpu", 1)
    path = tmp_path / "r.pt"
    torch.save(reproducer_data(Settings(impl=None, impl_name="x"), case, lse=False, backward=False, check="fwd.random",
                               dtype="float32"), path)
    result = CheckResult("replay:fwd.random", "float32", "FAIL", findings=[finding(None, HINT, "an observation")])
    text = describe_replay(path, result)
    assert "    -> an observation" in text and "[None]" not in text


def test_help_fits_a_screen_with_examples_that_parse_and_the_docs_page(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and len(text.splitlines()) <= 40, text
    examples = text.split("example:\n")[1].split("readme:")[0].splitlines()
    assert examples and all(line.startswith("  python -m attnformal.verify --impl ") for line in examples)
    for line in examples:
        assert parser().parse_args(shlex.split(line)[3:]).impl  # each is a command line the battery takes
    assert "docs: docs/verify.md" in text and (Path(__file__).parents[2] / "docs" / "verify.md").is_file()
