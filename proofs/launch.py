"""Obligation 12 -- what the host hands the kernels: class tables, loop-bound tables, row intervals.

The schedule's methods are proven for all lengths (obligations 5, 11), but the tables built
from them are torch code and the Triton host helpers are plain Python: they are **checked
exhaustively on a bounded domain**, never proved. Domain: every ``Sq, Sk <= 4``, every
``kv_lens`` value ``0..Sk`` (one batch element each), causal none / top-left / bottom-right,
windows none, ``(1, 0)``, ``(-1, 2)``, chunk size none or 2, a prefix ``prefix_lens[b] = Sk - b`` under
causal (no window, no chunk: the spec refuses those), with and without ``attn_mask``, block sizes 2x3 and 3x2
(ragged edges both ways, up to two blocks a side), ``num_splits`` 1 and 2. The Triton tables
are built only for ``Sq >= 1`` (the kernel returns before building them when there is no query).

* (a) ``TileSchedule.class_table(spec)[b, bm, bn] = tile_class(bm, bn, spec.geometry(b))``,
  the entries evaluated on Python ints: every batch element is classified with its own
  ``kv_lens`` (also for a named schedule of another class, with its own ``class_table``).
* (b) The Triton kernel's ``_schedule_tables`` (when triton is installed): its class table is
  (a)'s; its ``kv_ranges`` and ``kv_splits`` rows are ``kv_range`` and ``split_ranges`` of each
  batch element's geometry; its ``q_ranges`` row of key block ``bn`` is the interval of query
  blocks whose tile with ``bn`` is not SKIP (contiguous by obligation 5 (g)).
* (c) The Triton kernel's row intervals ``row_lo, row_hi [B, Sq]`` (the element-wise mask of a
  PARTIAL tile is ``row_lo[b, i] <= j <= row_hi[b, i]``) keep exactly the keys ``0 <= j < Sk``
  that ``may_attend(i, j, spec.geometry(b))`` allows, for every ``b`` and ``i < Sq``, also with
  window bounds far beyond the lengths (``2**40``: the tables are clamped into int32).
"""

from __future__ import annotations

import importlib.util
import itertools

from attnformal import masks, schedule
from attnformal.logic import Budget, Control, Settings, check_exhaustively
from attnformal.proofs.tile_classification import overriding
from attnformal.schedule import SKIP, TileSchedule
from attnformal.spec import AttentionSpec

COST = 6  # rough seconds; the prover starts the longest obligations first
TITLE = "Kernel launch tables (bounded domain)"
PROVES_SCHEDULES = True  # a named schedule of another class has its own class_table checked here
MAX_LENGTH = 4
WINDOWS = (None, (1, 0), (-1, 2))
CHUNKS = (None, 2)
HUGE = 2**40  # window bounds past int32: the row tables must still be the spec's intervals
SCHEDULES = (TileSchedule(2, 3, 1), TileSchedule(3, 2, 2))
DOMAIN = (f"all Sq, Sk <= {MAX_LENGTH}, kv_lens 0..Sk, causal x windows {WINDOWS[1:]} x chunk_size 2 x attn_mask, "
          "prefix_lens Sk..0 under causal, block sizes 2x3, 3x2, num_splits 1, 2")
TRITON_DOMAIN = DOMAIN.replace("all Sq", "all 1 <= Sq")
MAX_BOUND, MAX_REACH = 40, 20


def checks(settings: Settings, budget: Budget):
    schedules = (*SCHEDULES, *(s for _, s in overriding(settings)))  # a named schedule's own class_table too
    triton_flash = _triton_host()
    cases, expected = domain(), {}  # built once, shared by (a), (b) and (c)
    tables = class_tables(schedules, budget, cases, expected)
    if triton_flash is None:
        tables = tables.but(detail=tables.detail + "; the Triton host tables and row intervals were NOT checked: "
                                                   "triton is not installed")
    yield tables
    if triton_flash is not None:
        with_queries = [case for case in cases if case[1].len_q >= 1]
        yield triton_tables(triton_flash, schedules, budget, with_queries, expected)
        yield row_intervals(triton_flash, budget, with_queries)


