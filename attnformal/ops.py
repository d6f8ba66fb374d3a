"""The small vocabulary that the spec's definitions are written in.

The mask predicate, the tile classification and the online-softmax merge are each written
once, against this module, and then evaluated on whatever their arguments are:

* Python numbers (the schedule's loop bounds, brute-force checks),
* torch tensors (the kernels and the oracle),
* SymPy expressions (exact algebra, with ``-oo`` as a real value),
* Z3 terms: integers for masks and tiles, reals and IEEE floats for the merge.

Each public function looks at its arguments and picks the family to use. Arithmetic and
comparisons need no shim (every family overloads ``+ - * / <=``); only the operations
whose spelling differs between families live here. An object can bring its own family
by giving its class an ``__attn_ops__`` attribute (the prover's extended reals do).
"""

from __future__ import annotations

import functools
import math

NEG_INF = float("-inf")


class _Python:
    """Plain Python numbers and bools."""

    @staticmethod
    def and_(xs):
        return all(xs)

    @staticmethod
    def or_(xs):
        return any(xs)

    @staticmethod
    def not_(x):
        return not x

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def maximum(a, b):
        return a if a >= b else b

    @staticmethod
    def minimum(a, b):
        return a if a <= b else b

    @staticmethod
    def floordiv(a, b):
        return a // b

    @staticmethod
    def exp(x):
        return 0.0 if x == NEG_INF else math.exp(x)

    @staticmethod
    def log(x):
        return math.log(x) if x > 0 else NEG_INF

    @staticmethod
    def tanh(x):
        return math.tanh(x)

    @staticmethod
    def is_neg_inf(x):
        return x == NEG_INF


class _Torch:
    """torch tensors; a row of scores is the last dimension."""

    @staticmethod
    def _tensor(x, like):
        import torch

        return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=like.dtype, device=like.device)

    @staticmethod
    def and_(xs):
        return functools.reduce(lambda a, b: a & b, xs)

    @staticmethod
    def or_(xs):
        return functools.reduce(lambda a, b: a | b, xs)

    @staticmethod
    def not_(x):
        return ~x

    @staticmethod
    def where(cond, a, b):
        import torch

        return torch.where(cond, a, b)

    @staticmethod
    def maximum(a, b):
        import torch

        like = a if isinstance(a, torch.Tensor) else b
        return torch.maximum(_Torch._tensor(a, like), _Torch._tensor(b, like))

    @staticmethod
    def minimum(a, b):
        import torch

        like = a if isinstance(a, torch.Tensor) else b
        return torch.minimum(_Torch._tensor(a, like), _Torch._tensor(b, like))

    @staticmethod
    def floordiv(a, b):
        import torch

        return torch.div(a, b, rounding_mode="floor")

    @staticmethod
    def exp(x):
        return x.exp()

    @staticmethod
    def log(x):
        return x.log()

    @staticmethod
    def tanh(x):
        return x.tanh()

    @staticmethod
    def is_neg_inf(x):
        return x == NEG_INF

    @staticmethod
    def rowmax(s):
        if s.shape[-1] == 0:  # a row of no keys: the max of nothing, the merge's identity
            return s.new_full((*s.shape[:-1], 1), NEG_INF)
        return s.amax(dim=-1, keepdim=True)

    @staticmethod
    def rowsum(p):
        return p.sum(dim=-1, keepdim=True)

    @staticmethod
    def matmul(p, v):
        return p @ v


class _SymPy:
    """SymPy expressions; ``-oo`` is a value, so the -inf cases are computed, not assumed."""

    @staticmethod
    def and_(xs):
        import sympy

        return sympy.And(*xs)

    @staticmethod
    def or_(xs):
        import sympy

        return sympy.Or(*xs)

    @staticmethod
    def not_(x):
        import sympy

        return sympy.Not(x)

    @staticmethod
    def where(cond, a, b):
        import sympy

        if cond == sympy.true:
            return a
        if cond == sympy.false:
            return b
        return sympy.Piecewise((a, cond), (b, True))

    @staticmethod
    def maximum(a, b):
        import sympy

        return sympy.Max(a, b)

    @staticmethod
    def minimum(a, b):
        import sympy

        return sympy.Min(a, b)

    @staticmethod
    def floordiv(a, b):
        import sympy

        return sympy.floor(sympy.sympify(a) / b)

    @staticmethod
    def exp(x):
        import sympy

        return sympy.exp(x)

    @staticmethod
    def log(x):
        import sympy

        # sympy.log(0) is complex infinity; the real limit is what the spec means.
        return sympy.S.NegativeInfinity if x == 0 else sympy.log(x)

    @staticmethod
    def tanh(x):
        import sympy

        return sympy.tanh(x)

    @staticmethod
    def is_neg_inf(x):
        import sympy

        return sympy.Eq(x, sympy.S.NegativeInfinity)


