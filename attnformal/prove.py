"""``python -m attnformal.prove``: machine-checked proofs of the tiled algorithm behind the kernels.

Runs every obligation of :mod:`attnformal.proofs` on the spec's own definitions and prints one
line per obligation (tool, checks, status, time), then the negative controls -- deliberately
broken definitions that must each be refuted with a printed counterexample. The exit code is 0
only if every obligation is proved (or, for its parts that are checked exhaustively on a stated
bounded domain, checked) and every control refuted; ``unknown`` (a budget that ran out) is never
proved. ``--report`` writes each theorem with the hypotheses, axioms and lemmas it rests on, the
commit and tool versions, and what is trusted rather than proved.

Obligations run in worker processes (``--jobs``, default: up to 2). Each has a deterministic
budget, ``--budget`` millions of Z3 resource units (``rlimit``) for all its queries, so its verdict
and the resources it used (in ``--json``) are the same on every machine and under any load; a
query that runs out of it is unknown. ``--timeout`` is only a wall-clock safety net far above
that: a worker past it is stopped, and what it had not decided is *interrupted* (by time).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib
import json
import multiprocessing
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from attnformal import cli
from attnformal.logic import (CHECKED, DEFAULT_BUDGET, DEFAULT_WALL_S, INTERRUPTED, PROVED, REFUTED, RLIMIT_UNIT,
                              UNKNOWN, VACUOUS, Budget, Proof, Settings)
from attnformal.pictures import prove_options
from attnformal.schedule import TileSchedule
from attnformal.ttir.lower import TARGETS as TTIR_TARGETS

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
    rlimit: int = 0  # Z3 resource units all its checks used (the same in every run)
    cached: str = ""  # the cache key it was found under, when it was not proved in this run

    @property
    def status(self) -> str:
        """The weakest outcome of its checks: ``checked`` when all hold but some only on a bounded domain."""
        if not self.checks:
            return UNKNOWN
        for status in (REFUTED, VACUOUS, UNKNOWN, INTERRUPTED, CHECKED):
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
    cached: str = ""  # as ObligationResult.cached

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


def _budget(settings) -> Budget:
    """One obligation's budget (its checks share one, its controls another): ``--budget`` units, and
    the ``--timeout`` safety net."""
    return Budget(settings.timeout, settings.budget * RLIMIT_UNIT)


def _run_checks(number, module, settings):
    start = time.perf_counter()
    budget = _budget(settings)
    try:
        checks = list(module.checks(settings, budget))
    except Exception:  # an obligation that crashes is unknown, with the reason
        checks = [Proof(f"obligation {number} ran", "python", UNKNOWN, detail=traceback.format_exc(limit=4))]
    return ObligationResult(number, module.__name__.rsplit(".", 1)[-1], module.TITLE, module.__doc__ or "",
                            [p.portable() for p in checks], time.perf_counter() - start, budget.used)


def _run_controls(number, module, settings):
    results, budget = [], _budget(settings)  # one obligation's controls share one budget
    for control in module.CONTROLS:
        try:
            proof = control.run(settings, budget)
        except Exception:
            proof = Proof(control.name, "python", UNKNOWN, detail=traceback.format_exc(limit=4))
        results.append(ControlResult(number, control.name, control.breaks, control.replaces,
                                     getattr(control, "expect", REFUTED), proof.portable()))
    return results


def _run_both(number, module, settings):
    return _run_checks(number, module, settings), _run_controls(number, module, settings)


TASKS = {"checks": _run_checks, "controls": _run_controls, "both": _run_both}
SPLIT_COST = 4  # an obligation this costly runs its checks and its controls in two workers, others in one


def _child(kind, number, module, settings, connection):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers, quietly
    connection.send(TASKS[kind](number, module, settings))
    connection.close()


def run(chosen, settings: Settings, jobs: int, load_kernels=None, cache=None, progress=None):
    """Run the checks and the controls of each chosen obligation, ``jobs`` processes at a time.

    ``load_kernels(settings)`` adds the kernels' schedules. It runs once, right after the first
    workers start (on tasks that need no schedule), so the kernels' imports (torch, triton)
    overlap the first proofs and every later worker shares them; not at all when every task that
    needs them is in ``cache`` (a :class:`~attnformal.proofcache.VerdictCache`). ``progress(part,
    result)`` is told of each part (``"checks"``, ``"controls"``) as it finishes. Returns the checks,
    the controls and the settings they ran with.
    """
    context = multiprocessing.get_context("fork")
    results, keys = {}, {}
    if cache is not None:
        keys = _cached(chosen, settings, cache, results, progress)
    pending = sorted(((kind, number, module) for number, module in chosen
                      for kind in (("checks", "controls") if getattr(module, "COST", 1) >= SPLIT_COST else ("both",))
                      if not all((part, number) in results for part in _parts(kind))),
                     key=_cost, reverse=True)  # longest first
    if load_kernels is not None and not any(_proves_schedules(t) for t in pending):
        settings, load_kernels = _kernels_not_needed(settings), None
    running = {}
    try:
        settings = _work(context, pending, running, results, settings, jobs, load_kernels, progress)
    finally:  # on Ctrl-C too: no worker outlives the run
        for _, process, _ in running.values():
            process.kill()
            process.join()
    for (part, number), key in keys.items():
        if (part, number) in results and _passed(results[(part, number)]) and not _from_cache(results[(part, number)]):
            cache.put(key, results[(part, number)])
    checks = [results[("checks", n)] for n, _ in chosen]
    controls = [c for n, _ in chosen for c in results[("controls", n)]]
    return checks, controls, settings


def _work(context, pending, running, results, settings, jobs, load_kernels, progress):
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
                _store(results, task, receiver.recv(), progress)
            except EOFError:
                _store(results, task, _failed(task, f"worker exited with code {process.exitcode}", UNKNOWN), progress)
            process.join()
        for receiver, (task, process, started) in list(running.items()):
            limit = settings.timeout * (2 if task[0] == "both" else 1) + GRACE_S  # "both": two budgets
            if time.monotonic() - started > limit:
                process.kill()
                process.join()
                running.pop(receiver)
                _store(results, task, _failed(task, f"interrupted by time: stopped after {limit:.0f} s"), progress)
    return settings


def _parts(kind):
    return ("checks", "controls") if kind == "both" else (kind,)


def _store(results, task, value, progress=None):
    kind, number, _ = task
    for part, result in zip(_parts(kind), value if kind == "both" else [value]):
        results[(part, number)] = result
        if progress is not None:
            progress(part, result)


def _passed(result) -> bool:
    """A part worth keeping: every check proved or checked, or every control as expected."""
    return result.ok if isinstance(result, ObligationResult) else all(c.ok for c in result)


def _from_cache(result) -> bool:
    return bool(result.cached if isinstance(result, ObligationResult) else result and result[0].cached)


def _cached(chosen, settings, cache, results, progress) -> dict:
    """The cache keys of every part; the parts found in ``cache`` go into ``results`` (renumbered)."""
    keys = {}
    for number, module in chosen:
        for part in ("checks", "controls"):
            start = time.perf_counter()
            key = cache.key(part, module, settings)
            found = cache.get(key) if key is not None else None
            if found is not None:
                found = _as_cached(found, number, key, time.perf_counter() - start)
                _store(results, (part, number, module), found, progress)
            if key is not None:
                keys[(part, number)] = key
    return keys


def _as_cached(result, number, key, seconds):
    """A stored part as this run's: its number now, the key it was found under, the time finding it took."""
    if isinstance(result, ObligationResult):
        return dataclasses.replace(result, number=number, cached=key, seconds=seconds)
    return [dataclasses.replace(c, obligation=number, cached=key) for c in result]


