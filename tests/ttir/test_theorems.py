"""The TTIR theorems on the shipped forward and dQ kernels, and bugs planted in copies of their source refuted.

Lowering needs Triton's compiler, not its interpreter (which the suite's conftest turns on), so each
case runs in a child Python without ``TRITON_INTERPRET``. Each planted copy is compiled once and only
the theorem that must refute it is run. ``ATTNFORMAL_TTIR_TARGET=ascend`` (``make ascend-check``, in the
triton-ascend environment) lowers with triton-ascend's front end instead of CUDA's.
"""

import inspect
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from attnformal.ttir.theorems import THEOREMS  # noqa: E402

SOURCE = pathlib.Path(__file__).parents[2] / "kernels" / "triton_flash.py"
CHILD = """
import json, sys
from attnformal.ttir import launch
from attnformal.ttir.theorems import load_attr, prove_launch
described = getattr(launch, sys.argv[4])
fn = load_attr(sys.argv[1]) if sys.argv[1] else None
(config, proofs), = prove_launch(described, fn=fn, theorems=sys.argv[2].split(","),
                                 configs=[described.configs[int(sys.argv[3])]], target=sys.argv[5])
print(json.dumps([[p.status, p.claim, p.detail] for p in proofs]))
"""
# kernel -> its description in attnformal/ttir/launch.py
LAUNCHES = {"_attn_fwd": "FORWARD", "_attn_bwd_dq": "BACKWARD_DQ", "_attn_bwd_dkdv": "BACKWARD_DKDV"}
# indices into FORWARD.configs: CAUSAL_MODES order, then with the softcap, then with every feature (data masks, bias)
NOT_CAUSAL, BOTTOM_RIGHT, SOFTCAP, EVERY_FEATURE = 0, 2, 3, 6
CONFIG_IDS = [f"{causal}{features}" for features in ("", ", softcap", ", every feature")
              for causal in ("not causal", "top-left", "bottom-right")]
TARGET = os.environ.get("ATTNFORMAL_TTIR_TARGET", "cuda")  # whose front end lowers the kernels


