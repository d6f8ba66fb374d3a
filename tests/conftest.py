"""Test-suite settings shared by every test module."""

from __future__ import annotations

import os

import pytest
import torch

from attnformal.vector_paths import best_path, refusal

# Triton picks its CPU interpreter when a kernel is decorated, i.e. when a kernel module is
# imported: without a GPU, set it before any test module imports one. With a GPU, the real kernels run.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The prover's verdict cache keys source files, not definitions patched in memory (several tests patch
# one and expect the prover to fail): the suite, and CI with it, proves everything afresh.
os.environ["ATTNFORMAL_PROVE_CACHE"] = "off"

# torch reads ATEN_CPU_CAPABILITY once, at its first kernel dispatch: fix the vector path now, so that a
# test setting that variable (for a message) cannot switch this whole process to another path when
# it happens to come first -- its results would then differ from the worker processes' it is compared with.
torch.backends.cpu.get_cpu_capability()

# Modules whose verdicts rest on floating-point results: `make test` runs them again under each of
# torch's CPU vector paths below the CPU's best (ATEN_CPU_CAPABILITY=default, avx2 on an AVX-512 CPU),
# so an assumption that holds on one instruction set only fails here rather than on a user's machine.
NUMERICS_MODULES = (
    "tests/kernels/",
    "tests/reference/",
    "tests/test_merge.py",
    "tests/test_oracle.py",
    "tests/verify/test_correct.py",
    "tests/verify/test_testing.py",
    "tests/verify/test_tolerances.py",
)


def pytest_configure(config):
    # A vector path above the CPU's makes torch die with SIGILL mid-run: refuse it before any test module
    # (and so any torch kernel) is loaded, with one line.
    requested = os.environ.get("ATEN_CPU_CAPABILITY")
    if requested and (why := refusal(requested, best_path())):
        raise pytest.UsageError(why)
    config.addinivalue_line("markers", "numerics: floating-point results; run under every ATEN_CPU_CAPABILITY")


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath) + os.sep
    for item in items:
        if str(item.path).removeprefix(root).startswith(NUMERICS_MODULES):
            item.add_marker(pytest.mark.numerics)


def pytest_report_header(config):
    requested = os.environ.get("ATEN_CPU_CAPABILITY", "(not set)")
    return f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()} " \
           f"(ATEN_CPU_CAPABILITY={requested}), {torch.get_num_threads()} threads"
