"""One vocabulary, several interpretations: the same call agrees across families."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy
import torch
import z3

from attnformal import ops


def z3_value(term):
    return z3.simplify(term).as_long()


@pytest.mark.parametrize("a", [-9, -8, -1, 0, 1, 7, 8, 23])
@pytest.mark.parametrize("b", [1, 3, 8])
def test_floor_division_agrees_everywhere(a, b):
    expected = math.floor(a / b)
    assert ops.floordiv(a, b) == expected
    assert ops.floordiv(torch.tensor(a), b).item() == expected
    assert z3_value(ops.floordiv(z3.IntVal(a), b)) == expected
    assert ops.floordiv(sympy.Integer(a), b) == expected
    assert ops.cdiv(a, b) == math.ceil(a / b)


def test_log_of_zero_is_minus_infinity_in_every_family():
    assert ops.log(0.0) == -math.inf
    assert ops.log(torch.tensor(0.0)).item() == -math.inf
    assert ops.log(sympy.Integer(0)) == -sympy.oo
    assert ops.exp(ops.NEG_INF) == 0.0 and ops.exp(-sympy.oo) == 0


def test_python_bools_fold_away():
    x = z3.Int("x")
    assert ops.and_(True, x > 0) is not True and ops.and_(False, x > 0) is False
    assert ops.or_(True, x > 0) is True and ops.or_() is False and ops.and_() is True
    assert ops.where(True, "a", x) == "a"


@pytest.mark.parametrize("sort", [z3.Float32(), z3.FPSort(5, 11), z3.FPSort(8, 8)], ids=str)
@pytest.mark.parametrize("sign", [z3.fpIsPositive, z3.fpIsNegative], ids=["+0", "-0"])
def test_fp_maximum_of_signed_zeros_may_be_either_zero(sort, sign):
    # Proofs over ops.maximum must hold for both answers, because torch gives both.
    a, b = z3.FP("a", sort), z3.FP("b", sort)
    solver = z3.Solver()
    solver.add(z3.fpIsZero(a), z3.fpIsNegative(a), z3.fpIsZero(b), z3.fpIsPositive(b), sign(ops.maximum(a, b)))
    assert solver.check() == z3.sat


def test_object_arrays_run_element_wise():
    s = np.array([[sympy.Symbol("x", real=True), -sympy.oo, sympy.Integer(2)]], dtype=object)
    assert ops.rowmax(s)[0, 0] == sympy.Max(sympy.Symbol("x", real=True), 2)
    assert list(ops.exp(s)[0]) == [sympy.exp(sympy.Symbol("x", real=True)), 0, sympy.exp(2)]
    assert ops.rowsum(np.array([[1, 2, 3]], dtype=object))[0, 0] == 6


def test_torch_rowmax_of_no_keys_is_minus_infinity():
    assert ops.rowmax(torch.zeros(3, 0)).flatten().tolist() == [-math.inf] * 3


def test_every_integer_op_is_in_the_provers_vocabulary_table():
    """An op added to attnformal.ops must be added to proofs/vocabulary.py's INTEGER_OPS (integer and
    Boolean ops: proved on Z3, checked on every other family) or REAL_OPS (float ops, obligations 1-4, 7, 8)."""
    import inspect

    from attnformal.proofs.vocabulary import INTEGER_OPS, REAL_OPS

    infrastructure = {"family", "z3_function"}
    public = {name for name, f in inspect.getmembers(ops, inspect.isfunction)
              if f.__module__ == ops.__name__ and not name.startswith("_")}
    listed = {op.name for op in INTEGER_OPS} | set(REAL_OPS)
    assert public - infrastructure - listed == set(), "add these to proofs/vocabulary.py"
    assert listed - public <= {op.name for op in INTEGER_OPS if not op.name.isidentifier()}, "operators only"
