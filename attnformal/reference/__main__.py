"""``python -m attnformal.reference``: write golden files and check implementations against them.

    generate --shape B,Hq,Hkv,Sq,Sk,D[,Dv] --dtype bf16 --seed N --out FILE [--workers N | --cluster ADDRESS] [options]
    check FILE --impl IMPL [--rtol R --atol A] [--device DEV] [--isolate | --no-isolate] [--case-timeout S]

Exit status (:data:`attnformal.cli.EXIT_CODES`): 0 written / passed, 1 check failed (wrong
values, or the implementation raised, exited, crashed, hung or broke the protocol), 2 bad
arguments, an unusable file or a case that cannot be computed here, 3 INCOMPLETE (the lse or a
gradient was never checked and neither --no-lse nor --forward-only waived it) or NOTHING
VERIFIED (the implementation refuses the case), 4 an internal error (the golden file could not be written: a full
disk...), 130 cancelled (Ctrl-C; nothing is written). A user's file or module runs in a worker process
(:mod:`attnformal.execution`), each call bounded by --case-timeout.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import time
from pathlib import Path

from attnformal import cli
from attnformal.aliases import NAMES as ALIASES
from attnformal.distributed import EngineMissing, open_executor
from attnformal.features import FEATURES, feature
from attnformal.execution import Worker, isolated_by_default
from attnformal.reference import cost
from attnformal.spec import SpecError

# golden files, the certified reference and torch are imported after the arguments are parsed: a usage
# error is printed before torch is imported.

PROG = "python -m attnformal.reference"
ESTIMATE_SHOWN_ABOVE_S = 2.0
SHOWN = ("causal", "window", "softcap", "dropout_p")  # features the check's header names even when off
GENERATE_EXAMPLE = (f"{PROG} generate --shape 2,4,2,100,130,32 --dtype bf16 --causal bottom_right "
                    "--window 40,5 --seed 3 --out case.npz")
CHECK_EXAMPLE = f"{PROG} check case.npz --impl torch-tiled"
GUIDE = "I need references"  # the README path these commands belong to


class Refused(Exception):
    """The case cannot be computed or written here; the message says why, with the numbers."""


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from attnformal.reference import golden
    from attnformal.reference.certified import CertificationError

    try:
        return args.run(args)
    except (SpecError, golden.GoldenError, CertificationError, Refused, ValueError, EngineMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncancelled: nothing was written", file=sys.stderr)
        return 130
    except cli.WriteError as err:  # a full disk: the previous file, if any, is left as it was
        return cli.write_failed(err, PROG)
    except Exception as err:  # a defect of attnformal, not of the arguments nor of the kernel: never FAIL's code
        return cli.internal_error(err)


def _parser() -> argparse.ArgumentParser:
    parser = cli.Parser(prog=PROG, example=f"{GENERATE_EXAMPLE}\n  {CHECK_EXAMPLE}", guide=GUIDE,
                        description="Golden files: seeded inputs with certified outputs, gradients and error "
                                    "radii; and a check of an implementation against one.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="write a golden file (inputs, certified outputs and gradients)",
                              description="Write a golden file: seeded inputs, certified outputs and gradients.",
                              usage=f"{PROG} generate --shape B,Hq,Hkv,Sq,Sk,D[,Dv] --dtype DTYPE --seed N "
                                    "--out FILE [options]", example=GENERATE_EXAMPLE, guide=GUIDE)
    gen.add_argument("--shape", required=True, action=cli.IntList, count=(6, 7), minimum=1,
                     form="B,Hq,Hkv,Sq,Sk,D[,Dv] (6 or 7 sizes >= 1)", metavar="B,Hq,Hkv,Sq,Sk,D[,Dv]",
                     help="sizes, each >= 1 (Dv defaults to D)")
    gen.add_argument("--dtype", required=True, choices=cli.DTYPE_NAMES, metavar="DTYPE",
                     help="bf16, fp16, fp32, fp64 (or the long names)")
    gen.add_argument("--seed", required=True, type=cli.integer(minimum=0, below=2**64, what="an int in [0, 2^64)"),
                     help="seed of every random draw (an int >= 0)")
    gen.add_argument("--out", required=True, metavar="FILE", help="the .npz file to write (atomically)")
    for feature in FEATURES:  # each protocol feature's own flag (--causal, --window, --chunk-size, ...)
        feature.add_argument(gen)
    gen.add_argument("--attn-mask-density", type=cli.number(minimum=0, maximum=1, what="a fraction in [0, 1]"), metavar="F",
                     help="a seeded random bool mask, this fraction True")
    gen.add_argument("--scale", type=cli.number(), metavar="S", help="softmax scale (default 1/sqrt(D))")
    gen.add_argument("--input-scale", type=cli.number(minimum=0), default=1.0, metavar="X",
                     help="inputs ~ N(0,1) times X (default 1)")
    gen.add_argument("--max-radius", type=cli.number(above=0), metavar="R",
                     help="raise the precision until every radius is <= R")
    gen.add_argument("--prec", type=int, metavar="BITS",
                     help="Arb at BITS bits (default float64; fp64: 128)")
    gen.add_argument("--workers", type=int, metavar="N",
                     help="float64 tiles on N local Dask workers (extra [distributed])")
    gen.add_argument("--cluster", metavar="ADDRESS", help="or on the Dask scheduler at tcp://host:port")
    gen.set_defaults(run=_generate)

    chk = commands.add_parser("check", help="run an implementation against a golden file",
                              description="Run an implementation (forward and backward) on a golden file's "
                                          "inputs; report each tensor's worst error in ulps and against the "
                                          "tolerance radius + rtol*|ref| + atol*max|ref|.",
                              usage=f"{PROG} check FILE --impl IMPL [options]", example=CHECK_EXAMPLE,
                              guide=GUIDE)
    chk.add_argument("file", metavar="FILE", help="a golden file written by generate")
    chk.add_argument("--impl", required=True,
                     help=f"MODULE:FUNC, FILE.py:FUNC or an adapter: {', '.join(ALIASES)}")
    chk.add_argument("--rtol", type=cli.tolerance, help="replace the dtype's rtol (a finite number >= 0)")
    chk.add_argument("--atol", type=cli.tolerance, help="replace the dtype's atol (times the tensor's max |ref|)")
    chk.add_argument("--device", default="cpu", help="device the inputs are moved to (default cpu)")
    chk.add_argument("--forward-only", action="store_true",
                     help="check no gradients (else a kernel without backward is INCOMPLETE, exit 3)")
    chk.add_argument("--no-lse", action="store_true", help="check no lse (else a kernel without it is INCOMPLETE)")
    chk.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                     help="run the implementation in a worker process, so a crash or a hang is its FAIL "
                          "(default for MODULE:FUNC and FILE.py:FUNC)")
    chk.add_argument("--case-timeout", type=cli.seconds, default=300.0, metavar="S",
                     help="isolated: seconds one call may take before it is a FAIL (%(default)g)")
    chk.add_argument("--sample-seed", type=cli.integer(minimum=0, below=2**32, what="an int in [0, 2^32)"),
                     metavar="N", help="which groups of the file are recomputed first (default: random, printed)")
    chk.set_defaults(run=_check)
    return parser


def _generate(args) -> int:
    from attnformal.reference import golden

    dtype = cli.DTYPES[args.dtype]
    shape = tuple(args.shape) if len(args.shape) == 7 else (*args.shape, args.shape[5])
    out = cli.output_file(args.out, "--out")
    arb_tier = args.prec is not None or (args.max_radius is None and golden.default_prec(dtype) is not None)
    if arb_tier and (args.workers is not None or args.cluster is not None):
        raise ValueError("argument '--workers'/'--cluster': they run the float64 tier's tiles, but this case uses "
                         "the Arb tier (--prec, or float64 inputs), which runs in this process")
    given = {f.name: f.from_arguments(args) for f in FEATURES}  # tensor features: those given by a flag
    protocol = {"scale": args.scale, **{n: v for n, v in given.items() if not feature(n).tensor or v is not None}}
    _check_space(shape, dtype, out, args)
    packed = any(protocol.get(name) is not None for name in ("cu_seqlens_q", "cu_seqlens_k"))
    inputs = golden.make_inputs(shape, dtype, args.seed, input_scale=args.input_scale, dropout_p=args.dropout_p,
                                attn_mask_density=args.attn_mask_density, packed=packed)

    def first_rows(rows: int, progress):
        """The reference of the case's first ``rows`` query rows (every batch, head and key)."""
        sample = {name: t if name in ("k", "v") else t[:, :, :rows] for name, t in inputs.items()}
        return golden.generate(sample, max_radius=args.max_radius, prec=args.prec, progress=progress, **protocol)

    estimate = None if packed else cost.estimate(first_rows, shape[3], cost.available_memory())  # rows: padded
    if estimate is not None:
        _check_estimate(estimate, dtype, args)
    start = time.perf_counter()
    with open_executor(args.workers, args.cluster) as executor:
        result = golden.generate(inputs, max_radius=args.max_radius, prec=args.prec, executor=executor,
                                 progress=ProgressBar(sys.stderr), **protocol)
    _check_radii(result, dtype, args)
    generator = {"shape": list(shape), "input_scale": args.input_scale,
                 "attn_mask_density": args.attn_mask_density, "command": " ".join(sys.argv[1:])}
    golden.save(out, inputs, result, seed=args.seed, generator=generator)
    print(f"wrote {out}: {args.dtype} case, reference on the {result.tier} tier, largest radius "
          f"{result.enclosure_radius:.3g}, in {_duration(time.perf_counter() - start)}")
    return 0


