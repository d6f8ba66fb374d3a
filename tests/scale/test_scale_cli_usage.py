"""``python -m attnformal.scale`` as a new user meets it: a sweep that measured nothing, the default
output folder, list syntax, a quiet stderr, and a help screen."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attnformal.scale.cli import build_parser, configure, main
from attnformal.scale.measure import PROFILER_NOISE, Device, _stderr_without

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--sweep", "N=32..128", "--per-octave", "1", "--head-dim", "8", "--repeats", "2", "--min-time", "0"]
IMPLS = '''
def refuses(q, k, v, **kwargs):
    raise NotImplementedError("fp16 only")

def crashes(q, k, v, **kwargs):
    raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
'''


@pytest.fixture
def impls(tmp_path):
    path = tmp_path / "impls.py"
    path.write_text(IMPLS)
    return path


@pytest.mark.parametrize("fn, reason, code", [
    ("refuses", "unsupported: fp16 only", 3),  # NOTHING VERIFIED, as verify says of a kernel that refuses all
    ("crashes", "failed: RuntimeError: DefaultCPUAllocator: can't allocate", 1),  # FAIL
])
def test_a_sweep_that_measured_nothing_fails_and_says_why(impls, tmp_path, capsys, fn, reason, code):
    assert main(["--impl", f"{impls}:{fn}", *TINY, "--out", str(tmp_path / "out")]) == code
    err = capsys.readouterr().err
    assert f"NOTHING MEASURED: {impls}:{fn} under mask dense: every point was refused ({reason}" in err
    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert all(p["failure"].startswith(reason) for p in record["series"][0]["points"])
    assert not (tmp_path / "out" / "sweep.png").exists()  # nothing to draw


def test_one_refusing_implementation_of_two_fails_the_comparison(impls, tmp_path, capsys):
    """The control: the measured one is fitted; the refusing one still keeps the run from passing."""
    code = main(["--impl", "torch-tiled", "--vs", f"{impls}:refuses", *TINY, "--block-m", "32", "--block-n", "32",
                 "--sweep", "N=32..256", "--overhead-factor", "0", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3 and f"NOTHING MEASURED: {impls}:refuses under mask dense" in err
    assert "NOTHING MEASURED: torch-tiled" not in err
    assert (tmp_path / "sweep.png").is_file()


def test_results_go_to_a_folder_per_implementation_and_replace_old_results(impls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "out" / "scale" / "impls.refuses"
    folder.mkdir(parents=True)
    (folder / "sweep.png").write_bytes(b"a plot of an earlier run")
    (folder / "notes.txt").write_text("the user's own file")
    assert main(["--impl", f"{impls}:refuses", *TINY]) == 3  # NOTHING VERIFIED: every point refused
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == \
        ["notes.txt", "sweep.csv", "sweep.json"]  # the old plot is gone with the run that drew it
    args = build_parser().parse_args(["--impl", "torch-tiled", "--vs", "sdpa", *TINY])
    configure(args)
    assert args.out == Path("out/scale/torch-tiled-vs-sdpa") and args.out.is_dir()


def test_ctrl_c_ends_the_sweep_with_one_line_and_keeps_the_earlier_run(tmp_path, capsys, monkeypatch):
    (tmp_path / "sweep.json").write_text('{"an earlier run": true}')

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("attnformal.scale.sweep.run_sweep", interrupted)
    assert main(["--impl", "sdpa", *TINY, "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err == f"\ncancelled: {tmp_path} keeps what it held before this run\n"
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["sweep.json"]
    assert json.loads((tmp_path / "sweep.json").read_text()) == {"an earlier run": True}


def test_lists_take_spaces_and_commas_alike(tmp_path):
    def parsed(*argv):
        args = build_parser().parse_args(["--impl", "sdpa", "--out", str(tmp_path), *argv])
        _, masks, _, sweep, _ = configure(args)
        return [m.label for m in masks], sweep.values

    expected = (["dense", "causal", "window:N/4"], (32, 64, 128))
    assert parsed("--mask", "dense", "causal", "window:N/4", "--sweep", "N=32,64,128") == expected
    assert parsed("--mask", "dense,causal,window:N/4", "--sweep", "N=32", "64", "128") == expected
    assert parsed("--mask", "dense, causal", "window:N/4", "--sweep", "N=32 64, 128") == expected


def test_stderr_keeps_everything_but_the_profilers_start_and_stop_lines(capfd):
    with profile(activities=[ProfilerActivity.CPU]):
        pass
    if "profiler_start" not in capfd.readouterr().err:
        pytest.skip("this torch build prints no profiler start/stop lines: nothing to drop")
    Device("cpu").peak_memory(lambda: os.write(2, b"the kernel's own line\n") and torch.ones(3) + 1)
    assert capfd.readouterr().err == "the kernel's own line\n"
    noise = b"USDT:2026-12-01 05:31:28 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    with _stderr_without(PROFILER_NOISE):
        os.write(2, noise + b"a real error\n")
        print("a Python warning", file=sys.stderr)
    assert sorted(capfd.readouterr().err.splitlines()) == ["a Python warning", "a real error"]


def test_help_fits_a_screen_with_an_example_and_the_docs_page(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 40, text
    assert "example:\n  python -m attnformal.scale --impl torch-tiled" in text
    assert "docs: docs/references-and-scale.md" in text and (ROOT / "docs" / "references-and-scale.md").is_file()
