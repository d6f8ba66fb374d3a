"""tools/numerics_reruns.py: every capability's run is reported, and any failure fails the whole."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import numerics_reruns  # noqa: E402

# stands in for pytest: prints what it was started with, fails under avx2 when FAIL_AVX2 is set
FAKE_PYTEST = """import os
capability, threads = os.environ["ATEN_CPU_CAPABILITY"], os.environ["OMP_NUM_THREADS"]
print("ran under", capability, "on", threads, "thread")
raise SystemExit(int(capability == "avx2" and "FAIL_AVX2" in os.environ))
"""


def test_every_run_is_reported_with_its_capability_on_one_thread(monkeypatch, capsys):
    monkeypatch.setattr(numerics_reruns, "PYTEST", [sys.executable, "-c", FAKE_PYTEST])
    assert numerics_reruns.main(["default", "avx2"]) == 0
    out = capsys.readouterr().out
    assert "ran under default on 1 thread" in out and "ran under avx2 on 1 thread" in out


def test_one_failing_run_fails_the_whole_and_is_named(monkeypatch, capsys):
    monkeypatch.setattr(numerics_reruns, "PYTEST", [sys.executable, "-c", FAKE_PYTEST])
    monkeypatch.setenv("FAIL_AVX2", "1")
    assert numerics_reruns.main(["default", "avx2"]) == 1
    captured = capsys.readouterr()
    assert "ATEN_CPU_CAPABILITY=default, 1 thread: exit 0" in captured.out
    assert "ATEN_CPU_CAPABILITY=avx2, 1 thread: exit 1" in captured.out
    assert "failed under ATEN_CPU_CAPABILITY=avx2" in captured.err


def test_no_capability_is_a_usage_error(capsys):
    assert numerics_reruns.main([]) == 2
    assert "usage" in capsys.readouterr().err
