"""``python -m attnformal.verify --impl MODULE_OR_FILE.py:FUNC``: run the battery, print the verdict.

Exit status: 0 PASS; 1 FAIL (a check failed, crashed or hung, a required feature is refused,
or a regression against --baseline); 2 usage error; 3 NOTHING VERIFIED or INCOMPLETE (too
little was verified to judge -- the verdict says what the implementation refused);
4 internal error (an output could not be written: a full disk); 130 interrupted (Ctrl-C or SIGTERM: the
checks that finished are reported and kept in results.json; --json, --junit, --html stay as they were).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path

from attnformal import cli
from attnformal.cli import EXIT_CODES
from attnformal.distributed import EngineMissing
from attnformal.execution import isolated_by_default, start_server
from attnformal.verify import PROFILES
from attnformal.verify.outputs import PREVIOUS, RESULTS, ResultsStream, start_folder

# The battery (and torch) are imported by the functions that use them, after the arguments are parsed: a
# usage error is printed before torch is imported.

PROG = "python -m attnformal.verify"
MAX_JOBS = 4  # each worker holds its own torch
DEFAULT_DTYPES = "float32 bfloat16"
EXAMPLE = (f"{PROG} --impl attnformal.examples.causal_alignment_bug:attention --only 'mask.*'\n"
           f"  {PROG} --impl sdpa-math --workers 2 --junit verify.xml")


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog=PROG, usage=f"{PROG} --impl IMPL [--dtypes D ...] [--only PATTERN ...] [options]",
                   example=EXAMPLE, docs="docs/verify.md", guide="I have a kernel",
                   description="Run the conformance battery on an attention implementation and print the verdict "
                               "(exit 0 PASS, 1 FAIL, 2 usage error, 3 too little verified, 130 interrupted).")
    p.add_argument("--impl", help="MODULE:FUNC, FILE.py:FUNC or an alias (--list)")
    # the list options accumulate when repeated (--only a --only b), as they do in one list
    p.add_argument("--dtypes", nargs="+", action="extend", metavar="D",
                   help=f"dtypes, by spaces or commas ({DEFAULT_DTYPES})")
    p.add_argument("--device", default="cpu", help="torch device of the inputs (%(default)s)")
    p.add_argument("--profile", choices=("quick", "full"), default="quick",
                   help="quick: small cases; full: larger, >= 8k keys")
    p.add_argument("--tolerance", choices=PROFILES, default="default", metavar="T",
                   help=f"{', '.join(PROFILES)} (%(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="run seed; every case's derives from it (0)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failing check")
    p.add_argument("--require", nargs="+", action="extend", metavar="F",
                   help="features that must be supported (--list)")
    p.add_argument("--only", nargs="+", action="extend", metavar="PATTERN",
                   help="run only checks matching globs ('mask.*')")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="each check in a worker process: a crash or a hang fails it (default: not for an alias "
                        "at --jobs 1)")
    p.add_argument("--jobs", type=cli.integer(minimum=1), metavar="N",
                   help="checks at once, each in a worker process (default on the CPU: a worker per core, at most "
                        f"{MAX_JOBS}; else 1)")
    p.add_argument("--case-timeout", type=cli.seconds, default=300.0, metavar="S",
                   help="isolated: a call longer is a hang (%(default)g)")
    p.add_argument("--workers", type=cli.integer(minimum=1), metavar="N",
                   help="run on a local Dask cluster of N processes")
    p.add_argument("--cluster", metavar="ADDRESS", help="run on the Dask scheduler at ADDRESS")
    p.add_argument("--json", type=Path, metavar="FILE", help="results as JSON (written when the run ends)")
    p.add_argument("--junit", type=Path, metavar="FILE", help="results as JUnit XML")
    p.add_argument("--html", type=Path, metavar="FILE", help="one HTML page: tables, error maps, replays")
    p.add_argument("--save-baseline", type=Path, metavar="FILE", help="store this run as a baseline")
    p.add_argument("--baseline", type=Path, metavar="FILE", help="flag regressions against a stored baseline")
    p.add_argument("--repro-dir", type=Path, default=Path("verify-repro"), metavar="DIR",
                   help="reproducers, results: DIR/<impl>/ (%(default)s)")
    p.add_argument("--reference", choices=("auto", "oracle"), default="auto",
                   help="certified when installed, else fp64 oracle")
    p.add_argument("--threads", type=cli.integer(minimum=0), default=1, metavar="T",
                   help="torch CPU threads (1; 0: torch's setting)")
    p.add_argument("--replay", type=Path, metavar="FILE", help="rerun one saved reproducer and explain it")
    p.add_argument("--list", action="store_true", help="list the checks, features and aliases")
    return p


def settings_from(args) -> Settings:
    """Settings from parsed arguments; a ValueError names the option that is wrong, and
    :class:`EngineMissing` says how to install the engine --workers and --cluster need."""
    jobs = jobs_from(args)
    isolate = isolated(args, jobs)
    if isolate and not (args.workers or args.cluster):  # (a Dask worker starts its own)
        start_server("attnformal.verify.execute")  # its imports (torch) overlap this process's below
    from attnformal.adapters import resolve
    from attnformal.verify.options import check_campaign, parse_dtypes, parse_features, parse_patterns
    from attnformal.verify.runner import Settings

    dtypes = parse_dtypes(args.dtypes or DEFAULT_DTYPES)
    require = parse_features(args.require)
    only = parse_patterns(args.only, args.profile)
    cli.check_device(args.device)
    check_campaign(args.workers, args.cluster)
    if args.replay and (args.workers or args.cluster):
        raise cli.UsageError("--replay", "replays one case in this process; expected no --workers or --cluster")
    impl = resolve(args.impl)
    folder = args.repro_dir / cli.impl_slug(args.impl)
    if not args.replay:
        for option in ("json", "junit", "html", "save_baseline"):
            if getattr(args, option) is not None:
                cli.output_file(getattr(args, option), f"--{option.replace('_', '-')}")
        cli.output_folder(folder, "--repro-dir")
    return Settings(impl=impl, impl_name=args.impl, dtypes=dtypes, device=args.device, profile=args.profile,
                    tolerance=args.tolerance, seed=args.seed, fail_fast=args.fail_fast, require=require,
                    repro_dir=folder, use_certified=args.reference == "auto", only=only, threads=args.threads or None,
                    target=args.impl, isolate=isolate, case_timeout=args.case_timeout, jobs=jobs,
                    explicit_dtypes=bool(args.dtypes), workers=args.workers, cluster=args.cluster)


def jobs_from(args) -> int:
    """``--jobs``, or the default: a worker per core (per ``--threads``, at most :data:`MAX_JOBS`) for a
    battery on the CPU; 1 where checks cannot run side by side."""
    one_at_a_time = {"--no-isolate": args.isolate is False, "--workers": args.workers, "--cluster": args.cluster,
                     "--replay": args.replay}
    if args.jobs is not None:
        given = [option for option, on in one_at_a_time.items() if on]
        if args.jobs > 1 and given:
            raise cli.UsageError("--jobs", f"checks run side by side in worker processes; expected --jobs 1 with "
                                           f"{given[0]}, got {args.jobs}")
        return args.jobs
    if any(one_at_a_time.values()) or args.device != "cpu" or not args.threads:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_JOBS, cores // args.threads))


def isolated(args, jobs: int) -> bool:
    """``--isolate``, or the default: a user's target runs in workers, an alias too when jobs run side by side."""
    return args.isolate if args.isolate is not None else isolated_by_default(args.impl) or jobs > 1