def _check_space(shape, dtype, out, args):
    """Refuse, before any work, a case whose golden file alone exceeds the memory or the disk."""
    from attnformal.reference import golden

    need = golden.file_bytes(shape, dtype, attn_mask=args.attn_mask_density is not None,
                             dropout=args.dropout_p > 0)
    memory = cost.available_memory()
    if memory is not None and need > memory:
        raise Refused(f"argument --shape: the golden file's arrays alone take {cli.human_bytes(need)} of memory; "
                      f"{cli.human_bytes(memory)} are available. Reduce Sq, Sk, the batch or the heads")
    disk = shutil.disk_usage(out.parent).free
    if need > disk:
        raise Refused(f"argument --out: the golden file takes up to {cli.human_bytes(need)}; "
                      f"{out.parent} has {cli.human_bytes(disk)} free")


def _check_estimate(estimate: cost.Estimate, dtype, args):
    """Refuse a case that will not fit in memory, or whose first rows' radii are too loose; else
    show the estimate when the wait is long."""
    memory = cost.available_memory()
    peak = estimate.peak_bytes
    if peak is not None and memory is not None and peak > memory:
        raise Refused(f"argument --shape: this case needs about {cli.human_bytes(peak)} of memory at its peak, "
                      f"{cli.human_bytes(memory)} are available (and about {_duration(estimate.seconds)}; "
                      f"{estimate.describe()}). Reduce Sq, Sk, the batch or the heads")
    _check_radii(estimate.sample, dtype, args)
    if estimate.seconds > ESTIMATE_SHOWN_ABOVE_S:
        memory_text = "peak memory not measurable here" if peak is None else \
            f"peak memory about {cli.human_bytes(peak)}" + \
            ("" if memory is None else f" of {cli.human_bytes(memory)} available")
        print(f"estimated time: {_duration(estimate.seconds)}, {memory_text} ({estimate.describe()}; "
              "Ctrl-C cancels, nothing is written until the end)", file=sys.stderr, flush=True)


