"""Running checks: the context a check works in, and the result it leaves.

A check is a function of a :class:`CheckRun`. It builds seeded cases -- adapted to what
the implementation accepts (:mod:`.capabilities`) -- runs the implementation on them
(:meth:`CheckRun.observe`, :meth:`CheckRun.against_reference`) and records each case as
pass, FAIL or unsupported; it may add findings. :func:`run_check` turns that into a
:class:`CheckResult`: the status, the worst errors, where they sit, the likely bug, what the
check covered, and a reproducer file with the one-line command that replays it.
"""

from __future__ import annotations

import fnmatch
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnformal.pictures.errors import error_map_data
from attnformal.testing import Comparison, format_ratio
from attnformal.verify import diagnosis
from attnformal.verify.calls import LAID_OUT, ContractError, Observed, Unsupported, call, case_features
from attnformal.verify.cases import Case, Shape, derive_seed, random_case
from attnformal.verify.coverage import case_coverage, check_coverage
from attnformal.features import mask_features
from attnformal.verify.diagnosis import Finding, finding
from attnformal.verify.reference import PARAMETER_GRADIENTS, Expected, expected_for, naive_for
from attnformal.verify.tolerances import LOW_PRECISION, judge



def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class Settings:
    """One run of the battery: what to test, how, and where reproducers go."""

    impl: Callable | None  # None: resolved from ``target`` (in a worker process)
    impl_name: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    device: str = "cpu"
    profile: str = "quick"
    tolerance: str = "default"
    seed: int = 0
    fail_fast: bool = False
    require: frozenset[str] = frozenset()
    repro_dir: Path | None = None  # this implementation's output folder: reproducers, results.json
    use_certified: bool = True
    only: tuple[str, ...] = ()
    threads: int | None = 1  # torch CPU threads during the run (None: leave as is); the cases are small
    target: str | None = None  # MODULE:FUNC, FILE.py:FUNC or an alias: how a worker process finds ``impl``
    isolate: bool = False  # run the checks in a worker process (crashes and hangs become FAILs)
    case_timeout: float = 300.0  # seconds one call of the implementation may take when isolated
    jobs: int = 1  # isolated: checks run at once, each in its own worker process
    explicit_dtypes: bool = True  # False: dtypes the implementation refuses are replaced by ones it accepts
    workers: int | None = None  # run the tasks on a local Dask cluster of this many worker processes
    cluster: str | None = None  # ... or on the Dask scheduler at this address

    @property
    def distributed(self) -> bool:
        return bool(self.workers or self.cluster)

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
    kind: str = ""  # for an isolated FAIL: "crash" (the process died) or "hang" (over --case-timeout)
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
    coverage: dict = field(default_factory=dict)  # what the cases exercised (see .coverage)
    error_map: dict | None = field(default=None, repr=False)  # a FAIL's error-map data, until it is drawn
    picture: str | None = None  # the error map's PNG, next to the reproducer

    @property
    def label(self) -> str:
        return f"{self.check}[{self.dtype}]"

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "ERROR")

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("findings", "error_map")}
        out["findings"] = [f.to_json() for f in self.findings]
        return out


