"""Obligation 15 -- theorem (g) of tile classification for the slow (chunked) families without an explicit mask.

For every family with a feature declared ``slow_tiles`` and no ``attn_mask``
(:mod:`attnformal.proofs.tile_classification_slow` has the rest), all lengths, block sizes and
chunk sizes: for each key block, the
non-SKIP query blocks are contiguous, so the backward's key-major loop walks one interval of
query blocks. Its own obligation because it was the slowest query of all (three symbolic tiles, each
dividing by the symbolic chunk size): 30 M Z3 resource units in the nonlinear solver, about 2.4 M since
it is decided in linear arithmetic with proven lemmas (:func:`~attnformal.proofs.integers.linear_abstraction`;
docs/measured.md).
"""

from __future__ import annotations

import z3

from attnformal import schedule
from attnformal.logic import Budget, Control, Settings
from attnformal.proofs import tile_classification
from attnformal.proofs.integers import floor_division_lemma, symbolic_schedule
from attnformal.schedule import SKIP

COST = 2  # rough seconds; the prover starts the longest obligations first
PROVES_SCHEDULES = True
TITLE = "Chunked tiles: contiguous query blocks"
PROPERTIES = tuple(p for p in tile_classification.PROPERTIES if p[0].startswith("(g)"))


def checks(settings: Settings, budget: Budget):
    yield from tile_classification.checks(settings, budget, slow_families=True, properties=PROPERTIES,
                                          keep=_unmasked)


def _unmasked(g):
    return not g.has_attn_mask


def _hole_in_every_column(bm, bn, g, block_m, block_n):
    """BROKEN: query block 1 is SKIP in every column, a hole between visited blocks 0 and 2."""
    return z3.If(bm == 1, SKIP, _TILE_CLASS(bm, bn, g, block_m, block_n))


_TILE_CLASS = schedule.tile_class


def _contiguity(budget):
    (claim, prop), = PROPERTIES
    return tile_classification.check_property(claim, prop, [("all block sizes", symbolic_schedule())],
                                              floor_division_lemma(budget), budget, slow_families=True,
                                              keep=_unmasked)


CONTROLS = (
    Control("a hole in the column", "tile_class skips query block 1 of every key block", schedule, "tile_class",
            _hole_in_every_column, _contiguity),
)
