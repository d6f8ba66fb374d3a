"""Wall time of the full default prover run (``python -m attnformal.prove``), as a user sees it.

Runs the command ``--repeat`` times in fresh processes (imports included, ``--no-cache``: a
cold run) and prints each wall time, the median, each obligation's time and Z3 resource units
(``rlimit``: the load-independent measure, the same in every run) of the last run, and the
machine's load so a number from a shared machine can be read as such; then one warm run
(from the verdict cache). The goal (issue 26): cold <= 10 s, warm <= 2 s on a 2-core machine.

    python benchmarks/bench_prove.py [--repeat 3] [--jobs N] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_S, WARM_GOAL_S = 10.0, 2.0


def run_once(jobs: int | None, cache: str | None = None) -> tuple[float, dict]:
    """One run; ``cache``: a cache folder to use (default: none, everything proved afresh)."""
    with tempfile.TemporaryDirectory() as folder:
        results = os.path.join(folder, "prove.json")
        command = [sys.executable, "-m", "attnformal.prove", "--json", results] + ([] if cache else ["--no-cache"])
        environment = {**os.environ, **({"ATTNFORMAL_PROVE_CACHE": cache} if cache else {})}
        if jobs is not None:
            command += ["--jobs", str(jobs)]
        start = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True, env=environment)
        wall = time.perf_counter() - start
        if completed.returncode != 0:
            sys.exit(f"the prover failed (exit {completed.returncode}):\n{completed.stdout}{completed.stderr}")
        with open(results) as handle:
            return wall, json.load(handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None, help="passed to the prover (default: its own)")
    parser.add_argument("--out", help="write the measurements as JSON")
    args = parser.parse_args()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    walls, last = [], None
    for attempt in range(args.repeat):
        wall, last = run_once(args.jobs)
        walls.append(wall)
        print(f"run {attempt + 1}: {wall:.1f} s wall (prover-reported {last['wall_seconds']:.1f} s)")
    median = statistics.median(walls)
    verdict = "met" if median <= GOAL_S else "NOT met"
    print(f"cold: median {median:.1f} s, min {min(walls):.1f} s, goal <= {GOAL_S:.0f} s: {verdict}")
    print("per obligation (last run, each in its own worker; units: millions of Z3 resource units):")
    for o in last["obligations"]:
        queries = sum(p["queries"] for p in o["checks"])
        print(f"  {o['number']:>2}. {o['title']:<52} {o['seconds']:6.1f} s {o['rlimit'] / 1e6:8.2f} M  "
              f"({queries} queries)")
    print(f"total: {sum(o['rlimit'] for o in last['obligations']) / 1e6:.2f} M units in the checks, "
          f"{sum(c['proof']['rlimit'] for c in last['controls']) / 1e6:.2f} M in the controls")
    with tempfile.TemporaryDirectory() as cache:
        run_once(args.jobs, cache)  # fills the cache
        warm, _ = run_once(args.jobs, cache)
    print(f"warm (every verdict cached): {warm:.1f} s wall, goal <= {WARM_GOAL_S:.0f} s: "
          f"{'met' if warm <= WARM_GOAL_S else 'NOT met'}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"walls_s": walls, "median_s": median, "cpus": os.cpu_count(),
                       "obligations": {o["name"]: o["seconds"] for o in last["obligations"]},
                       "rlimit": {o["name"]: o["rlimit"] for o in last["obligations"]}, "warm_s": warm,
                       "environment": last["environment"]}, handle, indent=2)


if __name__ == "__main__":
    main()
