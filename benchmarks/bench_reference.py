"""Cost of the precision references: the fp64 oracle, the certified float64 tier and mpmath.

Case: B = H = 1, D = Dv = 128, Sq = Sk = N, no mask, bfloat16 inputs drawn from N(0, 1)
with seed 0 (the exact values every path computes on), forward (out, lse) and forward +
backward (dQ, dK, dV for a seeded dO). Times are wall-clock seconds, best of --repeat runs.

mpmath costs ``N^2 (D + Dv)`` Python-level multiprecision operations, far too slow at large
N: it is measured at --mp-sizes and extrapolated to the other sizes as ``c N^2`` from the
largest measured size; extrapolated entries are marked ``~`` and say so in the summary.

    nice .venv/bin/python benchmarks/bench_reference.py [--sizes 256,1024,4096] [--mp-sizes 64,128,256]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from attnformal.oracle import attention_oracle, forward_backward
from attnformal.reference import certified_attention
from attnformal.reference.mp import mp_attention

GOAL_VS_ORACLE = 20  # certified fwd+bwd at the largest N: at most this times the oracle
GOAL_VS_MPMATH = 100  # certified at N = 1024: at least this times faster than mpmath


def inputs(n: int, dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, n, dim, generator=g, dtype=torch.float64).to(torch.bfloat16) for _ in range(4)]


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def paths(q, k, v, do):
    q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
    return {
        "oracle": (lambda: attention_oracle(q, k, v, return_lse=True),
                   lambda: forward_backward(attention_oracle, q64, k64, v64, do64)),
        "certified": (lambda: certified_attention(q, k, v), lambda: certified_attention(q, k, v, do)),
        "mpmath": (lambda: mp_attention(q, k, v, dps=40), lambda: mp_attention(q, k, v, do, dps=40)),
    }


def measure(sizes, mp_sizes, dim, repeat):
    """``{(path, mode, n): (seconds, measured?)}`` for every path, mode and size."""
    times = {}
    for n in sorted(set(sizes) | set(mp_sizes)):
        x = inputs(n, dim)
        for path, (fwd, fwd_bwd) in paths(*x).items():
            if n not in (mp_sizes if path == "mpmath" else sizes):
                continue
            for mode, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                runs = 1 if path == "mpmath" else repeat
                times[path, mode, n] = (best_time(fn, runs), True)
                print(f"  measured {path:9} {mode:7} N={n:5}: {times[path, mode, n][0]:9.3f} s", flush=True)
    top = max(mp_sizes)
    for n in sizes:
        for mode in ("fwd", "fwd+bwd"):
            if ("mpmath", mode, n) not in times:
                times["mpmath", mode, n] = (times["mpmath", mode, top][0] * (n / top) ** 2, False)
    return times


def report(times, sizes, mp_sizes):
    def cell(key):
        seconds, measured = times[key]
        return f"{'' if measured else '~'}{seconds:.3g}"

    print(f"\n{'N':>6} {'mode':8} {'oracle s':>10} {'certified s':>12} {'mpmath s':>12} "
          f"{'cert/oracle':>12} {'mpmath/cert':>12}")
    for n in sizes:
        for mode in ("fwd", "fwd+bwd"):
            oracle, cert, mp = (times[p, mode, n][0] for p in ("oracle", "certified", "mpmath"))
            mark = "" if times["mpmath", mode, n][1] else "~"
            print(f"{n:6} {mode:8} {cell(('oracle', mode, n)):>10} {cell(('certified', mode, n)):>12} "
                  f"{cell(('mpmath', mode, n)):>12} {cert / oracle:12.2f} {mark + f'{mp / cert:.0f}':>12}")
    largest = max(sizes)
    vs_oracle = times["certified", "fwd+bwd", largest][0] / times["oracle", "fwd+bwd", largest][0]
    print(f"\ngoal: certified fwd+bwd at N={largest} within {GOAL_VS_ORACLE}x of the fp64 oracle: "
          f"{vs_oracle:.1f}x -> {'met' if vs_oracle <= GOAL_VS_ORACLE else 'MISSED'}")
    if 1024 in sizes:
        for mode in ("fwd", "fwd+bwd"):
            speedup = times["mpmath", mode, 1024][0] / times["certified", mode, 1024][0]
            how = "measured" if times["mpmath", mode, 1024][1] else \
                f"mpmath extrapolated as c*N^2 from its measured N={max(mp_sizes)}"
            print(f"goal: certified {mode} at N=1024 at least {GOAL_VS_MPMATH}x faster than mpmath: {speedup:.0f}x "
                  f"({how}) -> {'met' if speedup >= GOAL_VS_MPMATH else 'MISSED'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--mp-sizes", default="64,128,256", help="sizes at which mpmath is actually run")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2, help="runs per oracle/certified timing (best is kept)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every path (default 1; 0: torch's default). On a busy shared "
                             "machine two OpenMP threads stall at every parallel region, which distorts both "
                             "paths (measured: oracle 17x and certified 100x slower at N=256)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    mp_sizes = [int(s) for s in args.mp_sizes.split(",")]
    print(f"bench_reference: B*H=1, D=Dv={args.dim}, bf16 inputs, seed 0; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; wall-clock seconds")
    times = measure(sizes, mp_sizes, args.dim, args.repeat)
    report(times, sizes, mp_sizes)


if __name__ == "__main__":
    main()