def _prove(theorems, kernel="", config=NOT_CAUSAL, function="_attn_fwd", described=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    described = described or LAUNCHES[function]
    done = subprocess.run([sys.executable, "-c", CHILD, kernel, theorems, str(config), described, TARGET],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _kernel_source(text, function="_attn_fwd"):
    """The span of a kernel in the kernel file (helpers it calls come before it): to the next unindented line."""
    start = text.index(f"def {function}(")
    end = re.compile(r"\n(?=[^\s)])").search(text, start)
    return start, end.start() if end else len(text)


def _plant(old, new, *, anywhere=False, function="_attn_fwd"):
    """A textual edit of the kernel file: ``old`` must occur once (in ``function`` unless ``anywhere``)."""
    def edit(text):
        start, end = (0, len(text)) if anywhere else _kernel_source(text, function)
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


def _statement_lines(text, line):
    """The lines of the statement that starts at ``line``: a call written over several lines is located at its
    first by Triton >= 3.3 and at its last by Triton 3.2 (triton-ascend)."""
    lines, depth = text.splitlines(), 0
    for k in range(line - 1, len(lines)):
        depth += lines[k].count("(") - lines[k].count(")")
        if depth <= 0:
            return range(line, k + 2)
    return range(line, line + 1)


_LOOP = SOURCE.read_text()[slice(*_kernel_source(SOURCE.read_text()))]
_LOOP = _LOOP[_LOOP.index("    for bn in range("):_LOOP.index("\n\n    state_rows")]


def _visit_last_block_again(loop):
    """After the loop, the same body over the range's last block (the diagonal one under causal)."""
    again = loop.replace("range(tl.load(split_range), tl.load(split_range + 1))",
                         "range(tl.maximum(tl.load(split_range), tl.load(split_range + 1) - 1), "
                         "tl.load(split_range + 1))")
    return loop + "\n" + again


DQ, DKDV = "_attn_bwd_dq", "_attn_bwd_dkdv"

# (name, edit, theorem, claim prefix, marker of the line the refutation names (_line_of), config)
FORWARD_PLANTED = [
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
    ("attn_mask's False let through", _plant("allowed = allowed & _load_flags(", "allowed = allowed | _load_flags(",
                                             anywhere=True),
     "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), EVERY_FEATURE),
    ("mask flags read transposed", _plant("rows[:, None].to(tl.int64) * stride_i + cols[None, :].to(tl.int64) * stride_j",
                                          "rows[:, None].to(tl.int64) * stride_j + cols[None, :].to(tl.int64) * stride_i",
                                          anywhere=True),
     "address", "address: load of ATTN_MASK", ("_load_flags", "flags = tl.load(", 0), EVERY_FEATURE),
    ("bias of the batch's first head", _plant("bias_base = BIAS + bh * seq_q * seq_k",
                                              "bias_base = BIAS + b * heads_q * seq_q * seq_k"),
     "address", "address: load of BIAS", ("_load_rows", "return tl.load(", 0), EVERY_FEATURE),
    ("keep flags of head 0", _plant("keep_base = _flags_base(KEEP, b, h,", "keep_base = _flags_base(KEEP, b, 0,"),
     "merge", "merge: the keep flags", ("_load_flags", "flags = tl.load(", 0), EVERY_FEATURE),
    # the merge theorem names the first line where the kernel's (m, l, acc) tree departs from the spec's
    ("dropout applied before the denominator",
     _plant("        l_ij = tl.sum(p, 1)\n        if HAS_KEEP:\n"
            "            p = p * _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj)\n",
            "        if HAS_KEEP:\n"
            "            p = p * _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj)\n"
            "        l_ij = tl.sum(p, 1)\n"),
     "merge", "merge: l after an iteration", ("_attn_fwd", "p = p * _keep_weights(", 0), EVERY_FEATURE),
    ("l not rescaled by alpha", _plant("return m, alpha * l_a +", "return m, l_a +", anywhere=True),
     "merge", "merge: l after an iteration", ("_merge", "return m, ", 0), NOT_CAUSAL),
    ("acc weights swapped", _plant("alpha[:, None] * acc_a + beta[:, None] * acc_b",
                                   "beta[:, None] * acc_a + alpha[:, None] * acc_b", anywhere=True),
     "merge", "merge: acc after an iteration", ("_merge", "beta = tl.exp(", 0), NOT_CAUSAL),
    ("exp without the empty-row shift guard", _plant("tl.exp(s - _finite_shift(m_ij)[:, None])",
                                                     "tl.exp(s - m_ij[:, None])"),
     "merge", "merge: l after an iteration", ("_attn_fwd", "p = tl.exp(s -", 0), NOT_CAUSAL),
    ("running max starts at 0", _plant('m_i = tl.full([BLOCK_M], float("-inf"), M_PART.dtype.element_ty)',
                                       "m_i = tl.zeros([BLOCK_M], M_PART.dtype.element_ty)"),
     "merge", "merge: the loop at", ("_attn_fwd", "for bn in range(", 0), NOT_CAUSAL),
]

DQ_PLANTED = [
    ("dQ: key loop one block short", _plant("tl.load(kv_range + 1)):", "tl.load(kv_range + 1) - 1):", function=DQ),
     "coverage", "coverage:", (DQ, "for bn in range(", 0), NOT_CAUSAL),
    ("dQ: K read with the query head", _plant("k_base = K + kv_bh * seq_k", "k_base = K + bh * seq_k", function=DQ),
     "address", "address: load of K", (DQ, "k = _load_rows(k_base", 0), NOT_CAUSAL),
    ("dQ: lse rows strided by the head dim", _plant("stats = bh * seq_q + rows", "stats = bh * head_dim + rows",
                                                anywhere=True),
     "address", "address: load of LSE", ("_load_query_rows", "lse = tl.load(LSE", 0), NOT_CAUSAL),
    ("dQ: every tile taken as FULL", _plant("tl.load(class_row + bn),", "2,", function=DQ),
     "masking", "masking:", (DQ, "_, ds, slope = _tile_grads(", 0), BOTTOM_RIGHT),
    ("dQ: tail rows stored past the end", _plant("mask=(rows[:, None] < seq_q) & (dims[None, :] < head_dim))",
                                                  "mask=dims[None, :] < head_dim)", function=DQ),
     "address", "address: store of DQ", (DQ, "tl.store(DQ", 0), NOT_CAUSAL),
    ("dQ: dS stored to DBIAS with Sq's row stride", _plant("rows[:, None].to(tl.int64) * seq_k + cols[None, :], ds,",
                                                         "rows[:, None].to(tl.int64) * seq_q + cols[None, :], ds,",
                                                         function=DQ),
     "address", "address: store of DBIAS", (DQ, "tl.store(DBIAS", 0), EVERY_FEATURE),
    # the merge theorem holds each loop's gradient sums to the spec's state + score_grads(s, ...), op for op
    ("dQ: dS with delta added", _plant("ds = p * (dp - delta[:, None])", "ds = p * (dp + delta[:, None])",
                                      anywhere=True),
     "merge", "merge: dq (stored to ", ("_tile_grads", "ds = p * (dp", 0), NOT_CAUSAL),
    ("dQ: P without the empty-row shift guard", _plant("tl.exp(s - _finite_shift(lse)[:, None])",
                                                       "tl.exp(s - lse[:, None])", anywhere=True),
     "merge", "merge: dq (stored to ", ("_tile_grads", "p = tl.exp(s -", 0), NOT_CAUSAL),
    ("dQ: the scale left out of a tile's sum", _plant("dq += scale * _dot(", "dq += _dot(", function=DQ),
     "merge", "merge: dq (stored to ", (DQ, "dq += _dot(", 0), NOT_CAUSAL),
]
DKDV_PLANTED = [
    ("dK/dV: one query head of the group missed", _plant("for g in range(group):", "for g in range(group - 1):",
                                                          function=DKDV),
     "coverage", "coverage:", (DKDV, "for g in range(group", 0), NOT_CAUSAL),
    ("dK/dV: every iteration reads the group's first head", _plant("h = first_head + g", "h = first_head + 0 * g",
                                                                   function=DKDV),
     "address", "address: load of Q", ("_load_rows", "return tl.load(", 0), NOT_CAUSAL),
    ("dK/dV: query loop one block short", _plant("tl.load(q_range + 1)):", "tl.load(q_range + 1) - 1):",
                                                 function=DKDV),
     "coverage", "coverage:", (DKDV, "for bm in range(", 0), NOT_CAUSAL),
    ("dK/dV: K addressed with V's head dim", _plant("K + bhk * seq_k * head_dim,", "K + bhk * seq_k * head_dim_v,",
                                                    function=DKDV),
     "address", "address: load of K", ("_load_rows", "return tl.load(", 0), NOT_CAUSAL),
    ("dK/dV: DK stored past the last key", _plant("mask=in_cols & (dims[None, :] < head_dim))",
                                                  "mask=dims[None, :] < head_dim)", function=DKDV),
     "address", "address: store of DK", (DKDV, "tl.store(DK", 0), NOT_CAUSAL),
    ("dK/dV: dV weighted by dS instead of P", _plant("tl.trans(p_kept.to(do.dtype))", "tl.trans(ds.to(do.dtype))",
                                                     function=DKDV),
     "merge", "merge: dv (stored to ", (DKDV, "tl.trans(ds.to(do.dtype))", 0), NOT_CAUSAL),
    ("dK/dV: the softcap's slope left out of dK", _plant("tl.trans((ds * slope).to(q.dtype))",
                                                         "tl.trans(ds.to(q.dtype))", function=DKDV),
     "merge", "merge: dk (stored to ", (DKDV, "dk += scale", 0), SOFTCAP),
    ("dK/dV: the sums restarted for each query head", _plant("        h = first_head + g\n",
                                                             "        h = first_head + g\n"
                                                             "        dk = tl.zeros([BLOCK_N, BLOCK_D], LSE.dtype.element_ty)\n",
                                                             function=DKDV),
     "merge", "merge: the loop at", (DKDV, "for g in range(", 0), NOT_CAUSAL),
    ("dK/dV: dV without the dropout weights", _plant("p_kept = p * weights", "p_kept = p", anywhere=True),
     "merge", "merge: dv (stored to ", (DKDV, "dv += _dot(", 0), EVERY_FEATURE),
    ("dK/dV: dK's slope of the biased scores", _plant("        s = s + _load_rows(bias_base, rows, cols, seq_q, seq_k)\n",
                                                      "        s = s + _load_rows(bias_base, rows, cols, seq_q, seq_k)\n"
                                                      "        slope = 1.0 - (s / softcap) * (s / softcap)\n",
                                                      anywhere=True),
     "merge", "merge: dk (stored to ", ("_tile_scores", "slope = 1.0 - (s / softcap)", 0), EVERY_FEATURE),
    ("dK/dV: DK stores the dV sum", _plant("dk.to(DK.dtype.element_ty)", "dv.to(DK.dtype.element_ty)", function=DKDV),
     "merge", "merge: dk (stored to DK", (DKDV, "tl.store(DK", 0), NOT_CAUSAL),
]
PLANTED = [(*planted, "_attn_fwd") for planted in FORWARD_PLANTED] + [(*planted, DQ) for planted in DQ_PLANTED] \
    + [(*planted, DKDV) for planted in DKDV_PLANTED]


def _count(counts, config):
    """The number of theorems of a configuration: without features, with the softcap, with every feature."""
    return counts[2 if config >= EVERY_FEATURE else 1 if config >= SOFTCAP else 0]


@pytest.mark.parametrize("config", range(len(CONFIG_IDS)), ids=CONFIG_IDS)
def test_shipped_forward_is_proved_for_all_shapes(config):
    """Each shipped configuration (128x64): no-wrap, address, bounds, masking (at the row max and at the exp),
    coverage, writes and merge (the unit, then m, l and acc), all proved (loading the softcap scalar adds its
    pointer's no-wrap and its bounds). With every feature the masking claim includes the attn_mask's element and
    the merge proves the dropout weights' keep flags are the pairs'."""
    proofs = _prove("no-wrap,address,bounds,masking,coverage,writes,merge", config=config)
    assert len(proofs) == _count((86, 88, 118), config) and all(status == "proved" for status, _, _ in proofs), \
        [p for p in proofs if p[0] != "proved"]
    assert {claim.split(":")[0] for _, claim, _ in proofs} >= {"no-wrap", "address", "bounds", "masking", "coverage",
                                                               "writes", "merge"}
    every = config >= EVERY_FEATURE
    assert sum(claim.startswith("merge:") for _, claim, _ in proofs) == 4 + every
    assert every == any(claim.startswith("merge: the keep flags") for _, claim, _ in proofs)
    assert every == all("and ATTN_MASK[b, h, i, j]" in claim for _, claim, _ in proofs if claim.startswith("masking:"))


@pytest.mark.parametrize("config", range(len(CONFIG_IDS)), ids=CONFIG_IDS)
@pytest.mark.parametrize("function, counts, table, sums", [(DQ, (79, 81, 116), "KV_RANGES[b, bm, 0:2]", ("dq",)),
                                                            (DKDV, (93, 95, 125), "Q_RANGES[b, bn, 0:2]", ("dk", "dv"))])
def test_shipped_backward_is_proved_for_all_shapes(config, function, counts, table, sums):
    """The dQ and dK/dV kernels, each shipped configuration: the forward's theorems over Q, DO, LSE, DELTA, K, V and
    the stores; masking at the exp that weighs the scores by the saved lse (the backward has no row max); dK/dV's
    loop over the query heads of its group runs over exactly [0, G); each gradient sum starts from 0 and adds the
    spec's score_grads of each tile (dK/dV's head loop carries them through its query-block loop)."""
    proofs = _prove("no-wrap,address,bounds,masking,coverage,writes,merge", config=config, function=function)
    assert len(proofs) == _count(counts, config) and all(status == "proved" for status, _, _ in proofs), \
        [p for p in proofs if p[0] != "proved"]
    assert any(claim.startswith("masking: scores weighed by the exp") for _, claim, _ in proofs)
    assert any(claim.startswith("coverage: the block loop") and table in claim for _, claim, _ in proofs)
    assert (function == DKDV) == any("runs over [0, G)" in claim for _, claim, _ in proofs)
    assert [name for name in sums if any(claim.startswith(f"merge: {name} (stored to {name.upper()} at ")
                                         and "score_grads" in claim
                                         for _, claim, _ in proofs)] == list(sums)


@pytest.mark.parametrize("name, edit, theorem, prefix, marker, config, function", PLANTED,
                         ids=[p[0] for p in PLANTED])
def test_planted_bug_is_refuted_with_its_line(tmp_path, name, edit, theorem, prefix, marker, config, function,
                                              source=SOURCE, described=None):
    text = edit(source.read_text())
    path = tmp_path / "planted_flash.py"
    path.write_text(text)
    proofs = _prove(theorem, f"{path}:{function}", config, function, described)
    lines = _statement_lines(text, _line_of(text, marker))
    refuted = [(claim, detail) for status, claim, detail in proofs if status == "refuted" and claim.startswith(prefix)]
    # a claim names the line; a merge refutation names it where its trees first differ (or a call on the way there)
    named = [claim + (detail.split(": the kernel computes")[0] if theorem == "merge" else "") for claim, detail in refuted]
    assert any(re.search(rf"(planted_flash\.py:|line ){line}\b", text) for text in named for line in lines), \
        (lines, proofs)
    if "-1e6" in name:
        assert all("-1e+06 is finite" in detail for _, detail in refuted)


def test_a_sum_stored_other_than_as_a_loop_result_leaves_the_merge_unknown(tmp_path):
    """Each backward sum is bound to the loop result its store writes; DK storing ``2 * dk`` writes none of them, so
    the merge theorem is unknown (never proved, and not refuted against a value picked by position)."""
    text = _plant("dk.to(DK.dtype.element_ty)", "(2.0 * dk).to(DK.dtype.element_ty)", function=DKDV)(SOURCE.read_text())
    path = tmp_path / "planted_flash.py"
    path.write_text(text)
    proofs = _prove("merge", f"{path}:{DKDV}", NOT_CAUSAL, DKDV)
    assert [status for status, _, _ in proofs] == ["unknown"], proofs
    assert "1 stores of DK, writing 0 of the results" in proofs[0][2]


# A kernel with block pointers (tests/ttir/block_pointer_attention.py) under the Triton tutorial's launch description:
# make_tensor_ptr, advance and block pointers carried by the key loop. Recent Triton (3.9 here) has no block
# pointers; the triton-ascend environment (make ascend-check) lowers it.
BLOCK_POINTER_SOURCE = pathlib.Path(__file__).parent / "block_pointer_attention.py"
needs_block_pointers = pytest.mark.skipif("removed" in inspect.getsource(tl.make_block_ptr),
                                          reason="this Triton has no block pointers (removed: triton-lang/triton#6847)")
BLOCK_POINTER_PLANTED = [
    ("K addressed with Q's batch and head strides", _plant("K + z * stride_kz + h * stride_kh",
                                                           "K + z * stride_qz + h * stride_qh"),
     "address", "address: load of K", ("_attn_fwd", "tl.load(k_tile)", 0), 0),
    ("finite -1e6 fill (the tutorial's)", _plant('s, float("-inf"))', "s, -1.0e6)"),
     "masking", "masking", ("_attn_fwd", "s = tl.where(rows", 0), 1),
    ("K advanced half a block", _plant("k_tile = tl.advance(k_tile, (0, BLOCK_N))",
                                       "k_tile = tl.advance(k_tile, (0, BLOCK_N // 2))"),
     "address", "address: load of K", ("_attn_fwd", "tl.load(k_tile)", 0), 0),
    ("V advanced along the head dim", _plant("v_tile = tl.advance(v_tile, (BLOCK_N, 0))",
                                             "v_tile = tl.advance(v_tile, (0, BLOCK_N))"),
     "address", "address: load of V", ("_attn_fwd", "tl.load(v_tile)", 0), 0),
    ("the key loop one block short", _plant("range(0, end, BLOCK_N)", "range(0, end - BLOCK_N, BLOCK_N)"),
     "coverage", "coverage", ("_attn_fwd", "for start_n in range(", 0), 1),
]


def _all_proved_but(kernel, config, described, unproved):
    proofs = _prove(",".join(THEOREMS), kernel, config, described=described)
    left = [(status, claim) for status, claim, _ in proofs if status != "proved"]
    assert len(proofs) > 40 and left == list(unproved), left


# A kernel with host tensor descriptors (tests/ttir/descriptor_attention.py) under the tutorial's TMA launch
# description: CUDA's ttir stage rewrites the descriptors to pointer arithmetic, with a loop-carried row index.
DESCRIPTOR_SOURCE = pathlib.Path(__file__).parent / "descriptor_attention.py"
needs_cuda_descriptors = pytest.mark.skipif(TARGET != "cuda", reason="host tensor descriptors: lowered for CUDA here")
DESCRIPTOR_PLANTED = [
    ("the tutorial's batch offset off_z + off_h * N_CTX",
     _plant("head_row = off_hz * N_CTX", "head_row = off_hz // H + off_hz % H * N_CTX", function="_attn_fwd_tma"),
     "address", "address: load of desc_q", ("_attn_fwd_tma", "q = desc_q.load", 0), 0),
    ("key rows never advanced", _plant("key_row += BLOCK_N", "key_row += 0", function="_attn_fwd_tma"),
     "address", "address: load of desc_k", ("_attn_fwd_tma", "desc_k.load", 0), 0),
    ("finite -1e6 fill", _plant('s, float("-inf"))', "s, -1.0e6)", function="_attn_fwd_tma"),
     "masking", "masking", ("_attn_fwd_tma", "s = tl.where(rows", 0), 1),
    # the base-2 merge, in real arithmetic: refuted by a float64 valuation, named by the loop
    ("l not rescaled by alpha", _plant("l = l * alpha + tl.sum(p, 1)", "l = l + tl.sum(p, 1)", function="_attn_fwd_tma"),
     "merge", "merge: (acc, l, m: iter_args 0, 1, 2) after an iteration", ("_attn_fwd_tma", "for start_n in range(", 0), 0),
    ("alpha in base e", _plant("alpha = tl.exp2(m - m_new)", "alpha = tl.exp(m - m_new)", function="_attn_fwd_tma"),
     "merge", "merge: (acc, l, m: iter_args 0, 1, 2) after an iteration", ("_attn_fwd_tma", "for start_n in range(", 0), 1),
]


# The kernels written here for the tutorial's two launch descriptions: (skip mark, source, kernel, description,
# what stays unproved: the descriptor's "every o element is stored" runs out of its Z3 budget, the flattened view's
# row bound Z * H * N_CTX being a product of three unknowns)
OWN_KERNELS = {
    "block_pointer": (needs_block_pointers, BLOCK_POINTER_SOURCE, "_attn_fwd", "TRITON_TUTORIAL", ()),
    "descriptor": (needs_cuda_descriptors, DESCRIPTOR_SOURCE, "_attn_fwd_tma", "TRITON_TUTORIAL_TMA",
                   (("unknown", "writes: every desc_o element is stored (descriptor_attention.py:41)"),)),
}


@pytest.mark.parametrize("kernel, config", [pytest.param(kernel, config, marks=OWN_KERNELS[kernel][0],
                                                         id=f"{kernel}, {'causal' if config else 'not causal'}")
                                            for kernel in OWN_KERNELS for config in (0, 1)])
def test_tutorial_shaped_kernel_is_proved_for_all_shapes_and_strides(kernel, config):
    _, source, function, described, unproved = OWN_KERNELS[kernel]
    _all_proved_but(f"{source}:{function}", config, described, unproved)


@pytest.mark.parametrize("kernel, name, edit, theorem, prefix, marker, config", [
    pytest.param(kernel, *bug, marks=OWN_KERNELS[kernel][0], id=f"{kernel}: {bug[0]}")
    for kernel, bugs in (("block_pointer", BLOCK_POINTER_PLANTED), ("descriptor", DESCRIPTOR_PLANTED)) for bug in bugs])
def test_planted_bug_in_a_tutorial_shaped_kernel_is_refuted(tmp_path, kernel, name, edit, theorem, prefix, marker,
                                                              config):
    _, source, function, described, _ = OWN_KERNELS[kernel]
    test_planted_bug_is_refuted_with_its_line(tmp_path, name, edit, theorem, prefix, marker, config, function, source,
                                              described)
