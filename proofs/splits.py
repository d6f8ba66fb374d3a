"""Obligation 11 -- split-KV: the parts partition the visited key blocks, and combine merges them.

* **(a) Split arithmetic (Z3, all ``num_splits``).** For all ``start <= end``, ``num_splits >= 1``
  and ``0 <= s < num_splits``, with ``part(s) = split_part(start, end, num_splits, s)``:
  ``part(0)`` starts at ``start``, ``part(num_splits - 1)`` ends at ``end``, ``part(s)`` ends
  where ``part(s + 1)`` starts, and no part ends before it starts. So the parts are disjoint,
  in order, and their union is exactly ``[start, end)``.
* **(b) ``TileSchedule.split_ranges`` as the kernels call it (Z3, all lengths and block sizes).**
  On the schedule of obligation 5 (symbolic block sizes) for every index-mask geometry (an
  explicit mask does not enter the loop bounds: ``kv_block_range`` never reads it) and
  ``num_splits`` in 1..4 and each named schedule's own (and on a named schedule of another
  class, with its own methods): ``split_ranges(bm, g)`` has
  ``num_splits`` parts, the first starts where ``kv_range(bm, g)`` starts, the last ends where
  it ends, each ends where the next starts, none ends before it starts. (The list is built by
  a Python loop over the parts, so its count is a number, not a symbol: (a) covers every
  count, (b) the code around it for these.)
* **(c) ``kernels.split_kv.combine`` (Z3).** For disjoint key sets ``K1, K2``, each empty or
  not, ``combine([state(K1)]) = state(K1)`` and ``combine([state(K1), state(K2)]) = state(K1 u K2)``
  (the key-set states of :mod:`attnformal.proofs.keysets`; axioms ``exp-positive``, ``exp-add``,
  ``exp-zero``).
* **(d) ``combine`` is the fold of the merge (Z3, 1 to 8 partial states).** With the merge an
  uninterpreted function ``merge(State, State)``: ``combine([p1]) = p1`` and
  ``combine([p1, ..., pn]) = merge(combine([p1, ..., p(n-1)]), pn)``. By (c) and induction on
  ``n``, ``combine`` of the states of up to 8 disjoint key sets is the state of their union;
  with (a) and (b), the partial states of the split parts combine to the state of the whole
  visited range, which ``finalize`` turns into the answer (obligations 3, 4).
* **(e) The kernels' own fold, ``kernels.split_kv.fold_row`` (SymPy, exact; 1 to 3 parts of 0 to 2
  blocks each).** The function ``torch_tiled._forward`` and the ring kernel call per row block,
  evaluated on symbolic states: key block ``bn``'s state is ``(0, w_bn, 0)`` (``w_bn`` a positive
  symbol), so the real ``merge`` adds the ``l`` of the states it is given (equal maxima) and the
  result's ``l`` counts how often each state was merged. It is ``sum_bn w_bn`` over every block of
  every part: each visited block merged exactly once, the empty start merged into nothing. With
  sinks (obligation 17, Theorem Sc) the sink's state ``(0, 1, 0)`` adds exactly 1: merged once per
  row, whatever the number of parts. With (c), (d) and Theorem 1a, the row's state is then the
  state of the union of the parts' key sets (and the sink).
"""

from __future__ import annotations

import itertools

import sympy
import z3

from attnformal import schedule
from attnformal.kernels import split_kv
from attnformal.logic import Budget, Control, Query, Settings, check_identities, check_z3, patched, plain_solver
from attnformal.merge import SoftmaxState
from attnformal.proofs.integers import floor_division, floor_division_lemma, geometries, symbolic_schedule
from attnformal.proofs.keysets import (EXP_AXIOMS, describe, identity_state, key_set_cases, same_state, show_state,
                                       union_state)
from attnformal.proofs.tile_classification import Tile, overriding

TITLE = "Split-KV parts and combine"
# fold_row is evaluated as the kernels call it, never restated with the merge's own start.
STATED_WITHOUT = ("attnformal.merge.initial_state", "attnformal.merge.sink_state")
PROVES_SCHEDULES = True  # the named schedules' num_splits (and overridden methods) are proven here
NUM_SPLITS = (1, 2, 3, 4)
MAX_PARTIALS = 8  # combine is shown to be the fold of the merge for up to this many partial states
FOLD_PARTS, FOLD_BLOCKS = 3, 2  # fold_row's shapes: 1..FOLD_PARTS parts of 0..FOLD_BLOCKS key blocks each