def _triton_host():
    """The Triton kernel module, or None when triton is not installed (then (b) and (c) are not run)."""
    try:
        from attnformal.kernels import triton_flash
    except ImportError:
        return None
    return triton_flash


def specs(min_len_q=0):
    """``(label, spec)``: one spec per lengths and mask family; batch element ``b`` has ``kv_lens[b] = b`` and,
    with a prefix, ``prefix_lens[b] = Sk - b``."""
    import torch

    for len_q, len_k in itertools.product(range(min_len_q, MAX_LENGTH + 1), range(MAX_LENGTH + 1)):
        q, k = torch.zeros(len_k + 1, 1, len_q, 1), torch.zeros(len_k + 1, 1, len_k, 1)
        for causal, window, chunk, prefix, has_mask in itertools.product(masks.CAUSAL_MODES, WINDOWS, CHUNKS,
                                                                         (False, True), (False, True)):
            if prefix and (causal is None or window is not None or chunk is not None):
                continue  # the spec refuses a prefix without causal, or with a window or a chunk
            mask = torch.ones(len_q, len_k, dtype=torch.bool) if has_mask else None
            prefix_lens = [len_k - b for b in range(len_k + 1)] if prefix else None
            spec = AttentionSpec.from_inputs(q, k, k, causal=causal, window=window, attn_mask=mask,
                                             kv_lens=list(range(len_k + 1)), chunk_size=chunk, prefix_lens=prefix_lens)
            yield (f"Sq={len_q}, Sk={len_k}, causal={causal}, window={window}, chunk_size={chunk}, "
                   f"prefix={prefix}, attn_mask={has_mask}"), spec


def domain(min_len_q=0):
    """``(label, spec, geometries)``: :func:`specs` with each batch element's geometry, computed once."""
    return [(label, spec, [spec.geometry(b) for b in range(spec.batch)]) for label, spec in specs(min_len_q)]


def expected_classes(sched: TileSchedule, spec: AttentionSpec, geometries):
    """``[b][bm][bn]`` from ``tile_class`` on Python ints, batch element by batch element."""
    rows, cols = range(sched.num_q_blocks(spec.geometry())), range(sched.num_kv_blocks(spec.geometry()))
    return [[[schedule.tile_class(bm, bn, g, sched.block_m, sched.block_n) for bn in cols] for bm in rows]
            for g in geometries]


def _expected(memo, sched, label, spec, geometries):
    """:func:`expected_classes`, once per case and schedule for every table compared with it."""
    if (label, sched) not in memo:
        memo[(label, sched)] = expected_classes(sched, spec, geometries)
    return memo[(label, sched)]


def class_tables(schedules, budget: Budget, cases=None, memo=None):
    memo = {} if memo is None else memo

    def compared():
        for label, spec, geometries in domain() if cases is None else cases:
            for sched in schedules:
                table, expected = sched.class_table(spec).tolist(), _expected(memo, sched, label, spec, geometries)
                wrong = _first_difference(table, expected)
                yield f"{label}; {sched}", wrong is None, {"[b, bm, bn]": wrong, "class_table": table,
                                                          "tile_class": expected}

    return check_exhaustively("(a) class_table[b, bm, bn] = tile_class(bm, bn, spec.geometry(b))", compared(),
                              domain=DOMAIN, budget=budget)


def _first_difference(table, expected):
    if len(table) != len(expected):
        return f"batch size {len(table)} != {len(expected)}"
    for b, bm in itertools.product(range(len(table)), range(len(expected[0]) if expected else 0)):
        if table[b][bm] != expected[b][bm]:
            return f"[{b}, {bm}, :]"
    return None


