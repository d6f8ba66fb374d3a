"""``python -m attnformal.scale``: sweep one parameter, fit exponents, explain them.

Exit status (:data:`attnformal.cli.EXIT_CODES`): 0 when every implementation got a time exponent
under every mask family; 1 (FAIL) when some fit was refused (too few points, or overhead-dominated),
a series measured nothing because its calls failed, or an implementation exited, crashed or hung
(nothing is written then); 2 for bad arguments (a sweep whose point cannot fit in memory, an --out
another run holds); 3 (NOTHING VERIFIED) when the only trouble is a series whose every point the
implementation refused (``NotImplementedError``); 4 for an internal error or an output that cannot be
written; 130 when cancelled (Ctrl-C: the earlier run's files stay). A user's file or module is swept in
a worker process (:mod:`attnformal.execution`), each call bounded by ``--case-timeout``.
Results go to ``--out``, by default ``out/scale/<impl>`` (``out/scale/<impl>-vs-<vs>``).
"""

from __future__ import annotations

import argparse
import datetime
import pickle
import platform
import shlex
import sys
from pathlib import Path

from attnformal import cli
from attnformal.execution import Exited, Worker, isolated_by_default
from attnformal.schedule import DEFAULT_SCHEDULE, TileSchedule
from attnformal.scale.fit import OVERHEAD_FACTOR, TOLERANCE
from attnformal.scale.problem import SWEEP_PARAMS, Problem, parse_mask, parse_sweep
from attnformal.spec import SUPPORTED_DTYPES

# torch, the measurements and the analysis are imported after the arguments are parsed: a usage error is
# printed before torch is imported.

PROG = "python -m attnformal.scale"
DEFAULT_SWEEP = "N=512..8192"  # ~1-2 minutes for the torch kernel on one CPU core
DEFAULT_OUT = Path("out/scale")
POSITIVE = cli.integer(minimum=1)
EXAMPLE = f"{PROG} --impl torch-tiled --vs sdpa --mask dense causal window:256 --clock process"


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog=PROG, example=EXAMPLE, guide="I have a kernel",
        usage=f"{PROG} --impl IMPL [--vs IMPL] [--sweep P=LO..HI] [--mask M ...] [options]",
        description="Sweep one parameter of an attention implementation; fit time and memory exponents "
                    "and compare them with the work the tiling schedule predicts.")
    p.add_argument("--impl", required=True, help="an alias (sdpa, ...), MODULE:FUNC or FILE.py:FUNC")
    p.add_argument("--vs", metavar="IMPL", help="a second one, measured interleaved with --impl")
    p.add_argument("--sweep", nargs="+", default=[DEFAULT_SWEEP], metavar="P=LO..HI",
                   help=f"or P=V1,V2,...; P: {', '.join(SWEEP_PARAMS)} (default {DEFAULT_SWEEP})")
    p.add_argument("--per-octave", type=POSITIVE, default=2, metavar="K", help="points per doubling in LO..HI (2)")
    p.add_argument("--mask", nargs="+", default=["dense"], metavar="M",
                   help="dense, causal, window:W, window:N/K, window (W swept), chunk:C, chunk:N/K, chunk")
    p.add_argument("--dtype", default="float32", choices=SUPPORTED_DTYPES, metavar="DTYPE",
                   help=f"{', '.join(SUPPORTED_DTYPES)} (float32)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or npu (cpu)")
    p.add_argument("--clock", default="wall", choices=("wall", "process"), metavar="CLOCK",
                   help="CPU timer: wall, or process CPU time (wall)")
    p.add_argument("--backward", action="store_true", help="time forward + backward")
    p.add_argument("--batch", type=POSITIVE, default=1, metavar="B", help="batch (1)")
    p.add_argument("--heads", type=POSITIVE, default=2, metavar="H", help="query heads (2)")
    p.add_argument("--heads-kv", type=POSITIVE, metavar="H", help="KV heads (default: --heads)")
    p.add_argument("--seq", type=POSITIVE, default=2048, metavar="N", help="sequence length when N is not swept (2048)")
    p.add_argument("--head-dim", type=POSITIVE, default=64, metavar="D", help="head dim when D is not swept (64)")
    p.add_argument("--block-m", type=POSITIVE, default=DEFAULT_SCHEDULE.block_m, metavar="M",
                   help=f"schedule the work is predicted from ({DEFAULT_SCHEDULE.block_m})")
    p.add_argument("--block-n", type=POSITIVE, default=DEFAULT_SCHEDULE.block_n, metavar="N",
                   help=f"its key block ({DEFAULT_SCHEDULE.block_n})")
    p.add_argument("--repeats", type=POSITIVE, default=5, metavar="R", help="minimum timed repeats per point (5)")
    p.add_argument("--warmup", type=POSITIVE, default=1, metavar="W", help="untimed calls before them (1)")
    p.add_argument("--min-time", type=cli.number(minimum=0), default=0.2, metavar="S",
                   help="seconds of samples per point (0.2)")
    p.add_argument("--overhead-factor", type=cli.number(minimum=0), default=OVERHEAD_FACTOR, metavar="F",
                   help=f"under F x a 1-token call: not fitted ({OVERHEAD_FACTOR:g})")
    p.add_argument("--tolerance", type=cli.tolerance, default=TOLERANCE, metavar="T",
                   help=f"exponent difference still consistent ({TOLERANCE})")
    p.add_argument("--threads", type=POSITIVE, metavar="T", help="torch CPU threads (1 on cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the bootstrap (0)")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="in a worker process (default for FILE.py, MODULE)")
    p.add_argument("--case-timeout", type=cli.seconds, default=300.0, metavar="S",
                   help="isolated: seconds a call may take (300)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help=f"results folder ({DEFAULT_OUT}/IMPL[-vs-IMPL])")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch

    from attnformal.scale.limits import check_sweep

    threads = torch.get_num_threads()
    try:
        try:
            config = configure(args)
            # before the first point: a sweep that cannot fit is refused now (sampled only in this process's
            # own implementations: a user's runs in the worker alone)
            check_sweep(*config, sample=not _isolated(args, config[0]))
        except ValueError as err:
            parser.error(str(err))
        try:
            with cli.folder_lock(args.out, "--out"):
                return run(argv, args, *config)
        except cli.FolderBusy as err:
            parser.error(str(err))
    except KeyboardInterrupt:
        print(f"\ncancelled: {args.out} keeps what it held before this run", file=sys.stderr)
        return 130
    except cli.WriteError as err:
        return cli.write_failed(err, PROG)
    except Exception as err:  # a defect of attnformal, not of the arguments nor of the kernel: never FAIL's code
        return cli.internal_error(err)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test session) keeps its own


