"""The TTIR theorems on bugs planted in copies of the shipped kernels' source, and on the kernels written here in
the Triton tutorial's shapes; the shipped kernels themselves are obligation 20 (tests/proofs/test_triton_kernels.py).

Lowering needs Triton's compiler, not its interpreter (which the suite's conftest turns on), so each case runs in
a child Python without ``TRITON_INTERPRET`` (:mod:`attnformal.ttir.child`). Each planted copy is compiled once and
only the theorem that must refute it is run. ``ATTNFORMAL_TTIR_TARGET=ascend`` (``make ascend-check``, in the
triton-ascend environment) lowers with triton-ascend's front end instead of CUDA's.
"""

import inspect
import os
import pathlib
from dataclasses import replace

import pytest

pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from attnformal.ttir import child  # noqa: E402
from attnformal.ttir.planted import FLASH as SOURCE, PlantedBug, plant  # noqa: E402
from attnformal.ttir.theorems import THEOREMS  # noqa: E402
from attnformal.proofs.triton_kernels import BOTTOM_RIGHT, CONTROLS, NOT_CAUSAL  # noqa: E402

# indices into FORWARD.configs: CAUSAL_MODES order, then with the softcap, then with every feature (data masks, bias)
SOFTCAP, EVERY_FEATURE = 3, 6
TARGET = os.environ.get("ATTNFORMAL_TTIR_TARGET", "cuda")  # whose front end lowers the kernels


def _prove(theorems, kernel="", config=NOT_CAUSAL, described="FORWARD"):
    (answer,) = child.prove([child.Request(described, kernel, tuple(theorems.split(",")), (config,), TARGET)])
    (_, proofs), = answer
    return proofs


DQ, DKDV = "_attn_bwd_dq", "_attn_bwd_dkdv"