def triton_tables(triton_flash, schedules, budget: Budget, cases, memo):
    def compared():
        for label, spec, geometries in cases:
            for sched in schedules:
                classes, q_ranges, kv_ranges, kv_splits = (t.tolist() for t in triton_flash._schedule_tables(
                    sched, triton_flash._IndexGeometry(spec), "cpu")[:4])
                expected = _expected(memo, sched, label, spec, geometries)
                got = {"classes": classes, "q_ranges": q_ranges, "kv_ranges": kv_ranges, "kv_splits": kv_splits}
                want = {"classes": expected, "q_ranges": [_query_intervals(c) for c in expected],
                        "kv_ranges": [[_bounds(r) for r in _per_block(sched.kv_range, sched, g)] for g in geometries],
                        "kv_splits": [[[_bounds(r) for r in parts] for parts in
                                       _per_block(sched.split_ranges, sched, g)] for g in geometries]}
                wrong = [name for name in got if got[name] != want[name]]
                yield (f"{label}; {sched}", not wrong,
                       {"table": ", ".join(wrong), **{f"{n} (host)": got[n] for n in wrong},
                        **{f"{n} (schedule)": want[n] for n in wrong}})

    return check_exhaustively("(b) the Triton host tables are the schedule's: classes, q_ranges, kv_ranges, "
                              "kv_splits", compared(), domain=TRITON_DOMAIN, budget=budget)


def _per_block(method, sched, g):
    return [method(bm, g) for bm in range(sched.num_q_blocks(g))]


def _bounds(r):
    return [r.start, r.stop]


def _query_intervals(classes):
    """Per key block, ``[first, last + 1)`` of the query blocks whose tile is not SKIP (``[0, 0)`` if none)."""
    out = []
    for bn in range(len(classes[0]) if classes else 0):
        visited = [bm for bm, row in enumerate(classes) if row[bn] != SKIP]
        out.append([visited[0], visited[-1] + 1] if visited else [0, 0])
    return out


def row_intervals(triton_flash, budget: Budget, cases=None):
    def compared():
        for label, spec, geometries in (*(domain(min_len_q=1) if cases is None else cases), *huge_window_specs()):
            lo, hi = (t.tolist() for t in triton_flash._row_interval_tables(spec))
            wrong = [(b, i, j) for b, g in enumerate(geometries) for i in range(spec.len_q) for j in range(spec.len_k)
                     if (lo[b][i] <= j <= hi[b][i]) != bool(masks.may_attend(i, j, g))]
            yield label, not wrong, {"(b, i, j) differing": wrong[:4], "row_lo": lo, "row_hi": hi}

    return check_exhaustively("(c) the Triton row intervals keep exactly the keys may_attend(i, j, spec.geometry(b)) "
                              "allows", compared(), domain=f"{TRITON_DOMAIN}; windows with bounds {HUGE}",
                              budget=budget)


def huge_window_specs():
    """Specs whose window bounds pass int32 (the tables clamp them; the mask must not change)."""
    import torch

    for len_q, len_k in itertools.product(range(1, MAX_LENGTH + 1), range(MAX_LENGTH + 1)):
        q, k = torch.zeros(1, 1, len_q, 1), torch.zeros(1, 1, len_k, 1)
        for window in ((HUGE, 0), (0, HUGE), (HUGE, HUGE), (-HUGE, HUGE)):
            spec = AttentionSpec.from_inputs(q, k, k, causal="bottom_right", window=window)
            yield f"Sq={len_q}, Sk={len_k}, window={window}", spec, [spec.geometry(0)]


# ---- negative controls


def _class_table_ignoring_kv_lens(self, spec, device=None):
    """BROKEN: every batch element is classified with the full key length."""
    table = _CLASS_TABLE(self, spec, device)
    return table[:1].expand_as(table) if spec.kv_lens is not None and len(table) else table


def _one_key_short(row_tables):
    """BROKEN: ``row_tables`` with the last key of every row's interval dropped."""
    def tables(spec):
        lo, hi = row_tables(spec)
        return lo, hi - 1
    return tables


_CLASS_TABLE = TileSchedule.class_table
# Imported only when the obligation runs (torch and triton take seconds): here, only whether it can be.
_HAS_TRITON = importlib.util.find_spec("triton") is not None


CONTROLS = (
    Control("class_table ignores kv_lens", "class_table gives every batch element batch 0's classes",
            TileSchedule, "class_table", _class_table_ignoring_kv_lens, lambda budget: class_tables(SCHEDULES, budget)),
    *(() if not _HAS_TRITON else (
        Control("row intervals one key short", "the Triton row tables drop each row's last key",
                "attnformal.kernels.triton_flash", "_row_interval_tables", _one_key_short,
                lambda budget: row_intervals(_triton_host(), budget), wraps=True),)),
)
