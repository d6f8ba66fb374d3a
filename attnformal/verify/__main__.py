"""``python -m attnformal.verify --impl MODULE_OR_FILE.py:FUNC``: run the battery, print the verdict.

Exit status: 0 when every supported check passes (and no regression against --baseline),
1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from attnformal.adapters import ALIASES, resolve
from attnformal.verify import report as reporting
from attnformal.verify.baseline import compare_baseline, load_baseline, save_baseline
from attnformal.verify.battery import run_battery
from attnformal.verify.calls import FEATURES
from attnformal.verify.checks import CHECKS
from attnformal.verify.replay import replay
from attnformal.verify.runner import DTYPE_NAMES, Settings
from attnformal.verify.tolerances import PROFILES


def _split(values) -> list[str]:
    return [part for value in values or () for part in value.replace(",", " ").split()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attnformal.verify", description=__doc__.splitlines()[0])
    p.add_argument("--impl", help=f"MODULE:FUNC, FILE.py:FUNC or one of: {', '.join(ALIASES)}")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="dtypes to test (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="torch device of the inputs (default: %(default)s)")
    p.add_argument("--profile", choices=("quick", "full"), default="quick",
                   help="quick: small cases (< 30 s on CPU); full: larger ones and >= 8k keys")
    p.add_argument("--tolerance", choices=PROFILES, default="default",
                   help="default: elementwise per dtype; naive: <= k x the error of a same-dtype dense "
                        "implementation; ascend: MERE/MARE thresholds")
    p.add_argument("--seed", type=int, default=0, help="run seed; every case seed derives from it")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failing check")
    p.add_argument("--require", nargs="+", help=f"features that must be supported: {', '.join(FEATURES)}")
    p.add_argument("--only", nargs="+", help="run only checks matching these glob patterns (e.g. 'mask.*')")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the full results as JSON")
    p.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML")
    p.add_argument("--save-baseline", type=Path, metavar="FILE", help="store this run as a baseline")
    p.add_argument("--baseline", type=Path, metavar="FILE", help="flag regressions against a stored baseline")
    p.add_argument("--repro-dir", type=Path, default=Path("verify-repro"),
                   help="where reproducers of failures go (default: %(default)s)")
    p.add_argument("--reference", choices=("auto", "oracle"), default="auto",
                   help="auto: the certified reference when installed (small cases), else the fp64 oracle")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads during the run (default: %(default)s; the cases are small, and idle "
                        "threads spinning on a shared machine cost more than they give); 0 leaves torch's setting")
    p.add_argument("--replay", type=Path, metavar="FILE", help="rerun one saved reproducer and explain it")
    p.add_argument("--list", action="store_true", help="list the checks and the features, then exit")
    return p


def settings_from(args, p) -> Settings:
    if not args.impl:
        p.error("argument --impl is required")
    dtypes = []
    for name in _split(args.dtypes):
        if name not in DTYPE_NAMES:
            p.error(f"argument --dtypes: expected names from {', '.join(DTYPE_NAMES)}, got {name!r}")
        dtypes.append(DTYPE_NAMES[name])
    require = _split(args.require)
    unknown = [f for f in require if f not in FEATURES]
    if unknown:
        p.error(f"argument --require: unknown features {unknown}; known: {', '.join(FEATURES)}")
    try:
        torch.empty(0, device=args.device)
    except (RuntimeError, ValueError) as err:
        p.error(f"argument --device: {args.device!r} is not usable here: {err}")
    try:
        impl = resolve(args.impl)
    except ValueError as err:
        p.error(str(err))
    return Settings(impl=impl, impl_name=args.impl, dtypes=tuple(dtypes), device=args.device, profile=args.profile,
                    tolerance=args.tolerance, seed=args.seed, fail_fast=args.fail_fast, require=frozenset(require),
                    repro_dir=args.repro_dir, use_certified=args.reference == "auto", only=tuple(_split(args.only)),
                    threads=args.threads or None)


def _list_checks() -> str:
    lines = [f"{c.name:32s} {c.doc}" + (" [full only]" if c.full_only else "") for c in CHECKS]
    return "\n".join(lines + ["", "features (for --require): " + ", ".join(FEATURES)])


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.list:
        print(_list_checks())
        return 0
    settings = settings_from(args, p)
    if args.replay:
        result, text = replay(settings, args.replay)
        print(text)
        return 1 if result.failed else 0
    baseline = load_baseline(args.baseline) if args.baseline else None
    report = run_battery(settings, progress=reporting.ProgressBar())
    print(reporting.render(report), end="")
    failed = not report.passed
    if baseline is not None:
        diff = compare_baseline(report, baseline)
        print(diff.render())
        failed |= bool(diff.regressions)
    if args.json:
        args.json.write_text(json.dumps(reporting.to_json(report), indent=1, default=str))
    if args.junit:
        args.junit.write_text(reporting.to_junit(report))
    if args.save_baseline:
        save_baseline(report, args.save_baseline)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
