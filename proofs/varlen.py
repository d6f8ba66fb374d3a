"""Obligation 16 -- packed variable-length batches (``cu_seqlens_q``, ``cu_seqlens_k``).

Every consumer runs a packed batch sequence by sequence (:func:`attnformal.features.varlen.run_packed`):
sequence ``b`` is gathered from the packed rows ``query_rows(spec, b, i)`` / ``key_rows(spec, b, j)``,
computed as its own problem ``spec.sequence(b)`` (geometry ``spec.geometry(b)``: its own lengths
``len_q(b) = cu_q[b+1] - cu_q[b]``, ``len_k(b)``, then ``kv_lens[b]``), and scattered back to the same
rows. The *packed predicate* is therefore: packed query row ``r`` may attend packed key ``c`` iff
``r = query_rows(b, i)``, ``c = key_rows(b, j)`` and ``may_attend(i, j, spec.geometry(b))`` for some
``b, i, j``. Here ``cu_q``, ``cu_k`` and ``kv_lens`` are Z3 arrays and the sequence indices symbolic.

Hypotheses (what validation allows): ``B >= 1``; ``cu[0] = 0`` and ``cu`` non-decreasing on ``[0, B]``
(its instances at the index terms the claim reads: ``0, B, b, b + 1, b', b' + 1``);
``0 <= kv_lens[b] <= len_k(b)``; the window's and other features' own domains.

**Theorem 16a (no key of another sequence; Z3, all B and all cumulative lengths).** For every mask
family of the spec (the features' prover values), if query ``i`` of sequence ``b`` may attend key
``j``, its packed key ``key_rows(b, j)`` lies in sequence ``b``'s keys ``[cu_k[b], cu_k[b+1])`` and in
no other sequence's: ``cu_k[b'] <= key_rows(b, j) < cu_k[b'+1]`` implies ``b' = b``.

**Theorem 16b (tiles never straddle a sequence; Z3, all B and lengths).** The kernels tile only the
unpacked problem of one sequence, whose geometry is an ordinary one: ``len_q(b), len_k(b) >= 0`` and
its key length ``spec.geometry(b).len_k`` is in ``[0, len_k(b)]``, so obligation 5's classification
(for all lengths) applies to it as it stands. And a tile of it covers exactly packed rows of that
sequence, no more: every in-range query ``0 <= i < len_q(b)`` maps into ``[cu_q[b], cu_q[b+1])`` and
every in-range key into ``[cu_k[b], cu_k[b+1])``. So no FULL tile (nor any tile) spans two sequences.

**Theorem 16c (the index map is a bijection; Z3).** Injective for all B: ``query_rows(b, i) =
query_rows(b', i')`` with both in range implies ``b = b'`` and ``i = i'`` (keys likewise). Onto for
``B <= 8`` (an existential over ``b``, written out): every ``0 <= r < cu[B]`` is ``query_rows(b, i)``
for some ``b`` and its in-range ``i = r - cu[b]``.

Every claim's ranges are written on the arrays themselves (``cu[b] <= row < cu[b+1]``, lengths
``cu[b+1] - cu[b]``), never with the functions of :mod:`attnformal.features.varlen` under test.
"""

from __future__ import annotations

import z3

from attnformal import masks
from attnformal.features import varlen
from attnformal.logic import Budget, Control, Query, Settings, check_z3
from attnformal.proofs.integers import domain, spec_families, symbolic_spec

TITLE = "Packed variable-length batches"
# The claims' ranges are written on the arrays; these functions under test are reached only through the
# index maps (query_rows, key_rows) the claims are about (tests/proofs/test_statements.py).
STATED_WITHOUT = ("attnformal.features.varlen.sequence_start", "attnformal.features.varlen.sequence_length",
                  "attnformal.features.varlen.packed_index")
ONTO_UP_TO = 8  # batch sizes for which 16c's surjectivity is checked (the other claims hold for all B)