class _Z3:
    """Z3 terms: Int and Real arithmetic, Bool, and IEEE floating point (FPSort)."""

    @staticmethod
    def _fp_like(x, like):
        import z3

        if isinstance(like, z3.FPRef) and not isinstance(x, z3.ExprRef):
            return z3.FPVal(float(x), like.sort())
        return x

    @staticmethod
    def and_(xs):
        import z3

        return z3.And(*xs)

    @staticmethod
    def or_(xs):
        import z3

        return z3.Or(*xs)

    @staticmethod
    def not_(x):
        import z3

        return z3.Not(x)

    @staticmethod
    def where(cond, a, b):
        import z3

        a, b = _Z3._fp_like(a, b), _Z3._fp_like(b, a)
        return z3.If(cond, a, b)

    @staticmethod
    def maximum(a, b):
        import z3

        a, b = _Z3._fp_like(a, b), _Z3._fp_like(b, a)
        if isinstance(a, z3.FPRef):
            # SMT-LIB leaves fp.max(-0, +0) unspecified, and so does torch in practice (its scalar
            # path returns the first argument, its vectorised path +0). A proof over fp.max
            # therefore holds whichever zero the hardware picks.
            return z3.fpMax(a, b)
        return z3.If(a >= b, a, b)

    @staticmethod
    def minimum(a, b):
        import z3

        return z3.If(a <= b, a, b)

    @staticmethod
    def floordiv(a, b):
        # SMT-LIB integer division is Euclidean, which is floor division for b > 0 (the
        # only use here: block sizes are positive).
        return a / b

    @staticmethod
    def exp(x):
        return z3_function("exp", x.sort())(x)

    @staticmethod
    def log(x):
        return z3_function("log", x.sort())(x)

    @staticmethod
    def tanh(x):
        return z3_function("tanh", x.sort())(x)

    @staticmethod
    def is_neg_inf(x):
        import z3

        if isinstance(x, z3.FPRef):
            return z3.And(z3.fpIsInf(x), z3.fpIsNegative(x))
        return z3.BoolVal(False)  # a z3 Real is never -inf; the prover's extended reals are


class _NumPy:
    """numpy arrays, object arrays of SymPy or Z3 terms included: each element by its own family.

    This is how a tile of symbolic scores runs through the same tile code as a tensor.
    """

    @staticmethod
    def _elementwise(fn, nin):
        import numpy

        return numpy.frompyfunc(fn, nin, 1)

    and_ = staticmethod(lambda xs: functools.reduce(_NumPy._elementwise(and_, 2), xs))
    or_ = staticmethod(lambda xs: functools.reduce(_NumPy._elementwise(or_, 2), xs))
    not_ = staticmethod(lambda x: _NumPy._elementwise(not_, 1)(x))
    where = staticmethod(lambda c, a, b: _NumPy._elementwise(where, 3)(c, a, b))
    maximum = staticmethod(lambda a, b: _NumPy._elementwise(maximum, 2)(a, b))
    minimum = staticmethod(lambda a, b: _NumPy._elementwise(minimum, 2)(a, b))
    floordiv = staticmethod(lambda a, b: _NumPy._elementwise(floordiv, 2)(a, b))
    exp = staticmethod(lambda x: _NumPy._elementwise(exp, 1)(x))
    log = staticmethod(lambda x: _NumPy._elementwise(log, 1)(x))
    tanh = staticmethod(lambda x: _NumPy._elementwise(tanh, 1)(x))
    is_neg_inf = staticmethod(lambda x: _NumPy._elementwise(is_neg_inf, 1)(x))
    rowmax = staticmethod(lambda s: _NumPy._elementwise(maximum, 2).reduce(s, axis=-1, keepdims=True))
    rowsum = staticmethod(lambda p: _NumPy._elementwise(lambda a, b: a + b, 2).reduce(p, axis=-1, keepdims=True))
    matmul = staticmethod(lambda p, v: p @ v)


@functools.cache
def z3_function(name, sort):
    """The uninterpreted function that ``exp``/``log``/``tanh`` denote on a Z3 sort.

    It is uninterpreted on purpose: a proof about it holds for every function that
    satisfies the axioms the prover states, and nothing else is assumed.
    """
    import z3

    return z3.Function(f"{name}_{sort}", sort, sort)


_FAMILIES = {"torch": _Torch, "sympy": _SymPy, "z3": _Z3, "numpy": _NumPy}


def family(*xs):
    """The interpretation that the arguments call for (Python if none of them is special).

    An object that brings its own family wins over the Z3 Bool or plain number beside it, as in
    ``where(z3_condition, extended_real, 0.0)``; numpy arrays still go element by element first.
    """
    return _family_of_types(tuple(map(type, xs)))


@functools.cache  # decided by the argument types alone: the enumerations call ``family`` millions of times
def _family_of_types(types):
    modules = [t.__module__.partition(".")[0] for t in types]
    if "numpy" not in modules:
        for t in types:
            own = getattr(t, "__attn_ops__", None)
            if own is not None:
                return own
    for module in modules:
        found = _FAMILIES.get(module)
        if found is not None:
            return found
    return _Python


def _is_python_bool(x):
    return isinstance(x, bool)


