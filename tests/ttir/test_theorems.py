"""The TTIR theorems on the shipped forward kernel, and planted bugs in copies of its source refuted.

Lowering needs Triton's compiler, not its interpreter (which the suite's conftest turns on), so each
case runs in a child Python without ``TRITON_INTERPRET``.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SOURCE = pathlib.Path(__file__).parents[2] / "kernels" / "triton_flash.py"
CHILD = """
import json, sys
from attnformal.ttir.launch import FORWARD
from attnformal.ttir.theorems import load_attr, prove_launch
fn = load_attr(sys.argv[1]) if sys.argv[1] else None
(config, proofs), = prove_launch(FORWARD, fn=fn, timeout_s=120, theorems=sys.argv[2].split(","),
                                 configs=FORWARD.configs[:1])
print(json.dumps([[p.status, p.claim, p.detail] for p in proofs]))
"""


def _prove(theorems, kernel=""):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", CHILD, kernel, theorems], capture_output=True, text=True, env=env,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _planted(tmp_path, old, new):
    text = SOURCE.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / "planted_flash.py"
    path.write_text(text.replace(old, new))
    return f"{path}:_attn_fwd"


def test_shipped_forward_masking_and_writes_are_proved():
    proofs = _prove("masking,writes")
    assert len(proofs) == 7 and all(status == "proved" for status, _, _ in proofs), proofs


def test_finite_fill_is_refuted_by_masking(tmp_path):
    kernel = _planted(tmp_path, 's = tl.where(allowed, s, float("-inf"))', 's = tl.where(allowed, s, -1e6)')
    ((status, claim, detail),) = _prove("masking", kernel)
    assert status == "refuted" and claim.startswith("masking:") and "-1e+06 is finite" in detail


def test_tail_rows_not_stored_is_refuted_by_writes(tmp_path):
    kernel = _planted(tmp_path, "in_rows = rows < seq_q", "in_rows = rows < (seq_q // BLOCK_M) * BLOCK_M")
    refuted = [claim for status, claim, _ in _prove("writes", kernel) if status == "refuted"]
    assert any(claim.startswith("writes: every M_PART element") and ":333" in claim for claim in refuted), refuted
