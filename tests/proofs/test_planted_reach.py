"""Issue 24's bugs, planted in a copy of the tree: each was once proved (exit 0) although it changes
what the torch kernel computes; now ``prove`` refutes each in the obligation named here.

Same machinery as :mod:`test_planted_bugs` (the copy, the one-line change that must occur exactly
once, the prover's command line on the copy with ``--only``).
"""

from __future__ import annotations

import pytest

from test_planted_bugs import failures, installed_copy, plant, prove

# (name, file, text, replacement, obligation that must refute it)
PLANTED = [
    ("spec.kv_heads maps h to h % Hkv", "attnformal/spec.py",
     "return kv_head_of(torch.arange(self.heads_q, device=device), self.heads_q, self.heads_kv)",
     "return torch.arange(self.heads_q, device=device) % self.heads_kv", 19),
    ("the sink merged into every split-KV part", "attnformal/kernels/split_kv.py",
     "state = initial_state(empty, sinks) if part == 0 else empty", "state = initial_state(empty, sinks)", 17),
    ("ALiBi's sign flipped", "attnformal/features/alibi.py",
     "return -slope * ops.maximum(distance, -distance)", "return slope * ops.maximum(distance, -distance)", 18),
    ("ALiBi aligned top-left (no Sk - Sq shift)", "attnformal/features/alibi.py",
     "distance = i + len_k - len_q - j", "distance = i - j", 18),
    ("varlen.sequence_start off by one", "attnformal/features/varlen.py",
     "first token of sequence ``b``.\"\"\"\n    return element(cu, b)\n",
     "first token of sequence ``b``.\"\"\"\n    return element(cu, b) + 1\n", 16),
]


@pytest.mark.parametrize("name, file, text, replacement, obligation", PLANTED, ids=[p[0] for p in PLANTED])
def test_issue_24s_bug_is_refuted_in_its_obligation(tmp_path, name, file, text, replacement, obligation):
    folder = installed_copy(tmp_path)
    plant(folder, file, text, replacement)
    result = prove(folder, "--only", str(obligation), "--timeout", "600")
    assert result.returncode == 1, result.stdout + result.stderr
    assert (obligation, "refuted") in failures(result.stdout), result.stdout[-3000:]
