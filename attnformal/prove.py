"""``python -m attnformal.prove``: machine-checked proofs of the tiled algorithm behind the kernels.

Runs every obligation of :mod:`attnformal.proofs` on the spec's own definitions and prints one
line per obligation (tool, checks, status, time), then the negative controls -- deliberately
broken definitions that must each be refuted with a printed counterexample. The exit code is 0
only if every obligation is proved and every control refuted; ``unknown`` (a solver timeout)
is never proved.

Obligations run in worker processes (``--jobs``, default: up to 2), each under a hard time
limit: ``--timeout`` seconds of solver time, then the process is stopped and what it had not
decided is unknown.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import multiprocessing
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from attnformal.logic import PROVED, REFUTED, UNKNOWN, VACUOUS, Budget, Proof, Settings
from attnformal.schedule import TileSchedule

# The kernels whose block sizes are always proven. Add a kernel's schedule here as
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
        if not self.checks:
            return UNKNOWN
        for status in (REFUTED, VACUOUS, UNKNOWN):
            if any(p.status == status for p in self.checks):
                return status
        return PROVED

    @property
    def tools(self) -> str:
        return "+".join(sorted({p.tool for p in self.checks}))


@dataclass
class ControlResult:
    obligation: int
    name: str
    breaks: str
    replaces: str
    proof: Proof

    @property
    def ok(self) -> bool:
        return self.proof.status == REFUTED and bool(self.proof.countermodel)


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


def _run_checks(number, module, settings):
    start = time.perf_counter()
    budget = Budget(settings.timeout)
    try:
        checks = list(module.checks(settings, budget))
    except Exception:  # an obligation that crashes is unknown, with the reason
        checks = [Proof(f"obligation {number} ran", "python", UNKNOWN, detail=traceback.format_exc(limit=4))]
    return ObligationResult(number, module.__name__.rsplit(".", 1)[-1], module.TITLE, module.__doc__ or "",
                            [_portable(p) for p in checks], time.perf_counter() - start)


def _run_controls(number, module, settings):
    results, budget = [], Budget(settings.timeout)  # one obligation's controls share its timeout
    for control in module.CONTROLS:
        try:
            proof = control.run(settings, budget)
        except Exception:
            proof = Proof(control.name, "python", UNKNOWN, detail=traceback.format_exc(limit=4))
        results.append(ControlResult(number, control.name, control.breaks, control.replaces, _portable(proof)))
    return results


def _portable(proof: Proof) -> Proof:
    proof.model = None  # Z3 models do not cross process boundaries
    return proof


TASKS = {"checks": _run_checks, "controls": _run_controls}


def _child(kind, number, module, settings, connection):
    connection.send(TASKS[kind](number, module, settings))
    connection.close()


def run(chosen, settings: Settings, jobs: int):
    """Run the checks and the controls of each chosen obligation, ``jobs`` processes at a time."""
    context = multiprocessing.get_context("fork")
    pending = [(kind, number, module) for kind in ("checks", "controls") for number, module in chosen]
    pending.sort(key=lambda task: -getattr(task[2], "COST", 1) if task[0] == "checks" else 0)  # longest first
    running, results = {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            task = pending.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(*task, settings, sender), daemon=True)
            process.start()
            sender.close()
            running[receiver] = (task, process, time.monotonic())
        for receiver in wait(list(running), timeout=0.5):
            task, process, _ = running.pop(receiver)
            try:
                results[task[:2]] = receiver.recv()
            except EOFError:
                results[task[:2]] = _failed(task, f"worker exited with code {process.exitcode}")
            process.join()
        for receiver, (task, process, started) in list(running.items()):
            if time.monotonic() - started > settings.timeout + GRACE_S:
                process.kill()
                process.join()
                running.pop(receiver)
                results[task[:2]] = _failed(task, f"stopped after {settings.timeout + GRACE_S:.0f} s")
    checks = [results[("checks", n)] for n, _ in chosen]
    controls = [c for n, _ in chosen for c in results[("controls", n)]]
    return checks, controls


def _failed(task, reason):
    kind, number, module = task
    proof = Proof(f"obligation {number}", "python", UNKNOWN, detail=reason)
    if kind == "checks":
        return ObligationResult(number, module.__name__.rsplit(".", 1)[-1], module.TITLE, module.__doc__ or "", [proof])
    return [ControlResult(number, c.name, c.breaks, c.replaces, proof) for c in module.CONTROLS]


# ---------------------------------------------------------------------------- output


def table(checks, controls, wall: float, jobs: int, settings: Settings) -> str:
    lines = [f"attnformal prover: {len(checks)} obligations, {jobs} worker(s), timeout {settings.timeout:g} s each",
             "schedules: " + ", ".join([*settings.kernel_schedule_specs, *settings.schedule_specs,
                                        *(f"{s.block_m}x{s.block_n} ({label})" for label, s in settings.schedules)]),
             "",
             f"{'#':>2}  {'obligation':<44} {'tool':<12} {'checks':>6}  {'status':<8} {'time':>7}"]
    for o in checks:
        lines.append(f"{o.number:>2}  {o.title:<44} {o.tools:<12} {len(o.checks):>6}  {o.status:<8} {o.seconds:>6.1f}s")
    lines += ["", "negative controls (each must be refuted with a counterexample)",
              f"{'#':>2}  {'control':<44} {'status':<8}  counterexample"]
    for c in controls:
        lines.append(f"{c.obligation:>2}  {c.name:<44} {c.proof.status:<8}  {_counterexample(c.proof)}")
    failures = [(o, p) for o in checks for p in o.checks if not p.ok]
    for o, p in failures:
        lines += ["", f"obligation {o.number} ({o.title}): {p.status}: {p.claim}"]
        lines += [f"    case: {p.case}"] if p.case else []
        lines += [f"    counterexample: {_counterexample(p)}"] if p.countermodel else []
        lines += [f"    {p.detail.strip()}"] if p.detail else []
    for c in controls:
        if not c.ok:
            lines += ["", f"control '{c.name}' was NOT refuted: {c.proof.status}", f"    {c.proof.detail.strip()}"]
    proved = sum(o.status == PROVED for o in checks)
    refuted = sum(c.ok for c in controls)
    lines += ["", f"{proved}/{len(checks)} obligations proved ({sum(len(o.checks) for o in checks)} checks, "
                  f"{sum(p.queries for o in checks for p in o.checks)} queries); {refuted}/{len(controls)} "
                  f"controls refuted; wall {wall:.1f} s"]
    return "\n".join(lines)


def _counterexample(proof: Proof) -> str:
    if not proof.countermodel:
        return proof.detail.strip().splitlines()[-1] if proof.detail.strip() else "-"
    values = ", ".join(f"{k} = {v}" for k, v in proof.countermodel.items())
    return f"[{proof.case}] {values}" if proof.case else values


def to_json(checks, controls, wall: float, settings: Settings) -> dict:
    import sympy
    import z3

    return {
        "environment": {"python": platform.python_version(), "z3": z3.get_version_string(),
                        "sympy": sympy.__version__, "machine": platform.machine(), "cpus": os.cpu_count()},
        "settings": {"timeout_s": settings.timeout, "kernel_schedules": list(settings.kernel_schedule_specs),
                     "schedule_specs": list(settings.schedule_specs),
                     "schedules": [{"label": label, "block_m": s.block_m, "block_n": s.block_n}
                                   for label, s in settings.schedules]},
        "obligations": [{"number": o.number, "name": o.name, "title": o.title, "status": o.status,
                         "seconds": o.seconds, "checks": [p.to_json() for p in o.checks]} for o in checks],
        "controls": [{"obligation": c.obligation, "name": c.name, "breaks": c.breaks, "replaces": c.replaces,
                      "refuted": c.ok, "proof": c.proof.to_json()} for c in controls],
        "wall_seconds": wall,
        "all_proved": all(o.status == PROVED for o in checks),
        "all_controls_refuted": all(c.ok for c in controls),
    }


def report(checks, controls, wall: float, settings: Settings) -> str:
    """A markdown document for design reviews: each theorem, how it was proven, the controls."""
    out = ["# attnformal: proof report", "",
           f"Obligations proved: {sum(o.status == PROVED for o in checks)} of {len(checks)}; negative controls "
           f"refuted: {sum(c.ok for c in controls)} of {len(controls)}; wall time {wall:.1f} s.", "",
           "Kernel schedules: " + ", ".join([*settings.kernel_schedule_specs, *settings.schedule_specs])
           + "; the block sizes proven are listed under obligation 5.", ""]
    for o in checks:
        out += [f"## {o.number}. {o.title} -- {o.status}", "", _dedent(o.theorem), "",
                "| check | tool | status | queries | time |", "|---|---|---|---|---|"]
        out += [f"| {p.claim} | {p.tool} | {p.status} | {p.queries} | {p.seconds:.2f} s |" for p in o.checks]
        hypotheses = sorted({h for p in o.checks for h in p.hypotheses})
        axioms = sorted({a for p in o.checks for a in p.axioms})
        if hypotheses:
            out += ["", "Hypotheses: " + "; ".join(f"`{h}`" for h in hypotheses) + "."]
        if axioms:
            out += ["", "Axioms and lemmas the proofs rest on:", ""] + [f"- {a}" for a in axioms]
        for p in o.checks:
            if not p.ok:
                out += ["", f"**{p.status}**: {p.claim} -- case `{p.case}`: {_counterexample(p)} {p.detail}"]
        notes = dict.fromkeys(p.detail for p in o.checks if p.ok and p.detail)
        out += [f"\nNote: {note}" for note in notes]
        mine = [c for c in controls if c.obligation == o.number]
        if mine:
            out += ["", "Negative controls:", ""]
            out += [f"- **{c.name}** -- replaces `{c.replaces}`: {c.breaks}. {c.proof.status}; counterexample: "
                    f"{_counterexample(c.proof)}" for c in mine]
        out.append("")
    return "\n".join(out)


def _dedent(text: str) -> str:
    import textwrap

    first, _, rest = text.partition("\n")
    return (first + "\n" + textwrap.dedent(rest)).strip()


# ---------------------------------------------------------------------------- command line


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m attnformal.prove", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", metavar="PATTERN",
                        help="an obligation number, or a glob or substring of its name or title")
    parser.add_argument("--json", metavar="FILE", help="write machine-readable results")
    parser.add_argument("--report", metavar="FILE.md", help="write a markdown report for design reviews")
    parser.add_argument("--timeout", metavar="S", type=float, default=60.0, help="seconds per obligation (60)")
    parser.add_argument("--block-m", type=int, metavar="M", help="also prove tiles of M query rows (with --block-n)")
    parser.add_argument("--block-n", type=int, metavar="N", help="... and N key columns")
    parser.add_argument("--schedule", action="append", default=[], metavar="MODULE:ATTR",
                        help="also prove a kernel's TileSchedule, e.g. attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE")
    parser.add_argument("--kernel", action="append", default=[], metavar="FILE.py:ATTR",
                        help="prove a kernel's own tiling instead (an attnformal.tiling.KernelTiling subclass or a "
                             "list of them; MODULE:ATTR too, e.g. attnformal.tilings:EXAMPLES); repeatable")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (<= 2)")
    args = parser.parse_args(argv)
    if (args.block_m is None) != (args.block_n is None):
        parser.error("argument '--block-m'/'--block-n': expected both, got only one")
    if args.timeout <= 0:
        parser.error(f"argument '--timeout': expected seconds > 0, got {args.timeout:g}")
    if args.jobs < 1:
        parser.error(f"argument '--jobs': expected >= 1, got {args.jobs}")
    for spec in args.schedule:
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            parser.error(f"argument '--schedule': expected MODULE:ATTR, got {spec!r}")
    schedules = ()
    if args.block_m is not None:
        try:
            schedules = (("--block-m/--block-n", TileSchedule(args.block_m, args.block_n)),)
        except ValueError as error:
            parser.error(f"argument '--block-m'/'--block-n': {error}")
    if args.kernel:
        from attnformal.tiling import kernel_obligations

        try:
            chosen = kernel_obligations(args.kernel)
        except ValueError as error:
            parser.error(str(error))
        return args, chosen, Settings(timeout=args.timeout)
    chosen = selected(args.only)
    if not chosen:
        parser.error(f"argument '--only': expected a pattern matching an obligation, got {args.only!r}")
    # Kernel schedules are imported by the tile obligation's worker: importing a kernel may
    # import torch, which should not hold up the other obligations.
    return args, chosen, Settings(timeout=args.timeout, schedules=schedules, schedule_specs=tuple(args.schedule),
                                  kernel_schedule_specs=KERNEL_SCHEDULES)


def main(argv=None) -> int:
    start = time.perf_counter()
    args, chosen, settings = parse(argv)
    checks, controls = run(chosen, settings, args.jobs)
    wall = time.perf_counter() - start
    print(table(checks, controls, wall, args.jobs, settings))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(to_json(checks, controls, wall, settings), handle, indent=2)
    if args.report:
        with open(args.report, "w") as handle:
            handle.write(report(checks, controls, wall, settings))
    ok = all(o.status == PROVED for o in checks) and all(c.ok for c in controls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
