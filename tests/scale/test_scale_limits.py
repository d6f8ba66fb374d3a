"""``scale`` checks its sweep before the first point (attnformal/scale/limits.py): a point that cannot fit in
memory is refused with one line naming it, the estimate and the memory available; a long one is announced.
Judged against a synthetic clock and synthetic memory, never the machine's speed."""

from __future__ import annotations

import contextlib

import pytest

from attnformal.reference import cost
from attnformal.scale import limits
from attnformal.scale.cli import build_parser, configure, main
from attnformal.scale.sweep import Candidate

GIB = 2**30


def nothing_runs(monkeypatch):
    """Any point measured, or any input allocated, fails the test: a refusal must come before the work."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the refusal")
    monkeypatch.setattr("attnformal.scale.sweep.run_sweep", forbidden)
    monkeypatch.setattr("attnformal.scale.problem.Problem.inputs", forbidden)


def test_a_sweep_whose_inputs_alone_cannot_fit_is_refused_before_any_allocation(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cost, "available_memory", lambda: 8 * GIB)
    nothing_runs(monkeypatch)
    with pytest.raises(SystemExit) as exited:
        main(["--impl", "torch-tiled", "--sweep", "N=10000000..20000000", "--out", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    # q, dO, out [1, 2, N, 64] and k, v [1, 2, N, 64], float32: 5 tensors of 2 N 64 elements, 4 bytes each
    need = 5 * 2 * 10_000_000 * 64 * 4 / 2**30
    assert err.count("\n") == 1 and err.startswith("error: argument --sweep: the point N=10000000 (mask dense) "
                                                    f"needs at least {need:.1f} GiB for its inputs and outputs")
    assert "8.0 GiB are available" in err


def test_with_the_memory_there_the_arithmetic_lets_the_sweep_start(monkeypatch, tmp_path):
    """The control: the same check with enough memory refuses nothing (and the sweep is then measured)."""
    monkeypatch.setattr(cost, "available_memory", lambda: 64 * GIB)
    args = build_parser().parse_args(["--impl", "torch-tiled", "--sweep", "N=10000000", "--out", str(tmp_path)])
    candidates, masks, base, sweep, settings = configure(args)
    assert limits.point_bytes(base.at("N", 10_000_000), 4, False) < 64 * GIB
    monkeypatch.setattr(limits, "sampled", lambda *args: None)  # not the 24 GiB of inputs here
    limits.check_sweep(candidates, masks, base, sweep, settings)


class Synthetic:
    """An implementation whose calls cost, on a synthetic clock and in synthetic memory, 10 ms plus 1 ms and
    1 MiB per query row: what the estimator measures, whatever the machine."""

    def __init__(self):
        self.now, self.peak = 0.0, 0

    def clock(self) -> float:
        return self.now

    def __call__(self, q, k, v, **kwargs):
        rows = q.shape[2]
        self.now += 0.010 + 0.001 * rows
        self.peak = rows * 2**20
        return q

    @contextlib.contextmanager
    def peak_memory(self):
        class Peak:
            bytes = None
        peak = Peak()
        yield peak
        peak.bytes = self.peak


@pytest.fixture
def synthetic(monkeypatch):
    impl = Synthetic()
    monkeypatch.setattr(cost, "clock", impl.clock)
    monkeypatch.setattr(cost, "peak_memory", impl.peak_memory)
    return impl


def checked(tmp_path, impl, memory, monkeypatch):
    monkeypatch.setattr(cost, "available_memory", lambda: memory)
    args = build_parser().parse_args(["--impl", "torch-tiled", "--sweep", "N=1024,4096", "--head-dim", "8",
                                      "--out", str(tmp_path)])
    _, masks, base, sweep, settings = configure(args)
    said = []
    limits.check_sweep([Candidate("synthetic", impl, None)], masks, base, sweep, settings, log=said.append)
    return said


def test_a_point_whose_sampled_peak_exceeds_the_memory_is_refused(synthetic, tmp_path, monkeypatch):
    with pytest.raises(limits.SweepRefused) as refused:
        checked(tmp_path, synthetic, 1 * GIB, monkeypatch)
    text = str(refused.value)
    assert text.startswith("argument --sweep: the point N=4096 (mask dense) needs about ")
    peak = float(text.split("needs about ")[1].split(" GiB")[0])
    assert 0.5 * 4 < peak < 2 * 4  # truth: 4096 rows x 1 MiB
    assert "at its peak with synthetic (extended from runs of" in text and "1.0 GiB are available" in text


def test_a_point_that_fits_is_announced_with_its_estimate(synthetic, tmp_path, monkeypatch):
    """The control: with 16 GiB the same point is not refused; its time per call is announced."""
    said = checked(tmp_path, synthetic, 16 * GIB, monkeypatch)
    assert len(said) == 1 and said[0].startswith("estimated: one call of synthetic at N=4096 (mask dense) takes about")
    seconds = float(said[0].split("takes about ")[1].split(" s")[0])
    assert 0.5 * 4.106 < seconds < 2 * 4.106  # truth: 10 ms + 4096 ms