# (name, edit, theorem, claim prefix, marker of the line the refutation names (_line_of), config)
# beyond obligation 20's ten controls (proofs/triton_kernels.py), which run here too
FORWARD_PLANTED = [
    PlantedBug("softcap applied after the mask", plant('        s = tl.where(allowed, s, float("-inf"))\n    return s, slope',
                                                        '        s = tl.where(allowed, s, float("-inf"))\n'
                                                        '    s = _modify_scores(s, softcap, HAS_SOFTCAP)[0]\n    return s, slope',
                                                        anywhere=True),
               "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), SOFTCAP),
    PlantedBug("attn_mask's False let through", plant("allowed = allowed & _load_flags(", "allowed = allowed | _load_flags(",
                                                       anywhere=True),
               "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), EVERY_FEATURE),
    PlantedBug("mask flags read transposed", plant("rows[:, None].to(tl.int64) * stride_i + cols[None, :].to(tl.int64) * stride_j",
                                                    "rows[:, None].to(tl.int64) * stride_j + cols[None, :].to(tl.int64) * stride_i",
                                                    anywhere=True),
               "address", "address: load of ATTN_MASK", ("_load_flags", "flags = tl.load(", 0), EVERY_FEATURE),
    PlantedBug("bias of the batch's first head", plant("bias_base = BIAS + bh * seq_q * seq_k",
                                                        "bias_base = BIAS + b * heads_q * seq_q * seq_k"),
               "address", "address: load of BIAS", ("_load_rows", "return tl.load(", 0), EVERY_FEATURE),
    PlantedBug("keep flags of head 0", plant("keep_base = _flags_base(KEEP, b, h,", "keep_base = _flags_base(KEEP, b, 0,"),
               "merge", "merge: the keep flags", ("_load_flags", "flags = tl.load(", 0), EVERY_FEATURE),
    # the merge theorem names the first line where the kernel's (m, l, acc) tree departs from the spec's
    PlantedBug("dropout applied before the denominator",
               plant("        l_ij = tl.sum(p, 1)\n        if HAS_KEEP:\n"
                      "            p = p * _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj)\n",
                      "        if HAS_KEEP:\n"
                      "            p = p * _keep_weights(rows, cols, seq_q, seq_k, keep_scale, keep_base, keep_si, keep_sj)\n"
                      "        l_ij = tl.sum(p, 1)\n"),
               "merge", "merge: l after an iteration", ("_attn_fwd", "p = p * _keep_weights(", 0), EVERY_FEATURE),
    PlantedBug("l not rescaled by alpha", plant("return m, alpha * l_a +", "return m, l_a +", anywhere=True),
               "merge", "merge: l after an iteration", ("_merge", "return m, ", 0), NOT_CAUSAL),
    PlantedBug("acc weights swapped", plant("alpha[:, None] * acc_a + beta[:, None] * acc_b",
                                             "beta[:, None] * acc_a + alpha[:, None] * acc_b", anywhere=True),
               "merge", "merge: acc after an iteration", ("_merge", "beta = tl.exp(", 0), NOT_CAUSAL),
    PlantedBug("exp without the empty-row shift guard", plant("tl.exp(s - _finite_shift(m_ij)[:, None])",
                                                               "tl.exp(s - m_ij[:, None])"),
               "merge", "merge: l after an iteration", ("_attn_fwd", "p = tl.exp(s -", 0), NOT_CAUSAL),
    PlantedBug("running max starts at 0", plant('m_i = tl.full([BLOCK_M], float("-inf"), M_PART.dtype.element_ty)',
                                                 "m_i = tl.zeros([BLOCK_M], M_PART.dtype.element_ty)"),
               "merge", "merge: the loop at", ("_attn_fwd", "for bn in range(", 0), NOT_CAUSAL),
]

DQ_PLANTED = [
    PlantedBug("dQ: key loop one block short", plant("tl.load(kv_range + 1)):", "tl.load(kv_range + 1) - 1):", function=DQ),
               "coverage", "coverage:", (DQ, "for bn in range(", 0), NOT_CAUSAL),
    PlantedBug("dQ: K read with the query head", plant("k_base = K + kv_bh * seq_k", "k_base = K + bh * seq_k", function=DQ),
               "address", "address: load of K", (DQ, "k = _load_rows(k_base", 0), NOT_CAUSAL),
    PlantedBug("dQ: lse rows strided by the head dim", plant("stats = bh * seq_q + rows", "stats = bh * head_dim + rows",
                                                          anywhere=True),
               "address", "address: load of LSE", ("_load_query_rows", "lse = tl.load(LSE", 0), NOT_CAUSAL),
    PlantedBug("dQ: every tile taken as FULL", plant("tl.load(class_row + bn),", "2,", function=DQ),
               "masking", "masking:", (DQ, "_, ds, slope = _tile_grads(", 0), BOTTOM_RIGHT),
    PlantedBug("dQ: tail rows stored past the end", plant("mask=(rows[:, None] < seq_q) & (dims[None, :] < head_dim))",
                                                            "mask=dims[None, :] < head_dim)", function=DQ),
               "address", "address: store of DQ", (DQ, "tl.store(DQ", 0), NOT_CAUSAL),
    PlantedBug("dQ: dS stored to DBIAS with Sq's row stride", plant("rows[:, None].to(tl.int64) * seq_k + cols[None, :], ds,",
                                                                   "rows[:, None].to(tl.int64) * seq_q + cols[None, :], ds,",
                                                                   function=DQ),
               "address", "address: store of DBIAS", (DQ, "tl.store(DBIAS", 0), EVERY_FEATURE),
    # the merge theorem holds each loop's gradient sums to the spec's state + score_grads(s, ...), op for op
    PlantedBug("dQ: dS with delta added", plant("ds = p * (dp - delta[:, None])", "ds = p * (dp + delta[:, None])",
                                                anywhere=True),
               "merge", "merge: dq (stored to ", ("_tile_grads", "ds = p * (dp", 0), NOT_CAUSAL),
    PlantedBug("dQ: P without the empty-row shift guard", plant("tl.exp(s - _finite_shift(lse)[:, None])",
                                                                 "tl.exp(s - lse[:, None])", anywhere=True),
               "merge", "merge: dq (stored to ", ("_tile_grads", "p = tl.exp(s -", 0), NOT_CAUSAL),
    PlantedBug("dQ: the scale left out of a tile's sum", plant("dq += scale * _dot(", "dq += _dot(", function=DQ),
               "merge", "merge: dq (stored to ", (DQ, "dq += _dot(", 0), NOT_CAUSAL),
]
DKDV_PLANTED = [
    PlantedBug("dK/dV: one query head of the group missed", plant("for g in range(group):", "for g in range(group - 1):",
                                                                    function=DKDV),
               "coverage", "coverage:", (DKDV, "for g in range(group", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: every iteration reads the group's first head", plant("h = first_head + g", "h = first_head + 0 * g",
                                                                             function=DKDV),
               "address", "address: load of Q", ("_load_rows", "return tl.load(", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: query loop one block short", plant("tl.load(q_range + 1)):", "tl.load(q_range + 1) - 1):",
                                                           function=DKDV),
               "coverage", "coverage:", (DKDV, "for bm in range(", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: K addressed with V's head dim", plant("K + bhk * seq_k * head_dim,", "K + bhk * seq_k * head_dim_v,",
                                                              function=DKDV),
               "address", "address: load of K", ("_load_rows", "return tl.load(", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: DK stored past the last key", plant("mask=in_cols & (dims[None, :] < head_dim))",
                                                            "mask=dims[None, :] < head_dim)", function=DKDV),
               "address", "address: store of DK", (DKDV, "tl.store(DK", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: dV weighted by dS instead of P", plant("tl.trans(p_kept.to(do.dtype))", "tl.trans(ds.to(do.dtype))",
                                                               function=DKDV),
               "merge", "merge: dv (stored to ", (DKDV, "tl.trans(ds.to(do.dtype))", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: the softcap's slope left out of dK", plant("tl.trans((ds * slope).to(q.dtype))",
                                                                   "tl.trans(ds.to(q.dtype))", function=DKDV),
               "merge", "merge: dk (stored to ", (DKDV, "dk += scale", 0), SOFTCAP),
    PlantedBug("dK/dV: the sums restarted for each query head", plant("        h = first_head + g\n",
                                                                       "        h = first_head + g\n"
                                                                       "        dk = tl.zeros([BLOCK_N, BLOCK_D], LSE.dtype.element_ty)\n",
                                                                       function=DKDV),
               "merge", "merge: the loop at", (DKDV, "for g in range(", 0), NOT_CAUSAL),
    PlantedBug("dK/dV: dV without the dropout weights", plant("p_kept = p * weights", "p_kept = p", anywhere=True),
               "merge", "merge: dv (stored to ", (DKDV, "dv += _dot(", 0), EVERY_FEATURE),
    PlantedBug("dK/dV: dK's slope of the biased scores", plant("        s = s + _load_rows(bias_base, rows, cols, seq_q, seq_k)\n",
                                                                "        s = s + _load_rows(bias_base, rows, cols, seq_q, seq_k)\n"
                                                                "        slope = 1.0 - (s / softcap) * (s / softcap)\n",
                                                                anywhere=True),
               "merge", "merge: dk (stored to ", ("_tile_scores", "slope = 1.0 - (s / softcap)", 0), EVERY_FEATURE),
    PlantedBug("dK/dV: DK stores the dV sum", plant("dk.to(DK.dtype.element_ty)", "dv.to(DK.dtype.element_ty)", function=DKDV),
               "merge", "merge: dk (stored to DK", (DKDV, "tl.store(DK", 0), NOT_CAUSAL),
]
PLANTED = [*CONTROLS, *FORWARD_PLANTED, *(replace(bug, function=DQ, launch="BACKWARD_DQ") for bug in DQ_PLANTED),
           *(replace(bug, function=DKDV, launch="BACKWARD_DKDV") for bug in DKDV_PLANTED)]


