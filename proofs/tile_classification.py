"""Obligation 5 -- tile classification and the visited ranges, for all sequence lengths.

Z3 over unbounded integers, on the schedule's own ``tile_class`` and ``kv_block_range`` and
the mask's own ``may_attend``, for each schedule (block sizes ``(block_m, block_n)``) and each
mask geometry: causal none / top-left / bottom-right, times no window / a window ``(L, R)``
with symbolic bounds (negative = unbounded side), times no / an explicit ``attn_mask``.
Lengths ``len_q, len_k >= 0`` are symbolic; ``len_k`` is the batch element's effective key
length (``kv_lens[b]``), so padding keys are exactly the keys ``j >= len_k``. Block indices
``bm, bn >= 0`` and positions ``i, j`` are symbolic; a tile is the unclipped
``[bm*block_m, (bm+1)*block_m) x [bn*block_n, (bn+1)*block_n)``. An explicit mask is an
uninterpreted ``attn_mask(i, j)``, so it stands for every mask. ``allowed(i, j) =
may_attend(i, j) and attn_mask(i, j)``; the kernel keeps ``(i, j)`` iff the tile is not SKIP
and (it is FULL, or ``allowed(i, j)``) -- what ``torch_tiled`` does.

Theorems, for every schedule, geometry, length and tile:

* (a) skip sound: a SKIP tile holds no allowed pair;
* (b) full sound: every position of a FULL tile is in range and allowed (never with ``attn_mask``);
* (c) mixed tiles are partial: a tile holding an allowed and a not-allowed position is PARTIAL;
* (d) ragged edges: no position with ``i >= len_q`` or ``j >= len_k`` is ever kept;
* (e) exact: the kernel keeps ``(i, j)`` iff ``allowed(i, j)``;
* (f) ``bn`` is in ``kv_block_range(bm)`` iff tile ``(bm, bn)`` is not SKIP;
* (g) for each key block, the non-SKIP query blocks are contiguous (the backward's
  key-major loop walks one interval of query blocks).
"""

from __future__ import annotations

import importlib
import itertools

import z3

from attnformal import masks, schedule
from attnformal.logic import Budget, Control, Labeled, Query, Settings, check_z3
from attnformal.masks import MaskGeometry
from attnformal.schedule import FULL, PARTIAL, SKIP, TILE_CLASS_NAMES

COST = 6  # rough seconds; the prover starts the longest obligations first
TITLE = "Tile classification for all lengths"

# Block sizes always proven, besides the kernels' own: unequal both ways and not powers of two.
DEFAULT_BLOCKS = ((1, 1), (3, 5), (5, 3), (64, 128), (128, 64))


def geometries():
    """``(label, MaskGeometry)`` for every mask family and combination (lengths symbolic)."""
    len_q, len_k, left, right = z3.Ints("len_q len_k L R")
    for causal, window, has_mask in itertools.product(masks.CAUSAL_MODES, (None, (left, right)), (False, True)):
        label = ", ".join([f"causal={causal}", "window=(L, R)" if window else "no window",
                           "attn_mask" if has_mask else "no attn_mask"])
        yield label, MaskGeometry(len_q, len_k, causal, window, has_mask)


class Tile:
    """Symbolic tile ``(bm, bn)`` of a schedule, positions ``(i, j)`` in it, and the kernel's decision."""

    def __init__(self, g: MaskGeometry, block_m: int, block_n: int, suffix=""):
        self.g, self.block_m, self.block_n = g, block_m, block_n
        self.bm, self.bn = z3.Ints(f"bm{suffix} bn{suffix}")
        self.cls = schedule.tile_class(self.bm, self.bn, g, block_m, block_n)

    def contains(self, i, j):
        return z3.And(self.bm * self.block_m <= i, i < (self.bm + 1) * self.block_m,
                      self.bn * self.block_n <= j, j < (self.bn + 1) * self.block_n)

    def allowed(self, i, j):
        rule = masks.may_attend(i, j, self.g)
        return z3.And(rule, attn_mask(i, j)) if self.g.has_attn_mask else rule

    def kept(self, i, j):
        return z3.And(self.cls != SKIP, z3.Or(self.cls == FULL, self.allowed(i, j)))

    def hypotheses(self):
        return (("len_q, len_k >= 0", z3.And(self.g.len_q >= 0, self.g.len_k >= 0)),
                ("bm, bn >= 0", z3.And(self.bm >= 0, self.bn >= 0)))

    def show(self, **positions):
        g = self.g
        shown = {"len_q": g.len_q, "len_k": g.len_k, "bm": self.bm, "bn": self.bn,
                 "class": Labeled(self.cls, TILE_CLASS_NAMES), **positions}
        if g.window is not None:
            shown.update(L=g.window[0], R=g.window[1])
        return shown


def attn_mask(i, j):
    return z3.Function("attn_mask", z3.IntSort(), z3.IntSort(), z3.BoolSort())(i, j)


def in_range(g, i, j):
    return z3.And(0 <= i, i < g.len_q, 0 <= j, j < g.len_k)


# ---- the properties: each builds (claim, extra hypotheses, shown terms) for one tile


def skip_sound(t: Tile):
    i, j = z3.Ints("i j")
    return z3.Implies(z3.And(t.cls == SKIP, t.contains(i, j)), z3.Not(t.allowed(i, j))), t.show(i=i, j=j)