def checks(settings: Settings, budget: Budget):
    lemma = floor_division_lemma(budget)
    yield parts_partition(lemma, budget)
    counts = sorted({*NUM_SPLITS, *(s.num_splits for _, s in settings.schedules)})
    yield split_ranges_partition(lemma, [(f"num_splits={n}", symbolic_schedule(n)) for n in counts], budget)
    mine = overriding(settings)
    if mine:
        yield split_ranges_partition(lemma, mine, budget)
    pairs = combine_is_union(budget)
    yield pairs
    yield combine_is_fold(pairs, budget)
    yield fold_row_merges_each_once(budget, with_sink=False)


def parts_partition(lemma, budget: Budget):
    start, end, n, s = z3.Ints("start end num_splits s")
    first, last = schedule.split_part(start, end, n, 0), schedule.split_part(start, end, n, n - 1)
    this, following = schedule.split_part(start, end, n, s), schedule.split_part(start, end, n, s + 1)
    claim = z3.And(first[0] == start, last[1] == end, this[0] <= this[1],
                   z3.Implies(s + 1 < n, this[1] == following[0]))
    hypotheses = (("start <= end", start <= end), ("num_splits >= 1", n >= 1),
                  ("0 <= s < num_splits", z3.And(0 <= s, s < n)))
    show = {"start": start, "end": end, "num_splits": n, "s": s, "part(s)": this[0], "part(s) end": this[1],
            "part(s+1)": following[0], "last end": last[1]}
    return check_z3("split_part: the parts of [start, end) are disjoint, in order, and cover it (every num_splits)",
                    [Query(claim, hypotheses, show)], budget=budget, axioms=(floor_division(lemma),),
                    solver=plain_solver)


def split_ranges_partition(lemma, schedules, budget: Budget):
    def queries():
        for label, sched in schedules:
            num_splits = sched.num_splits
            for family, g in geometries():
                if g.has_attn_mask:  # loop bounds do not read the explicit mask
                    continue
                t = Tile(g, sched)
                parts, visited = sched.split_ranges(t.bm, g), sched.kv_range(t.bm, g)
                claim = z3.And(z3.BoolVal(len(parts) == num_splits), parts[0].start == visited.start,
                               parts[-1].stop == visited.stop, *(p.start <= p.stop for p in parts),
                               *(a.stop == b.start for a, b in zip(parts, parts[1:])))
                show = {**t.show(), "kv_range start": visited.start, "kv_range stop": visited.stop,
                        **{f"part {s} {side}": getattr(p, side) for s, p in enumerate(parts)
                           for side in ("start", "stop")}}
                yield Query(claim, t.hypotheses(), show, case=f"{label}; {family}")

    return check_z3(f"split_ranges(bm) cuts kv_range(bm) into num_splits contiguous parts, in order "
                    f"({', '.join(label for label, _ in schedules)})", queries(), budget=budget,
                    axioms=(floor_division(lemma),), solver=plain_solver)


def combine_is_union(budget: Budget):
    def queries():
        for n in (1, 2):
            for sets in key_set_cases(*(f"K{k}" for k in range(1, n + 1))):
                combined = split_kv.combine([k.state() for k in sets])
                yield Query(same_state(combined, union_state(*sets)), tuple(f for k in sets for f in k.facts()),
                            {**{name: v for k in sets for name, v in k.show().items()},
                             **show_state("combine", combined)}, case=describe(sets))

    return check_z3("combine([state(K1)]) = state(K1), combine([state(K1), state(K2)]) = state(K1 u K2)",
                    queries(), budget=budget, axioms=EXP_AXIOMS)


