"""torch's CPU vector paths (``ATEN_CPU_CAPABILITY``): which ones this CPU can run.

torch honours ``ATEN_CPU_CAPABILITY`` without asking the CPU: a path above the CPU's dies with SIGILL
at the first kernel that uses it (``avx512`` on an AVX2-only EPYC). So the CPU's best path is asked of
torch in a fresh process with the variable removed, and only paths at or below it are ever requested.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Each architecture's paths, lowest first, as ATEN_CPU_CAPABILITY spells them (ATen's DispatchStub.cpp).
LADDERS = (("default", "avx2", "avx512"), ("default", "sve256"), ("default", "vsx"), ("default", "zvector"))
# torch.backends.cpu.get_cpu_capability()'s words that are not the variable's own spelling
_REPORTED = {"no avx": "default", "z vector": "zvector"}


def path_name(reported: str) -> str:
    """``get_cpu_capability()``'s answer ("AVX512", "NO AVX", "Z VECTOR") as ATEN_CPU_CAPABILITY spells it."""
    word = reported.strip().lower()
    return _REPORTED.get(word, word)


def best_path(python: str = sys.executable) -> str:
    """The best path torch picks on this CPU when nothing is requested (asked in a fresh process)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    answer = subprocess.run([python, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                            env=env, capture_output=True, text=True, check=True, timeout=600)
    return path_name(answer.stdout.strip().splitlines()[-1])


def paths_up_to(best: str) -> tuple[str, ...]:
    """Every path this CPU runs, lowest first: its architecture's ladder up to ``best``."""
    for ladder in LADDERS:
        if best in ladder:
            return ladder[:ladder.index(best) + 1]
    return ("default", best)  # a path this module does not know: the scalar one is below it on every CPU


def paths_below(best: str) -> tuple[str, ...]:
    """The paths under ``best``: the numerics tests run again under each."""
    return paths_up_to(best)[:-1]


def refusal(requested: str, best: str) -> str | None:
    """Why ``requested`` cannot run on a CPU whose best path is ``best`` (None when it can)."""
    runnable = paths_up_to(best)
    if requested in runnable:
        return None
    ladder = next((ladder for ladder in LADDERS if requested in ladder), None)
    if ladder is None:
        why = "not a vector path torch knows (it would ignore it and pick its own)"
    elif best in ladder:
        why = f"above this CPU's best, {best}: torch would die with SIGILL at its first {requested} kernel"
    else:
        why = f"another architecture's path (this CPU's best is {best})"
    return f"ATEN_CPU_CAPABILITY={requested} is {why}; expected one of {', '.join(runnable)}"
