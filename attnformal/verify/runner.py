"""Running checks: the context a check works in, and the result it leaves.

A check is a function of a :class:`CheckRun`. It builds seeded cases, runs the
implementation on them (:meth:`CheckRun.observe`, :meth:`CheckRun.against_reference`) and
records each case as pass, FAIL or unsupported; it may add findings. :func:`run_check`
turns that into a :class:`CheckResult`: the status, the worst errors, where they sit, the
likely bug, and a reproducer file with the one-line command that replays it.
"""

from __future__ import annotations

import fnmatch
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnformal.testing import Comparison
from attnformal.verify import diagnosis
from attnformal.verify.calls import FIELDS, ContractError, Observed, Unsupported, call, case_features
from attnformal.verify.cases import Case, derive_seed, random_case
from attnformal.verify.diagnosis import Finding, finding
from attnformal.verify.reference import Expected, expected_for, naive_for
from attnformal.verify.tolerances import LOW_PRECISION, judge

DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
               "float64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
               "fp64": torch.float64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class Settings:
    """One run of the battery: what to test, how, and where reproducers go."""

    impl: Callable
    impl_name: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    device: str = "cpu"
    profile: str = "quick"
    tolerance: str = "default"
    seed: int = 0
    fail_fast: bool = False
    require: frozenset[str] = frozenset()
    repro_dir: Path | None = None
    use_certified: bool = True
    only: tuple[str, ...] = ()
    threads: int | None = 1  # torch CPU threads during the run (None: leave as is); the cases are small

    def selects(self, check_name: str) -> bool:
        return not self.only or any(fnmatch.fnmatch(check_name, pattern) for pattern in self.only)


@dataclass
class CaseRecord:
    case: Case
    status: str  # "pass" | "FAIL" | "unsupported"
    lse: bool = False
    backward: bool = False
    comparisons: list[Comparison] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    observed: Observed | None = None
    expected: Expected | None = None
    features: tuple[str, ...] = ()
    message: str = ""

    @property
    def worst_ratio(self) -> float:
        ratios = [c.worst_ratio for c in self.comparisons]
        return max(ratios + ([float("inf")] if self.problems else [0.0]))


@dataclass
class CheckResult:
    check: str
    dtype: str
    status: str  # "pass" | "FAIL" | "unsupported" | "ERROR" (the battery itself failed)
    summary: str = ""
    details: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    reproducer: str | None = None
    command: str | None = None
    seed: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # process CPU time: comparable across loaded and idle machines
    cases: int = 0
    unsupported_cases: int = 0
    reference: str = ""

    @property
    def label(self) -> str:
        return f"{self.check}[{self.dtype}]"

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "ERROR")

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "findings"}
        out["findings"] = [f.to_json() for f in self.findings]
        return out