class CheckRun:
    """What a check sees: the implementation, the dtype, seeded case builders and recorders.

    ``capabilities`` (dtype name -> :class:`~.capabilities.Capabilities`) adapt every case to
    what the implementation accepts; ``watch`` is told about each call (see :func:`.calls.call`).
    """

    def __init__(self, settings: Settings, check_name: str, dtype: torch.dtype, *, impl=None,
                 capabilities: dict | None = None, watch=None):
        self.settings, self.check_name, self.dtype = settings, check_name, dtype
        self.impl = impl or settings.impl
        self.device = settings.device
        self.capabilities = capabilities or {}
        self.watch = watch
        self.records: list[CaseRecord] = []
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.metrics: dict = {}
        self.refused_probes: list[str] = []  # expected-refusal probes the implementation refused
        self._built: set = set()

    def caps_for(self, dtype=None):
        return self.capabilities.get(dtype_name(dtype or self.dtype))

    @property
    def caps(self):
        return self.caps_for(self.dtype)

    @property
    def quick(self) -> bool:
        return self.settings.profile == "quick"

    def pick(self, quick, full):
        return quick if self.quick else full

    def seed(self, *parts) -> int:
        return derive_seed(self.settings.seed, self.check_name, dtype_name(self.dtype), *parts)

    def adapt(self, sh: Shape, kwargs=None, *, keep=(), incidental=(), identity_values=False, dtype=None):
        """``(shape, kwargs, notes)``: the nearest case the implementation accepts in ``dtype``
        (this check's by default); see :meth:`.capabilities.Capabilities.adapt`."""
        caps = self.caps_for(dtype)
        kwargs = dict(kwargs or {})
        if caps is None:
            return sh, kwargs, ()
        return caps.adapt(sh, kwargs, keep=keep, incidental=incidental, identity_values=identity_values,
                          head_dim_ok=lambda d: caps.head_dim_ok(d, self.impl, self.device, self.watch))

    def random_case(self, name, sh, *, grad=True, keep=(), incidental=(), identity_values=False, dtype=None,
                    **kwargs) -> Case:
        """A seeded random case, adapted (see :meth:`adapt`); one adapted into the shape of an earlier
        case of this check is marked a duplicate and not run."""
        sh, kwargs, notes = self.adapt(sh, kwargs, keep=keep, incidental=incidental,
                                       identity_values=identity_values, dtype=dtype)
        case = random_case(name, sh, dtype or self.dtype, self.device, self.seed(name), grad=grad, **kwargs)
        if notes:
            key = (sh, tuple(sorted((k, repr(v)) for k, v in kwargs.items())), grad)
            plain = not any(isinstance(v, torch.Tensor) for v in kwargs.values())
            case = case.with_(adapted=notes, duplicate=plain and key in self._built)
            self._built.add(key)
        return case

    def as_asked(self, case: Case, sh: Shape, *, grad=True, **kwargs) -> Case | None:
        """``case`` (built by :meth:`random_case` from ``sh`` and ``kwargs``) as asked when its lengths were
        rounded to the implementation's multiple, else None: an expected-refusal probe (``observe(...,
        expect_refusal=True)``) of the ragged lengths the adaptation hid."""
        if not any(note.startswith("lengths rounded up") for note in case.adapted):
            return None
        return random_case(f"{case.name} as asked", sh, self.dtype, self.device, self.seed(case.name), grad=grad,
                           **kwargs)

    # -- running the implementation

    def observe(self, case: Case, *, lse=False, backward=False, expect_refusal=False) -> Observed | None:
        """The implementation's results, or None when it does not support the case (recorded; with
        ``expect_refusal`` only counted), broke the contract (recorded as a failure), or the case duplicates
        an adapted one."""
        if case.duplicate:
            return None
        try:
            return call(self.impl, case, lse=lse, backward=backward, watch=self.watch)
        except Unsupported as err:
            if expect_refusal:
                self.refused_probes.append(case.name)
                return None
            self.records.append(CaseRecord(case, "unsupported", lse, backward, features=err.features,
                                           message=str(err)))
        except ContractError as err:
            self.records.append(CaseRecord(case, "FAIL", lse, backward, problems=[str(err)],
                                           features=case_features(case, lse=lse, backward=backward)))
            self.find(*diagnosis.contract_finding(str(err), case))
        return None

    def expected(self, case: Case, *, backward=False) -> Expected:
        return expected_for(case, backward=backward, use_certified=self.settings.use_certified)

    def against_reference(self, case: Case, *, lse=False, backward=False, expected: Expected | None = None,
                          expect_refusal=False) -> CaseRecord | None:
        """Run the case and judge every tensor it returns against the reference (or ``expected``)."""
        observed = self.observe(case, lse=lse, backward=backward, expect_refusal=expect_refusal)
        if observed is None:
            return None
        expected = expected or self.expected(case, backward=backward)
        names = ["out"] + (["lse"] if lse else []) + (["dq", "dk", "dv"] if backward else [])
        names += [n for n in ("dsinks", "dbias") if backward and observed.get(n) is not None]
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


