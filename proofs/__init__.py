"""Proof obligations, one per module; installed as ``attnformal.proofs``.

Each module states its theorems in plain math in its docstring and checks them on the
spec's own definitions (mask predicate, tile classification, merge step, schedule methods,
the host code before a kernel launch), never on a copy. It exposes ``TITLE``,
``checks(settings, budget)`` (yielding :class:`attnformal.logic.Proof` values) and
``CONTROLS``: deliberately broken variants the prover must refute with a counterexample. A module
may declare ``STATED_WITHOUT``: the functions under test its claims must not be written with (the
claims use the independent meaning modules, ``mask_meaning`` and ``meaning``, instead).
:mod:`attnformal.prove` runs them.
"""

from attnformal.proofs import (backward, floating_point, gqa, launch, loop_invariant, mask_semantics, masked_rows,
                               merge_correctness, monoid, npu_masks, sinks, splits, tile_classification,
                               tile_classification_slow, tile_contiguity_slow, varlen, vocabulary)
from attnformal.proofs import head_tensors, score_bias, triton_kernels

OBLIGATIONS = (merge_correctness, monoid, loop_invariant, masked_rows, tile_classification, gqa, backward,
               floating_point, npu_masks, mask_semantics, splits, launch, vocabulary, tile_classification_slow,
               tile_contiguity_slow, varlen, sinks, score_bias, head_tensors, triton_kernels)

# What the obligations take on trust: the report's "trusted, not proved" section, with what is
# checked only on bounded domains and the axioms the proofs used (both read off the results).
TRUSTED = (
    "The Triton kernels' in-kernel copies of the spec -- `_merge`, `_finite_shift`, "
    "`_kv_head_of`, `_first_query_head` in kernels/triton_flash.py -- are proved through the three kernels' "
    "compiled TTIR (obligation 20, docs/ttir.md): their integer arithmetic, addresses (so the head maps), bounds, "
    "masking (the spec's key interval, handed over as row tables: obligation 12 (c)), block coverage and writes, "
    "and the forward's key loop as the spec's merge op for op in IEEE float32 (exp uninterpreted); trusted there: "
    "Triton's lowering after TTIR and the hardware. The backward's sums (their association) and every "
    "kernel's accumulation error are tested against the float64 oracle; the torch and ring kernels' fold "
    "is `kernels.split_kv.fold_row` (obligations 11 (e) and 17); every other kernel's loads and offsets "
    "are tested.",
    "Rounding: the IEEE lemmas model each float operation rounded to nearest-even on its own -- no fused "
    "multiply-add contraction, no flush-to-zero or denormals-are-zero of arithmetic results; exp and log "
    "are faithfully rounded (exp may return +0 for tiny results: no axiom rules that out); accumulators "
    "stay below 2^(emax-2) (true for float32 accumulation; in float16 only up to 8192).",
    "Python glue the symbols cannot enter: the loop in `TileSchedule.split_ranges` is proven for the "
    "listed num_splits (its arithmetic for all), `kernels.split_kv.combine` for up to 8 partial states, "
    "`fold_row` for up to 3 parts of up to 2 key blocks, "
    "and the `range` built from proven bounds by `schedule.blocks` is checked with the host tables.",
    "The tools: Z3 and SymPy (versions above). SymPy identities are proved by exact simplification; "
    "a refutation is a numeric point checked at 50 and 100 digits.",
)
