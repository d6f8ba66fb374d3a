"""Issue 25's reach: dominant masked scores across the dtype's range, values past float16's, shape regimes,
and ragged lengths an adaptation would hide -- each found where only it can be, and named with its detail."""

import pytest
import torch

import zoo
from attnformal.verify import Settings, run_battery
from attnformal.verify.cases import shape
from attnformal.verify.checks.ranges import magnitudes, spreads
from attnformal.verify.checks.regimes import SQ, cells
from attnformal.verify.coverage import REGIMES
from attnformal.verify.report import render


def _run(impl, name, dtype=torch.float32, **changes):
    return run_battery(Settings(impl=impl, impl_name=name, dtypes=(dtype,), **changes))


def _findings(report, bug):
    return [f.evidence for r in report.results for f in r.findings if f.bug == bug]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_spreads_reach_near_the_dtypes_maximum_and_full_adds_to_quick(dtype):
    top = float(torch.finfo(dtype).max)
    quick, full = spreads(dtype, True), spreads(dtype, False)
    assert set(quick) <= set(full) and quick[0] == 1e2
    assert top / 8 < quick[-1] < top  # near the maximum, with room for a log2(e) factor
    if dtype != torch.float16:
        assert {1e4, 1e6} <= set(quick)
        assert any(65504 < m < 1e6 for m in magnitudes(dtype, shape(2, 2, 2, 24, 64, 16)))  # past float16's range


@pytest.mark.parametrize("sentinel, threshold", [(-1e6, "1e+06"), (-1e4, "1e+04")])
def test_a_finite_sentinel_is_named_with_the_spread_it_starts_to_fail_at(monkeypatch, sentinel, threshold):
    monkeypatch.setattr(zoo, "SENTINEL", sentinel)
    report = _run(zoo.specimen_impl("finite_sentinel"), "zoo:finite_sentinel", only=("extreme.masked_dominant",))
    evidence = _findings(report, "finite_mask_sentinel")
    assert evidence and f"from a score spread of {float(threshold):.3g} on" in evidence[0], render(report)
    assert report.diagnosis[0].bug == "finite_mask_sentinel"


def test_a_replacing_finite_fill_is_not_called_a_sentinel():
    """The -1e4 fill of the finite_fill specimen replaces masked scores: dominant masked keys lose anyway."""
    report = _run(zoo.specimen_impl("finite_fill"), "zoo:finite_fill", only=("extreme.masked_dominant",))
    assert report.passed, render(report)


def test_float16_partials_fail_only_outside_float16s_range():
    """Past its maximum (V, dO of 1e5) -- and below its smallest subnormal: q, k, v ~ 1e-10 underflow to 0."""
    report = _run(zoo.specimen_impl("fp16_partials"), "zoo:fp16_partials", torch.bfloat16)
    failed = {r.check for r in report.results if r.failed}
    assert failed == {"extreme.value_range", "extreme.equal_and_zero"}, render(report)
    assert report.diagnosis[0].bug == "partials_overflow"
    clean = _run(zoo.attention, "zoo", torch.bfloat16, only=("extreme.value_range",))
    assert clean.passed, render(clean)


def test_a_split_kv_path_wrong_under_dropout_is_met_only_by_the_regime_sweep():
    report = _run(zoo.specimen_impl("split_kv_dropout"), "zoo:split_kv_dropout")
    failed = {r.check for r in report.results if r.failed}
    assert failed == {"regimes.sweep"}, render(report)
    evidence = _findings(report, "shape_regime")
    assert any(e.startswith("dropout fails only at") and "Sq=13 Sk=1031" in e and "Sq=128" not in e
               for e in evidence), evidence


def test_the_report_records_which_regimes_ran():
    report = _run(zoo.attention, "zoo", only=("regimes.sweep",))
    result = report.results[0]
    assert result.status == "pass", render(report)
    assert {tuple(map(int, cell.split("x"))) for cell in result.metrics["regimes"]["dropout backward"]} == \
        set(cells(True))
    assert "shape regimes run:" in render(report)
    assert {f"Sq {band} x Sk 129-1024" for band in ("1", "2", "3-16", ">= 128")} <= set(report.coverage["regimes"])
    assert set(report.coverage["regimes"]) | set(report.coverage["missing_regimes"]) == set(REGIMES)
    assert {sq for sq, _ in cells(True)} == set(SQ) and set(cells(True)) <= set(cells(False))


def test_unwritten_tail_rows_are_named_with_the_real_block():
    report = _run(zoo.specimen_impl("ragged_tail_rows"), "zoo:ragged_tail_rows", only=("fwd.lengths",))
    evidence = _findings(report, "ragged_block")
    assert evidence and "past the last multiple of 64 fail" in evidence[0], render(report)
    assert any("ragged lengths hidden by the adaptation were refused" in d for d in report.results[0].details)


def _accepts_small_ragged(bug=None):
    """Refuses lengths that are not multiples of 16 above 64 keys (the probe's), takes them below: and with
    ``bug``, is off by 1 % exactly there."""
    def attention(q, k, v, **kwargs):
        ragged = q.shape[2] % 16 or k.shape[2] % 16
        if ragged and k.shape[2] > 64:
            raise NotImplementedError("lengths must be multiples of 16 above 64 keys")
        out = zoo.attention(q, k, v, **kwargs)
        return out * 1.01 if bug and ragged and not isinstance(out, tuple) else out
    return attention


def test_ragged_lengths_the_adaptation_hides_are_judged_where_accepted():
    report = _run(_accepts_small_ragged(bug=True), "ragged only below 64", only=("fwd.lengths",))
    result = report.results[0]
    assert result.status == "FAIL" and "as asked" in result.details[0], render(report)
    assert report.capabilities["float32"].multiple_k == 16  # the cases were adapted: only the probes see it
    clean = _run(_accepts_small_ragged(), "ragged only below 64, no bug", only=("fwd.lengths",))
    assert clean.passed, render(clean)
