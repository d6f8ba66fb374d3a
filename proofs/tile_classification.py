"""Obligation 5 -- tile classification and the visited ranges, for all lengths and block sizes.

Z3 over unbounded integers, on the methods the kernels call -- ``TileSchedule.tile_class``,
``kv_range``, ``num_q_blocks``, ``num_kv_blocks`` -- of a schedule whose block sizes
``block_m, block_n >= 1`` are symbolic (so every schedule of that class is an instance), and
on the mask's own ``may_attend``, for each mask geometry: causal none / top-left /
bottom-right, times no window / a window ``(L, R)`` with symbolic bounds (negative = unbounded
side), times no / an explicit ``attn_mask``. Lengths ``len_q, len_k >= 0`` are symbolic;
``len_k`` is the batch element's effective key length (``kv_lens[b]``; obligation 10 shows
``spec.geometry(b)`` builds it), so padding keys are exactly the keys ``j >= len_k``. Block
indices ``bm, bn >= 0`` and positions ``i, j`` are symbolic; a tile is the unclipped
``[bm*block_m, (bm+1)*block_m) x [bn*block_n, (bn+1)*block_n)``. An explicit mask is an
uninterpreted ``attn_mask(i, j)``, so it stands for every mask. ``allowed(i, j) =
may_attend(i, j) and attn_mask(i, j)``; the kernel keeps ``(i, j)`` iff the tile is not SKIP
and (it is FULL, or ``allowed(i, j)``) -- what both kernels do.

Theorems, for every geometry, length, block size and tile (each conditional one with its
premise shown satisfiable in every case, so none holds vacuously):

* (a) skip sound: a SKIP tile holds no allowed pair;
* (b) full sound: every position of a FULL tile is in range and allowed; with an
  ``attn_mask`` no tile is FULL;
* (c) mixed tiles are partial: a tile holding an allowed and a not-allowed position is PARTIAL;
* (d) ragged edges: no position with ``i >= len_q`` or ``j >= len_k`` is ever kept;
* (e) exact: the kernel keeps ``(i, j)`` iff ``allowed(i, j)``;
* (f) ``bn`` is in ``kv_range(bm)`` iff tile ``(bm, bn)`` is not SKIP;
* (g) for each key block, the non-SKIP query blocks are contiguous (the backward's
  key-major loop walks one interval of query blocks);
* (h) the launch grid is exact: ``bm < num_q_blocks`` iff block ``bm`` starts before
  ``len_q``, and likewise ``bn < num_kv_blocks`` for ``len_k``.

Division by a symbolic block size is nonlinear; (f) and (h) use the floor-division lemma of
:mod:`attnformal.proofs.integers`, proved first.
"""

from __future__ import annotations

import z3

from attnformal import masks, schedule
from attnformal.logic import VACUOUS, Budget, Control, Labeled, Proof, Query, Settings, check_z3, plain_solver
from attnformal.masks import MaskGeometry
from attnformal.proofs.integers import (BLOCK_SIZES, domain, floor_division, floor_division_lemma, geometries,
                                        linear_abstraction, shown_values, slow, symbolic_schedule)
from attnformal.schedule import FULL, PARTIAL, SKIP, TILE_CLASS_NAMES

COST = 3  # rough seconds; the prover starts the longest obligations first
PROVES_SCHEDULES = True  # the schedules named on the command line are proven here
TITLE = "Tile classification, all lengths and block sizes"


class Tile:
    """Symbolic tile ``(bm, bn)`` of a schedule, positions ``(i, j)`` in it, and the kernel's decision."""

    def __init__(self, g: MaskGeometry, sched: schedule.TileSchedule, suffix=""):
        self.g, self.sched = g, sched
        self.block_m, self.block_n = sched.block_m, sched.block_n
        self.bm, self.bn = z3.Ints(f"bm{suffix} bn{suffix}")
        self.cls = sched.tile_class(self.bm, self.bn, g)

    def contains(self, i, j):
        return z3.And(self.bm * self.block_m <= i, i < (self.bm + 1) * self.block_m,
                      self.bn * self.block_n <= j, j < (self.bn + 1) * self.block_n)

    def allowed(self, i, j):
        rule = masks.may_attend(i, j, self.g)
        return z3.And(rule, attn_mask(i, j)) if self.g.has_attn_mask else rule

    def kept(self, i, j):
        return z3.And(self.cls != SKIP, z3.Or(self.cls == FULL, self.allowed(i, j)))

    def hypotheses(self):
        out = [("len_q, len_k >= 0", z3.And(self.g.len_q >= 0, self.g.len_k >= 0)),
               ("bm, bn >= 0", z3.And(self.bm >= 0, self.bn >= 0))]
        if isinstance(self.block_m, z3.ExprRef):
            out.append(BLOCK_SIZES)
        return (*out, *domain(self.g))

    def show(self, **positions):
        g = self.g
        shown = {"len_q": g.len_q, "len_k": g.len_k, "block_m": self.block_m, "block_n": self.block_n,
                 "bm": self.bm, "bn": self.bn, "class": Labeled(self.cls, TILE_CLASS_NAMES), **positions}
        if g.window is not None:
            shown.update(L=g.window[0], R=g.window[1])
        return {**shown, **shown_values(g.values)}