def _kernels_not_needed(settings: Settings) -> Settings:
    return dataclasses.replace(settings, notes=(*settings.notes, "the kernels' schedules (every obligation that "
                                                "proves them was cached)"))


def _cost(task) -> float:
    """Rough seconds: an obligation's ``COST``; its controls, a quarter of it."""
    kind, _, module = task
    return getattr(module, "COST", 1) * {"checks": 1, "controls": 0.25, "both": 1.25}[kind]


def _proves_schedules(task) -> bool:
    return task[0] != "controls" and getattr(task[2], "PROVES_SCHEDULES", False)


def _failed(task, reason, status=INTERRUPTED):
    kind, number, module = task
    proof = Proof(f"obligation {number}", "python", status, detail=reason)
    checks = ObligationResult(number, module.__name__.rsplit(".", 1)[-1], module.TITLE, module.__doc__ or "", [proof])
    controls = [ControlResult(number, c.name, c.breaks, c.replaces, getattr(c, "expect", REFUTED), proof)
                for c in module.CONTROLS]
    return {"checks": checks, "controls": controls, "both": (checks, controls)}[kind]


# ---------------------------------------------------------------------------- output


def table(checks, controls, wall: float, jobs: int, settings: Settings) -> str:
    lines = [f"attnformal prover: {len(checks)} obligations, {jobs} worker(s), budget {settings.budget:g} M Z3 "
             f"resource units each (wall-clock safety net {settings.timeout:g} s)",
             "schedules: " + describe_schedules(settings), "",
             f"{'#':>2}  {'obligation':<52} {'tool':<16} {'checks':>6}  {'time':>7} {'units':>8}  status"]
    for o in checks:
        lines.append(_obligation_line(o))
        lines += [f"    {p.detail}" for p in o.checks if p.tool == "summary"]  # e.g. a kernel tiling's families
    lines += ["", "negative controls (each must be refuted with a counterexample, or shown vacuous)",
              f"{'#':>2}  {'control':<52} {'status':<8}  counterexample"]
    for c in controls:
        status = f"{c.proof.status} (cached)" if c.cached else c.proof.status
        lines.append(f"{c.obligation:>2}  {c.name:<52} {status:<8}  {_counterexample(c.proof)}")
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


