"""folding.py: the spec's merge run on value trees, evaluated concretely, and the first difference between trees.

The trees here are built from the spec's own functions on :class:`TreeTile` leaves (no kernel), so the
concrete evaluator is checked against the spec evaluated on numpy arrays, and a hand-written tree without the
empty-row shift guard is the control that must differ from it. The real-arithmetic reading (:class:`Reals`) is
held to a base-2 online update, which means what the spec's merge means, with a rescale left out and ln 2 rounded
as the controls that must not.
"""

import numpy as np
import z3

from attnformal import ops
from attnformal.merge import SoftmaxState, block_state, merge
from attnformal.ttir.folding import LN2, Concrete, Reals, Trees, TreeTile, first_difference

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


def _exp2(x):
    return TreeTile(x.shape, lambda lane: ("op", "math.exp2", x.at(lane)))


def _base2_update(rescale=True, ln2=LN2):
    """The Triton tutorial's loop body on leaves: s and m in units of log2 e; what it means, as the spec's state."""
    m, l, acc, s = (_leaves(name) for name in ("m", "l", "acc", "s"))
    m_new = ops.maximum(m, ops.rowmax(s))
    p, alpha = _exp2(s - m_new), _exp2(m - m_new)
    state = SoftmaxState(m_new, l * alpha + ops.rowsum(p), (acc * alpha if rescale else acc) + ops.matmul(p, _leaves("v")))
    return SoftmaxState(state.m * ln2, state.l, state.acc)


def _means_the_spec(kernel):
    """Whether ``kernel`` has the spec merge's out = acc / l and exp(lse) = exp(m) l, on each lane, in real arithmetic."""
    spec = merge(SoftmaxState(_leaves("m") * LN2, _leaves("l"), _leaves("acc")), block_state(_leaves("s") * LN2, _leaves("v")))
    reals = Reals({})
    lanes = (z3.Int("i"), z3.Int("d"))
    return [reals.equal(reals.value(a.at(lanes)), reals.value(b.at(lanes)))
            for a, b in ((kernel.acc / kernel.l, spec.acc / spec.l), (Trees.exp(kernel.m) * kernel.l, Trees.exp(spec.m) * spec.l))]


def test_a_base_2_update_means_the_spec_merge_in_real_arithmetic():
    assert _means_the_spec(_base2_update()) == [True, True]


def test_a_base_2_update_without_the_rescale_or_with_ln_2_rounded_does_not():
    assert _means_the_spec(_base2_update(rescale=False)) == [False, True]  # lse never reads acc
    rounded = TreeTile((), lambda lane: ("const", float(np.log(2))))  # exact in real arithmetic: not ln 2
    assert _means_the_spec(_base2_update(ln2=rounded)) == [True, False]  # out is the same whatever m stands for
