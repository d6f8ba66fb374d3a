"""Error maps: a failing check draws where its error sits, next to its reproducer, and says so."""

from __future__ import annotations

import math

import torch

from attnformal import pictures
from attnformal.oracle import attention_oracle
from attnformal.pictures import errors
from attnformal.verify import Settings, run_battery
from attnformal.verify.checks import CHECKS
from attnformal.verify.report import render
from attnformal.verify.runner import run_check


def head_1_unscaled(q, k, v, *, scale=None, **kwargs):
    """A porting bug in one head: head 1 forgets the softmax scale (its scores are q k^T, unscaled)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    q = q.double().clone()
    q[:, 1] /= scale
    return attention_oracle(q, k.double(), v.double(), scale=scale, **kwargs).to(k.dtype)


def settings(**changes):
    return Settings(impl=head_1_unscaled, impl_name="head_1_unscaled", dtypes=(torch.float32,),
                    only=("fwd.random",), **changes)


def test_the_map_of_a_one_head_bug_is_hot_on_that_head_alone():
    check = next(c for c in CHECKS if c.name == "fwd.random")
    result = run_check(settings(), check, torch.float32)
    assert result.status == "FAIL"
    data = result.error_map  # run without a folder: the data stays with the result
    assert data["tensor"] == "out" and data["head"] == 1
    for row in data["per_head"]:  # log10 of the worst ratio: > 0 fails
        assert row[1] > 0 and all(value < 0 for h, value in enumerate(row) if h != 1)
    rows, dim = data["shape"][2:]
    assert len(data["matrix"]) == rows and len(data["matrix"][0]) == dim and data["steps"] == [1, 1]


def test_a_failing_check_writes_its_map_beside_the_reproducer_and_names_it(tmp_path, png):
    report = run_battery(settings(repro_dir=tmp_path))
    (result,) = report.results
    assert result.picture == str(tmp_path / "fwd.random-float32.png")
    assert result.reproducer == str(tmp_path / "fwd.random-float32.pt")
    assert f"    error map: {result.picture}" in render(report)
    picture = png(result.picture)
    assert picture.size[0] > 800 and picture.size[1] > 300
    assert "error_map" not in result.to_json() and result.error_map is None  # drawn, then dropped


def test_without_matplotlib_the_check_says_how_to_get_the_map(tmp_path, monkeypatch):
    def missing():
        raise pictures.PicturesUnavailable(f"pictures need matplotlib: {pictures.INSTALL}")

    monkeypatch.setattr(errors, "require_matplotlib", missing)
    (result,) = run_battery(settings(repro_dir=tmp_path)).results
    assert result.status == "FAIL" and result.picture is None
    assert f"no error map: pictures need matplotlib: {pictures.INSTALL}" in result.details


def test_a_large_map_is_max_pooled_so_the_worst_element_stays():
    ratio = torch.zeros(3000, 70)
    ratio[2999, 69] = 50.0
    pooled, step_r, step_c = errors._pool(ratio, errors.MAX_ROWS, errors.MAX_COLS)
    assert (step_r, step_c) == (6, 1) and pooled.shape == (500, 70) and float(pooled.max()) == 50.0