def _obligation_line(o: ObligationResult) -> str:
    """One row of the table; ``units`` are the Z3 resource units it used, in millions (load-independent)."""
    status = f"{o.status} (cached, key {o.cached[:12]})" if o.cached else o.status
    return (f"{o.number:>2}  {o.title:<52} {o.tools:<16} {len(o.checks):>6}  {_duration(o.seconds)} "
            f"{o.rlimit / RLIMIT_UNIT:>7.2f}M  {status}")


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:>5.0f}ms" if seconds < 1 else f"{seconds:>6.1f}s"


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
        "settings": {"timeout_s": settings.timeout, "budget_rlimit": settings.budget * RLIMIT_UNIT, "schedules": [
            {"label": label, "block_m": s.block_m, "block_n": s.block_n, "num_splits": s.num_splits,
             "class": type(s).__qualname__} for label, s in settings.schedules], "not_loaded": list(settings.notes)},
        "obligations": [{"number": o.number, "name": o.name, "title": o.title, "status": o.status,
                         "seconds": o.seconds, "rlimit": o.rlimit, "checks": [p.to_json() for p in o.checks]}
                        for o in checks],
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
                        help="an obligation number, or a glob/substring of its name")
    parser.add_argument("--json", metavar="FILE", help="write machine-readable results")
    parser.add_argument("--report", metavar="FILE", help="a review report (.md, or .html with pictures)")
    parser.add_argument("--budget", metavar="M", type=cli.number(above=0, what="millions of units > 0"),
                        default=DEFAULT_BUDGET,
                        help=f"million Z3 resource units per obligation ({DEFAULT_BUDGET})")
    parser.add_argument("--timeout", metavar="S", type=cli.seconds, default=DEFAULT_WALL_S,
                        help=f"wall-clock safety net per obligation ({DEFAULT_WALL_S:g})")
    parser.add_argument("--block-m", type=int, metavar="M",
                        help="also prove TileSchedule(M, N) (with --block-n)")
    parser.add_argument("--block-n", type=int, metavar="N", help="... and N key columns")
    parser.add_argument("--schedule", action="append", default=[], metavar="MODULE:ATTR",
                        help="also prove a kernel's TileSchedule (or a list of them), e.g. "
                             "attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE")
    parser.add_argument("--kernel", action="append", default=[], metavar="FILE.py:ATTR",
                        help="prove a kernel's KernelTiling (or a list; MODULE:ATTR too); repeatable")
    parser.add_argument("--jobs", type=cli.integer(minimum=1), default=min(2, os.cpu_count() or 1), metavar="N",
                        help="worker processes (<= 2)")
    parser.add_argument("--triton", metavar="FILE.py:KERNEL", action="append",
                        help="prove a Triton kernel from its TTIR; repeatable")
    parser.add_argument("--triton-target", choices=TTIR_TARGETS, default="cuda",
                        help=argparse.SUPPRESS)  # docs/ttir.md; `make ascend-check` passes ascend
    parser.add_argument("--no-cache", action="store_true",
                        help="re-prove unchanged obligations too")
    prove_options.add_options(parser)
    args = parser.parse_args(argv)
    prove_options.check(parser, args)
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
        return args, chosen, Settings(timeout=args.timeout, budget=args.budget)
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
    return args, chosen, Settings(timeout=args.timeout, budget=args.budget, schedules=tuple(schedules))


