"""Obligation 13 -- one vocabulary: every interpretation of the integer ops means the same.

The mask, the schedule and the GQA map are written once against :mod:`attnformal.ops` and
run on Python ints (loop bounds), torch tensors (the kernels' masks and tables), numpy arrays
and SymPy, while the proofs run them on Z3 Ints. This obligation ties those together, for
each operation in :data:`INTEGER_OPS` (to add one, add a line there; a test checks that every
integer operation of ``ops`` is listed):

* **(a) Z3 (proved, all integers).** The Z3 interpretation satisfies the operation's
  definition, e.g. ``floordiv(a, b) = q`` with ``q b <= a < q b + b`` for ``b >= 1`` (floor,
  not truncation: negative ``a`` included); ``truncdiv`` (C's division, for kernels' index
  arithmetic) leaves a remainder smaller than ``|b|`` with the sign of ``a``, for every ``b != 0``;
  ``shr(a, k)`` is ``floor(a / 2**k)`` and ``shl(a, k)`` is ``a * 2**k`` for each shift
  ``k = 0..5``; ``minimum(a, b)`` is ``<=`` both and one of them; ``where(c, a, b)`` is ``a``
  when ``c`` and ``b`` otherwise.
* **(b) Every other interpretation (checked exhaustively, bounded).** For every operand in the
  domain -- integers ``-10..10``, divisors ``1..7`` (``-7..-1`` too for ``truncdiv``), shifts
  ``0..5``, both booleans -- the result on Python
  ints, on torch int64 tensors (alone and with Python-int operands, as the kernels mix them),
  on numpy int64 arrays and on SymPy Integers equals the Z3 interpretation's value, which (a)
  shows is the definition.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy
import sympy
import z3

from attnformal import ops
from attnformal.logic import Budget, Control, Query, Settings, check_exhaustively, check_z3

TITLE = "One ops vocabulary: every interpretation agrees"
INTS, DIVISORS, BOOLS = range(-10, 11), range(1, 8), (False, True)
NONZERO, SHIFTS = (*range(-7, 0), *range(1, 8)), range(0, 6)
DOMAIN = "every operand in -10..10, divisors 1..7 (and -7..-1 for truncdiv), shifts 0..5, both booleans"


@dataclass(frozen=True)
class IntOp:
    """An integer or Boolean operation of the vocabulary.

    ``operands`` names each operand's kind: ``"int"``, ``"divisor"`` (an int >= 1), ``"nonzero"``
    (an int != 0), ``"shift"`` (a constant ``0 <= k``: a Python int in every family, as kernels
    shift by constants) or ``"bool"``; ``meaning(result, *operands)`` is its definition as a Z3
    formula.
    """

    name: str
    call: Callable
    operands: tuple[str, ...]
    meaning: Callable


INTEGER_OPS = (
    IntOp("floordiv", ops.floordiv, ("int", "divisor"), lambda q, a, b: z3.And(q * b <= a, a < q * b + b)),
    IntOp("cdiv", ops.cdiv, ("int", "divisor"), lambda q, a, b: z3.And(q * b >= a, a > q * b - b)),
    IntOp("truncdiv", ops.truncdiv, ("int", "nonzero"), lambda q, a, b: _rounds_toward_zero(a - q * b, a, b)),
    IntOp("shr", ops.shr, ("int", "shift"), lambda q, a, k: z3.And(q * 2**k <= a, a < (q + 1) * 2**k)),
    IntOp("shl", ops.shl, ("int", "shift"), lambda r, a, k: r == a * 2**k),
    IntOp("minimum", ops.minimum, ("int", "int"), lambda r, a, b: z3.And(r <= a, r <= b, z3.Or(r == a, r == b))),
    IntOp("maximum", ops.maximum, ("int", "int"), lambda r, a, b: z3.And(r >= a, r >= b, z3.Or(r == a, r == b))),
    IntOp("where", ops.where, ("bool", "int", "int"), lambda r, c, a, b: r == z3.If(c, a, b)),
    IntOp("and_", ops.and_, ("bool", "bool"), lambda r, a, b: r == z3.And(a, b)),
    IntOp("or_", ops.or_, ("bool", "bool"), lambda r, a, b: r == z3.Or(a, b)),
    IntOp("not_", ops.not_, ("bool",), lambda r, a: r == z3.Not(a)),
    IntOp("a + b", operator.add, ("int", "int"), lambda r, a, b: r == a + b),
    IntOp("a - b", operator.sub, ("int", "int"), lambda r, a, b: r == a - b),
    IntOp("a * b", operator.mul, ("int", "int"), lambda r, a, b: r == a * b),
    IntOp("a < b", operator.lt, ("int", "int"), lambda r, a, b: r == (a < b)),
    IntOp("a <= b", operator.le, ("int", "int"), lambda r, a, b: r == (a <= b)),
    IntOp("a == b", operator.eq, ("int", "int"), lambda r, a, b: r == (a == b)),
)
# The operations of ops that are not integer operations (checked by obligations 1-4, 7, 8).
REAL_OPS = ("exp", "log", "tanh", "is_neg_inf", "rowmax", "rowsum", "matmul")


def _rounds_toward_zero(remainder, a, b):
    """C's division: ``|remainder| < |b|``, and the remainder is 0 or has the sign of ``a``."""
    size = z3.If(remainder >= 0, remainder, -remainder)
    return z3.And(size < z3.If(b >= 0, b, -b), z3.Or(remainder == 0, (remainder > 0) == (a > 0)))