def run(argv, args, candidates, masks, base, sweep, settings) -> int:
    """Measure, print the tables, write JSON, CSV and PNG; the exit code of :func:`_verdict`."""
    from attnformal.scale.analysis import analyse, analyse_ratio
    from attnformal.scale.report import OUTPUTS, ratio_table, series_table, to_json, write_csv, write_json

    runs = _measured(args, candidates, masks, base, sweep, settings)
    if isinstance(runs, str):  # the implementation exited, crashed or hung: no result to write
        print(f"FAIL: {runs}")
        return cli.EXIT_CODES["FAIL"]
    refused, unmeasured = False, []
    for run in runs:
        for series in run.series:
            analysis = analyse(series, args.backward, args.tolerance, args.overhead_factor, args.seed)
            refused |= analysis.time is None and bool(series.measured())
            if not series.measured():
                unmeasured.append(series)
            print(series_table(series, sweep.param, settings, args.overhead_factor) + "\n")
        if len(run.series) == 2:
            analyse_ratio(run, args.tolerance, args.seed)
            print(ratio_table(run, sweep.param) + "\n")
    meta = _metadata(argv, args, base, sweep.param, settings)
    writers = {"sweep.json": lambda path: write_json(path, to_json(runs, meta)),
               "sweep.csv": lambda path: write_csv(path, runs, sweep.param, settings)}
    if any(series.measured() for run in runs for series in run.series):
        from attnformal.scale.plot import plot_sweep  # matplotlib only when there is something to draw

        writers["sweep.png"] = lambda path: plot_sweep(path, runs, sweep.param, meta["title"], args.overhead_factor)
    written = cli.replace_together(args.out, writers, OUTPUTS)
    print(f"wrote {', '.join(map(str, written))}")
    for series in unmeasured:
        reasons = sorted({p.failure for p in series.points})
        print(f"NOTHING MEASURED: {series.candidate.label} under mask {series.mask.label}: every point was refused "
              f"({'; '.join(reasons)})", file=sys.stderr)
    return cli.EXIT_CODES[_verdict(refused, unmeasured)]


def _verdict(refused: bool, unmeasured) -> str:
    """FAIL for a refused fit or a point that failed; NOTHING VERIFIED when the only trouble is a series
    whose every point the implementation refused (NotImplementedError); else PASS."""
    from attnformal.scale.sweep import UNSUPPORTED

    failed = any(not (p.failure or "").startswith(UNSUPPORTED) for series in unmeasured for p in series.points)
    return "FAIL" if refused or failed else "NOTHING VERIFIED" if unmeasured else "PASS"


