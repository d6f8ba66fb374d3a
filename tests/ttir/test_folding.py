"""folding.py: the spec's merge run on value trees, evaluated concretely, and the first difference between trees.

The trees here are built from the spec's own functions on :class:`TreeTile` leaves (no kernel), so the
concrete evaluator is checked against the spec evaluated on numpy arrays, and a hand-written tree without the
empty-row shift guard is the control that must differ from it.
"""

import numpy as np
import z3

from attnformal import ops
from attnformal.merge import SoftmaxState, block_state, merge
from attnformal.ttir.folding import Concrete, TreeTile, first_difference

RNG = np.random.default_rng(20261204)
# row 0 an ordinary row; row 1 a fully masked row that has seen no key yet (m = -inf, l = acc = 0)
VALUES = {"m": np.array([[0.5], [-np.inf]], np.float32), "l": np.array([[1.5], [0.0]], np.float32),
          "acc": np.vstack([RNG.standard_normal((1, 3)), np.zeros((1, 3))]).astype(np.float32),
          "s": np.vstack([RNG.standard_normal((1, 4)), np.full((1, 4), -np.inf)]).astype(np.float32),
          "v": RNG.standard_normal((4, 3)).astype(np.float32)}


def _leaves(name):
    return TreeTile(VALUES[name].shape, lambda lane: ("opaque", name, lane))


def _evaluate(tile):
    solver = z3.Solver()
    assert solver.check() == z3.sat
    concrete = Concrete(solver.model(), {}, lambda leaf, lane: VALUES[leaf[1]][lane], 32)
    return np.array([[concrete.value(tile.at((z3.IntVal(i), z3.IntVal(j)))) for j in range(tile.shape[1])]
                     for i in range(tile.shape[0])], np.float32)


def _spec_trees():
    state = SoftmaxState(_leaves("m"), _leaves("l"), _leaves("acc"))
    return merge(state, block_state(_leaves("s"), _leaves("v")))


def test_the_spec_on_value_trees_evaluates_to_the_spec_on_arrays():
    want = merge(SoftmaxState(VALUES["m"], VALUES["l"], VALUES["acc"]), block_state(VALUES["s"], VALUES["v"]))
    for tree, expected in zip(_spec_trees(), want):
        got, expected = _evaluate(tree), np.asarray(expected, np.float32)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    assert _evaluate(_spec_trees().l)[1, 0] == 0.0  # the masked row: no NaN


def test_a_tree_without_the_shift_guard_differs_and_its_first_difference_is_found():
    s = _leaves("s")
    unguarded = ops.rowsum(ops.exp(s - ops.rowmax(s)))  # exp(-inf - -inf) on the masked row
    spec = block_state(s, _leaves("v")).l
    lane = (z3.IntVal(1), z3.IntVal(0))
    assert first_difference(spec.at(lane), spec.at(lane), {}) is None
    found = first_difference(unguarded.at(lane), spec.at(lane), {})
    assert found is not None and found[1][0] == "reduce" and found[2][0] == "select", found
    got, want = _evaluate(unguarded), _evaluate(spec)
    assert np.isnan(got[1, 0]) and want[1, 0] == 0.0 and got[0, 0] == want[0, 0]
