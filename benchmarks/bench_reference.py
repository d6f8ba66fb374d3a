"""Cost of the precision references: the fp64 oracle, the certified float64 tier and mpmath.

Case: B = H = 1, D = Dv = 128, Sq = Sk = N, no mask, bfloat16 inputs drawn from N(0, 1)
with seed 0 (the exact values every path computes on), forward (out, lse) and forward +
backward (dQ, dK, dV for a seeded dO). Times are wall-clock seconds, best of --repeat runs; the oracle
and the certified reference take turns (oracle, certified, oracle, ...), so a machine whose speed drifts
slows both alike, and the certified/oracle ratio is of their best times in the same run.

mpmath costs ``N^2 (D + Dv)`` Python-level multiprecision operations, far too slow at large
N: it is measured at --mp-sizes and extrapolated to the other sizes as ``c N^2`` from the
largest measured size; extrapolated entries are marked ``~`` and say so in the summary.

    nice .venv/bin/python benchmarks/bench_reference.py [--sizes 256,1024,4096] [--mp-sizes 64,128,256]
        [--threads 1]

Long sequences (``--tiled-sizes 4096,16384,32768``): the tiled certified reference fwd+bwd against
the fp64 oracle where its dense ``N x N`` matrices fit (``--oracle-max``), each in a fresh process:
process CPU time, wall time and the process's peak resident memory (ru_maxrss). ``--workers-at N``
runs the tiled reference at N on 1 and 2 local Dask workers (wall time; same bits) and
extrapolates to 128k as c N^2 from the largest measured size.

    nice .venv/bin/python benchmarks/bench_reference.py --sizes '' --tiled-sizes 4096,16384,32768 \
        --workers-at 16384
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import subprocess
import sys
import time

import torch

from attnformal.oracle import attention_oracle, forward_backward
from attnformal.reference import certified_attention
from attnformal.reference.mp import mp_attention

GOAL_VS_ORACLE = 2  # certified fwd+bwd at the largest N: at most this times the oracle (issue 26)
GOAL_VS_MPMATH = 100  # certified at N = 1024: at least this times faster than mpmath


MODES = ("fwd", "fwd+bwd")


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
        runs = paths(*inputs(n, dim))
        for mode in (0, 1):
            turns = {path: [] for path in ("oracle", "certified")} if n in sizes else {}
            for _ in range(repeat):
                for path in turns:
                    turns[path].append(best_time(runs[path][mode], 1))
            if n in mp_sizes:
                turns["mpmath"] = [best_time(runs["mpmath"][mode], 1)]
            for path, seconds in turns.items():
                times[path, MODES[mode], n] = (min(seconds), True)
                print(f"  measured {path:9} {MODES[mode]:7} N={n:5}: {min(seconds):9.3f} s", flush=True)
    top = max(mp_sizes)
    for n in sizes:
        for mode in MODES:
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
        for mode in MODES:
            oracle, cert, mp = (times[p, mode, n][0] for p in ("oracle", "certified", "mpmath"))
            mark = "" if times["mpmath", mode, n][1] else "~"
            print(f"{n:6} {mode:8} {cell(('oracle', mode, n)):>10} {cell(('certified', mode, n)):>12} "
                  f"{cell(('mpmath', mode, n)):>12} {cert / oracle:12.2f} {mark + f'{mp / cert:.0f}':>12}")
    largest = max(sizes)
    vs_oracle = times["certified", "fwd+bwd", largest][0] / times["oracle", "fwd+bwd", largest][0]
    print(f"\ngoal: certified fwd+bwd at N={largest} within {GOAL_VS_ORACLE}x of the fp64 oracle: "
          f"{vs_oracle:.2f}x -> {'met' if vs_oracle <= GOAL_VS_ORACLE else 'MISSED'}")
    if 1024 in sizes:
        for mode in MODES:
            speedup = times["mpmath", mode, 1024][0] / times["certified", mode, 1024][0]
            how = "measured" if times["mpmath", mode, 1024][1] else \
                f"mpmath extrapolated as c*N^2 from its measured N={max(mp_sizes)}"
            print(f"goal: certified {mode} at N=1024 at least {GOAL_VS_MPMATH}x faster than mpmath: {speedup:.0f}x "
                  f"({how}) -> {'met' if speedup >= GOAL_VS_MPMATH else 'MISSED'}")


def one_run(path: str, n: int, dim: int, workers: int) -> dict:
    """Run one path once in this (fresh) process: CPU and wall seconds of the call, peak RSS.

    With workers, the local cluster is started before the clock starts (its start-up is
    reported apart) and the workers' peak is the largest child's.
    """
    from attnformal.distributed import open_executor

    q, k, v, do = inputs(n, dim)
    start = time.perf_counter()
    with open_executor(workers or None) as executor:
        if workers:  # workers import torch and attnformal on their first task: not part of the cost measured
            executor.client.run(importlib.import_module, "attnformal.reference.tiled")
        startup = time.perf_counter() - start
        worker_cpu = executor.client.run(time.process_time) if workers else {}
        cpu, wall = time.process_time(), time.perf_counter()
        if path == "oracle":
            forward_backward(attention_oracle, *(t.double() for t in (q, k, v, do)))
            radius = None
        else:
            radius = certified_attention(q, k, v, do, executor=executor).enclosure_radius
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        worker_cpu = sorted(t - worker_cpu[w] for w, t in executor.client.run(time.process_time).items()) \
            if workers else []
    return {"cpu_s": cpu, "wall_s": wall, "startup_s": startup, "radius": radius, "worker_cpu_s": worker_cpu,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def in_child(path: str, n: int, dim: int, threads: int, workers: int = 0) -> dict:
    command = [sys.executable, __file__, "--one", f"{path}:{n}:{workers}", "--dim", str(dim), "--threads", str(threads)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def long_sequences(sizes, oracle_max, dim, threads):
    print(f"\n{'N':>6} {'path':16} {'CPU s':>9} {'wall s':>9} {'peak MiB':>9} {'largest radius':>15}")
    for n in sizes:
        for path in ("certified-tiled", "oracle"):
            if path == "oracle" and n > oracle_max:
                print(f"{n:6} {path:16} {'-':>9} {'-':>9} ~{6 * n * n * 8 / 2**20:8.0f} (dense N x N, not run)")
                continue
            r = in_child(path, n, dim, threads)
            radius = f"{r['radius']:.3g}" if path != "oracle" else ""
            print(f"{n:6} {path:16} {r['cpu_s']:9.1f} {r['wall_s']:9.1f} {r['peak_mib']:9.0f} {radius:>15}", flush=True)


def workers_compare(n, dim, threads):
    print(f"\ntiled certified fwd+bwd at N={n}, D={dim}: 1 process vs local Dask workers (wall of the call)")
    walls = {}
    for workers in (0, 1, 2):
        r = in_child("certified-tiled", n, dim, threads, workers)
        walls[workers] = r["wall_s"]
        label = "in process" if workers == 0 else f"{workers} worker(s)"
        busy = ", ".join(f"{t:.1f}" for t in r["worker_cpu_s"])
        workers_note = f", worker CPU [{busy}] s, cluster start {r['startup_s']:.1f} s, worker peak " \
                       f"{r['worker_peak_mib']:.0f} MiB" if workers else ""
        print(f"  {label:12} wall {r['wall_s']:8.1f} s  driver CPU {r['cpu_s']:7.1f} s  driver peak "
              f"{r['peak_mib']:6.0f} MiB{workers_note}", flush=True)
    print(f"  load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    scale = (131072 / n) ** 2
    print(f"  extrapolated to N=131072 (x{scale:.0f}, c N^2): in process ~{walls[0] * scale / 3600:.1f} h, "
          f"2 workers ~{walls[2] * scale / 3600:.1f} h; speed-up 1 -> 2 workers {walls[1] / walls[2]:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--tiled-sizes", default="", help="long sequences: tiled certified vs oracle, fresh processes")
    parser.add_argument("--oracle-max", type=int, default=8192, help="largest N at which the dense oracle is run")
    parser.add_argument("--workers-at", type=int, help="compare 1 process, 1 and 2 local Dask workers at this N")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # PATH:N:WORKERS, run in a child process
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
    if args.one:
        path, n, workers = args.one.split(":")
        print(json.dumps(one_run(path, int(n), args.dim, int(workers))))
        return
    print(f"bench_reference: B*H=1, D=Dv={args.dim}, bf16 inputs, seed 0; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; wall-clock seconds")
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
        mp_sizes = [int(s) for s in args.mp_sizes.split(",")]
        times = measure(sizes, mp_sizes, args.dim, args.repeat)
        report(times, sizes, mp_sizes)
    if args.tiled_sizes:
        long_sequences([int(s) for s in args.tiled_sizes.split(",")], args.oracle_max, args.dim, args.threads)
    if args.workers_at:
        workers_compare(args.workers_at, args.dim, args.threads)


if __name__ == "__main__":
    main()
