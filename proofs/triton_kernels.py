"""Obligation 20 -- the project's Triton kernels, proved from the TTIR they compile to.

For the forward (``_attn_fwd``), dQ (``_attn_bwd_dq``) and dK/dV (``_attn_bwd_dkdv``) kernels of
kernels/triton_flash.py, in each configuration their launch descriptions ship (attnformal/ttir/launch.py: the three
causal modes; without features, with the softcap, with every feature -- attn_mask, dropout keep flags, softcap,
bias), lowered by the installed Triton's own front end and ``ttir`` stage (CUDA sm_80; no GPU needed) and run by
a symbolic interpreter over Z3 (docs/ttir.md), for every program of the grid and all runtime arguments the host
admits (every length, batch and head count; int32 arguments, i64 offsets):

* **(a) no-wrap** -- every integer op's exact result fits its width (so no int32 overflow), every divisor is
  non-zero;
* **(b) address** -- every load and store touches exactly the element the tensor's layout assigns to the logical
  ``(b, h, i, d)`` it is used for (batch and head offsets, the GQA head ``h // G``, K and V each their own);
* **(c) bounds** -- no access its mask lets through leaves its tensor;
* **(d) masking** -- key ``j``'s score reaches row ``i``'s softmax (its row max and its exp) only if the spec's
  ``may_attend(i, j)`` (and the attn_mask) allows it, else it is ``-inf``;
* **(e) coverage** -- each loop visits each key (query) block its row of the host's tables names, once; dK/dV's
  loop runs over the ``G`` query heads of its KV head;
* **(f) writes** -- every element of the outputs is stored by exactly one program and lane, nothing masked out;
* **(g) merge** -- the forward's key loop starts from the merge's unit and folds each tile by the spec's
  ``merge(state, block_state(s, V))`` op for op in IEEE float32 (``exp`` uninterpreted); each backward sum starts
  at 0 and adds the spec's ``score_grads`` of each tile.

Each claim is listed with what it assumed (the host's shapes and tables: obligation 12). Not proved here: how
``dot`` and the reductions sum (association), the compiler's lowering after TTIR, the hardware; ``make
ascend-check`` proves the same on triton-ascend's TTIR. The controls are ten bugs planted in copies of the kernel
source, each of which must be refuted by its theorem at its line.
"""

from __future__ import annotations

import importlib.util

from attnformal.logic import RLIMIT_UNIT, UNKNOWN, Budget, Proof, Settings
from attnformal.ttir import child
from attnformal.ttir.cli import config_name
from attnformal.ttir.planted import PlantedBug, function_span, plant
from attnformal.ttir.theorems import TOOL, Limits

TITLE = "Triton kernels from their compiled TTIR"
COST = 80  # rough seconds; the prover starts the longest obligations first
DEPENDS_ON = ("attnformal.kernels.triton_flash",)  # lowered in a child Python, not imported: its text keys the cache
KERNELS = (("FORWARD", "_attn_fwd"), ("BACKWARD_DQ", "_attn_bwd_dq"), ("BACKWARD_DKDV", "_attn_bwd_dkdv"))


def checks(settings: Settings, budget: Budget):
    if importlib.util.find_spec("triton") is None:
        yield Proof("lower the kernels to TTIR", TOOL, UNKNOWN,
                    detail="Triton is not installed (pip install 'attnformal[triton]'): nothing was lowered")
        return
    limits = Limits(units=settings.budget * RLIMIT_UNIT, seconds=budget.left())
    try:
        answers = child.prove([child.Request(launch) for launch, _ in KERNELS], limits, timeout=budget.left())
    except child.ChildFailed as why:
        yield Proof("lower the kernels to TTIR and interpret them", TOOL, UNKNOWN, detail=str(why))
        return
    for (_, function), answer in zip(KERNELS, answers):
        for config, proofs in answer:
            for proof in proofs:
                budget.used += proof.rlimit
                yield proof.but(claim=f"{function} [{config_name(config)}] {proof.claim}")


# indices into FORWARD.configs (attnformal.ttir.launch): not causal, top-left, bottom-right, then the same with
# the softcap, then with every feature
NOT_CAUSAL, BOTTOM_RIGHT = 0, 2


def _visit_last_block_again(text):
    """After the forward's key loop, the same body over the range's last block (the diagonal one under causal)."""
    forward = text[slice(*function_span(text, "_attn_fwd"))]
    loop = forward[forward.index("    for bn in range("):forward.index("\n\n    state_rows")]
    again = loop.replace("range(tl.load(split_range), tl.load(split_range + 1))",
                         "range(tl.maximum(tl.load(split_range), tl.load(split_range + 1) - 1), "
                         "tl.load(split_range + 1))")
    return plant(loop, loop + "\n" + again)(text)


CONTROLS = (
    PlantedBug("head map h % Hkv", plant("b * (heads_q // group) + _kv_head_of(h, group)",
                                         "b * (heads_q // group) + h % (heads_q // group)", anywhere=True),
               "address", "address: load of K", ("_attn_fwd", "k = _load_rows(k_base", 0), NOT_CAUSAL),
    PlantedBug("K read with Q's length", plant("k_base = K + kv_bh * seq_k * head_dim",
                                               "k_base = K + kv_bh * seq_q * head_dim"),
               "address", "address: load of K", ("_attn_fwd", "k = _load_rows(k_base", 0), NOT_CAUSAL),
    PlantedBug("missing batch offset", plant("q = _load_rows(Q + bh * seq_q * head_dim",
                                             "q = _load_rows(Q + h * seq_q * head_dim"),
               "address", "address: load of Q", ("_attn_fwd", "q = _load_rows(Q", 0), NOT_CAUSAL),
    PlantedBug("tail rows not stored", plant("in_rows = rows < seq_q", "in_rows = rows < (seq_q // BLOCK_M) * BLOCK_M"),
               "writes", "writes: every M_PART element", ("_attn_fwd", "tl.store(M_PART", 0), NOT_CAUSAL),
    PlantedBug("causal aligned top-left", plant("(cols[None, :] <= row_hi[:, None])",
                                                "(cols[None, :] <= rows[:, None])", anywhere=True),
               "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), BOTTOM_RIGHT),
    PlantedBug("finite -1e6 fill", plant('s = tl.where(allowed, s, float("-inf"))', 's = tl.where(allowed, s, -1e6)',
                                         anywhere=True),
               "masking", "masking:", ("_tile_scores", "s = tl.where(allowed", 0), NOT_CAUSAL),
    PlantedBug("loop one block short", plant("tl.load(split_range + 1)):", "tl.load(split_range + 1) - 1):"),
               "coverage", "coverage:", ("_attn_fwd", "for bn in range(", 0), NOT_CAUSAL),
    PlantedBug("diagonal block visited twice", _visit_last_block_again,
               "coverage", "coverage:", ("_attn_fwd", "for bn in range(", 1), BOTTOM_RIGHT),
    PlantedBug("overlapping split parts", plant("* num_splits + split) * 2", "* num_splits) * 2"),
               "coverage", "coverage:", ("_attn_fwd", "for bn in range(", 0), NOT_CAUSAL),
    PlantedBug("lse (row max) stored under the wrong mask", plant("tl.store(M_PART + state_rows, m_i, mask=in_rows)",
                                                                  "tl.store(M_PART + state_rows, m_i, mask=rows < seq_k)"),
               "writes", "writes: no two programs or lanes store the same M_PART",
               ("_attn_fwd", "tl.store(M_PART", 0), NOT_CAUSAL),
)