def run_check(settings: Settings, check, dtype: torch.dtype, *, impl=None, capabilities=None,
              watch=None) -> CheckResult:
    run = CheckRun(settings, check.name, dtype, impl=impl, capabilities=capabilities, watch=watch)
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
    refused = {id(r): _refused_features(run, r) for r in unsupported}
    required = [r for r in unsupported if settings.require & refused[id(r)]]
    result.cases, result.unsupported_cases = len(records), len(unsupported)
    result.findings = list(dict.fromkeys(run.findings))  # the same finding from several cases, once
    result.details = list(run.notes)
    if run.refused_probes:
        result.details.append(f"{len(run.refused_probes)} ragged lengths hidden by the adaptation were refused, as "
                              f"expected (judged where accepted)")
    result.metrics = {**_metrics(records), **run.metrics}
    result.reference = next((r.expected.source for r in records if r.expected is not None), "")
    result.coverage = check_coverage([case_coverage(r.case, r.status, r.features, refused.get(id(r), ()))
                                      for r in records])
    tested = [r for r in records if r.case.role != "control"]  # a control alone does not make a pass
    if failed or required:
        result.status = "FAIL"
    elif all(r.status == "unsupported" for r in tested):
        result.status = "unsupported"
    if unsupported:
        first = unsupported[0]
        what = ", ".join(sorted(refused[id(first)])) or "the combination " + (", ".join(first.features) or "forward")
        if run.caps_for(first.case.dtype) is None:  # not probed one feature at a time: the case's, not the reason
            what = f"a case with {', '.join(first.features) or 'no feature'}"
        result.details.append(f"{len(unsupported)}/{len(records)} cases unsupported (refused: {what}): "
                              f"{first.message}")
    for r in required:
        result.details.append(f"required feature unsupported: {sorted(settings.require & refused[id(r)])} "
                              f"in case {r.case.describe()}")
    if result.status == "FAIL" and failed:
        worst = max(failed, key=lambda r: r.worst_ratio)
        _explain(settings, worst, result)
        result.findings = list(dict.fromkeys(result.findings + _support_probe(run, worst)))
        result.findings = _rotation_control(run, worst, result.findings)
    result.summary = _summary(result, failed, records)


def _refused_features(run: CheckRun, record: CaseRecord) -> set[str]:
    """The features the implementation refuses on their own, among those of a refused case
    (all of them when it was not probed in this dtype)."""
    caps = run.caps_for(record.case.dtype)
    return set(record.features) if caps is None else caps.refused_among(record.features)


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
        f"{c.name} {'NaN/Inf' if c.nonfinite else format_ratio(c.worst_ratio) + 'x tolerance'} "
        f"({c.mismatched}/{c.numel})" for c in bad)
    return f"{len(failed)}/{len(records)} cases fail; worst: {what}"


def _explain(settings: Settings, worst: CaseRecord, result: CheckResult):
    """Localise the worst failing case, look for an explanation, and save its reproducer."""
    result.details.insert(0, f"worst case: {worst.case.describe()} (seed {worst.case.seed})")
    failing = {c.name: c.max_abs for c in worst.comparisons if not c.passed and c.numel and c.name in LAID_OUT}
    padded = not worst.case.spec.packed  # localisation and mutants read [B, H, S, ...]; mask.packed names its own
    out_factor = _output_factor(worst)
    for c in worst.comparisons:
        if c.passed:
            continue
        result.details.append(c.message())
        if c.name in PARAMETER_GRADIENTS and worst.observed is not None and worst.observed.get(c.name) is not None:
            factor = diagnosis.factor_finding(c.name, worst.observed.get(c.name), worst.expected.values[c.name],
                                              worst.case)
            result.findings += [factor] if factor is not None else []
        if c.name not in LAID_OUT or not padded:
            continue
        if c.ratio is not None and c.numel and worst.expected is not None:
            text, found = diagnosis.localise(c.name, c.ratio > 1, worst.case, worst.expected)
            result.details.append("where: " + text)
            result.findings += found
        if worst.observed is not None and worst.expected is not None:
            factor = diagnosis.factor_finding(c.name, worst.observed.get(c.name), worst.expected.values[c.name],
                                              worst.case, out_factor=out_factor)
            if factor is not None:
                result.findings.append(factor)
            if c.name == "out":
                nan = diagnosis.nan_output_finding(worst.observed.out, worst.expected, worst.case)
                result.findings += [nan] if nan is not None else []
    if padded and failing and worst.observed is not None and _small_enough(worst.case):
        passing = {c.name: c.max_abs for c in worst.comparisons if c.passed and c.numel and c.name in LAID_OUT}
        result.findings += diagnosis.mutant_findings(worst.case, worst.observed, failing, backward=worst.backward,
                                                     passing=passing)
    result.findings = list(dict.fromkeys(result.findings))
    result.error_map = error_map_data(worst, LAID_OUT)
    _save_reproducer(settings, worst, result)


def _output_factor(worst: CaseRecord) -> float | None:
    """The constant the worst case's output is off by (None: none, or the output is right)."""
    out = next((c for c in worst.comparisons if c.name == "out"), None)
    if out is None or out.passed or worst.observed is None or worst.expected is None:
        return None
    return diagnosis.constant_factor(worst.observed.out, worst.expected.values["out"])


