"""``python -m attnformal.prove``: machine-checked proofs of the tiled algorithm behind the kernels.

Runs every obligation of :mod:`attnformal.proofs` on the spec's own definitions and prints one
line per obligation (tool, checks, status, time), then the negative controls -- deliberately
broken definitions that must each be refuted with a printed counterexample. The exit code is 0
only if every obligation is proved (or, for its parts that are checked exhaustively on a stated
bounded domain, checked) and every control refuted; ``unknown`` (a solver timeout) is never
proved. ``--report`` writes each theorem with the hypotheses, axioms and lemmas it rests on, the
commit and tool versions, and what is trusted rather than proved.

Obligations run in worker processes (``--jobs``, default: up to 2), each under a hard time
limit: ``--timeout`` seconds of solver time, then the process is stopped and what it had not
decided is unknown.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from attnformal import cli
from attnformal.logic import CHECKED, PROVED, REFUTED, UNKNOWN, VACUOUS, Budget, Proof, Settings
from attnformal.schedule import TileSchedule

# The kernels whose schedules are always proven. Add a kernel's schedule here as
# "module:attribute" (a TileSchedule, or a list/tuple of them, e.g. autotune configs).
KERNEL_SCHEDULES = ("attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE",
                    "attnformal.kernels.triton_flash:DEFAULT_SCHEDULE")
GRACE_S = 10.0  # beyond --timeout before a worker that ignores its solver limits is stopped


# ---------------------------------------------------------------------------- results


@dataclass
class ObligationResult:
    number: int
    name: str
    title: str
    theorem: str
    checks: list[Proof] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        """The weakest outcome of its checks: ``checked`` when all hold but some only on a bounded domain."""
        if not self.checks:
            return UNKNOWN
        for status in (REFUTED, VACUOUS, UNKNOWN, CHECKED):
            if any(p.status == status for p in self.checks):
                return status
        return PROVED

    @property
    def ok(self) -> bool:
        return self.status in (PROVED, CHECKED)

    @property
    def tools(self) -> str:
        return "+".join(sorted({p.tool for p in self.checks}))


@dataclass
class ControlResult:
    obligation: int
    name: str
    breaks: str
    replaces: str
    expect: str
    proof: Proof

    @property
    def ok(self) -> bool:
        """Refuted with a counterexample -- or, for a control that empties a premise, vacuous."""
        evidence = self.proof.countermodel if self.expect == REFUTED else self.proof.detail
        return self.proof.status == self.expect and bool(evidence)


# ---------------------------------------------------------------------------- running


def obligations():
    from attnformal.proofs import OBLIGATIONS

    return OBLIGATIONS


def selected(pattern: str | None):
    """``(number, module)`` of the obligations matching ``pattern``: a number, or a glob or a
    substring of the module name or the title (case-insensitive)."""
    chosen = []
    for number, module in enumerate(obligations(), start=1):
        keys = (module.__name__.rsplit(".", 1)[-1], module.TITLE.lower())
        if pattern is None or (pattern == str(number) if pattern.isdigit() else
                               any(fnmatch.fnmatch(k, pattern.lower()) or pattern.lower() in k for k in keys)):
            chosen.append((number, module))
    return chosen


def _timeout(module, settings) -> float:
    """An obligation's solver budget: ``--timeout`` times its ``TIMEOUT_SCALE`` (default 1; obligations whose
    queries are known to be slow declare more, in their docstring)."""
    return settings.timeout * getattr(module, "TIMEOUT_SCALE", 1)


def _run_checks(number, module, settings):
    start = time.perf_counter()
    budget = Budget(_timeout(module, settings))
    try:
        checks = list(module.checks(settings, budget))
    except Exception:  # an obligation that crashes is unknown, with the reason
        checks = [Proof(f"obligation {number} ran", "python", UNKNOWN, detail=traceback.format_exc(limit=4))]
    return ObligationResult(number, module.__name__.rsplit(".", 1)[-1], module.TITLE, module.__doc__ or "",
                            [_portable(p) for p in checks], time.perf_counter() - start)


def _run_controls(number, module, settings):
    results, budget = [], Budget(_timeout(module, settings))  # one obligation's controls share its timeout
    for control in module.CONTROLS:
        try:
            proof = control.run(settings, budget)
        except Exception:
            proof = Proof(control.name, "python", UNKNOWN, detail=traceback.format_exc(limit=4))
        results.append(ControlResult(number, control.name, control.breaks, control.replaces,
                                     getattr(control, "expect", REFUTED), _portable(proof)))
    return results


def _portable(proof: Proof) -> Proof:
    """Without Z3 models, which do not cross process boundaries (nor do those of its lemmas)."""
    return proof.but(model=None, by=tuple(_portable(lemma) for lemma in proof.by))


def _run_both(number, module, settings):
    return _run_checks(number, module, settings), _run_controls(number, module, settings)


TASKS = {"checks": _run_checks, "controls": _run_controls, "both": _run_both}
SPLIT_COST = 4  # an obligation this costly runs its checks and its controls in two workers, others in one


def _child(kind, number, module, settings, connection):
    connection.send(TASKS[kind](number, module, settings))
    connection.close()


def run(chosen, settings: Settings, jobs: int, load_kernels=None):
    """Run the checks and the controls of each chosen obligation, ``jobs`` processes at a time.

    ``load_kernels(settings)`` adds the kernels' schedules. It runs once, right after the first
    workers start (on tasks that need no schedule), so the kernels' imports (torch, triton)
    overlap the first proofs and every later worker shares them. Returns the checks, the controls
    and the settings they ran with.
    """
    context = multiprocessing.get_context("fork")
    pending = sorted(((kind, number, module) for number, module in chosen
                      for kind in (("checks", "controls") if getattr(module, "COST", 1) >= SPLIT_COST else ("both",))),
                     key=_cost, reverse=True)  # longest first
    running, results = {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            task = next((t for t in pending if load_kernels is None or not _proves_schedules(t)), None)
            if task is None:
                break
            pending.remove(task)
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(*task, settings, sender), daemon=True)
            process.start()
            sender.close()
            running[receiver] = (task, process, time.monotonic())
        if load_kernels is not None:
            settings, load_kernels = load_kernels(settings), None
            continue
        for receiver in wait(list(running), timeout=0.5):
            task, process, _ = running.pop(receiver)
            try:
                _store(results, task, receiver.recv())
            except EOFError:
                _store(results, task, _failed(task, f"worker exited with code {process.exitcode}"))
            process.join()
        for receiver, (task, process, started) in list(running.items()):
            limit = _timeout(task[2], settings) * (2 if task[0] == "both" else 1) + GRACE_S  # "both": two budgets
            if time.monotonic() - started > limit:
                process.kill()
                process.join()
                running.pop(receiver)
                _store(results, task, _failed(task, f"stopped after {limit:.0f} s"))
    checks = [results[("checks", n)] for n, _ in chosen]
    controls = [c for n, _ in chosen for c in results[("controls", n)]]
    return checks, controls, settings


def _store(results, task, value):
    kind, number, _ = task
    for part, result in zip(("checks", "controls"), value) if kind == "both" else [(kind, value)]:
        results[(part, number)] = result


def _cost(task) -> float:
    """Rough seconds: an obligation's ``COST``; its controls, a quarter of it."""
    kind, _, module = task
    return getattr(module, "COST", 1) * {"checks": 1, "controls": 0.25, "both": 1.25}[kind]