B = z3.Int("B")
CU_Q, CU_K = z3.Array("cu_q", z3.IntSort(), z3.IntSort()), z3.Array("cu_k", z3.IntSort(), z3.IntSort())


def checks(settings: Settings, budget: Budget):
    yield no_cross_sequence_key(budget)
    yield tiles_within_a_sequence(budget)
    yield map_is_injective(budget)
    yield map_is_onto(budget)


def cumulative(cu, name, indices, batch=B):
    """Hypotheses on cumulative lengths: ``cu[0] = 0`` and ``cu[x] <= cu[y]`` for ``0 <= x <= y <= B``,
    for every pair of the index terms the claim reads (``b, b+1, ...``). Validation makes ``cu``
    non-decreasing everywhere; these instances are all a claim uses, and they keep every query
    quantifier-free (a quantified hypothesis left the vacuity checks undecided)."""
    terms = [0, batch, *indices, *(x + 1 for x in indices)]
    monotone = [z3.Implies(z3.And(0 <= x, x <= y, y <= batch), cu[x] <= cu[y]) for x in terms for y in terms
                if x is not y]
    return ((f"{name}[0] = 0", cu[0] == 0), (f"{name} non-decreasing on [0, B] (at the claim's indices)",
                                               z3.And(*monotone)))


def packed_spec(values):
    return symbolic_spec({**values, "cu_seqlens_q": CU_Q, "cu_seqlens_k": CU_K}, attn_mask=False).replace(batch=B)


def sequence_hypotheses(spec, *indices):
    """``B >= 1``, both cumulative arrays valid, every index a sequence, kv_lens within its sequence."""
    hypotheses = [("B >= 1", B >= 1), *cumulative(CU_Q, "cu_q", indices), *cumulative(CU_K, "cu_k", indices)]
    for b in indices:
        hypotheses.append((f"0 <= {b} < B", z3.And(0 <= b, b < B)))
        if spec.kv_lens is not None:
            keys = CU_K[b + 1] - CU_K[b]
            hypotheses.append((f"0 <= kv_lens[{b}] <= len_k({b})",
                               z3.And(0 <= spec.kv_lens[b], spec.kv_lens[b] <= keys)))
    return tuple(hypotheses)


def in_sequence(cu, b, row):
    """Packed row ``row`` belongs to sequence ``b``: ``cu[b] <= row < cu[b+1]`` (the meaning of the cumulative
    lengths, written on the array itself: never with ``varlen``'s functions, which are under test)."""
    return z3.And(cu[b] <= row, row < cu[b + 1])


def no_cross_sequence_key(budget: Budget):
    def queries():
        b, other, i, j = z3.Ints("b b' i j")
        for label, values in spec_families():
            spec = packed_spec(values)
            g = spec.geometry(b)
            key = varlen.key_rows(spec, b, j)
            allowed = masks.may_attend(i, j, g)
            hypotheses = sequence_hypotheses(spec, b, other) + domain(g)
            show = {"b": b, "b'": other, "i": i, "j": j, "packed key": key, "cu_k[b]": CU_K[b],
                    "cu_k[b+1]": CU_K[b + 1], "cu_k[b']": CU_K[other], "len_k(b)": g.len_k}
            claim = z3.Implies(allowed, z3.And(in_sequence(CU_K, b, key),
                                               z3.Implies(in_sequence(CU_K, other, key), other == b)))
            yield Query(claim, hypotheses, show, case=label)

    return check_z3("a query of sequence b attends only keys of sequence b (packed rows), every mask family",
                    queries(), budget=budget)


