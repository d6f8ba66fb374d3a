"""One grammar: ``--impl`` means the same in verify, scale, reference check and the pytest plugin."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attnformal import adapters
from attnformal.schedule import TileSchedule
from attnformal.scale.sweep import load_candidate

# Each front end, run on an implementation it must refuse; pytest says a usage error with status 4.
FRONT_ENDS = {"verify": (["-m", "attnformal.verify", "--only", "hand.*"], 2),
              "scale": (["-m", "attnformal.scale"], 2),
              "reference check": (["-m", "attnformal.reference", "check", "case.npz"], 2),
              "pytest plugin": (["-m", "pytest", "-q", "-p", "no:cacheprovider"], 4)}


def refusal(front_end: str, target: str, folder) -> str:
    argv, status = FRONT_ENDS[front_end]
    option = "--attn-impl" if front_end == "pytest plugin" else "--impl"
    result = subprocess.run([sys.executable, *argv, option, target], cwd=folder, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == status, result.stdout + result.stderr
    return next(line for line in (result.stdout + result.stderr).splitlines() if "argument '--impl'" in line)


@pytest.mark.parametrize("target", ["tiled", "no_such_file.py:attention"])
def test_every_front_end_refuses_an_impl_with_the_same_words(target, tmp_path):
    # "tiled" was an alias of scale alone; now no command knows it, and all say so alike
    messages = {front_end: refusal(front_end, target, tmp_path) for front_end in FRONT_ENDS}
    reasons = {message.split("argument '--impl': ", 1)[1].split(" (see:")[0] for message in messages.values()}
    assert len(reasons) == 1, messages
    assert target.split(":")[0] in reasons.pop()


def test_scale_resolves_what_verify_resolves_and_gives_torch_tiled_its_schedule(tmp_path):
    (tmp_path / "kernel.py").write_text("def attention(q, k, v, **kwargs):\n    return v\n")
    own = load_candidate(f"{tmp_path}/kernel.py:attention", TileSchedule(32, 32))
    assert own.schedule is None and own.fn(None, None, "v") == "v"  # takes no schedule: launched as it is
    tiled = load_candidate("torch-tiled", TileSchedule(32, 32))
    assert tiled.schedule == TileSchedule(32, 32) and tiled.fn.func is adapters.resolve("torch-tiled")
    q = torch.randn(1, 1, 40, 8)
    assert torch.allclose(tiled.fn(q, q, q), adapters.sdpa_math(q, q, q), atol=1e-5)
    assert load_candidate("sdpa-math", TileSchedule(32, 32)).fn is adapters.resolve("sdpa-math")
