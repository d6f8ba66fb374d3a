"""verify --workers / --cluster: the battery's tasks on a Dask cluster, merged into the serial run's report.

One local cluster of 2 worker processes serves the module (the command line reaches it with
--cluster). Every case's seed derives from the run seed and the check's and case's names, and
every task runs on one torch thread with the same code, so a worker computes what this process
computes: the statuses and the worst ratios are the serial run's, to the bit.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch

from attnformal.distributed import INSTALL_HINT, open_executor
from attnformal.verify.__main__ import main
from attnformal.verify.battery import run_battery
from attnformal.verify.execute import LOCAL_CLUSTER
from attnformal.verify.runner import Settings
from test_pytest_plugin import load_plugin

pytest_plugins = ["pytester"]
EXAMPLE = f"{Path(__file__).parents[2] / 'examples' / 'causal_alignment_bug.py'}:attention"
SEGFAULTS = """
import ctypes, zoo

def attention(q, k, v, **kwargs):
    if k.shape[2] == 1 and q.shape[2] == 5:  # the second case of hand.single_token
        ctypes.string_at(0)  # a segfault
    return zoo.attention(q, k, v, **kwargs)
"""


@pytest.fixture(scope="module")
def cluster():
    with open_executor(workers=2, config=LOCAL_CLUSTER) as executor:
        yield executor.client.scheduler.address


def battery(tmp_path, **options):
    settings = Settings(impl=None, impl_name=EXAMPLE, target=EXAMPLE, only=("hand.*", "mask.*"),
                        repro_dir=tmp_path, **options)
    report = run_battery(settings)
    return report, {r.label: (r.status, r.kind, r.cases, r.unsupported_cases, r.metrics.get("worst_ratio"))
                    for r in report.results}


def test_a_cluster_gives_the_serial_statuses_and_worst_ratios(cluster, tmp_path):
    serial, expected = battery(tmp_path / "serial")
    campaign, found = battery(tmp_path / "cluster", cluster=cluster)
    assert {status for status, *_ in expected.values()} == {"pass", "FAIL", "unsupported"}  # nothing vacuous
    assert found == expected and list(found) == list(expected)  # every check, in the serial order
    assert campaign.verdict == serial.verdict == "FAIL"
    assert [r.label for r in campaign.results if r.reproducer] == [r.label for r in serial.results if r.reproducer]
    for result in campaign.results:  # the workers' reproducers are written here, bf16 tensors included
        if result.reproducer:
            assert Path(result.reproducer).parent == tmp_path / "cluster"
            assert f"--replay {result.reproducer}" in result.command
            data = torch.load(result.reproducer, weights_only=False)
            assert data["case"]["q"].dtype == {"float32": torch.float32, "bfloat16": torch.bfloat16}[result.dtype]


def test_a_segfault_on_a_cluster_fails_its_check_as_a_crash_and_the_run_goes_on(cluster, tmp_path, capsys):
    """Isolated (the default for FILE.py:FUNC): the worker's child process dies and names its case; not
    isolated, the Dask worker itself dies, and its task is a crash too."""
    kernel = tmp_path / "segfaults.py"
    kernel.write_text(SEGFAULTS)
    for isolate in ("--isolate", "--no-isolate"):
        out = tmp_path / isolate
        code = main(["--impl", f"{kernel}:attention", "--only", "hand.*", "--dtypes", "float32", "--cluster", cluster,
                     isolate, "--json", str(out.with_suffix(".json")), "--junit", str(out.with_suffix(".xml")),
                     "--repro-dir", str(out)])
        assert code == 1, capsys.readouterr().out
        run = json.loads(out.with_suffix(".json").read_text())
        assert run["state"] == "complete" and run["verdict"] == "FAIL" and run["cluster"] == cluster
        by_check = {r["check"]: r for r in run["results"]}
        crash = by_check.pop("hand.single_token")
        assert crash["status"] == "FAIL" and crash["kind"] == "crash"
        assert all(r["status"] == "pass" for r in by_check.values()) and len(by_check) == 5  # the run went on
        if isolate == "--isolate":
            assert "signal SIGSEGV" in crash["summary"] and "Sq=5 Sk=1" in crash["summary"]
            reproducer = Path(crash["reproducer"])
            assert reproducer.is_file() and reproducer.parent == out / "segfaults.attention"
        else:
            assert "the Dask worker tcp://" in crash["summary"] and "was lost" in crash["summary"]
        junit = ElementTree.parse(out.with_suffix(".xml")).getroot()
        assert [c.get("name") for c in junit.iter("testcase") if c.find("failure") is not None] == ["hand.single_token"]
        assert junit.find(".//failure").get("type") == "crash"


def test_the_plugin_runs_on_the_same_cluster_with_the_serial_outcomes(cluster, pytester, tmp_path):
    calls = tmp_path / "pids"
    kernel = tmp_path / "logs_its_process.py"  # the example kernel, noting which process runs each call
    kernel.write_text(f"import os, runpy\nexample = runpy.run_path({EXAMPLE.rpartition(':')[0]!r})['attention']\n\n"
                      f"def attention(*args, **kwargs):\n    with open({str(calls)!r}, 'a') as log:\n"
                      f"        log.write(f'{{os.getpid()}}\\n')\n    return example(*args, **kwargs)\n")

    def outcomes(*args):
        calls.unlink(missing_ok=True)
        result = pytester.runpytest_inprocess(*load_plugin(), "-p", "no:cacheprovider", "--attn-impl",
                                              f"{kernel}:attention", "--attn-only", "mask.*", "--attn-no-isolate", *args)
        return result.parseoutcomes(), set(calls.read_text().split())
    (serial, here), (campaign, there) = outcomes(), outcomes("--attn-cluster", cluster)
    assert serial == campaign and serial["failed"] == 5  # 4 checks and the verdict
    assert here == {str(os.getpid())} and there and str(os.getpid()) not in there  # the calls ran on the workers


def test_without_the_engine_one_line_says_how_to_install_it(monkeypatch, capsys, pytester):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(SystemExit) as exit_info:
        main(["--impl", "sdpa-math", "--workers", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and INSTALL_HINT in err[0]
    result = pytester.runpytest_inprocess(*load_plugin(), "-p", "no:cacheprovider", "--attn-impl", "sdpa-math",
                                          "--attn-workers", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and INSTALL_HINT in result.stderr.str()


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "argument --workers: expected an int >= 1, got '0'"),
    (["--workers", "2", "--cluster", "tcp://127.0.0.1:1"], "argument --workers: expected --workers or --cluster"),
    (["--workers", "2", "--replay", "x.pt"], "argument --replay: replays one case in this process"),
])
def test_bad_campaign_options_are_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--impl", "sdpa-math", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_isolation_on_workers_that_cannot_start_processes_is_refused_with_the_fix(capsys, tmp_path):
    daemonic_workers = {"distributed.worker.daemon": True}  # Dask's default (the module's cluster sets False meanwhile)
    with open_executor(workers=1, config=daemonic_workers) as daemonic:  # multiprocessing refuses them children
        with pytest.raises(SystemExit) as exit_info:
            main(["--impl", EXAMPLE, "--cluster", daemonic.client.scheduler.address, "--repro-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2
    assert "DASK_DISTRIBUTED__WORKER__DAEMON=False" in err[-1] and "--no-isolate" in err[-1]
