"""Obligation -- attention sinks: one more merge state.

A sink is a per-head logit ``sigma`` that joins the softmax denominator and carries no value:

    out = sum_j exp(s_j) v_j / (exp(sigma) + sum_j exp(s_j)),   lse = log(exp(sigma) + sum_j exp(s_j)).

In the key-set language of :mod:`attnformal.proofs.keysets` the sink is the key set of one score
``sigma`` and value 0: ``M = sigma``, ``E = exp(sigma)``, ``A = 0``. The spec's
``merge.sink_state(sigma)`` is ``(sigma, 1, 0)``; the kernels merge it into the row state.

**Theorem Sa (Z3, any block length).** The sink state is the state of that key set:
``sink_state(sigma) = state({sink}) = (sigma, exp(sigma) exp(-sigma), 0)``, and for a key set ``K``
of any length (empty or not), disjoint from it, ``merge(sink_state(sigma), state(K)) =
state(K u {sink}) = merge(state(K), sink_state(sigma))``. With Theorem 1a (the merge of two key
sets' states is their union's) and the monoid laws (obligation 2), merging the sink first,
between or last of any number of tiles, split-KV parts or devices gives ``state(K u {sink})``:
the dense definition above. A sink of ``-inf`` merged on either side gives ``state(K)``: no sink.
Axioms ``exp-positive``, ``exp-add``, ``exp-zero``; hypothesis ``E >= exp(M)`` for nonempty ``K``.

**Theorem Sb (SymPy, exact).** The row's result, as the kernels produce it (their fold,
``kernels.split_kv.fold_row``, which starts from ``merge.initial_state(e, sigma) = merge(e, sink_state(sigma))``,
then ``finalize``): for nonempty ``K``
``out = A / (E + exp(sigma))`` and ``lse = log(E + exp(sigma))``, both orders of ``M`` and
``sigma``; for empty ``K``, ``out = 0`` and ``lse = sigma`` (not ``-inf``); with ``sigma = -oo``,
``(A/E, log E)`` and ``(0, -oo)``: the rules without a sink.

**Theorem Sc (SymPy, exact; obligation 11 (e) with a sink).** ``fold_row`` over 1 to 3 split-KV
parts of 0 to 2 key blocks each merges the sink's state exactly once per row (into one part), and
every block's state once: with Sa, the row's state is ``state(K u {sink})`` however the keys are split.

Negative controls: the sink given a value (``acc = v``), and the sink left out of lse (the
kernel normalises ``out`` with the sink but finalises ``lse`` from the state without it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import sympy
import z3

from attnformal import merge as spec
from attnformal.domains import ExtendedReal
from attnformal.logic import Budget, Control, Query, Settings, check_identities, check_z3
from attnformal.kernels import split_kv
from attnformal.merge import SoftmaxState
from attnformal.proofs import splits
from attnformal.proofs.keysets import (EXP_AXIOMS, KeySet, describe, identity_state, key_set_cases, real_exp,
                                       same_state, show_state, union_state)

TITLE = "Attention sinks (one more merge state)"
# The row is the kernels' own fold (split_kv.fold_row), never a fold order restated here.
STATED_WITHOUT = ("attnformal.merge.initial_state",)


def checks(settings: Settings, budget: Budget):
    yield sink_is_a_key_set(budget)
    yield minus_inf_sink_is_no_sink(budget)
    yield row_result(budget)
    yield splits.fold_row_merges_each_once(budget, with_sink=True)


@dataclass(frozen=True)
class SinkKeySet(KeySet):
    """The sink as a key set: one score ``M = sigma``, so ``E = exp(sigma)``; value 0, so ``A = 0``."""

    name: str = "sink"
    empty: bool = False

    @property
    def M(self):
        return z3.Real("sigma")

    @property
    def E(self):
        return real_exp()(self.M)

    @property
    def A(self):
        return z3.RealVal(0)


def sink_is_a_key_set(budget: Budget):
    sink = SinkKeySet()
    sink_state = spec.sink_state(ExtendedReal.finite(sink.M))

    def queries():
        yield Query(same_state(sink_state, sink.state()), sink.facts(), case="sink_state = state({sink})",
                    show={**sink.show(), **show_state("sink_state", sink_state)})
        for (keys,) in key_set_cases("K"):
            for side, merged, union in (  # the union's max written in the merge's order (Z3's If terms match)
                    ("sink first", spec.merge(sink_state, keys.state()), union_state(sink, keys)),
                    ("sink last", spec.merge(keys.state(), sink_state), union_state(keys, sink))):
                yield Query(same_state(merged, union), (*keys.facts(), *sink.facts()),
                            case=f"{describe((keys,))}, {side}",
                            show={**keys.show(), **sink.show(), **show_state("merge", merged)})

    return check_z3("sink_state(sigma) = state({sink}); merging it on either side of state(K) gives "
                    "state(K u {sink}), K of any length", queries(), budget=budget, axioms=EXP_AXIOMS)


def minus_inf_sink_is_no_sink(budget: Budget):
    sink_state = spec.sink_state(ExtendedReal.lift(float("-inf")))

    def queries():
        for (keys,) in key_set_cases("K"):
            for side, merged in (("sink first", spec.merge(sink_state, keys.state())),
                                 ("sink last", spec.merge(keys.state(), sink_state))):
                yield Query(same_state(merged, keys.state()), keys.facts(), case=f"{describe((keys,))}, {side}",
                            show={**keys.show(), **show_state("merge", merged)})

    return check_z3("a sink of -inf merged on either side of state(K) gives state(K): no sink", queries(),
                    budget=budget, axioms=EXP_AXIOMS)


def kernel_row(key_state: SoftmaxState, sigma):
    """The kernels' row: their own fold (``split_kv.fold_row``: the sink into the first part, one part here
    whose one block has the keys' state), finalised."""
    return spec.finalize(split_kv.fold_row([[0]], identity_state(), lambda bn: key_state, sigma))