def and_(*xs):
    """Conjunction; Python ``True``/``False`` operands are folded away first."""
    if any(x is False for x in xs):
        return False
    rest = [x for x in xs if not _is_python_bool(x)]
    if not rest:
        return True
    return rest[0] if len(rest) == 1 else family(*rest).and_(rest)


def or_(*xs):
    """Disjunction; Python ``True``/``False`` operands are folded away first."""
    if any(x is True for x in xs):
        return True
    rest = [x for x in xs if not _is_python_bool(x)]
    if not rest:
        return False
    return rest[0] if len(rest) == 1 else family(*rest).or_(rest)


def not_(x):
    return (not x) if _is_python_bool(x) else family(x).not_(x)


def where(cond, a, b):
    """``a`` where ``cond`` holds, else ``b`` (a Python bool condition picks at once)."""
    if _is_python_bool(cond):
        return a if cond else b
    return family(cond, a, b).where(cond, a, b)


def maximum(a, b):
    return family(a, b).maximum(a, b)


def minimum(a, b):
    return family(a, b).minimum(a, b)


def floordiv(a, b):
    """``floor(a / b)`` for a positive ``b``."""
    return family(a, b).floordiv(a, b)


def cdiv(a, b):
    """``ceil(a / b)`` for a positive ``b``: the number of size-``b`` blocks covering ``a``."""
    return floordiv(a + b - 1, b)


def exp(x):
    return family(x).exp(x)


def log(x):
    """Natural log, with ``log(0) = -inf``."""
    return family(x).log(x)


def tanh(x):
    return family(x).tanh(x)


def is_neg_inf(x):
    return family(x).is_neg_inf(x)


def rowmax(s):
    """Maximum over a row of scores: the last dimension, kept as size 1."""
    return family(s).rowmax(s)


def rowsum(p):
    return family(p).rowsum(p)


def matmul(p, v):
    """``p @ v``: row weights times value rows."""
    return family(p, v).matmul(p, v)


# ---------------------------------------------------------------------------- kernel index arithmetic
# What third-party kernels' loop bounds are written in (attnformal.tiling transcribes them): C, C++,
# CUDA and Triton divide signed integers toward zero, and shift. ``floordiv``/``cdiv`` above are
# Python's and CuTe-DSL's (arith.floordivsi) division. Each operation is one function per family,
# named in KERNEL_INT_OPS, so a consistency check can iterate over them.


def _trunc_python(a, b):
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _trunc_torch(a, b):
    import torch

    return torch.div(a, b, rounding_mode="trunc")


def _trunc_z3(a, b):
    import z3

    if isinstance(a, z3.BitVecRef) or isinstance(b, z3.BitVecRef):
        return a / b  # z3py's ``/`` on bit-vectors is bvsdiv: signed, rounded toward zero
    return z3.If(a >= 0, a / b, -((-a) / b))  # Int ``/`` is Euclidean: floor for b > 0


def _trunc_sympy(a, b):
    import sympy

    return sympy.sign(a) * sympy.sign(b) * sympy.floor(sympy.Abs(a) / sympy.Abs(b))


def _shr_sympy(a, k):
    import sympy

    return sympy.floor(sympy.sympify(a) / 2**k)


def _shr_z3(a, k):
    import z3

    return a >> k if isinstance(a, z3.BitVecRef) else a / 2**k  # Euclidean: floor, like >>


_KERNEL_INT_METHODS = {
    # family: (truncdiv, shr, shl)
    _Python: (_trunc_python, lambda a, k: a >> k, lambda a, k: a << k),
    _Torch: (_trunc_torch, lambda a, k: a >> k, lambda a, k: a << k),
    _SymPy: (_trunc_sympy, _shr_sympy, lambda a, k: a * 2**k),
    _Z3: (_trunc_z3, _shr_z3, lambda a, k: a * 2**k),
}
for _family, (_truncdiv, _shr, _shl) in _KERNEL_INT_METHODS.items():
    _family.truncdiv, _family.shr, _family.shl = (staticmethod(f) for f in (_truncdiv, _shr, _shl))
_NumPy.truncdiv = staticmethod(lambda a, b: _NumPy._elementwise(truncdiv, 2)(a, b))
_NumPy.shr = staticmethod(lambda a, k: _NumPy._elementwise(shr, 2)(a, k))
_NumPy.shl = staticmethod(lambda a, k: _NumPy._elementwise(shl, 2)(a, k))


def truncdiv(a, b):
    """``a / b`` rounded toward zero, as C, C++, CUDA and Triton divide signed integers."""
    return family(a, b).truncdiv(a, b)


def shr(a, k):
    """Arithmetic shift right by a constant ``k >= 0``: ``floor(a / 2**k)`` (C's ``>>`` on int)."""
    return family(a).shr(a, k)


def shl(a, k):
    """Shift left by a constant ``k >= 0``: ``a * 2**k`` (wrapping, when the type is fixed-width)."""
    return family(a).shl(a, k)


KERNEL_INT_OPS = (truncdiv, shr, shl)