@pytest.mark.parametrize("bug", PLANTED, ids=[bug.name for bug in PLANTED])
def test_planted_bug_is_refuted_with_its_line(bug):
    """Refuted by the bug's theorem, by a claim naming the edited line (a merge refutation names it where its trees
    first differ, or a call on the way there): :meth:`PlantedBug.run` returns that refutation, else unknown."""
    proof = bug.run(target=TARGET)
    assert proof.status == "refuted" and proof.countermodel, proof
    if "-1e6" in bug.name:
        assert "-1e+06 is finite" in proof.detail


def test_a_sum_stored_other_than_as_a_loop_result_leaves_the_merge_unknown(tmp_path):
    """Each backward sum is bound to the loop result its store writes; DK storing ``2 * dk`` writes none of them, so
    the merge theorem is unknown (never proved, and not refuted against a value picked by position)."""
    text = plant("dk.to(DK.dtype.element_ty)", "(2.0 * dk).to(DK.dtype.element_ty)", function=DKDV)(SOURCE.read_text())
    path = tmp_path / "planted_flash.py"
    path.write_text(text)
    proofs = _prove("merge", f"{path}:{DKDV}", NOT_CAUSAL, "BACKWARD_DKDV")
    assert [p.status for p in proofs] == ["unknown"], proofs
    assert "1 stores of DK, writing 0 of the results" in proofs[0].detail


# A kernel with block pointers (tests/ttir/block_pointer_attention.py) under the Triton tutorial's launch description:
# make_tensor_ptr, advance and block pointers carried by the key loop. Recent Triton (3.9 here) has no block
# pointers; the triton-ascend environment (make ascend-check) lowers it.
BLOCK_POINTER_SOURCE = pathlib.Path(__file__).parent / "block_pointer_attention.py"
needs_block_pointers = pytest.mark.skipif("removed" in inspect.getsource(tl.make_block_ptr),
                                          reason="this Triton has no block pointers (removed: triton-lang/triton#6847)")
