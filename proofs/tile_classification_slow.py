"""Obligation 14 -- tile classification for the mask families whose queries are slow, with their own budget.

The theorems (a)-(h) of obligation 5 (:mod:`attnformal.proofs.tile_classification`), word for
word and on the same code, for every family with a feature declared ``slow_tiles`` (today
``chunk_size``: ``floordiv(i + offset, C)`` with the chunk size ``C >= 1`` and the block sizes
all symbolic is nonlinear) -- except theorem (g) for the families without an explicit mask, the
slowest queries, which are obligation 15 (:mod:`attnformal.proofs.tile_contiguity_slow`).
Obligation 5 covers every other family, so together they cover every family and combination
the spec accepts. About 9 M Z3 resource units (``--budget`` is per obligation; docs/measured.md): the
queries are decided in linear arithmetic with proven lemmas (:func:`~attnformal.proofs.integers.linear_abstraction`).
"""

from __future__ import annotations

from attnformal import masks, schedule
from attnformal.logic import Budget, Control, Settings
from attnformal.proofs import tile_classification
from attnformal.proofs.integers import floor_division_lemma, symbolic_schedule

COST = 6  # rough seconds; the prover starts the longest obligations first
PROVES_SCHEDULES = True
TITLE = "Tile classification, chunked families"
PROPERTIES = tuple(p for p in tile_classification.PROPERTIES if not p[0].startswith("(g)"))
CONTIGUITY = tuple(p for p in tile_classification.PROPERTIES if p[0].startswith("(g)"))


def checks(settings: Settings, budget: Budget):
    yield from tile_classification.checks(settings, budget, slow_families=True, properties=PROPERTIES)
    yield from tile_classification.checks(settings, budget, slow_families=True, properties=CONTIGUITY,
                                          keep=lambda g: g.has_attn_mask)


def _schedule_ignores_slow_features(i, g):
    """BROKEN: the schedule classifies tiles as if there were no chunk."""
    return masks.key_interval(i, g.replace(chunk_size=None))


def _property(index):
    claim, prop = tile_classification.PROPERTIES[index]
    schedules = [("all block sizes", symbolic_schedule())]
    return lambda budget: tile_classification.check_property(claim, prop, schedules, floor_division_lemma(budget),
                                                             budget, slow_families=True)


CONTROLS = (
    Control("schedule ignores the chunk", "the schedule's key intervals leave chunk_size out, so tiles across a "
            "chunk boundary are FULL", schedule, "key_interval", _schedule_ignores_slow_features, _property(1)),
)