def tiles_within_a_sequence(budget: Budget):
    def queries():
        b, i, j = z3.Ints("b i j")
        for label, values in spec_families():
            spec = packed_spec(values)
            g = spec.geometry(b)
            len_q, len_k = CU_Q[b + 1] - CU_Q[b], CU_K[b + 1] - CU_K[b]  # the meaning, not sequence_lengths
            row, key = varlen.query_rows(spec, b, i), varlen.key_rows(spec, b, j)
            lengths = spec.sequence_lengths(b)
            claim = z3.And(lengths[0] == len_q, lengths[1] == len_k, len_q >= 0, len_k >= 0, g.len_q == len_q,
                           0 <= g.len_k, g.len_k <= len_k,
                           z3.Implies(z3.And(0 <= i, i < len_q), in_sequence(CU_Q, b, row)),
                           z3.Implies(z3.And(0 <= j, j < len_k), in_sequence(CU_K, b, key)))
            show = {"b": b, "i": i, "j": j, "len_q(b)": len_q, "len_k(b)": len_k, "packed row": row,
                    "packed key": key}
            yield Query(claim, sequence_hypotheses(spec, b) + domain(g), show, case=label)

    return check_z3("a sequence's geometry is an ordinary one and its tiles cover only its own packed rows and keys",
                    queries(), budget=budget)


def map_is_injective(budget: Budget):
    def queries():
        b, other, i, i2 = z3.Ints("b b' i i'")
        spec = packed_spec({})
        for side, rows, cu in (("queries", varlen.query_rows, CU_Q), ("keys", varlen.key_rows, CU_K)):
            lengths = [cu[x + 1] - cu[x] for x in (b, other)]
            premise = z3.And(0 <= i, i < lengths[0], 0 <= i2, i2 < lengths[1],
                             rows(spec, b, i) == rows(spec, other, i2))
            show = {"b": b, "b'": other, "i": i, "i'": i2, "row(b, i)": rows(spec, b, i)}
            yield Query(z3.Implies(premise, z3.And(b == other, i == i2)), sequence_hypotheses(spec, b, other), show,
                        case=side)

    return check_z3("the packed index map is injective (queries and keys), all B", queries(), budget=budget)


def map_is_onto(budget: Budget):
    def queries():
        r = z3.Int("r")
        for batch in range(1, ONTO_UP_TO + 1):
            spec = packed_spec({}).replace(batch=batch)
            for side, rows, cu in (("queries", varlen.query_rows, CU_Q), ("keys", varlen.key_rows, CU_K)):
                hits = []
                for b in range(batch):  # r = rows(b, i) with i = r - cu[b] in [0, cu[b+1] - cu[b])
                    i = r - cu[b]
                    hits.append(z3.And(0 <= i, i < cu[b + 1] - cu[b], rows(spec, b, i) == r))
                hypotheses = (*cumulative(cu, "cu", list(range(batch)), batch),
                              ("0 <= r < cu[B]", z3.And(0 <= r, r < cu[batch])))
                yield Query(z3.Or(*hits), hypotheses, {"r": r, **{f"cu[{x}]": cu[x] for x in range(batch + 1)}},
                            case=f"B={batch}, {side}")

    return check_z3(f"the packed index map is onto [0, T) (queries and keys), B <= {ONTO_UP_TO}", queries(),
                    budget=budget)


# ---- negative controls


def _key_offset_by_one(spec, b, j):
    return varlen.packed_index(spec.cu_seqlens_k, b, j) + 1


def _keys_through_cu_q(spec, b, j):
    return varlen.packed_index(spec.cu_seqlens_q, b, j)


CONTROLS = (
    Control("key offset off by one", "key j of sequence b read from packed row cu_k[b] + j + 1 (the next "
            "sequence's first key leaks in)", varlen, "key_rows", _key_offset_by_one, no_cross_sequence_key),
    Control("keys through cu_seqlens_q", "the key rows computed with the query offsets cu_q", varlen, "key_rows",
            _keys_through_cu_q, no_cross_sequence_key),
    Control("sequence start ignored", "query i of every sequence at packed row i (sequences share rows)", varlen,
            "query_rows", lambda spec, b, i: i, map_is_injective),
)