def _proves_schedules(task) -> bool:
    return task[0] != "controls" and getattr(task[2], "PROVES_SCHEDULES", False)


def _failed(task, reason):
    kind, number, module = task
    proof = Proof(f"obligation {number}", "python", UNKNOWN, detail=reason)
    checks = ObligationResult(number, module.__name__.rsplit(".", 1)[-1], module.TITLE, module.__doc__ or "", [proof])
    controls = [ControlResult(number, c.name, c.breaks, c.replaces, getattr(c, "expect", REFUTED), proof)
                for c in module.CONTROLS]
    return {"checks": checks, "controls": controls, "both": (checks, controls)}[kind]


# ---------------------------------------------------------------------------- output


def table(checks, controls, wall: float, jobs: int, settings: Settings) -> str:
    lines = [f"attnformal prover: {len(checks)} obligations, {jobs} worker(s), timeout {settings.timeout:g} s each",
             "schedules: " + describe_schedules(settings), "",
             f"{'#':>2}  {'obligation':<52} {'tool':<16} {'checks':>6}  {'status':<8} {'time':>7}"]
    for o in checks:
        lines.append(f"{o.number:>2}  {o.title:<52} {o.tools:<16} {len(o.checks):>6}  {o.status:<8} {o.seconds:>6.1f}s")
    lines += ["", "negative controls (each must be refuted with a counterexample, or shown vacuous)",
              f"{'#':>2}  {'control':<52} {'status':<8}  counterexample"]
    for c in controls:
        lines.append(f"{c.obligation:>2}  {c.name:<52} {c.proof.status:<8}  {_counterexample(c.proof)}")
    for o, p in ((o, p) for o in checks for p in o.checks if not p.ok):
        lines += ["", f"obligation {o.number} ({o.title}) FAILED: {p.status}: {p.claim}"]
        lines += [f"    case: {p.case}"] if p.case else []
        lines += [f"    counterexample: {_counterexample(p)}"] if p.countermodel else []
        lines += [f"    {p.detail.strip()}"] if p.detail else []
    for c in controls:
        if not c.ok:
            lines += ["", f"control '{c.name}' of obligation {c.obligation} was NOT {c.expect}: {c.proof.status}",
                      f"    {c.proof.detail.strip()}"]
    proved = sum(o.status == PROVED for o in checks)
    checked = sum(o.status == CHECKED for o in checks)
    lines += ["", f"{proved}/{len(checks)} obligations proved, {checked} proved in part and checked on bounded "
                  f"domains ({sum(len(o.checks) for o in checks)} checks, "
                  f"{sum(p.queries for o in checks for p in o.checks)} queries or cases); "
                  f"{sum(c.ok for c in controls)}/{len(controls)} controls refuted; wall {wall:.1f} s"]
    return "\n".join(lines)


