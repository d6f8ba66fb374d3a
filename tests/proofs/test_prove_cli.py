"""``python -m attnformal.prove``: the table, the exit code, --json, --report and argument errors."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attnformal import merge, prove
from attnformal.prove import main, parse


def test_selected_obligation_is_proved_and_its_controls_refuted(tmp_path, capsys):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["--only", "npu", "--json", str(out_json), "--report", str(out_md)]) == 0
    table = capsys.readouterr().out
    assert "Ascend NPU mask semantics" in table and "proved" in table
    assert "atten_mask polarity" in table and "refuted" in table
    data = json.loads(out_json.read_text())
    assert data["all_proved"] and data["all_controls_refuted"]
    assert [o["number"] for o in data["obligations"]] == [9]
    assert all(c["proof"]["countermodel"] for c in data["controls"])
    report = out_md.read_text()
    assert "## 9. Ascend NPU mask semantics -- proved" in report and "Negative controls" in report
    assert data["environment"]["commit"] and data["environment"]["z3"] and data["environment"]["sympy"]


def test_the_report_says_what_each_theorem_rests_on_and_what_is_trusted(tmp_path):
    out_md = tmp_path / "r.md"
    assert main(["--only", "mask_semantics", "--report", str(out_md)]) == 0
    report = out_md.read_text()
    assert "Commit " in report and "Z3 " in report and "SymPy " in report
    assert "hypotheses: `0 <= kv_lens[b] <= Sk`" in report
    trusted = report.split("## Trusted, not proved", 1)[1]
    for item in ("_merge", "row tables", "fused", "flush-to-zero", "exp and log"):
        assert item in trusted, item
    assert "``" not in report and ":func:" not in report and ":mod:" not in report


def test_a_bounded_check_is_reported_as_checked_with_its_domain(tmp_path):
    out_md = tmp_path / "r.md"
    assert main(["--only", "vocabulary", "--report", str(out_md)]) == 0
    report = out_md.read_text()
    assert "-- checked" in report and "Checked, not proved (obligation 13)" in report
    assert "checked for every operand in -10..10" in report


def test_a_mutated_spec_makes_the_run_fail(monkeypatch, capsys):
    monkeypatch.setattr(merge, "finite_shift", lambda m: m)  # inherited by the forked workers
    assert main(["--only", "monoid"]) == 1
    out = capsys.readouterr().out
    assert "refuted" in out and "0/1 obligations proved" in out


def test_user_block_sizes_are_proven(tmp_path):
    out_json = tmp_path / "r.json"
    assert main(["--only", "tile*", "--block-m", "48", "--block-n", "80", "--json", str(out_json)]) == 0
    cases = [p for o in json.loads(out_json.read_text())["obligations"] for p in o["checks"]]
    assert all(p["status"] == "proved" for p in cases)


def test_a_named_schedule_that_cannot_be_proven_is_refused_before_proving(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--only", "tile*", "--schedule", "attnformal.kernels.no_such_kernel:SCHEDULE"])
    assert exit_info.value.code == 2
    assert "cannot load" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--block-m", "64"], "--block-m"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "-3"], "--timeout"),
    (["--timeout", "soon"], "--timeout"),
    (["--budget", "0"], "--budget"),
    (["--budget", "lots"], "--budget"),
    (["--schedule", "no_colon"], "--schedule"),
    (["--schedule", "attnformal.prove:KERNEL_SCHEDULES"], "not a TileSchedule"),
    (["--only", "gqa", "--schedule", "attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE"], "prove no schedule"),
    (["--only", "no-such-obligation"], "--only"),
    (["--block-m", "0", "--block-n", "4"], "--block-m"),
    (["--json", "/no/such/folder/r.json"], "--json"),
    (["--report", "/"], "--report"),
    (["--kernel", "attnformal.tilings:EXAMPLES", "--block-m", "64", "--block-n", "64"], "--kernel"),
])
def test_bad_arguments_give_one_clear_error(argv, message, capsys, monkeypatch):
    def proving(*args, **kwargs):
        raise AssertionError("a bad argument must be refused before any proving")

    monkeypatch.setattr(prove, "run", proving)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) < 300  # one line, not a dump


def test_module_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "attnformal.prove", "--only", "gqa"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 obligations proved" in result.stdout


def test_help_fits_a_screen_with_an_example_that_parses_and_the_docs_page(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)  # the example's --report is checked for writing there
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and len(text.splitlines()) <= 40, text
    example = text.split("example:\n")[1].splitlines()[0]
    assert example.startswith("  python -m attnformal.prove --")
    args, chosen, _ = parse(shlex.split(example)[3:])  # refused before proving if it were not a valid command
    assert chosen and args.report
    assert "docs: docs/proofs.md" in text and (Path(__file__).resolve().parents[2] / "docs" / "proofs.md").is_file()
