"""``python -m attnformal.scale``: sweep one parameter, fit exponents, explain them.

Exit status: 0 when every implementation that supports a mask family got a time
exponent, 1 when some fit was refused (too few points, or overhead-dominated), 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import sys
from pathlib import Path

import torch

from attnformal.kernels.torch_tiled import DEFAULT_SCHEDULE
from attnformal.schedule import TileSchedule
from attnformal.scale.analysis import TOLERANCE, analyse, analyse_ratio
from attnformal.scale.fit import OVERHEAD_FACTOR
from attnformal.scale.measure import Device
from attnformal.scale.problem import SWEEP_PARAMS, Problem, parse_mask, parse_sweep
from attnformal.scale.report import ratio_table, series_table, to_json, write_csv, write_json
from attnformal.scale.sweep import Settings, load_candidate, run_sweep
from attnformal.spec import SUPPORTED_DTYPES

DEFAULT_SWEEP = "N=512..8192"  # ~1-2 minutes for the torch kernel on one CPU core


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnformal.scale",
        description="Sweep one parameter of an attention implementation; fit time and memory exponents "
                    "and compare them with the work the tiling schedule predicts.")
    p.add_argument("--impl", required=True,
                   help="MODULE:FUNC, FILE.py:FUNC, tiled (the torch kernel, given the schedule), or an adapter "
                        "alias of python -m attnformal.verify: sdpa, sdpa-{flash,efficient,math,cudnn}, flex, ...")
    p.add_argument("--vs", help="a second implementation, measured interleaved with --impl at every point")
    p.add_argument("--sweep", default=DEFAULT_SWEEP,
                   help=f"P=LO..HI or P=V1,V2,...; P is one of: "
                        + "; ".join(f"{k} {v}" for k, v in SWEEP_PARAMS.items()) + f" (default {DEFAULT_SWEEP})")
    p.add_argument("--per-octave", type=int, default=2, help="points per doubling in LO..HI (default 2)")
    p.add_argument("--mask", nargs="+", default=["dense"],
                   help="mask families, each its own series: dense, causal, window:W (fixed), window:N/K "
                        "(grows with N), window (with --sweep W=...). Window: query i sees keys i-W..i")
    p.add_argument("--dtype", default="float32", choices=SUPPORTED_DTYPES)
    p.add_argument("--device", default="cpu", help="cpu, cuda or npu (needs torch_npu)")
    p.add_argument("--clock", default="wall", choices=("wall", "process"),
                   help="CPU timer: wall clock (default), or the process's CPU time, which a shared machine's "
                        "other jobs do not inflate (with --threads 1: the time the kernel ran)")
    p.add_argument("--backward", action="store_true", help="time forward + backward (autograd on out)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--heads-kv", type=int, help="KV heads (default: --heads)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length when N is not swept")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-m", type=int, default=DEFAULT_SCHEDULE.block_m,
                   help="reference schedule: the work is predicted from it, and kernels taking schedule= get it")
    p.add_argument("--block-n", type=int, default=DEFAULT_SCHEDULE.block_n)
    p.add_argument("--repeats", type=int, default=5, help="minimum timed repeats per point (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before the repeats (default 1)")
    p.add_argument("--min-time", type=float, default=0.2,
                   help="seconds of samples per point: fast points get up to 10x --repeats (default 0.2)")
    p.add_argument("--overhead-factor", type=float, default=OVERHEAD_FACTOR,
                   help=f"points under this many times the 1-token call cost are flagged, not fitted "
                        f"(default {OVERHEAD_FACTOR:g})")
    p.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help=f"exponent difference called consistent beyond the 95%% interval (default {TOLERANCE})")
    p.add_argument("--threads", type=int,
                   help="torch CPU threads (default 1 on cpu: on a shared machine, intra-op threads "
                        "spin-wait on busy cores and their cost, not the kernel's, sets the exponent)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the bootstrap")
    p.add_argument("--out", default="out/scale", help="directory for sweep.json, sweep.csv, sweep.png")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    try:
        try:
            config = configure(args)
        except ValueError as err:
            parser.error(str(err))
        return run(argv, args, *config)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test session) keeps its own


def run(argv, args, candidates, masks, base, sweep, settings) -> int:
    """Measure, print the tables, write JSON, CSV and PNG; 1 if a time fit was refused."""
    runs = run_sweep(candidates, masks, base, sweep, settings)
    refused = False
    for run in runs:
        for series in run.series:
            analysis = analyse(series, args.backward, args.tolerance, args.overhead_factor, args.seed)
            refused |= analysis.time is None and bool(series.measured())
            print(series_table(series, sweep.param, settings, args.overhead_factor) + "\n")
        if len(run.series) == 2:
            analyse_ratio(run, args.tolerance, args.seed)
            print(ratio_table(run, sweep.param) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = _metadata(argv, args, base, sweep.param, settings)
    write_json(out / "sweep.json", to_json(runs, meta))
    write_csv(out / "sweep.csv", runs, sweep.param, settings)
    from attnformal.scale.plot import plot_sweep  # matplotlib only when there is something to draw

    plot_sweep(out / "sweep.png", runs, sweep.param, meta["title"], args.overhead_factor)
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.csv'}, {out / 'sweep.png'}")
    return 1 if refused else 0


def configure(args):
    """Validate the arguments (``ValueError`` naming the argument) and build the sweep."""
    for name in ("batch", "heads", "seq", "head_dim", "block_m", "block_n", "repeats", "warmup", "per_octave"):
        if getattr(args, name) < 1:
            raise ValueError(f"argument '--{name.replace('_', '-')}': expected an int >= 1, got {getattr(args, name)}")
    for name in ("min_time", "overhead_factor", "tolerance"):
        if not getattr(args, name) >= 0:
            raise ValueError(f"argument '--{name.replace('_', '-')}': expected a number >= 0, got {getattr(args, name)}")
    heads_kv = args.heads if args.heads_kv is None else args.heads_kv
    if heads_kv < 1 or args.heads % heads_kv:
        raise ValueError(f"argument '--heads-kv': expected a divisor of --heads={args.heads}, got {heads_kv}")
    # N points at multiples of the block: ragged tiles would make the local exponent zigzag.
    multiple = max(args.block_m, args.block_n) if args.sweep.startswith("N=") else 8
    sweep = parse_sweep(args.sweep, args.per_octave, multiple)
    masks = [parse_mask(m) for m in args.mask]
    for mask in masks:
        swept_width = mask.kind == "window" and mask.width is None and mask.per_n is None
        if (sweep.param == "W") != swept_width:
            raise ValueError("argument '--mask': --sweep W=... needs the mask 'window' (its width is swept), "
                             f"and 'window' without a width needs --sweep W=...; got --mask {mask.label} "
                             f"with --sweep {sweep.param}=...")
    device = Device(args.device, args.clock)
    threads = args.threads if args.threads is not None else (1 if args.device == "cpu" else None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"argument '--threads': expected an int >= 1, got {threads}")
        torch.set_num_threads(threads)
    schedule = TileSchedule(args.block_m, args.block_n)
    candidates = [load_candidate(args.impl, schedule)]
    if args.vs:
        candidates.append(load_candidate(args.vs, schedule))
        if args.vs == args.impl:
            raise ValueError(f"argument '--vs': expected an implementation other than --impl, got {args.vs!r}")
    settings = Settings(device, getattr(torch, args.dtype), args.backward, schedule, args.repeats,
                        args.warmup, args.min_time, args.seed)
    base = Problem(args.batch, args.heads, heads_kv, args.seq, args.head_dim, masks[0])
    return candidates, masks, base, sweep, settings


def _metadata(argv, args, base: Problem, param: str, settings: Settings) -> dict:
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