def _cache():
    from attnformal.proofcache import VerdictCache, folder_from_environment

    folder = folder_from_environment()
    return None if folder is None else VerdictCache(folder, [spec.partition(":")[0] for spec in KERNEL_SCHEDULES])


def _progress():
    """On a terminal, a line on stderr as each obligation (and each set of controls) finishes."""
    if not sys.stderr.isatty():
        return None

    def show(part, result):
        if part == "checks":
            print(_obligation_line(result), file=sys.stderr, flush=True)
        elif result:
            print(f"{result[0].obligation:>2}  controls: {sum(c.ok for c in result)}/{len(result)} as expected",
                  file=sys.stderr, flush=True)
    return show


def with_kernel_schedules(settings: Settings) -> Settings:
    """``settings`` with the kernels' schedules first; a kernel whose optional dependency is missing
    is skipped, and a note says so."""
    try:
        kernels, skipped = load_schedules(KERNEL_SCHEDULES, optional=True)
    except ValueError as error:
        sys.exit(f"python -m attnformal.prove: error: a kernel's schedule: {error}")
    return dataclasses.replace(settings, schedules=(*kernels, *settings.schedules), notes=(*settings.notes, *skipped))


def main(argv=None) -> int:
    """The command line; Ctrl-C ends it with "interrupted" and exit 130, no report written."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("python -m attnformal.prove: interrupted", file=sys.stderr)
        return 130


def _main(argv) -> int:
    start = time.perf_counter()
    args, chosen, settings = parse(argv)
    if args.triton:
        from attnformal.ttir.cli import prove_triton
        from attnformal.ttir.theorems import Limits
        limits = Limits(units=int(args.budget * RLIMIT_UNIT), seconds=args.timeout)
        return max([prove_triton(target, limits, compiler=args.triton_target) for target in args.triton])  # 2: a usage error, 1: not proved
    if args.show_schedule:
        return prove_options.show_schedule(args, chosen, settings.schedules)
    proves_schedules = any(getattr(module, "PROVES_SCHEDULES", False) for _, module in chosen)
    checks, controls, settings = run(chosen, settings, args.jobs, with_kernel_schedules if proves_schedules else None,
                                     cache=None if args.no_cache else _cache(), progress=_progress())
    wall = time.perf_counter() - start
    print(table(checks, controls, wall, args.jobs, settings))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(to_json(checks, controls, wall, settings), handle, indent=2)
    pictures = prove_options.write_pictures(args, chosen, checks, controls)
    if args.report:
        with open(args.report, "w") as handle:
            handle.write(prove_options.html_report(args, chosen, checks, controls, wall, settings, pictures)
                         if args.report.endswith(".html") else report(checks, controls, wall, settings))
    ok = all(o.ok for o in checks) and all(c.ok for c in controls)
    return 0 if ok else 1


if __name__ == "__main__":
    # Run as this module's importable twin, so the verdict cache pickles ``attnformal.prove.ObligationResult``,
    # not ``__main__.ObligationResult``, which no other entry point (``attnformal prove``, a profiler) can read.
    from attnformal.prove import main as importable_main

    sys.exit(importable_main())
