"""Obligation 18 -- ALiBi, bias and softcap mean what the spec says, in the order it says.

The meaning is stated independently in :mod:`attnformal.proofs.meaning` (no code shared with the
features); the spec's own code is what runs here.

* **(a) ALiBi for all lengths (Z3).** For every batch element ``b`` (symbolic) of a symbolic spec --
  ``Sq, Sk >= 0``, with or without ``kv_lens`` (a Z3 array, ``0 <= kv_lens[b] <= Sk``) -- every
  ``0 <= i < Sq``, ``0 <= j < Sk`` and real slope:
  ``features.alibi.alibi_bias(i, j, slope, Sq, spec.geometry(b).len_k)`` (what
  ``AlibiSlopes.score_bias`` computes, with ``spec.key_lengths``' ``geometry(b).len_k``) equals
  ``-slope * |i + Sk_b - Sq - j|``, ``Sk_b = kv_lens[b]`` or ``Sk``.
* **(b) The tensors the kernels add (checked: B <= 2, Hq = 2, Sq, Sk <= 3).** ``spec.score_bias``
  on every tile of 2 x 2 of every batch group the kernels form (``spec.batch_groups()``), and
  ``spec.dense_score_bias`` (the adapters' and the references' one table), equal entry by entry
  the meaning's ``alibi(slope[b, h]) + bias[b, h, i, j]`` (numpy broadcasting, stated literally),
  for slopes ``[Hq]`` and ``[B, Hq]``, every ``kv_lens`` vector, a full bias and broadcast ones,
  ALiBi and bias together; None when neither is given. Values are dyadic: float64 sums are exact.
* **(c) The order (SymPy, exact).** ``tile.tile_scores`` gives ``softcap * tanh(scale q.k /
  softcap) + bias`` (the cap before the bias), ``scale q.k + bias`` without a cap; and
  ``spec.modify_scores(s) = softcap * tanh(s / softcap)``.

Negative controls: ALiBi's sign flipped, ALiBi aligned top-left (no ``Sk_b - Sq``), ALiBi aligned
with ``Sk`` instead of ``kv_lens[b]``, slopes read from batch element 0, the bias added inside the cap.
"""

from __future__ import annotations

import itertools

import numpy as np
import sympy
import z3

from attnformal import tile
from attnformal.features import alibi
from attnformal.features.softcap import apply_softcap
from attnformal.logic import Budget, Control, Query, Settings, check_exhaustively, check_identities, check_z3
from attnformal.proofs import meaning
from attnformal.proofs.integers import symbolic_spec
from attnformal.spec import AttentionSpec

TITLE = "ALiBi, bias, softcap (text and order)"
# The cap and the key lengths are stated by the meaning, not by the code under test.
STATED_WITHOUT = ("attnformal.features.softcap.apply_softcap", "attnformal.spec.AttentionSpec.key_lengths")
MAX_BATCH, HEADS, MAX_LEN, BLOCK = 2, 2, 3, 2  # (b)'s domain


def checks(settings: Settings, budget: Budget):
    yield alibi_all_lengths(budget)
    yield score_bias_tensors(budget)
    yield score_order(budget)


def alibi_all_lengths(budget: Budget):
    def queries():
        b, i, j = z3.Ints("b i j")
        slope = z3.Real("slope")
        for label, values in (("no kv_lens", {}), ("kv_lens", {"kv_lens": z3.Array("kv_lens", z3.IntSort(),
                                                                                     z3.IntSort())})):
            spec = symbolic_spec(values, attn_mask=False)
            kv_lens = values.get("kv_lens")
            kv_len = meaning.key_length(b, len_k=spec.len_k, kv_lens=kv_lens)
            got = alibi.alibi_bias(i, j, slope, spec.len_q, spec.geometry(b).len_k)
            expected = meaning.alibi(i, j, slope=slope, len_q=spec.len_q, kv_len=kv_len)
            hypotheses = [("0 <= i < Sq, 0 <= j < Sk", z3.And(0 <= i, i < spec.len_q, 0 <= j, j < spec.len_k))]
            if kv_lens is not None:
                hypotheses.append(("0 <= kv_lens[b] <= Sk", z3.And(0 <= kv_len, kv_len <= spec.len_k)))
            show = {"Sq": spec.len_q, "Sk": spec.len_k, "Sk_b": kv_len, "i": i, "j": j, "slope": slope,
                    "alibi_bias": got, "meaning": expected}
            yield Query(got == expected, tuple(hypotheses), show, case=label)

    return check_z3("(a) alibi_bias(i, j, slope, Sq, spec.geometry(b).len_k) = -slope * |i + Sk_b - Sq - j|, all "
                    "lengths and batch elements", queries(), budget=budget)