def _check_radii(result, dtype, args):
    """Refuse a reference whose radii are too loose to judge a kernel of ``dtype``."""
    from attnformal.reference.golden import loose_radius

    problem = loose_radius({name: (getattr(result, name), getattr(result, f"{name}_radius"))
                            for name in result.fields()}, dtype)
    if problem is not None:
        scales = f"--input-scale {args.input_scale:g}" + ("" if args.scale is None else f", --scale {args.scale:g}")
        raise Refused(f"argument --input-scale: {problem}. Logits this large ({scales}) need more precision than "
                      f"the {result.tier} tier: lower --input-scale, or pass --max-radius R (the precision rises "
                      f"until every radius is at most R)")


def _check(args) -> int:
    from attnformal.adapters import resolve
    from attnformal.reference import golden
    from attnformal.reference.check import format_report

    if Path(args.file).is_dir():
        raise ValueError(f"argument FILE: {args.file!r} is a folder, expected a golden file (.npz)")
    cli.check_device(args.device)
    impl = resolve(args.impl)
    case = golden.load(args.file, sample_seed=args.sample_seed)
    spec = case.spec
    print(f"golden: {args.file} ({case.meta['dtype']}, B={spec.batch} Hq={spec.heads_q} Hkv={spec.heads_kv} "
          f"Sq={spec.len_q} Sk={spec.len_k} D={spec.head_dim} Dv={spec.head_dim_v}, "
          + "".join(f"{f.name}={getattr(spec, f.name)}, " for f in FEATURES
                    if not f.tensor and (f.name in SHOWN or f.active(getattr(spec, f.name))))
          + f"seed {case.meta['seed']}; reference {case.meta['reference']['tier']} tier)")
    seed, groups = case.sample
    print(f"file:   its reference recomputed for {groups}" if seed is None else
          f"file:   its reference recomputed for (batch, KV head) {', '.join(map(str, groups))} (--sample-seed {seed})")
    print(f"impl:   {args.impl}")
    kind, found = _checked(case, impl, args)
    if kind == "unsupported":  # as verify says of a kernel that refuses every case
        print(f"NOTHING VERIFIED: the implementation does not support this case ({found})")
        return cli.EXIT_CODES["NOTHING VERIFIED"]
    if kind == "FAIL":
        print(f"FAIL: {found}")
        return cli.EXIT_CODES["FAIL"]
    verdict = found.verdict(forward_only=args.forward_only, no_lse=args.no_lse)
    print(format_report(found, verdict))
    return cli.EXIT_CODES[verdict]