BLOCK_POINTER_PLANTED = [
    PlantedBug("K addressed with Q's batch and head strides", plant("K + z * stride_kz + h * stride_kh",
                                                                     "K + z * stride_qz + h * stride_qh"),
               "address", "address: load of K", ("_attn_fwd", "tl.load(k_tile)", 0), 0),
    PlantedBug("finite -1e6 fill (the tutorial's)", plant('s, float("-inf"))', "s, -1.0e6)"),
               "masking", "masking", ("_attn_fwd", "s = tl.where(rows", 0), 1),
    PlantedBug("K advanced half a block", plant("k_tile = tl.advance(k_tile, (0, BLOCK_N))",
                                                 "k_tile = tl.advance(k_tile, (0, BLOCK_N // 2))"),
               "address", "address: load of K", ("_attn_fwd", "tl.load(k_tile)", 0), 0),
    PlantedBug("V advanced along the head dim", plant("v_tile = tl.advance(v_tile, (BLOCK_N, 0))",
                                                       "v_tile = tl.advance(v_tile, (0, BLOCK_N))"),
               "address", "address: load of V", ("_attn_fwd", "tl.load(v_tile)", 0), 0),
    PlantedBug("the key loop one block short", plant("range(0, end, BLOCK_N)", "range(0, end - BLOCK_N, BLOCK_N)"),
               "coverage", "coverage", ("_attn_fwd", "for start_n in range(", 0), 1),
]


def _all_proved_but(kernel, config, described, unproved):
    proofs = _prove(",".join(THEOREMS), kernel, config, described=described)
    left = [(p.status, p.claim) for p in proofs if p.status != "proved"]
    assert len(proofs) > 40 and left == list(unproved), left


# A kernel with host tensor descriptors (tests/ttir/descriptor_attention.py) under the tutorial's TMA launch
# description: CUDA's ttir stage rewrites the descriptors to pointer arithmetic, with a loop-carried row index.
DESCRIPTOR_SOURCE = pathlib.Path(__file__).parent / "descriptor_attention.py"
needs_cuda_descriptors = pytest.mark.skipif(TARGET != "cuda", reason="host tensor descriptors: lowered for CUDA here")
DESCRIPTOR_PLANTED = [
    PlantedBug("the tutorial's batch offset off_z + off_h * N_CTX",
               plant("head_row = off_hz * N_CTX", "head_row = off_hz // H + off_hz % H * N_CTX", function="_attn_fwd_tma"),
               "address", "address: load of desc_q", ("_attn_fwd_tma", "q = desc_q.load", 0), 0),
    PlantedBug("key rows never advanced", plant("key_row += BLOCK_N", "key_row += 0", function="_attn_fwd_tma"),
               "address", "address: load of desc_k", ("_attn_fwd_tma", "desc_k.load", 0), 0),
    PlantedBug("finite -1e6 fill", plant('s, float("-inf"))', "s, -1.0e6)", function="_attn_fwd_tma"),
               "masking", "masking", ("_attn_fwd_tma", "s = tl.where(rows", 0), 1),
    # the base-2 merge, in real arithmetic: refuted by a float64 valuation, named by the loop
    PlantedBug("l not rescaled by alpha", plant("l = l * alpha + tl.sum(p, 1)", "l = l + tl.sum(p, 1)", function="_attn_fwd_tma"),
               "merge", "merge: (acc, l, m: iter_args 0, 1, 2) after an iteration", ("_attn_fwd_tma", "for start_n in range(", 0), 0),
    PlantedBug("alpha in base e", plant("alpha = tl.exp2(m - m_new)", "alpha = tl.exp(m - m_new)", function="_attn_fwd_tma"),
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


@pytest.mark.parametrize("kernel, bug", [
    pytest.param(kernel, bug, marks=OWN_KERNELS[kernel][0], id=f"{kernel}: {bug.name}")
    for kernel, bugs in (("block_pointer", BLOCK_POINTER_PLANTED), ("descriptor", DESCRIPTOR_PLANTED)) for bug in bugs])
def test_planted_bug_in_a_tutorial_shaped_kernel_is_refuted(kernel, bug):
    _, source, function, described, _ = OWN_KERNELS[kernel]
    test_planted_bug_is_refuted_with_its_line(replace(bug, function=function, launch=described, source=source))
