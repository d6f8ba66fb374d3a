"""Wall time of the full default prover run (``python -m attnformal.prove``), as a user sees it.

Runs the command ``--repeat`` times in fresh processes (imports included) and prints each
wall time, the median, the per-obligation times of the last run, and the machine's load so
a number from a shared machine can be read as such. The goal is a default run under 30 s
on a 2-core machine.

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

GOAL_S = 30.0


def run_once(jobs: int | None) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as folder:
        results = os.path.join(folder, "prove.json")
        command = [sys.executable, "-m", "attnformal.prove", "--json", results]
        if jobs is not None:
            command += ["--jobs", str(jobs)]
        start = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True)
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
    verdict = "met" if median < GOAL_S else "NOT met"
    print(f"median {median:.1f} s, min {min(walls):.1f} s, goal < {GOAL_S:.0f} s: {verdict}")
    print("per obligation (last run, each in its own worker):")
    for o in last["obligations"]:
        queries = sum(p["queries"] for p in o["checks"])
        print(f"  {o['number']}. {o['title']:<44} {o['seconds']:6.1f} s  ({queries} queries)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"walls_s": walls, "median_s": median, "cpus": os.cpu_count(),
                       "obligations": {o["name"]: o["seconds"] for o in last["obligations"]},
                       "environment": last["environment"]}, handle, indent=2)


if __name__ == "__main__":
    main()
