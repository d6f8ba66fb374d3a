"""Proof obligations, one per module; installed as ``attnformal.proofs``.

Each module states its theorems in plain math in its docstring and checks them on the
spec's own definitions (mask predicate, tile classification, merge step, schedule block
sizes), never on a copy. It exposes ``TITLE``, ``checks(settings, budget)`` (yielding
:class:`attnformal.logic.Proof` values) and ``CONTROLS``: deliberately broken variants the
prover must refute with a counterexample. :mod:`attnformal.prove` runs them.
"""

from attnformal.proofs import (backward, floating_point, gqa, loop_invariant, masked_rows, merge_correctness, monoid,
                               npu_masks, tile_classification)

OBLIGATIONS = (merge_correctness, monoid, loop_invariant, masked_rows, tile_classification, gqa, backward,
               floating_point, npu_masks)