def attn_mask(i, j):
    return z3.Function("attn_mask", z3.IntSort(), z3.IntSort(), z3.BoolSort())(i, j)


def in_range(g, i, j):
    return z3.And(0 <= i, i < g.len_q, 0 <= j, j < g.len_k)


# ---- the properties: each builds (claim, shown terms) for one tile


def skip_sound(t: Tile):
    i, j = z3.Ints("i j")
    return z3.Implies(z3.And(t.cls == SKIP, t.contains(i, j)), z3.Not(t.allowed(i, j))), t.show(i=i, j=j)


def full_sound(t: Tile):
    i, j = z3.Ints("i j")
    if t.g.has_attn_mask:  # explicit mask data can exclude any pair
        return t.cls != FULL, t.show()
    ok = z3.And(in_range(t.g, i, j), t.allowed(i, j))
    return z3.Implies(z3.And(t.cls == FULL, t.contains(i, j)), ok), t.show(i=i, j=j)


def mixed_is_partial(t: Tile):
    i1, j1, i2, j2 = z3.Ints("i1 j1 i2 j2")
    mixed = z3.And(t.contains(i1, j1), t.allowed(i1, j1), t.contains(i2, j2), z3.Not(t.allowed(i2, j2)))
    return z3.Implies(mixed, t.cls == PARTIAL), t.show(i1=i1, j1=j1, i2=i2, j2=j2)


def ragged_edges(t: Tile):
    i, j = z3.Ints("i j")
    outside = z3.And(t.contains(i, j), z3.Or(i >= t.g.len_q, j >= t.g.len_k))
    return z3.Implies(outside, z3.Not(t.kept(i, j))), t.show(i=i, j=j)


def exact(t: Tile):
    i, j = z3.Ints("i j")
    return z3.Implies(t.contains(i, j), t.kept(i, j) == t.allowed(i, j)), t.show(i=i, j=j)


def range_is_non_skip(t: Tile):
    visited = t.sched.kv_range(t.bm, t.g)
    claim = z3.And(visited.start <= t.bn, t.bn < visited.stop) == (t.cls != SKIP)
    return claim, t.show(start=visited.start, stop=visited.stop)


def contiguous_along_bm(t: Tile):
    lower, upper = Tile(t.g, t.sched, "_lower"), Tile(t.g, t.sched, "_upper")
    same_column = z3.And(lower.bn == t.bn, upper.bn == t.bn, 0 <= lower.bm, lower.bm < t.bm, t.bm < upper.bm)
    claim = z3.Implies(z3.And(same_column, lower.cls != SKIP, upper.cls != SKIP), t.cls != SKIP)
    return claim, {**t.show(), "bm_lower": lower.bm, "bm_upper": upper.bm}


def grid_is_exact(t: Tile):
    q_blocks, kv_blocks = t.sched.num_q_blocks(t.g), t.sched.num_kv_blocks(t.g)
    claim = z3.And((t.bm < q_blocks) == (t.bm * t.block_m < t.g.len_q),
                   (t.bn < kv_blocks) == (t.bn * t.block_n < t.g.len_k))
    return claim, t.show(num_q_blocks=q_blocks, num_kv_blocks=kv_blocks)


PROPERTIES = (
    ("(a) SKIP tiles hold no allowed pair", skip_sound),
    ("(b) FULL tiles: every position in range and allowed; never FULL with attn_mask", full_sound),
    ("(c) a tile with allowed and not-allowed positions is PARTIAL", mixed_is_partial),
    ("(d) ragged edges: no out-of-range query or key is kept", ragged_edges),
    ("(e) the kernel keeps (i, j) iff allowed(i, j)", exact),
    ("(f) kv_range(bm) = the non-SKIP key blocks of bm", range_is_non_skip),
    ("(g) non-SKIP query blocks of each key block are contiguous", contiguous_along_bm),
    ("(h) num_q_blocks, num_kv_blocks: exactly the blocks that start inside the lengths", grid_is_exact),
)