def _checked(case, impl, args) -> tuple[str, object]:
    """:func:`.check.checked` of the case, in a worker process when isolated (the default for a
    user's file or module): a crash, a hang or an exit there is the implementation's FAIL."""
    from attnformal.reference.check import check_in_worker, checked

    isolate = isolated_by_default(args.impl) if args.isolate is None else args.isolate
    if not isolate:
        return checked(case, impl, rtol=args.rtol, atol=args.atol, device=args.device)
    worker = Worker(check_in_worker, pickle.dumps((args.impl, args.rtol, args.atol, args.device)),
                    timeout=args.case_timeout, option="--case-timeout", name="attnformal-reference-check")
    try:
        outcome = worker.run(case)
    finally:
        worker.close()
    if outcome.lost is not None:
        return "FAIL", outcome.lost.where
    if outcome.error is not None:
        raise cli.InternalError(f"the check raised in its worker process: {outcome.error.strip().splitlines()[-1]}")
    return outcome.value


class ProgressBar:
    """``progress(done, total)`` drawn on a terminal as a bar with elapsed and remaining time."""

    def __init__(self, stream, width: int = 30):
        self.stream, self.width = stream, width
        self.start = time.perf_counter()
        self.enabled = stream.isatty()

    def __call__(self, done: int, total: int):
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        filled = self.width * done // max(total, 1)
        left = elapsed * (total - done) / max(done, 1)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} row blocks, "
                          f"{_duration(elapsed)} elapsed, ~{_duration(left)} left ")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds / 3600:.1f} h"


if __name__ == "__main__":
    sys.exit(main())
