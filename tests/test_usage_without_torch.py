"""Usage errors are printed before torch is imported (it costs seconds): every command line parses and
validates its arguments first. Each runs in a fresh interpreter under ``-X importtime``, which lists every
module the process imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

BAD = {
    "verify": ["-m", "attnformal.verify", "--impl", "sdpa", "--case-timeout", "nan"],
    "reference generate": ["-m", "attnformal.reference", "generate", "--shape", "1,2"],
    "reference check": ["-m", "attnformal.reference", "check", "case.npz", "--impl", "sdpa", "--rtol", "-1"],
    "scale": ["-m", "attnformal.scale", "--impl", "sdpa", "--per-octave", "0"],
    "prove": ["-m", "attnformal.prove", "--jobs", "zero"],
    "attnformal (console script)": ["-m", "attnformal.command", "verify", "--case-timeout", "nan"],
    "attnformal, unknown tool": ["-m", "attnformal.command", "provee"],
}


def imported(args) -> tuple[int, set[str], str]:
    """Exit status, the modules imported, and the error lines of ``python -X importtime ARGS``."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=600)
    lines = done.stderr.splitlines()
    modules = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    errors = [line for line in lines if not line.startswith("import time:")]
    return done.returncode, modules, "\n".join(errors)


@pytest.mark.parametrize("command", sorted(BAD))
def test_a_usage_error_comes_before_torch(command):
    code, modules, errors = imported(BAD[command])
    assert code == 2 and errors.startswith("error: argument") and errors.count("\n") == 0, errors
    assert "torch" not in modules, f"{command} imported torch before its usage error"


def test_the_control_a_command_that_does_work_imports_torch():
    """Without this, an importtime output that listed nothing would pass the test above."""
    code, modules, _ = imported(["-m", "attnformal.verify", "--list"])
    assert code == 0 and "torch" in modules and "attnformal.verify.checks" in modules