def checks(settings: Settings, budget: Budget, slow_families=False, properties=None, keep=None):
    """``properties`` (default: all) for every family -- those with a slow feature (``slow_families``) or
    the others; ``keep(g)``, when given, picks among them."""
    lemma, abstraction = floor_division_lemma(budget), linear_abstraction(budget)  # one reading for all
    yield lemma
    note = "all block sizes; " + instances(settings)
    properties = PROPERTIES if properties is None else properties
    for claim, prop in properties:
        proof = check_property(claim, prop, [("all block sizes", symbolic_schedule())], lemma, budget,
                               slow_families=slow_families, keep=keep, abstraction=abstraction)
        yield proof.but(detail="; ".join(filter(None, (proof.detail, note))))
    mine = overriding(settings)
    for claim, prop in properties if mine else ():
        yield check_property(f"{claim} [{', '.join(label for label, _ in mine)}]", prop, mine, lemma, budget,
                             slow_families=slow_families, keep=keep, abstraction=abstraction)


def check_property(claim, prop, schedules, lemma: Proof, budget: Budget, families=None, slow_families=False,
                   keep=None, abstraction=None):
    def queries():
        for label, sched in schedules:
            for family, g in geometries():
                if (families is not None and family not in families) or slow(g) != slow_families \
                        or (keep is not None and not keep(g)):
                    continue
                t = Tile(g, sched)
                formula, show = prop(t)
                yield Query(formula, t.hypotheses(), show, case=f"{label}; {family}")

    # Nonlinear (symbolic block sizes): decided in linear arithmetic with proven lemmas first; what that
    # leaves open by the plain core, see attnformal.logic.minimal_core_solver.
    return check_z3(claim, queries(), budget=budget, axioms=(floor_division(lemma),), solver=plain_solver,
                    abstraction=abstraction or linear_abstraction(budget))


def overriding(settings: Settings):
    """The named schedules of a class other than TileSchedule: their own methods are proven, at their sizes."""
    return [(label, s) for label, s in settings.schedules if type(s) is not schedule.TileSchedule]


def instances(settings: Settings) -> str:
    """Which named schedules the all-block-sizes theorems cover: those of class TileSchedule itself."""
    covered = [f"{label} ({s.block_m}x{s.block_n})" for label, s in settings.schedules
               if type(s) is schedule.TileSchedule]
    return "instances: " + (", ".join(covered) if covered else "none named")


# ---- negative controls


def _key_interval_ending_early(i, g):
    lo, hi = masks.key_interval(i, g)
    return lo, hi - 1


def _key_interval_top_left(i, g):
    if g.causal == "bottom_right":
        g = g.replace(causal="top_left")
    return masks.key_interval(i, g)


def _tile_class_padded_lengths(bm, bn, g, block_m, block_n):
    from attnformal import ops

    padded = g.replace(len_q=ops.cdiv(g.len_q, block_m) * block_m, len_k=ops.cdiv(g.len_k, block_n) * block_n)
    return _TILE_CLASS(bm, bn, padded, block_m, block_n)


def _never_full(bm, bn, g, block_m, block_n):
    """BROKEN: FULL is never returned, so every tile is masked -- and theorem (b) says nothing."""
    cls = _TILE_CLASS(bm, bn, g, block_m, block_n)
    return z3.If(cls == FULL, PARTIAL, cls)


_TILE_CLASS = schedule.tile_class
_KV_RANGE = schedule.TileSchedule.kv_range


def _property(index):
    claim, prop = PROPERTIES[index]
    schedules = [("all block sizes", symbolic_schedule())]
    return lambda budget: check_property(claim, prop, schedules, floor_division_lemma(budget), budget)


CONTROLS = (
    Control("skip rule off by one", "the schedule's key intervals end one key early, so a tile whose "
            "only allowed key is its first column is skipped", schedule, "key_interval",
            _key_interval_ending_early, _property(0)),
    Control("top-left for bottom-right", "the schedule aligns a bottom-right causal mask top-left",
            schedule, "key_interval", _key_interval_top_left, _property(0)),
    Control("ragged edges ignored", "tile_class classifies as if both lengths were padded to whole blocks",
            schedule, "tile_class", _tile_class_padded_lengths, _property(3)),
    Control("never FULL", "tile_class never returns FULL: theorem (b)'s premise is unsatisfiable",
            schedule, "tile_class", _never_full, _property(1), expect=VACUOUS),
    Control("kv_range drops its last block", "TileSchedule.kv_range stops one key block early",
            schedule.TileSchedule, "kv_range", lambda self, bm, g: schedule.blocks(
                *(lambda r: (r.start, r.stop - 1))(_KV_RANGE(self, bm, g))), _property(5)),
)