@dataclass(frozen=True)
class ExpOf:
    """An expected lse given by its exponential."""

    value: sympy.Expr


def row_cases():
    """``(label, state(K), sigma, expected (out, lse))`` for the dense definition of the sink.

    Where ``K`` is nonempty and the sink finite, the expected lse is given as ``exp(lse)``
    (``= E + exp(sigma)``): SymPy does not fold ``M + log(E exp(-M) + exp(sigma - M))`` into
    ``log(E + exp(sigma))``, but ``exp`` of it, exactly; ``exp`` is injective.
    """
    M, A = sympy.symbols("M A", real=True)
    d = sympy.Symbol("d", nonnegative=True)
    E = sympy.Symbol("E", positive=True)
    sigma = sympy.Symbol("sigma", real=True)
    empty = identity_state()
    for label, m, s in (("M >= sigma", M, M - d), ("sigma >= M", sigma - d, sigma)):
        keys = SoftmaxState(m, E * sympy.exp(-m), A * sympy.exp(-m))
        yield f"K nonempty, {label}", keys, s, (A / (E + sympy.exp(s)), ExpOf(E + sympy.exp(s)))
    yield "K empty", empty, sigma, (sympy.Integer(0), sigma)
    keys = SoftmaxState(M, E * sympy.exp(-M), A * sympy.exp(-M))
    yield "K nonempty, sigma = -oo", keys, -sympy.oo, (A / E, sympy.log(E))
    yield "K empty, sigma = -oo", empty, -sympy.oo, (sympy.Integer(0), -sympy.oo)


def row_result(budget: Budget):
    def pairs():
        for label, keys, sigma, (out, lse) in row_cases():
            got_out, got_lse = kernel_row(keys, sigma)
            yield f"{label}: out", got_out, out
            if isinstance(lse, ExpOf):
                yield f"{label}: exp(lse)", sympy.exp(got_lse), lse.value
            else:
                yield f"{label}: lse", got_lse, lse

    return check_identities("finalize of the sink-started fold = (A / (E + exp(sigma)), log(E + exp(sigma))); "
                            "empty K: (0, sigma)", pairs(), budget=budget,
                            hypotheses=("E > 0 (K nonempty)", "sigma real or -oo"))


# ---- negative controls


def sink_state_with_a_value(sink) -> SoftmaxState:
    """BROKEN: the sink carries a value ``v_sink`` into the accumulator."""
    return SoftmaxState(sink, 1.0, sympy.Symbol("v_sink", real=True))


def kernel_row_lse_without_sink(key_state: SoftmaxState, sigma):
    """BROKEN: ``out`` from the sink-started fold, ``lse`` from the keys' state alone."""
    out, _ = KERNEL_ROW(key_state, sigma)
    _, lse = spec.finalize(spec.merge(identity_state(), key_state))
    return out, lse


def _fold_sink_in_every_part(parts, empty, tile_state, sinks=None):
    """BROKEN: the sink is merged into each part's fold (counted once per part)."""
    return split_kv.combine([_FOLD_ROW([blocks], empty, tile_state, sinks) for blocks in parts])


_FOLD_ROW = split_kv.fold_row
KERNEL_ROW = kernel_row  # the real one, which the broken variant calls for ``out``

CONTROLS = (
    Control("sink given a value", "sink_state is (sink, 1, v) instead of (sink, 1, 0): the sink adds v to out",
            spec, "sink_state", sink_state_with_a_value, row_result),
    Control("sink merged into every split part", "fold_row starts every part's fold from the sink state, "
            "not only the first", split_kv, "fold_row", _fold_sink_in_every_part,
            lambda budget: splits.fold_row_merges_each_once(budget, with_sink=True)),
    Control("sink left out of lse", "out is normalised with the sink, lse finalised from the keys' state alone",
            sys.modules[__name__], "kernel_row", kernel_row_lse_without_sink, row_result),
)
