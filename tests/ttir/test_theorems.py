"""The TTIR theorems on the shipped forward kernel, and bugs planted in copies of its source refuted.

Lowering needs Triton's compiler, not its interpreter (which the suite's conftest turns on), so each
case runs in a child Python without ``TRITON_INTERPRET``. Each planted copy is compiled once and only
the theorem that must refute it is run.
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
(config, proofs), = prove_launch(FORWARD, fn=fn, theorems=sys.argv[2].split(","),
                                 configs=[FORWARD.configs[int(sys.argv[3])]])
print(json.dumps([[p.status, p.claim, p.detail] for p in proofs]))
"""
NOT_CAUSAL, BOTTOM_RIGHT, SOFTCAP = 0, 2, 3  # indices into FORWARD.configs (CAUSAL_MODES order, then with softcap)


def _prove(theorems, kernel="", config=NOT_CAUSAL):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", CHILD, kernel, theorems, str(config)], capture_output=True,
                          text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _forward_source(text):
    """The span of ``_attn_fwd`` in the kernel file (helpers it calls come before it)."""
    start = text.index("def _attn_fwd(")
    return start, text.index("\n@triton.jit", start)


def _plant(old, new, *, anywhere=False):
    """A textual edit of the kernel file: ``old`` must occur once (in ``_attn_fwd`` unless ``anywhere``)."""
    def edit(text):
        start, end = (0, len(text)) if anywhere else _forward_source(text)
        span = text[start:end]
        assert span.count(old) == 1, old
        return text[:start] + span.replace(old, new(old) if callable(new) else new) + text[end:]
    return edit


def _line_of(text, marker):
    """The 1-based line of a marker ``(function, text, occurrence)``: the occurrence-th line containing the
    text from the function's definition on."""
    function, needle, occurrence = marker
    first = text[:text.index(f"def {function}(")].count("\n") + 1
    lines = text.splitlines()
    return [k + 1 for k in range(first - 1, len(lines)) if needle in lines[k]][occurrence]


_LOOP = SOURCE.read_text()[slice(*_forward_source(SOURCE.read_text()))]
_LOOP = _LOOP[_LOOP.index("    for bn in range("):_LOOP.index("\n\n    state_rows")]


def _visit_last_block_again(loop):
    """After the loop, the same body over the range's last block (the diagonal one under causal)."""
    again = loop.replace("range(tl.load(split_range), tl.load(split_range + 1))",
                         "range(tl.maximum(tl.load(split_range), tl.load(split_range + 1) - 1), "
                         "tl.load(split_range + 1))")
    return loop + "\n" + again


# (name, edit, theorem, claim prefix, marker of the line the refutation names (_line_of), config)
PLANTED = [
    ("finite -1e6 fill", _plant('s = tl.where(allowed, s, float("-inf"))', 's = tl.where(allowed, s, -1e6)',
                                anywhere=True),
     "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), NOT_CAUSAL),
    ("tail rows not stored", _plant("in_rows = rows < seq_q", "in_rows = rows < (seq_q // BLOCK_M) * BLOCK_M"),
     "writes", "writes: every M_PART element", ("_attn_fwd", "tl.store(M_PART", 0), NOT_CAUSAL),
    ("head map h % Hkv", _plant("b * (heads_q // group) + _kv_head_of(h, group)",
                                "b * (heads_q // group) + h % (heads_q // group)", anywhere=True),
     "address", "address: load of K", ("_attn_fwd", "k = _load_rows(k_base", 0), NOT_CAUSAL),
    ("K read with Q's length", _plant("k_base = K + kv_bh * seq_k * head_dim", "k_base = K + kv_bh * seq_q * head_dim"),
     "address", "address: load of K", ("_attn_fwd", "k = _load_rows(k_base", 0), NOT_CAUSAL),
    ("missing batch offset", _plant("q = _load_rows(Q + bh * seq_q * head_dim",
                                    "q = _load_rows(Q + h * seq_q * head_dim"),
     "address", "address: load of Q", ("_attn_fwd", "q = _load_rows(Q", 0), NOT_CAUSAL),
    ("causal aligned top-left", _plant("(cols[None, :] <= row_hi[:, None])", "(cols[None, :] <= rows[:, None])",
                                       anywhere=True),
     "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), BOTTOM_RIGHT),
    ("softcap applied after the mask", _plant('        s = tl.where(allowed, s, float("-inf"))\n    return s, slope',
                                              '        s = tl.where(allowed, s, float("-inf"))\n'
                                              '    s = _modify_scores(s, softcap, HAS_SOFTCAP)[0]\n    return s, slope',
                                              anywhere=True),
     "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), SOFTCAP),
    ("loop one block short", _plant("tl.load(split_range + 1)):", "tl.load(split_range + 1) - 1):"),
     "coverage", "coverage:", ("_attn_fwd", "for bn in range(", 0), NOT_CAUSAL),
    ("diagonal block visited twice", _plant(_LOOP, _visit_last_block_again),
     "coverage", "coverage:", ("_attn_fwd", "for bn in range(", 1), BOTTOM_RIGHT),
    ("overlapping split parts", _plant("* num_splits + split) * 2", "* num_splits) * 2"),
     "coverage", "coverage:", ("_attn_fwd", "for bn in range(", 0), NOT_CAUSAL),
    ("lse (row max) stored under the wrong mask", _plant("tl.store(M_PART + state_rows, m_i, mask=in_rows)",
                                                         "tl.store(M_PART + state_rows, m_i, mask=rows < seq_k)"),
     "writes", "writes: no two programs or lanes store the same M_PART", ("_attn_fwd", "tl.store(M_PART", 0), NOT_CAUSAL),
]


@pytest.mark.parametrize("config", range(6), ids=[f"{causal}{softcap}" for softcap in ("", ", softcap")
                                                   for causal in ("not causal", "top-left", "bottom-right")])
def test_shipped_forward_is_proved_for_all_shapes(config):
    """Each shipped configuration (128x64): no-wrap, address, bounds, masking, coverage and writes, all proved
    (loading the softcap scalar adds its pointer's no-wrap and its bounds)."""
    proofs = _prove("no-wrap,address,bounds,masking,coverage,writes", config=config)
    assert len(proofs) == (81 if config >= SOFTCAP else 79) and all(status == "proved" for status, _, _ in proofs), \
        [p for p in proofs if p[0] != "proved"]
    assert {claim.split(":")[0] for _, claim, _ in proofs} >= {"no-wrap", "address", "bounds", "masking", "coverage",
                                                               "writes"}


@pytest.mark.parametrize("name, edit, theorem, prefix, marker, config", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bug_is_refuted_with_its_line(tmp_path, name, edit, theorem, prefix, marker, config):
    text = edit(SOURCE.read_text())
    path = tmp_path / "planted_flash.py"
    path.write_text(text)
    proofs = _prove(theorem, f"{path}:_attn_fwd", config)
    line = _line_of(text, marker)
    refuted = [(claim, detail) for status, claim, detail in proofs if status == "refuted" and claim.startswith(prefix)]
    assert any(f"planted_flash.py:{line}" in claim or f"line {line}" in claim for claim, _ in refuted), \
        (line, proofs)
    if name == "finite -1e6 fill":
        assert all("-1e+06 is finite" in detail for _, detail in refuted)