def combine_is_fold(pairs, budget: Budget):
    state = z3.DeclareSort("State")
    merge = z3.Function("merge", state, state, state)
    partials = z3.Consts(" ".join(f"p{k}" for k in range(1, MAX_PARTIALS + 1)), state)
    with patched(split_kv, "merge", merge):
        folds = [split_kv.combine(partials[:n]) for n in range(1, MAX_PARTIALS + 1)]
    queries = [Query(folds[0] == partials[0], show={"combine": folds[0]}, case="n=1")]
    queries += [Query(folds[n - 1] == merge(folds[n - 2], partials[n - 1]), show={"combine": folds[n - 1]},
                      case=f"n={n}") for n in range(2, MAX_PARTIALS + 1)]
    return check_z3(f"combine([p1..pn]) = merge(combine([p1..p(n-1)]), pn), n <= {MAX_PARTIALS}: by (c), "
                    f"combine of n <= {MAX_PARTIALS} disjoint key sets' states is their union's state",
                    queries, budget=budget, by=(pairs,))


def fold_shapes():
    """Every split of consecutive key blocks into 1..FOLD_PARTS parts of 0..FOLD_BLOCKS blocks."""
    for count in range(1, FOLD_PARTS + 1):
        for sizes in itertools.product(range(FOLD_BLOCKS + 1), repeat=count):
            ends = list(itertools.accumulate(sizes))
            yield [range(end - size, end) for size, end in zip(sizes, ends)]


def fold_row_merges_each_once(budget: Budget, with_sink: bool):
    weight = sympy.IndexedBase("w", positive=True)

    def pairs():
        for parts in fold_shapes():
            folded = split_kv.fold_row(parts, identity_state(), lambda bn: SoftmaxState(0, weight[bn], 0),
                                       sympy.Integer(0) if with_sink else None)
            expected = int(with_sink) + sum(weight[bn] for blocks in parts for bn in blocks)
            yield f"parts {[list(p) for p in parts]}", sympy.nsimplify(folded.l), expected

    sink = "and the sink's (0, 1, 0) once per row, " if with_sink else ""
    return check_identities(f"fold_row merges every part's blocks' states (0, w_bn, 0) once, {sink}l = "
                            f"{'1 + ' if with_sink else ''}sum w_bn ({FOLD_PARTS} parts or fewer of up to "
                            f"{FOLD_BLOCKS} blocks)", pairs(), budget=budget, hypotheses=("w_bn > 0",))


# ---- negative controls


def _parts_one_short(start, end, num_splits, s):
    """BROKEN: each part stops one block early (a block per split is never visited)."""
    lo, hi = _SPLIT_PART(start, end, num_splits, s)
    return lo, hi - 1


def _combine_all_but_last(partials):
    """BROKEN: the last split's partial state is dropped."""
    return _COMBINE(partials[:-1]) if len(partials) > 1 else _COMBINE(partials)


def _fold_skipping_the_last_block(parts, empty, tile_state, sinks=None):
    """BROKEN: each part's last key block is left out of the fold."""
    return _FOLD_ROW([blocks[:-1] for blocks in parts], empty, tile_state, sinks)


_SPLIT_PART = schedule.split_part
_COMBINE = split_kv.combine
_FOLD_ROW = split_kv.fold_row


CONTROLS = (
    Control("split parts one block short", "split_part ends each part one key block early",
            schedule, "split_part", _parts_one_short, lambda budget: parts_partition(floor_division_lemma(budget),
                                                                                      budget)),
    Control("split_ranges drops a block per split", "split_part ends each part one key block early, "
            "as TileSchedule.split_ranges calls it", schedule, "split_part", _parts_one_short,
            lambda budget: split_ranges_partition(floor_division_lemma(budget),
                                                  [("num_splits=2", symbolic_schedule(2))], budget)),
    Control("combine drops the last partial", "combine merges all partial states but the last",
            split_kv, "combine", _combine_all_but_last, combine_is_union),
    Control("combine drops the last of many", "combine merges all partial states but the last, from 3 on",
            split_kv, "combine", lambda partials: _COMBINE(partials[:-1] if len(partials) > 2 else partials),
            lambda budget: combine_is_fold(combine_is_union(budget), budget)),
    Control("fold_row skips a block per part", "the kernels' fold leaves each part's last key block out",
            split_kv, "fold_row", _fold_skipping_the_last_block,
            lambda budget: fold_row_merges_each_once(budget, with_sink=False)),
)
