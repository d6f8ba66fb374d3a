"""Results never lost or mixed (docs/verify.md, "Reliability"): a full disk is exit 4 with one line, a second
run into a locked folder is refused, an interrupted run keeps the previous run's files."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from attnformal import cli
from attnformal.cli import EXIT_CODES
from attnformal.reference.__main__ import main as reference_main
from attnformal.scale.cli import main as scale_main
from attnformal.verify import __main__ as verify_cli

QUICK = ["--impl", "sdpa-math", "--dtypes", "float32", "--only", "hand.uniform_logits"]
TINY_SWEEP = ["--impl", "torch-tiled", "--sweep", "N=32..64", "--per-octave", "1", "--head-dim", "8", "--repeats",
              "1", "--min-time", "0"]


def full_disk(monkeypatch, target: str):
    """The temporary file of ``target`` (the file name :func:`attnformal.cli.atomic_path` writes first) is
    opened on ``/dev/full``: every write to it fails with ENOSPC, as on a full disk."""
    real_open = io.open

    def opened(file, mode="r", *args, **kwargs):
        name = os.path.basename(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
        if f".{target}." in name and name.endswith(".partial") and "w" in mode:
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)
    monkeypatch.setattr(io, "open", opened)
    monkeypatch.setattr(builtins, "open", opened)


def one_error_line(err: str, fragment: str):
    """stderr has one error line (progress lines aside), it holds ``fragment``, and no traceback."""
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and fragment in errors[0], err
    assert "Traceback" not in err


def test_verify_junit_on_a_full_disk_is_an_internal_error_not_a_fail(capsys, tmp_path, monkeypatch):
    assert verify_cli.main([*QUICK, "--repro-dir", str(tmp_path), "--junit", str(tmp_path / "r.xml")]) == 0
    capsys.readouterr()  # the control: with space, it passes and writes the file
    full_disk(monkeypatch, "r.xml")
    code = verify_cli.main([*QUICK, "--repro-dir", str(tmp_path), "--junit", str(tmp_path / "r.xml")])
    captured = capsys.readouterr()
    assert code == EXIT_CODES["INTERNAL ERROR"] == 4
    assert "verdict: PASS" in captured.out  # printed before the write failed; the exit code says what happened
    one_error_line(captured.err, "cannot write")
    assert "No space left on device (internal error)" in captured.err and "r.xml" in captured.err


def test_verify_results_on_a_full_disk_are_an_internal_error(capsys, tmp_path, monkeypatch):
    full_disk(monkeypatch, "results.json")
    assert verify_cli.main([*QUICK, "--repro-dir", str(tmp_path)]) == 4
    one_error_line(capsys.readouterr().err, "results.json': No space left on device (internal error)")


def test_reference_generate_on_a_full_disk_is_an_internal_error_and_keeps_the_old_file(capsys, tmp_path,
                                                                                       monkeypatch):
    out = tmp_path / "case.npz"
    argv = ["generate", "--shape", "1,1,1,4,4,8", "--dtype", "fp32", "--seed", "0", "--out", str(out)]
    assert reference_main(argv) == 0
    before = out.read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(np, "savez_compressed", no_space)
    capsys.readouterr()
    assert reference_main([*argv[:-1], str(out)]) == 4
    one_error_line(capsys.readouterr().err, "case.npz': No space left on device (internal error)")
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["case.npz"]


def test_scale_on_a_full_disk_is_an_internal_error_and_keeps_the_earlier_run(capsys, tmp_path, monkeypatch):
    (tmp_path / "sweep.json").write_text('{"an earlier run": true}')
    full_disk(monkeypatch, "sweep.csv")  # the second of the files: the first is written, then must not be swapped in
    assert scale_main([*TINY_SWEEP, "--out", str(tmp_path)]) == 4
    one_error_line(capsys.readouterr().err, "sweep.csv': No space left on device (internal error)")
    assert json.loads((tmp_path / "sweep.json").read_text()) == {"an earlier run": True}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["sweep.json"]


def test_a_second_verify_into_a_busy_folder_is_refused(capsys, tmp_path):
    folder = tmp_path / "sdpa-math"
    folder.mkdir()
    with cli.folder_lock(folder, "--repro-dir"), pytest.raises(SystemExit) as exited:  # another run holds it
        verify_cli.main([*QUICK, "--repro-dir", str(tmp_path)])
    assert exited.value.code == 2
    one_error_line(capsys.readouterr().err, f"argument --repro-dir: {str(folder)!r} is in use by another run (pid ")
    assert verify_cli.main([*QUICK, "--repro-dir", str(tmp_path)]) == 0  # the control: once it is free, it runs


def test_a_second_scale_into_a_busy_folder_is_refused(capsys, tmp_path):
    with cli.folder_lock(tmp_path, "--out"), pytest.raises(SystemExit) as exited:
        scale_main([*TINY_SWEEP, "--out", str(tmp_path)])
    assert exited.value.code == 2
    one_error_line(capsys.readouterr().err, f"argument --out: {str(tmp_path)!r} is in use by another run")
    assert not (tmp_path / "sweep.json").exists()


def test_an_interrupted_verify_keeps_the_previous_json_and_junit(capsys, tmp_path, monkeypatch):
    json_file, junit = tmp_path / "r.json", tmp_path / "r.xml"
    json_file.write_text("the previous run's json")
    junit.write_text("the previous run's junit")
    from attnformal.verify import battery

    run_battery = battery.run_battery

    def interrupted(*args, **kwargs):
        report = run_battery(*args, **kwargs)
        report.state = "interrupted"  # what a Ctrl-C after the first check leaves
        return report
    monkeypatch.setattr(battery, "run_battery", interrupted)
    code = verify_cli.main([*QUICK, "--repro-dir", str(tmp_path), "--json", str(json_file), "--junit", str(junit)])
    assert code == EXIT_CODES["INTERRUPTED"]
    assert f"interrupted: {json_file}, {junit} kept as the previous run wrote them" in capsys.readouterr().err
    assert json_file.read_text() == "the previous run's json" and junit.read_text() == "the previous run's junit"
    assert json.loads((tmp_path / "sdpa-math" / "results.json").read_text())["state"] == "interrupted"
    monkeypatch.undo()  # the control: a run that finishes replaces both
    assert verify_cli.main([*QUICK, "--repro-dir", str(tmp_path), "--json", str(json_file), "--junit", str(junit)]) == 0
    assert json.loads(json_file.read_text())["state"] == "complete" and junit.read_text().startswith("<")