_Z3_SORTS = {"int": z3.IntSort(), "divisor": z3.IntSort(), "nonzero": z3.IntSort(), "bool": z3.BoolSort()}
_RANGES = {"int": INTS, "divisor": DIVISORS, "nonzero": NONZERO, "shift": SHIFTS, "bool": BOOLS}


def checks(settings: Settings, budget: Budget):
    yield z3_meets_the_definitions(budget)
    yield interpretations_agree(budget)


def z3_meets_the_definitions(budget: Budget):
    def queries():
        for op in INTEGER_OPS:
            for shifts in itertools.product(*(SHIFTS if kind == "shift" else (None,) for kind in op.operands)):
                args = [k if kind == "shift" else z3.Const(f"{op.name}.{n}", _Z3_SORTS[kind])
                        for n, (kind, k) in enumerate(zip(op.operands, shifts))]
                result = op.call(*args)
                limits = [*(("divisors >= 1", a >= 1) for a, kind in zip(args, op.operands) if kind == "divisor"),
                          *(("divisors != 0", a != 0) for a, kind in zip(args, op.operands) if kind == "nonzero")]
                shown = {**{f"operand {n}": a for n, a in enumerate(args)}, "result": result}
                yield Query(op.meaning(result, *args), tuple(limits), shown,
                            case=op.name + "".join(f", shift {k}" for k in shifts if k is not None))

    return check_z3("(a) on Z3 terms each op is its definition (floordiv is floor division, ...)", queries(),
                    budget=budget)


def _tensor(values):
    import torch

    return torch.tensor(values)


# How each family takes a column of operand values and gives back a list of results.
FAMILIES = {
    "python": lambda call, columns: [call(*row) for row in zip(*columns)],
    "torch": lambda call, columns: _listed(call(*(_tensor(c) for c in columns))),
    "torch with Python operands": lambda call, columns: [
        _item(call(*(_tensor(v) if k == 0 else v for k, v in enumerate(row)))) for row in zip(*columns)],
    "numpy": lambda call, columns: _listed(call(*(numpy.array(c) for c in columns))),
    "sympy": lambda call, columns: [_item(call(*(sympy.sympify(v) for v in row))) for row in zip(*columns)],
}


def _listed(x):
    return [_item(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def _item(v):
    v = v.item() if hasattr(v, "item") else v
    return bool(v) if isinstance(v, (bool, sympy.logic.boolalg.BooleanAtom)) else int(v)


def _z3_value(term):
    value = z3.simplify(term)
    return z3.is_true(value) if z3.is_bool(value) else value.as_long()


def interpretations_agree(budget: Budget):
    def cases():
        for op in INTEGER_OPS:
            rows = list(itertools.product(*(_RANGES[kind] for kind in op.operands)))
            columns = list(zip(*rows))
            expected = [_z3_value(op.call(*(_z3_constant(v, kind) for v, kind in zip(row, op.operands))))
                        for row in rows]
            for family, evaluate in FAMILIES.items():
                got = evaluate(op.call, columns)
                wrong = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b or type(a) is not type(b)),
                             None if len(got) == len(expected) else len(expected))
                shown = {} if wrong is None else {"operands": rows[wrong] if wrong < len(rows) else "-",
                                                  family: got[wrong] if wrong < len(got) else "missing",
                                                  "z3": expected[wrong] if wrong < len(expected) else "missing"}
                yield f"{op.name} on {family}", wrong is None, shown

    return check_exhaustively("(b) Python, torch, numpy and SymPy results = the Z3 interpretation's", cases(),
                              domain=DOMAIN, budget=budget)


def _z3_constant(value, kind):
    if kind == "shift":
        return value
    return z3.BoolVal(value) if isinstance(value, bool) else z3.IntVal(value)


# ---- negative controls


def _truncating(a, b):
    """BROKEN: C-style division, rounding toward zero."""
    return int(a / b)


CONTROLS = (
    Control("Python floordiv truncates", "ops floordiv on Python ints rounds toward zero",
            ops._Python, "floordiv", staticmethod(_truncating), interpretations_agree),
    Control("torch floordiv truncates", "ops floordiv on tensors uses rounding_mode='trunc'",
            ops._Torch, "floordiv", staticmethod(lambda a, b: a.div(b, rounding_mode="trunc")), interpretations_agree),
    Control("Z3 floordiv truncates", "ops floordiv on Z3 Ints rounds toward zero",
            ops._Z3, "floordiv", staticmethod(lambda a, b: z3.If(a >= 0, a / b, -((-a) / b))),
            z3_meets_the_definitions),
)
