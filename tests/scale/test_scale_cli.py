"""``python -m attnformal.scale`` end to end on tiny sweeps (structure only: no timing asserted)."""

import csv
import json
import os

import pytest
import torch

from attnformal.scale.cli import main

TINY = ["--sweep", "N=32..256", "--per-octave", "1", "--block-m", "32", "--block-n", "32",
        "--head-dim", "8", "--repeats", "2", "--min-time", "0"]


def test_a_vs_sweep_writes_table_json_csv_and_plot(tmp_path, capsys):
    threads = torch.get_num_threads()
    # --overhead-factor 0 flags nothing, so four points always give a fit: the run is deterministic
    code = main(["--impl", "torch-tiled", "--vs", "sdpa", "--mask", "dense", "window:N/4", *TINY,
                 "--overhead-factor", "0", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert torch.get_num_threads() == threads  # the sweep's --threads 1 does not leak into the caller
    assert "== torch-tiled | mask dense | fixed: B=1 H=2/2 D=8 float32 cpu forward" in out
    assert "== ratio torch-tiled / sdpa | mask window:N/4" in out
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert record["swept"] == "N" and record["threads"] == 1
    assert len(record["series"]) == 4
    for series in record["series"]:
        assert [p["x"] for p in series["points"]] == [32, 64, 128, 256]
        fit = series["time_fit"]
        assert set(fit["predicted"]) == {"schedule", "pairs", "dense"}
        assert fit["verdict"] and len(fit["used_points"]) >= 4
        assert all(p["backend"] for p in series["points"])
    sdpa_window = next(s for s in record["series"] if s["impl"] == "sdpa" and s["mask"] == "window:N/4")
    # the window grows with N: the schedule predicts a quadratic, not a linear, amount of work
    assert sdpa_window["time_fit"]["predicted"]["pairs"] > 1.5
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert len(rows) == 2 * 2 * 4 and {r["impl"] for r in rows} == {"torch-tiled", "sdpa"}
    assert all(r["ratio_median"] for r in rows if r["impl"] == "torch-tiled")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_too_few_points_are_refused_with_a_clear_message(tmp_path, capsys):
    code = main(["--impl", "sdpa", "--sweep", "N=32,64,128", "--repeats", "2", "--min-time", "0",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "time exponent: fit refused -- time: 3 point(s) in the sweep; an exponent needs at least 4" in out
    assert json.loads((tmp_path / "sweep.json").read_text())["series"][0]["time_fit"]["refused"]


def test_a_width_sweep_needs_the_window_family(tmp_path, capsys):
    code = main(["--impl", "torch-tiled", "--sweep", "W=8..64", "--mask", "window", "--seq", "128", *TINY[2:],
                 "--overhead-factor", "0", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["problem"]["window"] for p in record["series"][0]["points"]] == [[8, 0], [16, 0], [32, 0], [64, 0]]


@pytest.mark.parametrize("argv, message", [
    (["--impl", "nosuch.module:f"], "argument '--impl': cannot import"),
    (["--impl", "sdpa", "--min-time", "inf"], "argument --min-time: expected a finite number >= 0"),
    (["--impl", "sdpa", "--tolerance", "nan"], "argument --tolerance: expected a finite number >= 0"),
    (["--impl", "sdpa", "--tolerance", "-1"], "argument --tolerance: expected a finite number >= 0"),
    (["--impl", "sdpa", "--overhead-factor", "inf"], "argument --overhead-factor: expected a finite number >= 0"),
    (["--impl", "sdpa", "--out", os.devnull], f"argument --out: '{os.devnull}' exists and is not a folder"),
    (["--impl", "sdpa", "--threads", "-3"], "argument --threads: expected an int >= 1, got '-3'"),
    (["--impl", "sdpa", "--sweep", "N=64,32"], "argument '--sweep': expected increasing values"),
    (["--impl", "sdpa", "--mask", ","], "argument '--mask': expected at least one mask family"),
    (["--impl", "sdpa-fastest"], "argument '--impl': expected one of sdpa, sdpa-math"),
    (["--impl", "sdpa", "--vs", "sdpa"], "argument '--vs'"),
    (["--impl", "sdpa", "--mask", "window:x"], "argument '--mask'"),
    (["--impl", "sdpa", "--sweep", "W=8..64"], "argument '--mask': --sweep W=... needs the mask 'window'"),
    (["--impl", "sdpa", "--sweep", "N=8..64", "--mask", "window"], "argument '--mask'"),
    (["--impl", "sdpa", "--sweep", "N=8..64", "--mask", "chunk"], "argument '--mask': --sweep W=... needs"),
    (["--impl", "sdpa", "--mask", "chunk:0"], "argument '--mask': expected"),
    (["--impl", "sdpa", "--heads", "4", "--heads-kv", "3"], "argument '--heads-kv'"),
    (["--impl", "sdpa", "--repeats", "0"], "argument --repeats: expected an int >= 1, got '0'"),
    (["--impl", "sdpa", "--device", "tpu"], "argument '--device'"),
])
def test_bad_arguments_get_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err  # one line, no usage block, no traceback
