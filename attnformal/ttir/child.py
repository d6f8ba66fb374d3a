"""The TTIR theorems run in a fresh Python, for a caller that cannot lower in its own process.

Triton lowers a kernel only where ``TRITON_INTERPRET`` is off: its interpreter replaces each ``@triton.jit``
function when the kernel's module is imported, which a process that imported the kernels under the interpreter
(the test suite, a user's CPU session) cannot undo. The child gets the caller's environment without it, with
``TRITON_DEFAULT_FP_FUSION=1`` (Triton's default, said aloud: Triton 3.9 warns when it is unset), and answers
through a pickle file: ``python -m attnformal.ttir.child REQUEST RESULT``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from attnformal.ttir.theorems import THEOREMS, Limits


@dataclass(frozen=True)
class Request:
    """One kernel to prove: its launch description (a name in :mod:`attnformal.ttir.launch`), the kernel
    (``FILE.py:ATTR`` or ``MODULE:ATTR``; the description's own by default), which theorems, which of the
    description's configurations (indices; all by default), whose front end lowers it."""

    launch: str
    kernel: str = ""
    theorems: tuple[str, ...] = THEOREMS
    configs: tuple[int, ...] | None = None
    target: str = "cuda"


class ChildFailed(RuntimeError):
    """The child Python did not answer: its last lines of stderr say why (Triton missing, a crash)."""


def prove(requests: list[Request], limits: Limits = Limits(), timeout: float | None = None) -> list:
    """For each request, ``[(config, [Proof])]`` as :func:`~attnformal.ttir.theorems.prove_launch` gives them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    with tempfile.TemporaryDirectory(prefix="attnformal-ttir-") as folder:
        asked, answered = os.path.join(folder, "request"), os.path.join(folder, "result")
        with open(asked, "wb") as handle:
            pickle.dump((requests, limits), handle)
        try:
            done = subprocess.run([sys.executable, "-m", __name__, asked, answered], env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ChildFailed(f"interrupted by time: the TTIR child ran past {timeout:.0f} s") from None
        if done.returncode != 0 or not os.path.exists(answered):
            raise ChildFailed(f"the TTIR child exited with code {done.returncode}: "
                              + " | ".join(done.stderr.strip().splitlines()[-3:]))
        with open(answered, "rb") as handle:
            return pickle.load(handle)


def _answer(requests: list[Request], limits: Limits) -> list:
    from attnformal.ttir import launch as launches
    from attnformal.ttir.theorems import load_attr, prove_launch

    answers = []
    for request in requests:
        described = getattr(launches, request.launch)
        configs = None if request.configs is None else [described.configs[k] for k in request.configs]
        fn = load_attr(request.kernel) if request.kernel else None
        answers.append(prove_launch(described, fn=fn, limits=limits, theorems=request.theorems, configs=configs,
                                    target=request.target))
    return answers


def main(argv: list[str]) -> int:
    asked, answered = argv
    with open(asked, "rb") as handle:
        requests, limits = pickle.load(handle)
    answers = [[(config, [proof.portable() for proof in proofs]) for config, proofs in answer]
               for answer in _answer(requests, limits)]
    with open(answered, "wb") as handle:
        pickle.dump(answers, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
