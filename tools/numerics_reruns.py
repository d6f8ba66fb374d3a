"""Run the `numerics`-marked tests again under the lower torch CPU vector paths, side by side.

    python tools/numerics_reruns.py                   # what `make test` runs after the full suite
    python tools/numerics_reruns.py default           # named paths (refused if above this CPU's best)

Without arguments, the paths are every one below the best this CPU has (the full suite ran under that
best): ``default avx2`` on an AVX-512 CPU, ``default`` on an AVX2 one, none on a CPU with only the scalar
path. A path above the CPU's best is never requested: torch would die with SIGILL on it.

One pytest per ``ATEN_CPU_CAPABILITY``, started together, each on one torch thread: the runs
share the cores instead of queueing (about half the wall time on 2 cores), and the suite meets
a thread count other than the full run's. Each run's output is printed whole when it ends; the
exit status is 1 when any run failed, naming which.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the checkout
from attnformal.vector_paths import best_path, paths_below, refusal  # noqa: E402

# no cache plugin: concurrent runs would write the same .pytest_cache
PYTEST = [sys.executable, "-m", "pytest", "-q", "-m", "numerics", "-p", "no:cacheprovider"]


def start(capability: str, log) -> subprocess.Popen:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    return subprocess.Popen(PYTEST, env=env, stdout=log, stderr=subprocess.STDOUT)


def main(capabilities: list[str], best: str | None = None) -> int:
    best = best or best_path()
    refused = [why for why in (refusal(c, best) for c in capabilities) if why]
    if refused:
        print("numerics_reruns.py: error: " + "; ".join(refused), file=sys.stderr)
        return 2
    capabilities = capabilities or list(paths_below(best))
    if not capabilities:
        print(f"numerics reruns: none, this CPU's only vector path is {best} (the full suite ran under it)")
        return 0
    print(f"numerics reruns under {', '.join(capabilities)}: the paths below this CPU's best, {best}", flush=True)
    logs = {c: tempfile.TemporaryFile("w+") for c in capabilities}
    runs = {c: start(c, logs[c]) for c in capabilities}
    failed = []
    for capability, run in runs.items():
        status = run.wait()
        logs[capability].seek(0)
        print(f"==== numerics tests under ATEN_CPU_CAPABILITY={capability}, 1 thread: exit {status} ====")
        print(logs[capability].read(), end="", flush=True)
        if status != 0:
            failed.append(capability)
    if failed:
        print(f"numerics tests failed under ATEN_CPU_CAPABILITY={', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