def describe_schedules(settings: Settings) -> str:
    named = [f"{label} = {s.block_m}x{s.block_n}, {s.num_splits} split(s)"
             + ("" if type(s) is TileSchedule else f" ({type(s).__qualname__}: its own methods)")
             for label, s in settings.schedules]
    return "; ".join(["all block sizes (symbolic)", *named, *(f"not loaded: {n}" for n in settings.notes)])


def _counterexample(proof: Proof) -> str:
    if not proof.countermodel:
        return proof.detail.strip().splitlines()[-1] if proof.detail.strip() else "-"
    values = ", ".join(f"{k} = {v}" for k, v in proof.countermodel.items())
    return f"[{proof.case}] {values}" if proof.case else values


def environment() -> dict:
    import sympy
    import z3

    return {"commit": _commit(), "python": platform.python_version(), "z3": z3.get_version_string(),
            "sympy": sympy.__version__, "machine": platform.machine(), "cpus": os.cpu_count()}


def _commit() -> str:
    """The checkout's commit, ``+ local changes`` when it has some; ``unknown`` outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "")


def to_json(checks, controls, wall: float, settings: Settings) -> dict:
    return {
        "environment": environment(),
        "settings": {"timeout_s": settings.timeout, "schedules": [
            {"label": label, "block_m": s.block_m, "block_n": s.block_n, "num_splits": s.num_splits,
             "class": type(s).__qualname__} for label, s in settings.schedules], "not_loaded": list(settings.notes)},
        "obligations": [{"number": o.number, "name": o.name, "title": o.title, "status": o.status,
                         "seconds": o.seconds, "checks": [p.to_json() for p in o.checks]} for o in checks],
        "controls": [{"obligation": c.obligation, "name": c.name, "breaks": c.breaks, "replaces": c.replaces,
                      "expect": c.expect, "ok": c.ok, "proof": c.proof.to_json()} for c in controls],
        "trusted": list(_trusted(checks)),
        "wall_seconds": wall,
        "all_proved": all(o.status == PROVED for o in checks),
        "all_passed": all(o.ok for o in checks),  # proved, or checked on the bounded domain each names
        "all_controls_refuted": all(c.ok for c in controls),
    }


def report(checks, controls, wall: float, settings: Settings) -> str:
    """A markdown document for design reviews: each theorem, how it was proven, what it rests on."""
    env = environment()
    out = ["# attnformal: proof report", "",
           f"Obligations proved: {sum(o.status == PROVED for o in checks)} of {len(checks)}, "
           f"{sum(o.status == CHECKED for o in checks)} more proved in part and checked on bounded domains; "
           f"negative controls refuted: {sum(c.ok for c in controls)} of {len(controls)}; wall time {wall:.1f} s.", "",
           f"Commit {env['commit']}; Z3 {env['z3']}, SymPy {env['sympy']}, Python {env['python']}.", "",
           "Schedules: " + describe_schedules(settings) + ".", ""]
    for o in checks:
        out += [f"## {o.number}. {o.title} -- {o.status}", "", plain(_dedent(o.theorem)), "",
                "| check | tool | status | queries | time |", "|---|---|---|---|---|"]
        out += [f"| {plain(p.claim).replace('|', chr(92) + '|')} | {p.tool} | {p.status} | {p.queries} | "
                f"{p.seconds:.2f} s |" for p in o.checks]
        out += ["", "What each check rests on:", ""] + [f"- {_rests_on(p)}" for p in o.checks]
        for p in o.checks:
            if not p.ok:
                out += ["", f"**{p.status}**: {plain(p.claim)} -- case `{p.case}`: {_counterexample(p)} {p.detail}"]
        mine = [c for c in controls if c.obligation == o.number]
        if mine:
            out += ["", "Negative controls:", ""]
            out += [f"- **{c.name}** -- replaces `{c.replaces}`: {c.breaks}. {c.proof.status} "
                    f"(expected {c.expect}): {_counterexample(c.proof)}" for c in mine]
        out.append("")
    out += ["## Trusted, not proved", ""] + [f"- {item}" for item in _trusted(checks)] + [""]
    return "\n".join(out)


def _rests_on(p: Proof) -> str:
    parts = [f"hypotheses: {'; '.join(f'`{h}`' for h in p.hypotheses) if p.hypotheses else 'none'}",
             f"axioms: {'; '.join(plain(a) for a in p.axioms) if p.axioms else 'none'}"]
    if p.by:
        parts.append("built from: " + "; ".join(plain(lemma.claim) for lemma in p.by))
    if p.status == CHECKED or (p.ok and p.detail):
        parts.append(plain(p.detail))
    return f"*{plain(p.claim)}* -- " + "; ".join(parts)


def _trusted(checks):
    from attnformal.proofs import TRUSTED

    for o in checks:
        for p in o.checks:
            if p.status == CHECKED:
                yield f"Checked, not proved (obligation {o.number}): {plain(p.claim)} -- {p.detail}."
    axioms = sorted({a for o in checks for p in o.checks for a in p.axioms if "proven lemma" not in a
                     and "proved bit-precisely" not in a})
    yield from (f"Axiom: {plain(a)}." for a in axioms)
    yield from TRUSTED


def plain(text: str) -> str:
    """Docstring markup as markdown: ``x`` and :func:`~a.b.x` become `x`."""
    text = re.sub(r":[a-z]+:`~[\w.]*?(\w+)`", r"`\1`", text)
    text = re.sub(r":[a-z]+:`([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _dedent(text: str) -> str:
    import textwrap

    first, _, rest = text.partition("\n")
    return (first + "\n" + textwrap.dedent(rest)).strip()


# ---------------------------------------------------------------------------- command line


def load_schedules(specs, optional=False):
    """``([(spec, TileSchedule)], [skipped])`` for ``module:attribute`` specs (a schedule or a list).

    With ``optional``, a kernel whose optional dependency is missing (e.g. triton) is skipped and
    said; otherwise anything that does not load is a ``ValueError`` naming the spec.
    """
    found, skipped = [], []
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            missing = error if isinstance(error, ModuleNotFoundError) else error.__cause__
            if optional and isinstance(missing, ModuleNotFoundError) and missing.name != module_name:
                skipped.append(f"{spec} ({error})")  # the kernel is there, a dependency is not
                continue
            raise ValueError(f"cannot load {spec!r} ({error})") from None
        loaded = list(value) if isinstance(value, (list, tuple)) else [value]
        if not loaded or not all(isinstance(s, TileSchedule) for s in loaded):
            raise ValueError(f"{spec!r} is not a TileSchedule or a list of them")
        found += [(spec, s) for s in loaded]
    return found, skipped


def parse(argv):
    parser = cli.Parser(prog="python -m attnformal.prove", docs="docs/proofs.md", guide="I review merge logic",
                        example="python -m attnformal.prove --only tile --block-m 64 --block-n 32 --report proofs.md",
                        description="Prove (SymPy, Z3) the tiled online-softmax algorithm the kernels run; exit 0 only "
                                    "if every obligation is proved and every negative control refuted.")
    parser.add_argument("--only", metavar="PATTERN",
                        help="an obligation number, or a glob or substring of its name or title")
    parser.add_argument("--json", metavar="FILE", help="write machine-readable results")
    parser.add_argument("--report", metavar="FILE.md", help="write a markdown report for design reviews")
    parser.add_argument("--timeout", metavar="S", type=cli.seconds, default=60.0, help="seconds per obligation (60)")
    parser.add_argument("--block-m", type=int, metavar="M",
                        help="also name TileSchedule(M, N) (with --block-n): an instance of the all-sizes theorems")
    parser.add_argument("--block-n", type=int, metavar="N", help="... and N key columns")
    parser.add_argument("--schedule", action="append", default=[], metavar="MODULE:ATTR",
                        help="also prove a kernel's TileSchedule (or a list of them), e.g. "
                             "attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE")
    parser.add_argument("--kernel", action="append", default=[], metavar="FILE.py:ATTR",
                        help="prove a kernel's own tiling instead (an attnformal.tiling.KernelTiling subclass or a "
                             "list of them; MODULE:ATTR too, e.g. attnformal.tilings:EXAMPLES); repeatable")
    parser.add_argument("--jobs", type=cli.integer(minimum=1), default=min(2, os.cpu_count() or 1), metavar="N",
                        help="worker processes (<= 2)")
    parser.add_argument("--triton", metavar="FILE.py:KERNEL", help="prove a Triton kernel from its TTIR (docs/ttir.md)")
    args = parser.parse_args(argv)
    if (args.block_m is None) != (args.block_n is None):
        parser.error("argument '--block-m'/'--block-n': expected both, got only one")
    for spec in args.schedule:
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            parser.error(f"argument '--schedule': expected MODULE:ATTR, got {spec!r}")
    try:  # an output path that cannot be written is refused before any proving
        for option in ("json", "report"):
            if getattr(args, option) is not None:
                cli.output_file(getattr(args, option), f"--{option}")
    except ValueError as error:
        parser.error(str(error))
    schedules = []
    if args.block_m is not None:
        try:
            schedules.append(("--block-m/--block-n", TileSchedule(args.block_m, args.block_n)))
        except ValueError as error:
            parser.error(f"argument '--block-m'/'--block-n': {error}")
    if args.kernel:
        from attnformal.tiling import kernel_obligations

        if args.schedule or schedules:
            parser.error("argument '--kernel': proves a kernel's own tiling instead of the spec's schedules; "
                         "expected no --schedule or --block-m/--block-n with it")
        try:
            chosen = kernel_obligations(args.kernel)
        except ValueError as error:
            parser.error(str(error))
        return args, chosen, Settings(timeout=args.timeout)
    chosen = selected(args.only)
    if not chosen:
        parser.error(f"argument '--only': expected a pattern matching an obligation, got {args.only!r}")
    named = bool(args.schedule or schedules)
    if named and not any(getattr(module, "PROVES_SCHEDULES", False) for _, module in chosen):
        parser.error("argument '--schedule'/'--block-m': the selected obligations prove no schedule "
                     f"(--only {args.only!r}); select one that does, e.g. --only tile")
    try:  # a schedule named but not loadable is refused before any proving
        schedules = [*load_schedules(args.schedule)[0], *schedules]
    except ValueError as error:
        parser.error(f"argument '--schedule': {error}")
    return args, chosen, Settings(timeout=args.timeout, schedules=tuple(schedules))


def with_kernel_schedules(settings: Settings) -> Settings:
    """``settings`` with the kernels' schedules first; a kernel whose optional dependency is missing
    is skipped, and a note says so."""
    try:
        kernels, skipped = load_schedules(KERNEL_SCHEDULES, optional=True)
    except ValueError as error:
        sys.exit(f"python -m attnformal.prove: error: a kernel's schedule: {error}")
    return dataclasses.replace(settings, schedules=(*kernels, *settings.schedules), notes=(*settings.notes, *skipped))


def main(argv=None) -> int:
    start = time.perf_counter()
    args, chosen, settings = parse(argv)
    if args.triton:
        from attnformal.ttir.cli import prove_triton
        return prove_triton(args.triton, args.timeout)
    proves_schedules = any(getattr(module, "PROVES_SCHEDULES", False) for _, module in chosen)
    checks, controls, settings = run(chosen, settings, args.jobs, with_kernel_schedules if proves_schedules else None)
    wall = time.perf_counter() - start
    print(table(checks, controls, wall, args.jobs, settings))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(to_json(checks, controls, wall, settings), handle, indent=2)
    if args.report:
        with open(args.report, "w") as handle:
            handle.write(report(checks, controls, wall, settings))
    ok = all(o.ok for o in checks) and all(c.ok for c in controls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