# ---- (b): the tensors, on a bounded domain


def _dyadic(shape, offset):
    """Distinct dyadic values (exact in float64) of ``shape``: entry n is (offset + n + 1) / 8."""
    return np.arange(int(np.prod(shape, dtype=int)), dtype=float).reshape(shape) / 8 + (offset + 1) / 8


def _feature_sets(batch, len_q, len_k):
    """``(label, {feature: (nested list, shape)}, kv_lens choices)`` of (b)'s domain."""
    every_kv_lens = [None, *(list(t) for t in itertools.product(range(len_k + 1), repeat=batch))]
    per_head, per_batch = (HEADS,), (batch, HEADS)
    yield "nothing", {}, [None]
    yield "slopes [Hq]", {"alibi_slopes": per_head}, every_kv_lens
    yield "slopes [B, Hq]", {"alibi_slopes": per_batch}, every_kv_lens
    yield "bias [B, Hq, Sq, Sk]", {"bias": (batch, HEADS, len_q, len_k)}, [None]
    yield "bias [Sk]", {"bias": (len_k,)}, [None]
    yield "slopes [B, Hq] + bias [1, Hq, 1, Sk]", {"alibi_slopes": per_batch, "bias": (1, HEADS, 1, len_k)}, \
        every_kv_lens[-1:]


def _problems():
    import torch

    for batch, len_q, len_k in itertools.product(range(1, MAX_BATCH + 1), range(MAX_LEN + 1), range(MAX_LEN + 1)):
        q = torch.zeros(batch, HEADS, len_q, 1, dtype=torch.float64)
        k = torch.zeros(batch, HEADS, len_k, 1, dtype=torch.float64)
        for label, shapes, kv_choices in _feature_sets(batch, len_q, len_k):
            arrays = {name: _dyadic(shape, offset) for offset, (name, shape) in enumerate(shapes.items())}
            tables = {name: (array.tolist(), array.shape) for name, array in arrays.items()}  # the meaning's
            for kv_lens in kv_choices:
                spec = AttentionSpec.from_inputs(q, k, k, kv_lens=kv_lens, **{
                    name: torch.from_numpy(array) for name, array in arrays.items()})
                yield f"B={batch}, Sq={len_q}, Sk={len_k}, {label}, kv_lens={kv_lens}", spec, tables, kv_lens


def _expected(spec, tables, kv_lens, b, h, i, j):
    total = 0.0
    if "alibi_slopes" in tables:
        slope = meaning.broadcast_entry(*tables["alibi_slopes"], (b, h))
        total += meaning.alibi(i, j, slope=slope, len_q=spec.len_q,
                               kv_len=meaning.key_length(b, len_k=spec.len_k, kv_lens=kv_lens))
    if "bias" in tables:
        total += meaning.broadcast_entry(*tables["bias"], (b, h, i, j))
    return total


def _tiles(spec):
    """The kernels' calls: each batch group's tiles of BLOCK x BLOCK, and the dense table (all elements)."""
    import torch

    whole = (tuple(range(spec.batch)), slice(0, spec.len_q), slice(0, spec.len_k))
    for group in spec.batch_groups():
        for r0, c0 in itertools.product(range(0, spec.len_q, BLOCK), range(0, spec.len_k, BLOCK)):
            rows, cols = slice(r0, min(r0 + BLOCK, spec.len_q)), slice(c0, min(c0 + BLOCK, spec.len_k))
            yield (group, rows, cols), spec.score_bias(torch.tensor(group), rows, cols, torch.float64)
    yield whole, spec.dense_score_bias(torch.float64)


def _tile_mismatch(spec, tables, kv_lens, where, got):
    """The first entry where ``got`` differs from the meaning (or a wrong shape / a missing table), or None."""
    group, rows, cols = where
    positions = list(itertools.product(range(len(group)), range(spec.heads_q), range(rows.start, rows.stop),
                                       range(cols.start, cols.stop)))
    if not tables:
        return None if got is None else {"expected": "None", "got": "a table"}
    shape = (len(group), spec.heads_q, rows.stop - rows.start, cols.stop - cols.start)
    if got is None or tuple(got.shape) != shape:
        return {"expected shape": shape, "got": None if got is None else tuple(got.shape)}
    for n, h, i, j in positions:
        value, expected = float(got[n, h, i - rows.start, j - cols.start]), _expected(spec, tables, kv_lens,
                                                                                     group[n], h, i, j)
        if value != expected:
            return {"b": group[n], "h": h, "i": i, "j": j, "score_bias": value, "meaning": expected}
    return None


