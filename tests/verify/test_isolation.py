"""Isolation: a kernel that crashes or hangs fails that check, and the run goes on, complete and written out;
Ctrl-C keeps the checks that finished; checks side by side (--jobs) report what one at a time reports.
Tiny cases: the cost is the worker processes themselves."""

import json
import signal
import subprocess
import sys
import time

import pytest

from attnformal.verify.__main__ import MAX_JOBS, jobs_from, main, parser
from sigint import ctrl_c_reaches_python

ZOO = __import__("zoo").__file__
CRASHES_AND_HANGS = """
import ctypes, time, zoo

def attention(q, k, v, **kwargs):
    if k.shape[2] == 1 and q.shape[2] == 5:  # the second case of hand.single_token
        ctypes.string_at(0)  # a segfault
    if k.shape[2] == 300:  # hand.dominant_score
        time.sleep(3600)  # a hang
    return zoo.attention(q, k, v, **kwargs)
"""


def test_a_crash_and_a_hang_fail_their_checks_and_the_report_is_complete(capsys, tmp_path):
    kernel = tmp_path / "bad.py"
    kernel.write_text(CRASHES_AND_HANGS)
    impl, timeout = f"{kernel}:attention", 10.0  # each hand case needs milliseconds: ample on a loaded machine
    code = main(["--impl", impl, "--only", "hand.*", "--dtypes", "float32", "--case-timeout", str(timeout),
                 "--json", str(tmp_path / "run.json"), "--repro-dir", str(tmp_path)])  # isolated: a FILE.py target
    out = capsys.readouterr().out
    assert code == 1, out
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["state"] == "complete" and run["verdict"] == "FAIL" and run["isolated"]
    by_check = {r["check"]: r for r in run["results"]}
    crash, hang = by_check["hand.single_token"], by_check["hand.dominant_score"]
    assert crash["kind"] == "crash" and "signal SIGSEGV" in crash["summary"] and "Sq=5 Sk=1" in crash["summary"]
    assert hang["kind"] == "hang" and timeout <= hang["seconds"] < 10 * timeout  # stopped at the timeout
    assert all(by_check[c]["status"] == "pass" for c in ("hand.uniform_logits", "hand.masked_dominant",
                                                          "hand.closed_form"))  # the run went on after each
    assert "seed" in crash["details"][0] and f"--replay {crash['reproducer']}" in out
    code = main(["--impl", impl, "--replay", crash["reproducer"]])  # the crash replays, isolated too
    assert code == 1 and "result: FAIL (crash)" in capsys.readouterr().out


def test_ctrl_c_keeps_the_checks_that_finished(tmp_path):
    """The implementation's results.json holds every finished check; --json, written only by a finished run,
    stays as the run before left it (here: absent)."""
    named = tmp_path / "run.json"
    results = tmp_path / "zoo.attention" / "results.json"
    process = subprocess.Popen([sys.executable, "-m", "attnformal.verify", "--impl", f"{ZOO}:attention", "--dtypes",
                                "float32", "--json", str(named), "--repro-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_reaches_python)
    deadline = time.monotonic() + 900  # a first check needs seconds; this is a hang guard
    while not (results.exists() and len(json.loads(results.read_text())["results"]) >= 2):
        assert process.poll() is None and time.monotonic() < deadline, "no check finished"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 130 and "verdict: INTERRUPTED" in out and "Traceback" not in err
    run = json.loads(results.read_text())
    assert run["state"] == "interrupted" and len(run["results"]) >= 2
    assert all(r["status"] == "pass" for r in run["results"])
    assert not named.exists() and f"interrupted: {named} kept as the previous run wrote them" in err


WRONG_AT_300_KEYS = """
import zoo

def attention(q, k, v, **kwargs):
    out = zoo.attention(q, k, v, **kwargs)
    if k.shape[2] == 300:  # hand.dominant_score, the second hand check
        return (out[0] * 1.5, *out[1:]) if isinstance(out, tuple) else out * 1.5
    return out
"""


def _results(capsys, tmp_path, name, *argv):
    """``(exit code, [(check, dtype, status, cases, worst error)] of the results and of the diagnosis's probes,
    the run's 'where' line)``."""
    json_file = tmp_path / f"{name}.json"
    code = main([*argv, "--dtypes", "float32", "--json", str(json_file), "--repro-dir", str(tmp_path / name)])
    out = capsys.readouterr().out
    run = json.loads(json_file.read_text())
    rows = [[(r["check"], r["dtype"], r["status"], r["cases"], r["metrics"].get("worst_ratio")) for r in run.get(key, [])]
            for key in ("results", "diagnostic_results")]
    return code, rows, next(line for line in out.splitlines() if "process" in line)


@pytest.mark.parametrize("argv", [("--impl", "sdpa-math", "--only", "hand.*", "fwd.random", "mask.causal*"),
                                  ("--impl", "BAD", "--only", "hand.*", "softmax.*", "--fail-fast")],
                         ids=["correct", "fail-fast"])
def test_checks_side_by_side_report_what_one_at_a_time_reports(capsys, tmp_path, argv):
    """The same checks, statuses and worst errors in the same order (the same float operations in one
    process or another); a --fail-fast stop drops what the other worker had started after the stop."""
    kernel = tmp_path / "bad.py"
    kernel.write_text(WRONG_AT_300_KEYS)
    argv = [f"{kernel}:attention" if a == "BAD" else a for a in argv]
    code_1, one, where_1 = _results(capsys, tmp_path, "one", *argv, "--jobs", "1")
    code_2, two, where_2 = _results(capsys, tmp_path, "two", *argv, "--jobs", "2")
    assert (code_1, one) == (code_2, two)
    assert "2 worker processes side by side" in where_2 and "side by side" not in where_1
    if "--fail-fast" in argv:  # the control: the stop is where the kernel is wrong, and nothing after it is kept
        assert code_1 == 1 and [r[:3] for r in one[0]] == [("hand.uniform_logits", "float32", "pass"),
                                                           ("hand.dominant_score", "float32", "FAIL")]
    else:
        assert code_1 == 0 and len(one[0]) == 9  # 5 hand, fwd.random, 3 mask.causal*


def test_jobs_default_to_a_worker_per_core_on_the_cpu_and_one_where_checks_cannot_run_side_by_side(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(6)), raising=False)
    jobs = lambda *argv: jobs_from(parser().parse_args(["--impl", "sdpa-math", *argv]))  # noqa: E731
    assert jobs() == MAX_JOBS and jobs("--threads", "2") == 3 and jobs("--jobs", "5") == 5
    for alone in (["--no-isolate"], ["--workers", "2"], ["--replay", "r.pt"], ["--device", "cuda"], ["--threads", "0"]):
        assert jobs(*alone) == 1, alone
    with pytest.raises(ValueError, match="argument --jobs: .*--no-isolate"):
        jobs("--jobs", "2", "--no-isolate")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert jobs() == 1  # one core: the alias runs in this process (no worker to start)
