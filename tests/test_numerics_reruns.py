"""tools/numerics_reruns.py: the paths come from the CPU, every run is reported, any failure fails the whole."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnformal import vector_paths

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import numerics_reruns  # noqa: E402

# stands in for pytest: prints what it was started with, fails under avx2 when FAIL_AVX2 is set
FAKE_PYTEST = """import os
capability, threads = os.environ["ATEN_CPU_CAPABILITY"], os.environ["OMP_NUM_THREADS"]
print("ran under", capability, "on", threads, "thread")
raise SystemExit(int(capability == "avx2" and "FAIL_AVX2" in os.environ))
"""


@pytest.fixture
def fake_pytest(monkeypatch):
    monkeypatch.setattr(numerics_reruns, "PYTEST", [sys.executable, "-c", FAKE_PYTEST])


@pytest.mark.parametrize("best, reruns", [("avx512", ["default", "avx2"]), ("avx2", ["default"]),
                                          ("default", []), ("sve256", ["default"])])
def test_the_reruns_are_every_path_below_the_cpus_best(fake_pytest, capsys, best, reruns):
    assert numerics_reruns.main([], best=best) == 0
    out = capsys.readouterr().out
    assert [c for c in ("default", "avx2", "avx512", "sve256") if f"ran under {c} " in out] == reruns


def test_a_path_above_the_cpus_best_is_refused_not_run(fake_pytest, capsys):
    assert numerics_reruns.main(["default", "avx512"], best="avx2") == 2
    captured = capsys.readouterr()
    assert "ran under" not in captured.out
    assert "ATEN_CPU_CAPABILITY=avx512 is above this CPU's best, avx2: torch would die with SIGILL" in captured.err


def test_every_run_is_reported_with_its_capability_on_one_thread(fake_pytest, capsys):
    assert numerics_reruns.main(["default", "avx2"], best="avx512") == 0
    out = capsys.readouterr().out
    assert "ran under default on 1 thread" in out and "ran under avx2 on 1 thread" in out


def test_one_failing_run_fails_the_whole_and_is_named(fake_pytest, monkeypatch, capsys):
    monkeypatch.setenv("FAIL_AVX2", "1")
    assert numerics_reruns.main(["default", "avx2"], best="avx512") == 1
    captured = capsys.readouterr()
    assert "ATEN_CPU_CAPABILITY=default, 1 thread: exit 0" in captured.out
    assert "ATEN_CPU_CAPABILITY=avx2, 1 thread: exit 1" in captured.out
    assert "failed under ATEN_CPU_CAPABILITY=avx2" in captured.err


@pytest.mark.parametrize("reported, name", [("AVX512", "avx512"), ("AVX2", "avx2"), ("DEFAULT", "default"),
                                            ("NO AVX", "default"), ("Z VECTOR", "zvector"), ("SVE256", "sve256")])
def test_torchs_words_are_the_variables_spelling(reported, name):
    assert vector_paths.path_name(reported) == name


@pytest.mark.parametrize("requested, best, expected", [
    ("avx2", "avx512", None), ("avx512", "avx512", None), ("default", "default", None),
    ("avx2", "default", "above this CPU's best, default"), ("avx512", "avx2", "would die with SIGILL"),
    ("sve256", "avx512", "another architecture's path"), ("avx9000", "avx2", "not a vector path torch knows"),
])
def test_refusal_names_why_a_path_cannot_run(requested, best, expected):
    why = vector_paths.refusal(requested, best)
    assert why is None if expected is None else expected in why


def test_the_cpus_best_is_asked_without_the_variable(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    unforced = vector_paths.best_path()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # would be torch's answer if it were passed on
    assert vector_paths.best_path() == unforced


def test_pytest_refuses_a_path_the_cpu_lacks_with_one_line():
    this_test = f"{Path(__file__).relative_to(ROOT)}::test_torchs_words_are_the_variables_spelling"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", this_test], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, ATEN_CPU_CAPABILITY="avx9000"))
    assert run.returncode == 4, run.stdout + run.stderr
    assert "ATEN_CPU_CAPABILITY=avx9000 is not a vector path torch knows" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