def full_sound(t: Tile):
    i, j = z3.Ints("i j")
    ok = z3.And(in_range(t.g, i, j), t.allowed(i, j), z3.BoolVal(not t.g.has_attn_mask))
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
    start, end = schedule.kv_block_range(t.bm, t.g, t.block_m, t.block_n)
    claim = z3.And(start <= t.bn, t.bn < end) == (t.cls != SKIP)
    return claim, t.show(start=start, end=end)


def contiguous_along_bm(t: Tile):
    lower, upper = Tile(t.g, t.block_m, t.block_n, "_lower"), Tile(t.g, t.block_m, t.block_n, "_upper")
    same_column = z3.And(lower.bn == t.bn, upper.bn == t.bn, 0 <= lower.bm, lower.bm < t.bm, t.bm < upper.bm)
    claim = z3.Implies(z3.And(same_column, lower.cls != SKIP, upper.cls != SKIP), t.cls != SKIP)
    return claim, {**t.show(), "bm_lower": lower.bm, "bm_upper": upper.bm}


PROPERTIES = (
    ("(a) SKIP tiles hold no allowed pair", skip_sound),
    ("(b) FULL tiles: every position in range and allowed", full_sound),
    ("(c) a tile with allowed and not-allowed positions is PARTIAL", mixed_is_partial),
    ("(d) ragged edges: no out-of-range query or key is kept", ragged_edges),
    ("(e) the kernel keeps (i, j) iff allowed(i, j)", exact),
    ("(f) kv_block_range(bm) = the non-SKIP key blocks of bm", range_is_non_skip),
    ("(g) non-SKIP query blocks of each key block are contiguous", contiguous_along_bm),
)


def schedules(settings: Settings):
    """``([(label, block_m, block_n)], note)``: the kernels' and the user's schedules, then the defaults.

    A kernel that cannot be imported because an optional dependency is missing (e.g. triton)
    is skipped, and the note says so; a schedule the user named must load.
    """
    kernels, skipped = load_schedules(settings.kernel_schedule_specs, optional=True)
    users, _ = load_schedules(settings.schedule_specs)
    seen = {}
    for label, s in [*kernels, *users, *settings.schedules]:
        seen.setdefault((s.block_m, s.block_n), label)
    for blocks in DEFAULT_BLOCKS:
        seen.setdefault(blocks, "default")
    blocks = [(label, bm, bn) for (bm, bn), label in seen.items()]
    note = "block sizes: " + ", ".join(f"{bm}x{bn} ({label})" for label, bm, bn in blocks)
    if skipped:
        note += "; not loaded: " + "; ".join(skipped)
    return blocks, note


def load_schedules(specs, optional=False):
    """``([(spec, TileSchedule)], [skipped])`` for ``module:attribute`` specs (a schedule or a list)."""
    found, skipped = [], []
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except ModuleNotFoundError as error:
            if optional and error.name != module_name:  # the kernel is there, a dependency is not
                skipped.append(f"{spec} ({error})")
                continue
            raise ValueError(f"argument '--schedule': cannot load {spec!r} ({error})") from None
        except (ImportError, AttributeError) as error:
            raise ValueError(f"argument '--schedule': cannot load {spec!r} ({error})") from None
        loaded = list(value) if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(s, schedule.TileSchedule) for s in loaded):
            raise ValueError(f"argument '--schedule': {spec!r} is not a TileSchedule or a list of them")
        found += [(spec, s) for s in loaded]
    return found, skipped


def checks(settings: Settings, budget: Budget):
    blocks, note = schedules(settings)
    for claim, prop in PROPERTIES:
        proof = check_property(claim, prop, blocks, budget)
        proof.detail = "; ".join(filter(None, (proof.detail, note)))
        yield proof


def check_property(claim, prop, blocks, budget: Budget, families=None):
    def queries():
        for label, block_m, block_n in blocks:
            for family, g in geometries():
                if families is not None and family not in families:
                    continue
                t = Tile(g, block_m, block_n)
                formula, show = prop(t)
                yield Query(formula, t.hypotheses(), show, case=f"blocks {block_m}x{block_n} ({label}); {family}")

    return check_z3(claim, queries(), budget=budget)


# ---- negative controls


def _key_interval_ending_early(i, g):
    lo, hi = masks.key_interval(i, g)
    return lo, hi - 1


def _key_interval_top_left(i, g):
    if g.causal == "bottom_right":
        g = MaskGeometry(g.len_q, g.len_k, "top_left", g.window, g.has_attn_mask)
    return masks.key_interval(i, g)


def _tile_class_padded_lengths(bm, bn, g, block_m, block_n):
    from attnformal import ops

    padded = MaskGeometry(ops.cdiv(g.len_q, block_m) * block_m, ops.cdiv(g.len_k, block_n) * block_n,
                          g.causal, g.window, g.has_attn_mask)
    return _TILE_CLASS(bm, bn, padded, block_m, block_n)


_TILE_CLASS = schedule.tile_class


def _on_small_blocks(prop_index):
    claim, prop = PROPERTIES[prop_index]
    return lambda budget: check_property(claim, prop, [("control", 3, 5), ("control", 64, 64)], budget)


CONTROLS = (
    Control("skip rule off by one", "the schedule's key intervals end one key early, so a tile whose "
            "only allowed key is its first column is skipped", schedule, "key_interval",
            _key_interval_ending_early, _on_small_blocks(0)),
    Control("top-left for bottom-right", "the schedule aligns a bottom-right causal mask top-left",
            schedule, "key_interval", _key_interval_top_left, _on_small_blocks(0)),
    Control("ragged edges ignored", "tile_class classifies as if both lengths were padded to whole blocks",
            schedule, "tile_class", _tile_class_padded_lengths, _on_small_blocks(3)),
)