def _isolated(args, candidates) -> bool:
    """Whether the sweep runs in a worker process: ``--isolate``, or by default for a user's file or module."""
    return any(isolated_by_default(c.label) for c in candidates) if args.isolate is None else args.isolate


def _measured(args, candidates, masks, base, sweep, settings):
    """The sweep's runs, or the FAIL message of an implementation that exited, crashed or hung. In a
    worker process when isolated (the default for a user's file or module: a crash there is its FAIL)."""
    import torch

    from attnformal.scale.sweep import Watch, run_sweep, sweep_in_worker

    if not _isolated(args, candidates):
        watch = Watch()
        try:
            return run_sweep(candidates, masks, base, sweep, settings, watch=watch)
        except Exited as err:
            return f"{err} while running {watch.label}"
    worker = Worker(sweep_in_worker, pickle.dumps(torch.get_num_threads()), timeout=args.case_timeout,
                    option="--case-timeout", name="attnformal-scale")
    try:
        outcome = worker.run(([c.label for c in candidates], masks, base, sweep, settings))
    finally:
        worker.close()
    if outcome.lost is not None:
        return outcome.lost.where
    if outcome.error is not None:
        raise cli.InternalError(f"the sweep raised in its worker process: {outcome.error.strip().splitlines()[-1]}")
    return outcome.value


def configure(args):
    """Validate the arguments (``ValueError`` naming the argument) and build the sweep."""
    import torch

    from attnformal.scale.measure import Device
    from attnformal.scale.report import prepare_out
    from attnformal.scale.sweep import Settings, load_candidate

    heads_kv = args.heads if args.heads_kv is None else args.heads_kv
    if args.heads % heads_kv:
        raise ValueError(f"argument '--heads-kv': expected a divisor of --heads={args.heads}, got {heads_kv}")
    # N points at multiples of the block: ragged tiles would make the local exponent zigzag.
    multiple = max(args.block_m, args.block_n) if args.sweep[0].startswith("N=") else 8
    sweep = parse_sweep(" ".join(args.sweep), args.per_octave, multiple)
    masks = [parse_mask(m) for m in cli.split_list(args.mask)]
    if not masks:
        raise ValueError(f"argument '--mask': expected at least one mask family, got {' '.join(args.mask)!r}")
    for mask in masks:
        if (sweep.param == "W") != mask.swept:
            raise ValueError("argument '--mask': --sweep W=... needs the mask 'window' or 'chunk' (its size is "
                             f"swept), and either without a size needs --sweep W=...; got --mask {mask.label} "
                             f"with --sweep {sweep.param}=...")
    device = Device(args.device, args.clock)
    threads = args.threads if args.threads is not None else (1 if args.device == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)
    schedule = TileSchedule(args.block_m, args.block_n)
    candidates = [load_candidate(args.impl, schedule)]
    if args.vs:
        candidates.append(load_candidate(args.vs, schedule))
        if args.vs == args.impl:
            raise ValueError(f"argument '--vs': expected an implementation other than --impl, got {args.vs!r}")
    if args.out is None:
        args.out = DEFAULT_OUT / "-vs-".join(cli.impl_slug(c.label) for c in candidates)
    prepare_out(args.out)
    settings = Settings(device, getattr(torch, args.dtype), args.backward, schedule, args.repeats,
                        args.warmup, args.min_time, args.seed)
    base = Problem(args.batch, args.heads, heads_kv, args.seq, args.head_dim, masks[0])
    return candidates, masks, base, sweep, settings


def _metadata(argv, args, base: Problem, param: str, settings) -> dict:
    import torch

    device = settings.device
    hardware = platform.processor() or platform.machine()
    if device.backend is not None:
        hardware = device.backend.get_device_name()
    fixed = f"{base.describe(param)} {settings.describe()} threads={torch.get_num_threads()}"
    if device.name == "cpu":
        fixed += f" clock={args.clock}"
    return {
        "command": "python -m attnformal.scale " + shlex.join(argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(), "hardware": hardware,
        "threads": torch.get_num_threads(), "swept": param, "fixed": fixed,
        "reference_schedule": [settings.schedule.block_m, settings.schedule.block_n],
        "timer": device.timer, "memory_method": device.memory_method, "seed": settings.seed,
        "repeats_min": settings.repeats, "warmup": settings.warmup, "overhead_factor": args.overhead_factor,
        "tolerance": args.tolerance,
        "title": f"{param} sweep | {fixed} | torch {torch.__version__} | {hardware}",
    }
