"""Executors, and the certified reference on a local Dask cluster of 2 workers: bitwise the single-process result.

Why bitwise: the task grid depends on the problem and the tiling only, every reduction (the
merge of the parts' states, the sums of dQ, dK, dV) runs in the driver in task order, and each
task runs on one torch thread -- so every float operation sees the same operands in the same
order, in whichever process it runs.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from attnformal.distributed import INSTALL_HINT, DaskExecutor, EngineMissing, InProcess, open_executor
from attnformal.reference import certified_attention
from attnformal.reference.__main__ import main
from attnformal.reference.tiled import Tiling
from attnformal.schedule import TileSchedule
from attnformal.reference.golden import make_inputs

FIELDS = ("out", "lse", "dq", "dk", "dv")
SMALL = Tiling(TileSchedule(block_m=4, block_n=8), chunk_rows=8, part_keys=16)


@pytest.fixture(scope="module")
def cluster():
    with open_executor(workers=2) as executor:
        yield executor


def test_tasks_really_run_on_two_worker_processes(cluster):
    assert isinstance(cluster, DaskExecutor) and cluster.workers == 2
    pids = set(cluster.map(_pid, None, range(40)))
    assert len(pids) == 2 and os.getpid() not in pids


def _pid(shared, item):
    import time

    time.sleep(0.02)  # long enough that one worker cannot take every task
    return os.getpid()


def test_results_come_back_in_item_order(cluster):
    assert list(cluster.map(_scaled, 3, range(25))) == [3 * i for i in range(25)]


def _scaled(factor, item):
    return factor * item


def test_two_workers_reproduce_the_single_process_result_bitwise(cluster):
    x = make_inputs((3, 4, 2, 23, 41, 8, 5), torch.bfloat16, 7, dropout_p=0.2)
    kwargs = {"causal": "bottom_right", "window": (12, 2), "kv_lens": [41, 30, 41], "dropout_p": 0.2,
              "dropout_mask": x["dropout_mask"]}
    args = (x["q"], x["k"], x["v"], x["grad_out"])
    local = certified_attention(*args, tiling=SMALL, executor=InProcess(), **kwargs)
    remote = certified_attention(*args, tiling=SMALL, executor=cluster, **kwargs)
    assert local.tier == remote.tier == "float64"
    for field in FIELDS:
        for name in (field, f"{field}_radius"):
            assert torch.equal(getattr(local, name), getattr(remote, name)), name


def generate(tmp_path, name, *extra):
    out = tmp_path / name
    argv = ["generate", "--shape", "1,2,1,40,300,16", "--dtype", "bf16", "--causal", "top_left", "--seed", "1",
            "--out", str(out), *extra]
    assert main(argv) == 0
    with np.load(out) as archive:
        return {name: archive[name] for name in archive.files if name != "meta"}


def test_generate_on_a_cluster_writes_the_same_file(cluster, tmp_path):
    local = generate(tmp_path, "local.npz")
    remote = generate(tmp_path, "remote.npz", "--cluster", cluster.client.scheduler.address)
    assert local.keys() == remote.keys()
    for name in local:
        assert np.array_equal(local[name], remote[name]), name


def test_without_the_engine_the_command_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(EngineMissing, match="attnformal\\[distributed\\]"):
        with open_executor(workers=2):
            pass
    argv = ["generate", "--shape", "1,1,1,4,4,8", "--dtype", "bf16", "--seed", "1", "--out",
            str(tmp_path / "x.npz"), "--workers", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and INSTALL_HINT in err[0]
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("workers", [0, -1])
def test_a_bad_worker_count_is_one_clear_error(workers, tmp_path, capsys):
    argv = ["generate", "--shape", "1,1,1,4,4,8", "--dtype", "bf16", "--seed", "1", "--out",
            str(tmp_path / "x.npz"), "--workers", str(workers)]
    assert main(argv) == 2
    assert "'--workers': expected an int >= 1" in capsys.readouterr().err


def test_workers_for_the_arb_tier_are_refused_clearly(tmp_path, capsys):
    argv = ["generate", "--shape", "1,1,1,4,4,8", "--dtype", "fp64", "--seed", "1", "--out", str(tmp_path / "x.npz"),
            "--workers", "2"]
    assert main(argv) == 2
    assert "this case uses the Arb tier" in capsys.readouterr().err
