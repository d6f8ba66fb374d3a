"""Time the conformance battery per implementation and profile, and print the zoo's detection table.

    python benchmarks/bench_verify.py [--profiles quick full] [--impls sdpa-math torch-tiled ...] [--isolate]
                                      [--workers N] [--zoo]

Each run is a fresh ``python -m attnformal.verify`` process (so torch.compile's in-process caches
do not flatter later runs; its on-disk cache still can). Prints the verdict, wall and CPU seconds
(CPU time -- this process's, plus the worker's when isolated -- is the number to compare on a shared
machine), the pass / FAIL / unsupported counts, the cases that ran and were refused, and the
unsupported checks. ``--isolate`` runs the same implementations in a worker process, to measure what
isolation costs; ``--workers N`` on a local Dask cluster of N worker processes. The last column is the
wall time of the process and CPU time of the whole process tree (the battery's process and every
process it started and waited for: workers, their imports, Dask): the honest total cost of a run. With --zoo, runs the quick battery on every specimen of tests/verify/zoo.py and
prints which bug class the battery names first.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnformal.verify import Settings, run_battery

IMPLS = ["sdpa-math", "sdpa-flash", "torch-tiled", "torch-tiled-split", "torch-tiled-small", "flex", "flex-compiled"]


def time_battery(profiles, impls, isolate, workers):
    """Each run in a fresh process: compile caches of an earlier run in the same process would flatter it."""
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| implementation | profile | verdict | wall s | CPU s | pass / FAIL / unsupported | cases ran / refused "
          "| unsupported checks | process wall s | tree CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    where = (" (isolated)" if isolate else "") + (f" ({workers} Dask workers)" if workers else "")
    for profile in profiles:
        for alias in impls:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run.json"
                before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                subprocess.run([sys.executable, "-m", "attnformal.verify", "--impl", alias, "--profile", profile,
                                "--json", str(out), "--repro-dir", tmp, "--isolate" if isolate else "--no-isolate",
                                *(["--workers", str(workers)] if workers else [])], capture_output=True, check=False)
                wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
                r = json.loads(out.read_text())
            tree = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            counts = {s: sum(x["status"] == s for x in r["results"]) for s in ("pass", "FAIL", "unsupported")}
            unsupported = sorted({x["check"] for x in r["results"] if x["status"] == "unsupported"})
            print(f"| {alias}{where} | {profile} | {r['verdict']} | {r['seconds']:.1f} | "
                  f"{r['cpu_seconds']:.1f} | {counts['pass']} / {counts['FAIL']} / {counts['unsupported']} | "
                  f"{r['coverage']['run']} / {r['coverage']['refused']} | {', '.join(unsupported)} | {wall:.1f} | "
                  f"{tree:.1f} |",
                  flush=True)


def zoo_table():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "verify"))
    import zoo

    print("| specimen: its one bug | dtype | named first | right? | checks failed | CPU s |")
    print("|---|---|---|---|---|---|")
    for s in zoo.ZOO:
        r = run_battery(Settings(impl=zoo.specimen_impl(s.bug), impl_name=s.bug, dtypes=(getattr(torch, s.dtype),)))
        top = r.diagnosis[0].bug if r.diagnosis else "-"
        print(f"| `{s.bug}`: {s.description} | {s.dtype} | {top} | {'yes' if top == s.diagnosis else 'NO'} | "
              f"{sum(x.failed for x in r.results)}/{len(r.results)} | {r.cpu_seconds:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profiles", nargs="+", default=["quick", "full"])
    p.add_argument("--impls", nargs="+", default=IMPLS)
    p.add_argument("--isolate", action="store_true", help="run each implementation in a worker process")
    p.add_argument("--workers", type=int, help="run on a local Dask cluster of this many worker processes")
    p.add_argument("--zoo", action="store_true", help="also print the zoo's detection table")
    args = p.parse_args()
    time_battery(args.profiles, args.impls, args.isolate, args.workers)
    if args.zoo:
        print()
        zoo_table()


if __name__ == "__main__":
    main()
