"""Bugs planted in the source make ``python -m attnformal.prove`` fail, naming the obligation.

Each case copies the package as it installs (``attnformal/``, with ``proofs/`` and ``kernels/``
inside) to a temporary folder, changes one line of the source there, and runs the prover's
command line on that copy. The first seven are the bugs of issue 9 that once got through.

To keep CI lean each run selects, with ``--only``, the obligation that must catch the bug: the
full run fails whenever one obligation does (its exit code is the AND of all of them), and one
case below runs the full prover to show it. A case fails here if the text to change is not in
the source exactly once, so a refactoring cannot silently turn a case into a no-op.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (name, file, text, replacement, obligation that must fail, how it fails)
PLANTED = [
    # -- the seven of issue 9
    ("window aligned top-left under top-left causal", "attnformal/features/window.py",
     "i + g.offset - left", "i + (0 if g.causal == 'top_left' else g.offset) - left", 10, "refuted"),
    ("strict diagonal under top-left causal with a window", "attnformal/masks.py",
     "    return lo, hi\n", "    if g.causal == 'top_left' and g.window is not None:\n"
                           "        hi = ops.minimum(hi, i - 1)\n    return lo, hi\n", 10, "refuted"),
    ("TileSchedule.kv_range drops the last visited block", "attnformal/schedule.py",
     "        return blocks(*kv_block_range(bm, g, self.block_m, self.block_n))",
     "        start, stop = kv_block_range(bm, g, self.block_m, self.block_n)\n"
     "        return blocks(start, ops.maximum(start, stop - 1))", 5, "refuted"),
    ("TileSchedule.split_ranges drops a block per split", "attnformal/schedule.py",
     "ops.minimum(start + (s + 1) * per_split, end)", "ops.minimum(start + (s + 1) * per_split - 1, end)",
     11, "refuted"),
    ("class_table ignores kv_lens", "attnformal/schedule.py",
     "self.tile_class(bm, bn, spec.geometry(b))", "self.tile_class(bm, bn, spec.geometry())", 12, "refuted"),
    ("spec.geometry ignores kv_lens", "attnformal/spec.py",
     "len_k = f.key_length(f.geometry_value(value, b), len_k)", "len_k = self.len_k", 10, "refuted"),
    ("ops.floordiv on Python ints truncates", "attnformal/ops.py", "        return a // b", "        return int(a / b)",
     13, "refuted"),
    # -- more: merge, finalize, combine, key_interval, tile_class, kv_head_of, ops, launch code
    ("merge forgets to rescale the accumulator", "attnformal/merge.py",
     "alpha * a.acc + beta * b.acc", "a.acc + beta * b.acc", 1, "refuted"),
    ("finalize without the log", "attnformal/merge.py",
     "state.m + ops.log(l_safe)", "state.m + l_safe", 3, "refuted"),
    ("combine drops the last split", "attnformal/kernels/split_kv.py",
     "functools.reduce(merge, partials)", "functools.reduce(merge, partials[:-1] or partials)", 11, "refuted"),
    ("bottom-right causal one key too far", "attnformal/features/causal.py",
     "else i + g.offset)", "else i + g.offset + 1)", 10, "refuted"),
    ("FULL tested on the first row's interval start", "attnformal/schedule.py",
     "lo_last <= c0, hi_first >= c1 - 1", "lo_first <= c0, hi_first >= c1 - 1", 5, "refuted"),
    ("num_q_blocks rounds down", "attnformal/schedule.py",
     "return ops.cdiv(g.len_q, self.block_m)", "return ops.floordiv(g.len_q, self.block_m)", 5, "refuted"),
    ("kv_range built with range() on the bounds", "attnformal/schedule.py",
     "        return blocks(*kv_block_range(bm, g, self.block_m, self.block_n))",
     "        start, stop = kv_block_range(bm, g, self.block_m, self.block_n)\n"
     "        return range(start, stop - 1)", 5, "unknown"),
    ("GQA divides by the KV head count", "attnformal/spec.py",
     "ops.floordiv(h, ops.floordiv(heads_q, heads_kv))", "ops.floordiv(h, heads_kv)", 6, "refuted"),
    ("torch floordiv truncates", "attnformal/ops.py",
     'rounding_mode="floor"', 'rounding_mode="trunc"', 13, "refuted"),
    ("Triton host row intervals one key short", "attnformal/kernels/triton_flash.py",
     "hi.clamp(-1, spec.len_k - 1)", "(hi - 1).clamp(-1, spec.len_k - 1)", 12, "refuted"),
]


def installed_copy(folder: Path) -> Path:
    """The package laid out as it installs: proofs/ and kernels/ inside attnformal/."""
    shutil.copytree(ROOT / "attnformal", folder / "attnformal", ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("proofs", "kernels"):
        shutil.copytree(ROOT / part, folder / "attnformal" / part, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def plant(folder: Path, file: str, text: str, replacement: str):
    path = folder / file
    source = path.read_text()
    assert source.count(text) == 1, f"the text to change occurs {source.count(text)} times in {file}"
    path.write_text(source.replace(text, replacement))


def prove(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, "-m", "attnformal.prove", *argv], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def failures(stdout: str) -> list[tuple[int, str]]:
    """``(obligation, status)`` of each failed check the table reports."""
    return [(int(n), status) for n, status in re.findall(r"^obligation (\d+) \(.*\) FAILED: (\w+):", stdout, re.M)]


def test_the_copy_is_what_runs_and_it_proves(tmp_path):
    folder = installed_copy(tmp_path)
    result = prove(folder, "--only", "mask_semantics")
    assert result.returncode == 0, result.stdout + result.stderr
    where = subprocess.run([sys.executable, "-c", "import attnformal.proofs, attnformal.kernels.split_kv as s; "
                            "print(attnformal.proofs.__file__, s.__file__)"], cwd=folder,
                           env={**os.environ, "PYTHONPATH": str(folder)}, capture_output=True, text=True)
    assert all(path.startswith(str(folder)) for path in where.stdout.split()), where.stdout + where.stderr


@pytest.mark.parametrize("name, file, text, replacement, obligation, how", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_bug_fails_the_prover_naming_its_obligation(tmp_path, name, file, text, replacement, obligation,
                                                               how):
    if file.endswith("triton_flash.py"):
        pytest.importorskip("triton")
    folder = installed_copy(tmp_path)
    plant(folder, file, text, replacement)
    result = prove(folder, "--only", str(obligation))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (obligation, how) in failures(result.stdout), result.stdout[-3000:]


def test_the_full_run_fails_on_a_bug_only_one_obligation_sees(tmp_path):
    folder = installed_copy(tmp_path)
    # (Python's floordiv truncating, once the example, is now also seen by 12: the chunked launch tables divide
    # negative positions; kv_head_of's wrong divisor by 19 too, through spec.kv_heads. Issue 24's kv_heads bug,
    # once proved, is seen by 19 alone.)
    plant(folder, "attnformal/spec.py",
          "return kv_head_of(torch.arange(self.heads_q, device=device), self.heads_q, self.heads_kv)",
          "return torch.arange(self.heads_q, device=device) % self.heads_kv")
    result = prove(folder, "--timeout", "600")  # a generous budget: under load no verdict comes from a timeout
    assert result.returncode == 1, result.stdout + result.stderr
    assert {n for n, _ in failures(result.stdout)} == {19}, result.stdout[-3000:]