class CheckRun:
    """What a check sees: the implementation, the dtype, seeded case builders and recorders."""

    def __init__(self, settings: Settings, check_name: str, dtype: torch.dtype):
        self.settings, self.check_name, self.dtype = settings, check_name, dtype
        self.device = settings.device
        self.records: list[CaseRecord] = []
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.metrics: dict = {}

    @property
    def quick(self) -> bool:
        return self.settings.profile == "quick"

    def pick(self, quick, full):
        return quick if self.quick else full

    def seed(self, *parts) -> int:
        return derive_seed(self.settings.seed, self.check_name, dtype_name(self.dtype), *parts)

    def random_case(self, name, sh, *, grad=True, **kwargs) -> Case:
        return random_case(name, sh, self.dtype, self.device, self.seed(name), grad=grad, **kwargs)

    # -- running the implementation

    def observe(self, case: Case, *, lse=False, backward=False) -> Observed | None:
        """The implementation's results, or None when it does not support the case (recorded) or
        broke the contract (recorded as a failure)."""
        try:
            return call(self.settings.impl, case, lse=lse, backward=backward)
        except Unsupported as err:
            self.records.append(CaseRecord(case, "unsupported", lse, backward, features=err.features,
                                           message=str(err)))
        except ContractError as err:
            self.records.append(CaseRecord(case, "FAIL", lse, backward, problems=[str(err)],
                                           features=case_features(case, lse=lse, backward=backward)))
            bug = "input_mutation" if "in place" in str(err) else "contract"
            self.find(bug, diagnosis.DEFINITIVE if bug == "input_mutation" else diagnosis.PATTERN, str(err))
        return None

    def expected(self, case: Case, *, backward=False) -> Expected:
        return expected_for(case, backward=backward, use_certified=self.settings.use_certified)

    def against_reference(self, case: Case, *, lse=False, backward=False,
                          expected: Expected | None = None) -> CaseRecord | None:
        """Run the case and judge every tensor it returns against the reference (or ``expected``)."""
        observed = self.observe(case, lse=lse, backward=backward)
        if observed is None:
            return None
        expected = expected or self.expected(case, backward=backward)
        names = ["out"] + (["lse"] if lse else []) + (["dq", "dk", "dv"] if backward else [])
        naive = naive_for(case, backward=backward) if self.settings.tolerance == "naive" and case.dtype in \
            LOW_PRECISION else None
        comparisons = [judge(self.settings.tolerance, n, observed.get(n), expected, case.dtype, naive=naive)
                       for n in names]
        return self.record(case, comparisons=comparisons, lse=lse, backward=backward, observed=observed,
                           expected=expected)

    def record(self, case, *, comparisons=(), problems=(), lse=False, backward=False, observed=None,
               expected=None) -> CaseRecord:
        comparisons, problems = list(comparisons), list(problems)
        failed = problems or any(not c.passed for c in comparisons)
        rec = CaseRecord(case, "FAIL" if failed else "pass", lse, backward, comparisons, problems, observed,
                         expected, case_features(case, lse=lse, backward=backward))
        self.records.append(rec)
        return rec

    def fail(self, record: CaseRecord, problems):
        """Add structural problems to a recorded case (which then fails)."""
        record.problems += problems
        record.status = "FAIL"

    def find(self, bug, weight, evidence):
        self.findings.append(finding(bug, weight, evidence))

    def note(self, text):
        self.notes.append(text)


def run_check(settings: Settings, check, dtype: torch.dtype) -> CheckResult:
    run = CheckRun(settings, check.name, dtype)
    result = CheckResult(check.name, dtype_name(dtype), "pass", seed=settings.seed)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        check.fn(run)
        _conclude(settings, run, result)
    except Exception:  # a defect of the battery, not of the implementation: say so plainly
        result.status = "ERROR"
        result.summary = "the check itself raised an exception (a battery defect)"
        result.details = traceback.format_exc().splitlines()[-6:]
    result.seconds, result.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return result


def _conclude(settings: Settings, run: CheckRun, result: CheckResult):
    records = run.records
    failed = [r for r in records if r.status == "FAIL"]
    unsupported = [r for r in records if r.status == "unsupported"]
    required = [r for r in unsupported if settings.require & set(r.features)]
    result.cases, result.unsupported_cases = len(records), len(unsupported)
    result.findings = list(dict.fromkeys(run.findings))  # the same finding from several cases, once
    result.details = list(run.notes)
    result.metrics = {**_metrics(records), **run.metrics}
    result.reference = next((r.expected.source for r in records if r.expected is not None), "")
    tested = [r for r in records if r.case.role != "control"]  # a control alone does not make a pass
    if failed or required:
        result.status = "FAIL"
    elif all(r.status == "unsupported" for r in tested):
        result.status = "unsupported"
    if unsupported:
        first = unsupported[0]
        result.details.append(f"{len(unsupported)}/{len(records)} cases unsupported (features: "
                              f"{', '.join(first.features) or 'forward'}): {first.message}")
    for r in required:
        result.details.append(f"required feature unsupported: {sorted(settings.require & set(r.features))} "
                              f"in case {r.case.describe()}")
    if result.status == "FAIL" and failed:
        worst = max(failed, key=lambda r: r.worst_ratio)
        _explain(settings, worst, result)
    result.summary = _summary(result, failed, records)


