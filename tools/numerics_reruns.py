"""Run the `numerics`-marked tests again under other torch CPU vector paths, side by side.

    python tools/numerics_reruns.py default avx2      # what `make test` runs after the full suite

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


# no cache plugin: concurrent runs would write the same .pytest_cache
PYTEST = [sys.executable, "-m", "pytest", "-q", "-m", "numerics", "-p", "no:cacheprovider"]


def start(capability: str, log) -> subprocess.Popen:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    return subprocess.Popen(PYTEST, env=env, stdout=log, stderr=subprocess.STDOUT)


def main(capabilities: list[str]) -> int:
    if not capabilities:
        print("usage: numerics_reruns.py CAPABILITY [CAPABILITY ...]  (e.g. default avx2)", file=sys.stderr)
        return 2
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
