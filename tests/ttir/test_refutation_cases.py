"""A TTIR refutation becomes a battery case that replays on the kernel's own entry point and fails there.

The planted bug (every batch element reads batch 0's queries, the Triton tutorial's defect) is refuted by the
address theorem with a two-batch launch; the case written for it replays under the Triton interpreter and the
battery names the cause. Control: the same case on the shipped kernel passes, so the failure is the bug's.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SOURCE = pathlib.Path(__file__).parents[2] / "kernels" / "triton_flash.py"
CHILD = """
import sys
from attnformal.ttir.cli import prove_triton
from attnformal.ttir.launch import FORWARD
sys.exit(prove_triton(sys.argv[1], repro_dir=sys.argv[2], configs=FORWARD.configs[:1]))
"""
BATCH_ZERO = ("q = _load_rows(Q + bh * seq_q * head_dim, rows, dims, seq_q, head_dim)",
              "q = _load_rows(Q + (bh % heads_q) * seq_q * head_dim, rows, dims, seq_q, head_dim)")


def _run(command, cwd, interpreted):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"TRITON_INTERPRET": "1"} if interpreted else {"TRITON_DEFAULT_FP_FUSION": "1"})
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)


def test_a_refutation_replays_as_a_failing_battery_case(tmp_path):
    text = SOURCE.read_text()
    assert text.count(BATCH_ZERO[0]) == 2  # the forward's and _load_query_rows'
    (tmp_path / "planted_flash.py").write_text(text.replace(*BATCH_ZERO))
    proved = _run([sys.executable, "-c", CHILD, "planted_flash.py:_attn_fwd", "repro"], tmp_path, interpreted=False)
    assert proved.returncode == 1, proved.stdout + proved.stderr
    refuted = [line for line in proved.stdout.splitlines() if line.strip().startswith("refuted")]
    assert any("address: load of Q" in line and "'B': '2'" in line for line in refuted), proved.stdout
    replays = re.findall(r"replay: (python -m attnformal\.verify --impl \S+ --replay \S+)", proved.stdout)
    assert len(replays) == 1, proved.stdout  # one refutation with a launch; the bounds theorem rests on it
    command = [sys.executable, *replays[0].split()[1:]]
    assert command[command.index("--impl") + 1] == "planted_flash.py:attention"

    replayed = _run(command, tmp_path, interpreted=True)
    assert replayed.returncode == 1 and "result: FAIL" in replayed.stdout, replayed.stdout + replayed.stderr
    assert "B=2" in replayed.stdout and "[batch_indexing]" in replayed.stdout, replayed.stdout

    shutil.copy(SOURCE, tmp_path / "shipped_flash.py")  # control: the shipped kernel on the same case
    command[command.index("--impl") + 1] = "shipped_flash.py:attention"
    control = _run(command, tmp_path, interpreted=True)
    assert control.returncode == 0 and "result: pass" in control.stdout, control.stdout + control.stderr


# A third-party kernel without the protocol replays on a host written from its own (examples/triton_tutorial.py for
# the Triton tutorial's TMA forward, told the kernel's file by ATTNFORMAL_KERNEL_FILE). The tutorial is not vendored:
# the descriptor kernel written for its launch description stands in for it, under its file name, with one of the
# tutorial's defects planted: its batch offset (STAGE 1), its finite causal fill (STAGE 3, whose case scales the
# scores up to the fill).
DESCRIPTOR = pathlib.Path(__file__).parent / "descriptor_attention.py"
TUTORIAL_CHILD = """
import sys
from attnformal.ttir.cli import prove_triton
from attnformal.ttir.launch import TRITON_TUTORIAL_TMA
sys.exit(prove_triton(sys.argv[1], repro_dir=sys.argv[2], configs=[TRITON_TUTORIAL_TMA.configs[int(sys.argv[3])]]))
"""
TUTORIAL_DEFECTS = [("head_row = off_hz * N_CTX", "head_row = off_hz // H + off_hz % H * N_CTX", 0, "address",
                     "[batch_indexing]"),
                    ('s, float("-inf"))', "s, -1.0e6)", 1, "masking", "scale=1000000.0")]


@pytest.mark.skipif(os.environ.get("ATTNFORMAL_TTIR_TARGET", "cuda") != "cuda",
                    reason="host tensor descriptors: lowered for CUDA here")
@pytest.mark.parametrize("old, new, config, theorem, shown", TUTORIAL_DEFECTS, ids=["batch offset", "finite fill"])
def test_a_third_party_refutation_replays_on_its_host(tmp_path, monkeypatch, old, new, config, theorem, shown):
    planted, shipped = tmp_path / "planted", tmp_path / "shipped"
    assert DESCRIPTOR.read_text().count(old) == 1
    for folder, text in ((planted, DESCRIPTOR.read_text().replace(old, new)), (shipped, DESCRIPTOR.read_text())):
        folder.mkdir()
        (folder / "06-fused-attention.py").write_text(text)
    proved = _run([sys.executable, "-c", TUTORIAL_CHILD, str(planted / "06-fused-attention.py:_attn_fwd_tma"), "repro",
                   str(config)], tmp_path, interpreted=False)
    assert proved.returncode == 1, proved.stdout + proved.stderr
    replays = re.findall(rf"replay: ATTNFORMAL_KERNEL_FILE=(\S+) (python -m attnformal\.verify --impl \S+ --replay "
                         rf"\S+{theorem}\S+)", proved.stdout)
    assert replays and all(file == str(planted / "06-fused-attention.py") for file, _ in replays), proved.stdout
    command = [sys.executable, *replays[0][1].split()[1:]]
    assert command[command.index("--impl") + 1] == "attnformal.examples.triton_tutorial:attention_tma"

    def replay(folder):
        monkeypatch.setenv("ATTNFORMAL_KERNEL_FILE", str(folder / "06-fused-attention.py"))
        return _run(command, tmp_path, interpreted=True)

    replayed = replay(planted)
    assert replayed.returncode == 1 and "result: FAIL" in replayed.stdout, replayed.stdout + replayed.stderr
    assert "[float16]" in replayed.stdout and shown in replayed.stdout, replayed.stdout
    control = replay(shipped)  # the same case on the kernel without the defect
    assert control.returncode == 0 and "result: pass" in control.stdout, control.stdout + control.stderr
    monkeypatch.delenv("ATTNFORMAL_KERNEL_FILE")
    untold = _run(command, tmp_path, interpreted=True)
    assert untold.returncode == 2 and "environment variable ATTNFORMAL_KERNEL_FILE: expected the path" in untold.stderr