def _list_checks() -> str:
    from attnformal.adapters import ALIASES
    from attnformal.verify.calls import FEATURES
    from attnformal.verify.checks import CHECKS

    lines = [f"{c.name:32s} {c.doc}" + (" [full only]" if c.full_only else "") for c in CHECKS]
    return "\n".join(lines + ["", "features (for --require): " + ", ".join(FEATURES),
                              "aliases (for --impl): " + ", ".join(ALIASES)])


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM stops the run like Ctrl-C: what finished is reported and kept."""
    def stop(signum, frame):
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.list:
        print(_list_checks())
        return 0
    if not args.impl:
        p.error("argument --impl is required")
    try:
        settings = settings_from(args)
        from attnformal.verify.baseline import load_baseline
        from attnformal.verify.replay import load_reproducer

        if args.replay:
            load_reproducer(args.replay)
        baseline = load_baseline(args.baseline) if args.baseline else None
    except (ValueError, EngineMissing) as err:
        p.error(str(err))
    with _sigterm_as_interrupt(), contextlib.ExitStack() as held:
        try:
            if not args.replay:  # one run at a time writes in the implementation's folder
                held.enter_context(cli.folder_lock(settings.repro_dir, "--repro-dir"))
        except cli.FolderBusy as err:
            p.error(str(err))
        try:
            executor = _executor(p, settings)
            try:
                if args.replay:
                    return _replay(settings, executor, args.replay)
                return _run(args, settings, executor, baseline)
            finally:
                executor.close()
        except KeyboardInterrupt:  # while a cluster starts, or during a replay; a battery run reports what finished
            print("interrupted", file=sys.stderr)
            return EXIT_CODES["INTERRUPTED"]
        except cli.WriteError as err:
            return cli.write_failed(err, PROG)
        except Exception as err:  # a defect of attnformal, not of the arguments nor of the kernel: never FAIL's code
            return cli.internal_error(err)


def _executor(p: argparse.ArgumentParser, settings: Settings):
    """The executor of the run; a cluster that cannot be had is a usage error."""
    from attnformal.verify.battery import make_executor

    if settings.workers:
        print(f"attnformal.verify: starting a local Dask cluster of {settings.workers} worker processes",
              file=sys.stderr, flush=True)
    elif settings.cluster:
        print(f"attnformal.verify: connecting to the Dask scheduler at {settings.cluster}", file=sys.stderr, flush=True)
    try:
        return make_executor(settings)
    except (ValueError, EngineMissing) as err:
        p.error(str(err))


def _replay(settings: Settings, executor, path: Path) -> int:
    from attnformal.verify.execute import Task
    from attnformal.verify.replay import describe_replay

    _, result = next(executor.map([Task("replay", str(path))]))
    print(describe_replay(path, result))
    verdict = {"pass": "PASS", "FAIL": "FAIL", "unsupported": "NOTHING VERIFIED", "ERROR": "INTERNAL ERROR"}
    return EXIT_CODES[verdict[result.status]]


def _run(args, settings: Settings, executor, baseline) -> int:
    from attnformal.verify import report as reporting
    from attnformal.verify.baseline import compare_baseline
    from attnformal.verify.battery import run_battery

    moved = start_folder(settings.repro_dir)
    write = ResultsStream([settings.repro_dir / RESULTS], reporting.to_json)
    report = run_battery(settings, progress=reporting.ProgressBar(), on_result=write, executor=executor)
    plural = "s" if moved > 1 else ""
    previous = f"the previous run's {moved} file{plural} moved to {settings.repro_dir / PREVIOUS}/" if moved else None
    print(reporting.render(report, previous=previous), end="")
    code = EXIT_CODES[report.verdict]
    if baseline is not None and report.state == "complete":
        diff = compare_baseline(report, baseline)
        print(diff.render())
        if diff.regressions:
            code = EXIT_CODES["FAIL"]
    write(report)
    print(f"results: {settings.repro_dir / RESULTS}")
    _write_outputs(args, report, previous)
    return code


def _write_outputs(args, report, previous):
    """--json, --junit, --html, --save-baseline: replaced only by a run that finished; an interrupted one
    leaves them as the run before wrote them (its own results are in results.json)."""
    from attnformal.pictures import html
    from attnformal.verify import report as reporting
    from attnformal.verify.baseline import save_baseline

    named = [path for path in (args.json, args.junit, args.html, args.save_baseline) if path is not None]
    if report.state != "complete":
        if named:
            print(f"interrupted: {', '.join(map(str, named))} kept as the previous run wrote them", file=sys.stderr)
        return
    if args.json:
        ResultsStream([args.json], reporting.to_json)(report)
    if args.junit:
        cli.write_atomic(args.junit, reporting.to_junit(report))
    if args.html:
        cli.write_atomic(args.html, html.verify_report(report, previous))
    if args.save_baseline:
        save_baseline(report, args.save_baseline)


if __name__ == "__main__":
    sys.exit(main())
