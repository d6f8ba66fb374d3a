"""``python -m attnformal.reference``: write golden files and check implementations against them.

    generate --shape B,Hq,Hkv,Sq,Sk,D[,Dv] --dtype bf16 [--causal bottom_right] [--window L,R]
             [--kv-lens N,...] [--softcap C] [--dropout-p P] [--attn-mask-density F] [--scale S]
             [--input-scale X] [--max-radius R] [--prec BITS] [--workers N | --cluster ADDRESS]
             --seed N --out FILE
    check FILE --impl MODULE:FUNC [--rtol R] [--atol A] [--device DEV]

Exit status: 0 written / passed, 1 check failed, 2 bad arguments or unusable file,
130 cancelled (Ctrl-C; nothing is written).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from attnformal.distributed import EngineMissing, open_executor
from attnformal.impl import load_impl
from attnformal.reference import golden
from attnformal.reference.certified import CertificationError
from attnformal.spec import SpecError

DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp32": torch.float32, "float32": torch.float32, "fp64": torch.float64, "float64": torch.float64}
ESTIMATE_SHOWN_ABOVE_S = 2.0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (SpecError, golden.GoldenError, CertificationError, ValueError, EngineMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncancelled: nothing was written", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attnformal.reference",
                                     description="Write golden files (seeded inputs with certified outputs, "
                                                 "gradients and error radii) and check implementations "
                                                 "against them. File format: attnformal/reference/golden.py.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="write a golden file (inputs, certified outputs and gradients)")
    gen.add_argument("--shape", required=True, type=_shape, help="B,Hq,Hkv,Sq,Sk,D[,Dv]")
    gen.add_argument("--dtype", required=True, choices=sorted(DTYPES), help="input dtype")
    gen.add_argument("--causal", default="none", choices=["none", "top_left", "bottom_right"])
    gen.add_argument("--window", type=_ints(2), help="L,R (negative: unbounded on that side)")
    gen.add_argument("--kv-lens", type=_ints(None), help="one key length per batch, comma-separated")
    gen.add_argument("--softcap", type=float)
    gen.add_argument("--dropout-p", type=float, default=0.0, help="with a seeded keep-mask stored in the file")
    gen.add_argument("--attn-mask-density", type=_fraction, help="add a seeded random bool mask, this fraction True")
    gen.add_argument("--scale", type=float, help="softmax scale (default 1/sqrt(D))")
    gen.add_argument("--input-scale", type=float, default=1.0, help="inputs ~ N(0,1) times this (large: extreme logits)")
    gen.add_argument("--max-radius", type=float, help="raise precision until every radius is at most this")
    gen.add_argument("--prec", type=int, help="use Arb at this many bits (default: float64 tier; 128 for fp64)")
    gen.add_argument("--workers", type=int, help="run the float64 tier's tiles on a local Dask cluster of N worker "
                                                 "processes (pip install 'attnformal[distributed]'); same result")
    gen.add_argument("--cluster", metavar="ADDRESS", help="run them on the Dask scheduler at ADDRESS (tcp://host:port)")
    gen.add_argument("--seed", required=True, type=int)
    gen.add_argument("--out", required=True, help="output .npz file")
    gen.set_defaults(run=_generate)

    chk = commands.add_parser("check", help="run an implementation against a golden file")
    chk.add_argument("file")
    chk.add_argument("--impl", required=True, help="MODULE:FUNC or FILE.py:FUNC (the implementation protocol)")
    chk.add_argument("--rtol", type=float, help="override the per-dtype rtol")
    chk.add_argument("--atol", type=float, help="override the per-dtype atol (times the tensor's max |ref|)")
    chk.add_argument("--device", default="cpu", help="device the inputs are moved to (default cpu)")
    chk.set_defaults(run=_check)
    return parser


def _shape(text: str):
    values = _ints(None)(text)
    if len(values) not in (6, 7) or min(values) < 0:
        raise argparse.ArgumentTypeError("expected B,Hq,Hkv,Sq,Sk,D[,Dv] (6 or 7 non-negative ints)")
    return tuple(values) if len(values) == 7 else (*values, values[5])


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return value


def _ints(count):
    def parse(text: str):
        try:
            values = [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
        if count is not None and len(values) != count:
            raise argparse.ArgumentTypeError(f"expected {count} comma-separated ints, got {text!r}")
        return values
    return parse


def _generate(args) -> int:
    dtype = DTYPES[args.dtype]
    arb_tier = args.prec is not None or (args.max_radius is None and golden.default_prec(dtype) is not None)
    if arb_tier and (args.workers is not None or args.cluster is not None):
        raise ValueError("argument '--workers'/'--cluster': they run the float64 tier's tiles, but this case uses "
                         "the Arb tier (--prec, or float64 inputs), which runs in this process")
    protocol = {"scale": args.scale, "causal": None if args.causal == "none" else args.causal,
                "window": None if args.window is None else tuple(args.window), "kv_lens": args.kv_lens,
                "softcap": args.softcap, "dropout_p": args.dropout_p}
    inputs = golden.make_inputs(args.shape, dtype, args.seed, input_scale=args.input_scale,
                                dropout_p=args.dropout_p,
                                attn_mask_density=args.attn_mask_density)
    estimate = golden.estimate_seconds(inputs, prec=args.prec, **protocol)
    if estimate > ESTIMATE_SHOWN_ABOVE_S:
        print(f"estimated time: {_duration(estimate)} (Ctrl-C cancels; nothing is written until the end)",
              file=sys.stderr)
    start = time.perf_counter()
    with open_executor(args.workers, args.cluster) as executor:
        result = golden.generate(inputs, max_radius=args.max_radius, prec=args.prec, executor=executor,
                                 progress=ProgressBar(sys.stderr), **protocol)
    generator = {"shape": list(args.shape), "input_scale": args.input_scale,
                 "attn_mask_density": args.attn_mask_density, "command": " ".join(sys.argv[1:])}
    golden.save(args.out, inputs, result, seed=args.seed, generator=generator)
    print(f"wrote {args.out}: {args.dtype} case, reference on the {result.tier} tier, largest radius "
          f"{result.enclosure_radius:.3g}, in {_duration(time.perf_counter() - start)}")
    return 0


def _check(args) -> int:
    from attnformal.reference.check import format_report, run_check

    case = golden.load(args.file)
    impl = load_impl(args.impl)
    spec = case.spec
    print(f"golden: {args.file} ({case.meta['dtype']}, B={spec.batch} Hq={spec.heads_q} Hkv={spec.heads_kv} "
          f"Sq={spec.len_q} Sk={spec.len_k} D={spec.head_dim} Dv={spec.head_dim_v}, causal={spec.causal}, "
          f"window={spec.window}, softcap={spec.softcap}, dropout_p={spec.dropout_p}, seed {case.meta['seed']}; "
          f"reference {case.meta['reference']['tier']} tier)")
    print(f"impl:   {args.impl}")
    try:
        report = run_check(case, impl, rtol=args.rtol, atol=args.atol, device=args.device)
    except NotImplementedError as err:
        print(f"unsupported by the implementation: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0 if report.passed else 1


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
