"""Isolation: a kernel that crashes or hangs fails that check, and the run goes on, complete and written out;
Ctrl-C keeps the checks that finished. Tiny cases: the cost is the worker processes themselves."""

import json
import signal
import subprocess
import sys
import time

from attnformal.verify.__main__ import main
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
