"""The battery against the zoo: every specimen is caught, with the right diagnosis ranked first.

Each specimen runs the whole quick battery (one dtype: the one its bug shows in), so the
diagnosis must come out right in the presence of every other check's findings.
"""

import pytest
import torch

import zoo
from attnformal.verify import Settings, run_battery
from attnformal.verify.checks import CHECKS
from attnformal.verify.diagnosis import summarise
from attnformal.verify.report import render, to_json

_reports = {}


def battery_for(specimen, **changes):
    key = (specimen.bug, tuple(sorted(changes.items())))
    if key not in _reports:
        settings = Settings(impl=zoo.specimen_impl(specimen.bug), impl_name=f"zoo:{specimen.bug}",
                            dtypes=(getattr(torch, specimen.dtype),), **changes)
        _reports[key] = run_battery(settings)
    return _reports[key]


@pytest.mark.parametrize("specimen", zoo.ZOO, ids=lambda s: s.bug)
def test_specimen_is_caught_and_named(specimen):
    report = battery_for(specimen)
    assert not report.passed, f"{specimen.bug} ({specimen.description}) passed the battery"
    assert report.count("ERROR") == 0, render(report)  # a battery defect must not pass for a detection
    top = report.diagnosis[0].bug if report.diagnosis else None
    assert top == specimen.diagnosis, f"{specimen.bug}: diagnosed {top}, expected {specimen.diagnosis}\n" + render(report)


def test_zoo_base_without_a_bug_passes_in_both_dtypes():
    """The negative control of the zoo: its kernel without a bug passes everything."""
    report = run_battery(Settings(impl=zoo.attention, impl_name="zoo (no bug)"))
    assert report.passed, render(report)
    assert report.count("unsupported") == 0


def test_every_quick_check_is_failed_by_some_specimen():
    """No check can pass vacuously: each one fails for at least one specimen."""
    failed = {r.check for s in zoo.ZOO for r in battery_for(s).results if r.failed}
    quick = {c.name for c in CHECKS if not c.full_only}
    assert quick <= failed, f"never failed by any specimen: {sorted(quick - failed)}"


def test_long_sequences_check_catches_low_precision_accumulation():
    """fwd.long (full profile only) fails for the bf16-accumulating specimen; the clean kernel passes it."""
    low = next(s for s in zoo.ZOO if s.bug == "low_precision")
    report = battery_for(low, profile="full", only=("fwd.long",))
    assert [r.status for r in report.results] == ["FAIL"], render(report)
    clean = run_battery(Settings(impl=zoo.attention, impl_name="zoo", dtypes=(torch.bfloat16,), profile="full",
                                 only=("fwd.long",)))
    assert clean.passed, render(clean)


def test_a_first_block_masked_nan_is_caught_in_bf16_and_fp16_by_the_masks_across_blocks():
    """flash_attn_triton.py's bug: NaN for a row whose first 128 keys are masked though later keys are allowed.
    Only the cases whose masks span several key blocks see it (regimes.sweep's window over 1031 keys is one):
    every other check passes."""
    report = run_battery(Settings(impl=zoo.specimen_impl("first_block_nan"), impl_name="zoo:first_block_nan",
                                  dtypes=(torch.bfloat16, torch.float16)))
    failed = {r.label for r in report.results if r.failed}
    assert failed == {f"{check}[{dtype}]" for check in ("mask.across_blocks", "bwd.masks", "regimes.sweep")
                      for dtype in ("bfloat16", "float16")}, render(report)
    assert report.diagnosis[0].bug == "nan_first_block", render(report)


@pytest.mark.parametrize("specimen", zoo.ZOO, ids=lambda s: s.bug)
def test_fail_fast_keeps_the_diagnosis(specimen):
    """--fail-fast stops at the first failing check: the evidence that names the class is gathered there
    (localisation, mutants, the V = I probe of the mask the kernel used, the batch rotation control) or, when
    that check saw only a symptom, by the checks that name causes run after it for the diagnosis."""
    report = battery_for(specimen, fail_fast=True)
    # one failing check: the run stopped there (stopped_early), or it was the battery's last (regimes.sweep)
    assert report.count("FAIL") == 1 and (report.stopped_early or report.results[-1].failed), render(report)
    top = report.diagnosis[0].bug if report.diagnosis else None
    assert top == specimen.diagnosis, f"{specimen.bug} with --fail-fast: diagnosed {top}\n" + render(report)


def test_checks_that_name_causes_run_only_after_a_stop_that_named_nothing():
    """The probes after a --fail-fast stop are what names the class of a symptom-only stop (without them no
    class is named), they run in the stopping dtype and stay out of the verdict; a stop that names its class
    runs none."""
    symptom = battery_for(next(s for s in zoo.ZOO if s.bug == "acc_not_rescaled"), fail_fast=True)
    assert symptom.probes and not summarise(symptom.results), render(symptom)
    assert {r.dtype for r in symptom.probes} == {"float32"} and symptom.verdict == "FAIL"
    assert not {r.label for r in symptom.probes} & {r.label for r in symptom.results}
    assert len(to_json(symptom)["diagnostic_results"]) == len(symptom.probes) and "for the diagnosis" in render(symptom)
    named = battery_for(next(s for s in zoo.ZOO if s.bug == "batch0"), fail_fast=True)
    assert named.stopped_early and summarise(named.results) and named.probes == [], render(named)