def score_bias_tensors(budget: Budget):
    def cases():
        for label, spec, tables, kv_lens in _problems():
            for where, got in _tiles(spec):
                wrong = _tile_mismatch(spec, tables, kv_lens, where, got)
                group, rows, cols = where
                yield f"{label}; batches {list(group)}, rows {rows.start}:{rows.stop}, cols {cols.start}:{cols.stop}", \
                    wrong is None, wrong or {}

    return check_exhaustively("(b) spec.score_bias (every tile, every batch group) and dense_score_bias = "
                              "alibi(slope[b, h], Sk_b) + bias[b, h, i, j] (broadcast), entry by entry", cases(),
                              domain=f"B <= {MAX_BATCH}, Hq = {HEADS}, Sq, Sk <= {MAX_LEN}, every kv_lens, "
                                     f"{BLOCK} x {BLOCK} tiles", budget=budget)


# ---- (c): the order


def score_order(budget: Budget):
    x, y, beta, s = sympy.symbols("x y beta s", real=True)
    cap = sympy.Symbol("softcap", positive=True)
    scale = sympy.Rational(1, 3)
    raw = scale * x * y
    spec = AttentionSpec(batch=1, heads_q=1, heads_kv=1, len_q=1, len_k=1, head_dim=1, head_dim_v=1, scale=scale,
                         softcap=cap)

    def scores(softcap, bias):
        matrix = np.array([[bias]], dtype=object) if bias is not None else None
        got, _ = tile.tile_scores(np.array([[x]], dtype=object), np.array([[y]], dtype=object), scale, softcap,
                                  None, matrix)
        return got[0, 0]

    def pairs():
        for softcap, bias in ((cap, beta), (cap, None), (None, beta)):
            label = f"softcap {'on' if softcap is not None else 'off'}, bias {'on' if bias is not None else 'off'}"
            biases = [] if bias is None else [bias]
            yield f"tile_scores, {label}", scores(softcap, bias), meaning.score(raw, softcap=softcap, biases=biases)
        yield "spec.modify_scores", spec.modify_scores(s), meaning.score(s, softcap=cap, biases=[])

    return check_identities("(c) tile_scores = softcap * tanh(scale q.k / softcap) + bias (the cap before the "
                            "bias); spec.modify_scores caps", pairs(), budget=budget,
                            hypotheses=("softcap > 0",))


# ---- negative controls


def _alibi_sign_flipped(i, j, slope, len_q, len_k):
    return -_ALIBI_BIAS(i, j, slope, len_q, len_k)


def _alibi_top_left(i, j, slope, len_q, len_k):
    return _ALIBI_BIAS(i, j, slope, len_q, len_q)  # kv_len = Sq: the Sk_b - Sq shift is gone


def _key_lengths_without_kv_lens(self, batches):
    import torch

    return torch.as_tensor(self.len_k).expand(len(batches))


def _slopes_of_element_zero(self, value, spec, batches, rows, cols, dtype):
    return _SCORE_BIAS(self, value[:1].expand_as(value), spec, batches, rows, cols, dtype)


def _bias_inside_the_cap(q, k, scale, softcap=None, allowed=None, bias=None):
    """BROKEN: the bias is added before the cap."""
    if softcap is None or bias is None:
        return _TILE_SCORES(q, k, scale, softcap, allowed, bias)
    return apply_softcap(scale * (q @ k.swapaxes(-1, -2)) + bias, softcap), None


_ALIBI_BIAS = alibi.alibi_bias
_SCORE_BIAS = alibi.AlibiSlopes.score_bias
_TILE_SCORES = tile.tile_scores

CONTROLS = (
    Control("ALiBi sign flipped", "alibi_bias returns +slope * |i + Sk_b - Sq - j|", alibi, "alibi_bias",
            _alibi_sign_flipped, alibi_all_lengths),
    Control("ALiBi aligned top-left", "alibi_bias measures |i - j| (no Sk_b - Sq shift)", alibi, "alibi_bias",
            _alibi_top_left, alibi_all_lengths),
    Control("ALiBi ignores kv_lens", "spec.key_lengths gives every batch element Sk keys (score_bias aligns "
            "ALiBi with Sk, not kv_lens[b])", AttentionSpec, "key_lengths", _key_lengths_without_kv_lens,
            score_bias_tensors),
    Control("ALiBi slopes of batch element 0", "score_bias reads every element's slopes from row 0",
            alibi.AlibiSlopes, "score_bias", _slopes_of_element_zero, score_bias_tensors),
    Control("bias inside the cap", "tile_scores caps scale q.k + bias instead of adding the bias after the cap",
            tile, "tile_scores", _bias_inside_the_cap, score_order),
)