def _rotation_control(run: CheckRun, worst: CaseRecord, findings: list[Finding]) -> list[Finding]:
    """Test a localised "every batch fails except batch 0" by rotating the batches: the finding is confirmed
    (STRONG) when the failure stays with the batch positions, dropped when it follows the data."""
    hint = next((f for f in findings if f.bug == "batch_indexing" and f.weight == diagnosis.PATTERN), None)
    out = next((c for c in worst.comparisons if c.name == "out" and not c.passed and c.ratio is not None), None)
    rotated = diagnosis.rotated_batches(worst.case) if hint is not None and out is not None else None
    if rotated is None:
        return findings
    try:  # the case again first: a kernel whose failing batches change from call to call localises nothing
        again, moved = (call(run.impl, c, lse=worst.lse, watch=run.watch) for c in (worst.case, rotated))
    except (Unsupported, ContractError):
        return findings
    before = [b for b in range(worst.case.spec.batch) if bool((out.ratio[b] > 1).any())]
    if _failing_batches(run, again, worst.expected, worst.case) != before:
        return [f for f in findings if f is not hint]
    failing = _failing_batches(run, moved, run.expected(rotated), rotated)
    verdict = diagnosis.rotation_finding(before, failing, rotated.spec.batch)
    if verdict is None:
        return findings
    return [f for f in findings if f is not hint] + [verdict]


def _failing_batches(run: CheckRun, observed, expected, case) -> list[int]:
    out = judge(run.settings.tolerance, "out", observed.out, expected, case.dtype)
    return [b for b in range(case.spec.batch) if bool((out.ratio[b] > 1).any())]


SUPPORT_PROBE_KEYS = 512  # V = I makes the value dim Sk: the probe runs up to this many keys


def _support_probe(run: CheckRun, worst: CaseRecord) -> list[Finding]:
    """The mask the implementation used on the worst failing case, read off its output with V = I (as
    softmax.probabilities does): the boundary it gets wrong is then named in the failing check itself, so a
    ``--fail-fast`` run that stops here keeps its diagnosis. Only for a masked, padded, forward case."""
    case = worst.case
    spec = case.spec
    masked = any(f.active(case.kwargs.get(f.name)) for f in mask_features())
    if not masked or spec.packed or spec.dropout_p > 0 or not 0 < spec.len_k <= SUPPORT_PROBE_KEYS \
            or any(case.kwargs.get(n) is not None for n in ("bias", "sinks")) or not _small_enough(case) \
            or spec.head_dim_v == spec.len_k or case.dtype == torch.float16:
        return []  # (Dv = Sk: the case may itself be a V = I probe; float16 underflows small probabilities to 0;
        # a sink given a value would read as a mask)
    eye = torch.eye(spec.len_k, dtype=case.dtype, device=case.q.device)
    probe = case.with_(v=eye.expand(spec.batch, spec.heads_kv, spec.len_k, spec.len_k).clone())
    try:
        observed = call(run.impl, probe, watch=run.watch)
    except (Unsupported, ContractError):
        return []
    if not torch.isfinite(observed.out).all():
        return []  # NaN rows say nothing about the mask; the checks of NaN name them
    _, found = diagnosis.support_findings(observed.out.double(), probe)
    return [f for f in found if f.bug != "mask_wrong"]  # a boundary named, or nothing: the checks say the rest


def _small_enough(case) -> bool:
    s = case.spec
    return s.batch * s.heads_q * s.len_q * s.len_k <= 2**22


def rerun_command(settings: Settings, check: str, dtype: str) -> str:
    """The command that runs one check again, exactly as in this run."""
    return (f"python -m attnformal.verify --impl {settings.impl_name} --dtypes {dtype} --profile {settings.profile} "
            f"--tolerance {settings.tolerance} --seed {settings.seed} --only '{check}'")


def reproducer_path(settings: Settings, check: str, dtype: str) -> Path | None:
    return None if settings.repro_dir is None else settings.repro_dir / f"{check}-{dtype}.pt"


def reproducer_data(settings: Settings, case: Case, *, lse: bool, backward: bool, check: str, dtype: str) -> dict:
    """What a reproducer file holds (the format :func:`.replay.load_reproducer` reads)."""
    return {"case": case.to_payload(), "lse": lse, "backward": backward, "check": check, "dtype": dtype,
            "tolerance": settings.tolerance, "impl": settings.impl_name, "run_seed": settings.seed,
            "spec": case.spec.to_json(), "rerun": rerun_command(settings, check, dtype)}


def replay_command(settings: Settings, path) -> str:
    return f"python -m attnformal.verify --impl {settings.impl_name} --replay {path}"


def _save_reproducer(settings: Settings, worst: CaseRecord, result: CheckResult):
    result.command = rerun_command(settings, result.check, result.dtype)
    path = reproducer_path(settings, result.check, result.dtype)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(reproducer_data(settings, worst.case, lse=worst.lse, backward=worst.backward, check=result.check,
                               dtype=result.dtype), path)
    result.reproducer = str(path)
    result.command = replay_command(settings, path)