def _metrics(records) -> dict:
    comps = [c for r in records for c in r.comparisons if c.numel]
    if not comps:
        return {}
    worst = max(comps, key=lambda c: c.worst_ratio)
    return {"worst_ratio": worst.worst_ratio, "worst_tensor": worst.name, "worst_index": worst.worst_index,
            "max_abs": max(c.max_abs for c in comps), "max_rel": max(c.max_rel for c in comps),
            "mean_abs": sum(c.mean_abs for c in comps) / len(comps),
            "mean_rel": sum(c.mean_rel for c in comps) / len(comps),
            "fraction_over": max(c.fraction for c in comps)}


def _summary(result: CheckResult, failed, records) -> str:
    if result.status == "unsupported":
        return result.details[0] if result.details else "no case ran"
    if result.status == "pass":
        ratio = result.metrics.get("worst_ratio")
        return f"{len(records)} cases" + (f", worst error {ratio:.2g}x tolerance" if ratio is not None else "")
    if not failed:
        return next((d for d in result.details if d.startswith("required")), "failed")
    worst = max(failed, key=lambda r: r.worst_ratio)
    bad = [c for c in worst.comparisons if not c.passed]
    what = worst.problems[0] if worst.problems else ", ".join(
        f"{c.name} {c.worst_ratio:.3g}x tolerance ({c.mismatched}/{c.numel})" for c in bad)
    return f"{len(failed)}/{len(records)} cases fail; worst: {what}"


def _explain(settings: Settings, worst: CaseRecord, result: CheckResult):
    """Localise the worst failing case, look for an explanation, and save its reproducer."""
    result.details.insert(0, f"worst case: {worst.case.describe()} (seed {worst.case.seed})")
    failing = {c.name: c.max_abs for c in worst.comparisons if not c.passed and c.numel and c.name in FIELDS}
    for c in worst.comparisons:
        if c.passed:
            continue
        result.details.append(c.message())
        if c.name not in FIELDS:
            continue
        if c.ratio is not None and c.numel and worst.expected is not None:
            text, found = diagnosis.localise(c.name, c.ratio > 1, worst.case, worst.expected)
            result.details.append("where: " + text)
            result.findings += found
        if worst.observed is not None and worst.expected is not None:
            factor = diagnosis.factor_finding(c.name, worst.observed.get(c.name), worst.expected.values[c.name],
                                              worst.case)
            if factor is not None:
                result.findings.append(factor)
    if failing and worst.observed is not None and _small_enough(worst.case):
        result.findings += diagnosis.mutant_findings(worst.case, worst.observed, failing, backward=worst.backward)
    result.findings = list(dict.fromkeys(result.findings))
    _save_reproducer(settings, worst, result)


def _small_enough(case) -> bool:
    s = case.spec
    return s.batch * s.heads_q * s.len_q * s.len_k <= 2**22


def _save_reproducer(settings: Settings, worst: CaseRecord, result: CheckResult):
    rerun = (f"python -m attnformal.verify --impl {settings.impl_name} --dtypes {result.dtype} "
             f"--profile {settings.profile} --tolerance {settings.tolerance} --seed {settings.seed} "
             f"--only '{result.check}'")
    result.command = rerun
    if settings.repro_dir is None:
        return
    settings.repro_dir.mkdir(parents=True, exist_ok=True)
    path = settings.repro_dir / f"{result.check}-{result.dtype}.pt"
    torch.save({"case": worst.case.to_payload(), "lse": worst.lse, "backward": worst.backward,
                "check": result.check, "dtype": result.dtype, "tolerance": settings.tolerance,
                "impl": settings.impl_name, "run_seed": settings.seed, "spec": worst.case.spec.to_json(),
                "rerun": rerun}, path)
    result.reproducer = str(path)
    result.command = f"python -m attnformal.verify --impl {settings.impl_name} --replay {path}"
