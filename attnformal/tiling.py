"""Prove *their* kernel: a third-party kernel's own tiling arithmetic, against the spec, for every shape.

A kernel decides, in its own integer arithmetic, which key blocks a query block visits, which
tiles get the element-wise mask, how split-KV cuts the range and how packed-GQA rows map to
query positions. A :class:`KernelTiling` transcribes those few lines against
:mod:`attnformal.ops`, so they evaluate on Python ints (the executor), Z3 integers (the proofs)
and range-checked Z3 integers (the int32 check)::

    class MyKernel(KernelTiling):
        block_m, block_n = 128, 64
        division = "trunc"                  # C/C++/CUDA/Triton ``/`` on signed ints; "floor": Python, CuTe DSL
        int_bits = 32                       # int32 arithmetic, wrapping: proved for every int32 input
        masks = ("dense", "bottom_right")   # the mask families it supports (MASK_FAMILIES)

        def kv_blocks(self, m_block, g):    # g: the spec's MaskGeometry (len_q, len_k, causal, window)
            n_max = self.ceil_div(g.len_k, self.block_n)
            if g.causal:
                n_max = ops.minimum(n_max, self.ceil_div((m_block + 1) * self.block_m + g.offset, self.block_n))
            return 0, n_max                 # half-open, in key blocks

Optional: ``masked(m_block, n_block, g)`` (does the kernel apply the element-wise mask on this
tile? default: always), ``q_blocks(n_block, g)`` (the backward's query blocks of a key block),
``num_splits`` with ``split(m_block, split_idx, g)`` (split-KV parts, or a loop's stages),
``qhead_per_kvhead`` (packed GQA: row ``r`` of a query block is position ``row_position(r)``,
default ``r // qhead_per_kvhead``), ``requires(g)`` (preconditions on the shape, e.g.
``len_q == len_k``), and ``kv_unit = "keys"`` for key loops that start at an arbitrary key
(``kv_blocks`` then returns key positions ``[start, end)``, walked in steps of ``block_n``; the
last tile stops at ``end`` unless ``clips_last_tile = False``), ``element_mask(i, j, g)`` (the
kernel's own element-wise mask, proven against the spec's on the tiles it masks). The hooks run on
kernel integers: a symbolic length may not meet a Python ``if``/``min``, nor ``/`` or ``//``
(``self.div``/``self.ceil_div`` divide as the kernel's language does); branch on the structure
(``g.causal``, :func:`window_size`), compute on values with ``ops.where``/``ops.minimum``/
``ops.maximum``. A mistake is one :class:`TilingError` line naming the class and the method, and an
unknown public name on a tiling class is refused with the closest known one.

Obligations, for every mask family the tiling declares, all lengths ``len_q, len_k >= 0`` and all
window bounds (Z3, unbounded integers, the tiling's own division semantics), against the spec's
``masks.may_attend``:

* *complete*: every tile holding an allowed pair is visited (by some part);
* *in bounds*: no tile reads a key outside the tensor (a block loop's ragged last block may);
* *mask-safe*: on a tile the kernel leaves unmasked, every position of a real query row is allowed
  (the tile is FULL on the rows the kernel stores); with ``element_mask``, on a masked tile it keeps
  exactly the allowed pairs;
* *splits*: the parts read disjoint keys, inside the visited range, and cover it;
* *backward*: ``q_blocks`` visits every query block whose tile with the key block holds an
  allowed pair, and stays inside the query blocks;
* *waste* (reported): the most visited SKIP tiles of one query block, over all shapes;
* *int32* (``int_bits = 32``): for every int32 input the launch allows, the kernel's wrapping int32
  arithmetic computes the ranges and masking decisions proven above (an overflow that changes one
  is refuted at its smallest shape); the first overflow, harmless or not, is reported.

A wrong variant (a control) counts as refuted only by a refutation in a family and check its base
tiling proves; otherwise it is *not a control* and the run fails.

A refutation shows the smallest shape it finds with the missed tile and one allowed ``(i, j)``
in it, and writes a battery case for exactly that shape: a tiling class is itself an
implementation of the protocol (``MyKernel(q, k, v, causal=...)`` runs the torch tiled loop with
the tiling's own ``kv_blocks``/``split``/``masked`` decisions and the spec's merge and finalize),
so ``python -m attnformal.verify --impl my_file.py:MyKernel --replay FILE`` fails on the buggy
tiling and passes on a correct kernel. ``python -m attnformal.prove --kernel my_file.py:MyKernel``
runs it all; docs/kernel-tilings.md has a complete example.
"""

from __future__ import annotations

import difflib
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import z3

from attnformal import ops, schedule
from attnformal.logic import INTERRUPTED, PROVED, REFUTED, UNKNOWN, Budget, Proof, Query, check_z3, render, render_value
from attnformal.masks import MaskGeometry, may_attend

# ---------------------------------------------------------------------------- mask families

_WINDOWS = {None: (False, False), "window": (True, True), "window_left": (True, False),
            "window_right": (False, True)}  # which side of the window is bounded


@dataclass(frozen=True)
class MaskFamily:
    """A causal mode and which sides of the (bottom-right aligned) window are bounded."""

    name: str
    causal: str | None
    window: str | None  # None, "window" (both sides), "window_left" or "window_right" (one side)

    def geometry(self, len_q, len_k, left, right) -> MaskGeometry:
        """The spec's geometry; an unbounded side is the spec's ``-1``."""
        bounded_left, bounded_right = _WINDOWS[self.window]
        window = (left if bounded_left else -1, right if bounded_right else -1) if self.window else None
        return MaskGeometry(len_q, len_k, self.causal, window)


MASK_FAMILIES = {
    "+".join(filter(None, (causal, window))) or "dense": MaskFamily(
        "+".join(filter(None, (causal, window))) or "dense", causal, window)
    for causal, window in itertools.product((None, "top_left", "bottom_right"), _WINDOWS)
}


WITHOUT_TOP_LEFT = tuple(name for name, family in MASK_FAMILIES.items() if family.causal != "top_left")


def family_of(g: MaskGeometry) -> MaskFamily:
    """The family of a concrete geometry (ints)."""
    window = None
    if g.window is not None:
        left, right = g.window
        window = {(True, True): "window", (True, False): "window_left", (False, True): "window_right",
                  (False, False): None}[(left >= 0, right >= 0)]
    return MASK_FAMILIES["+".join(filter(None, (g.causal, window))) or "dense"]


def window_size(g: MaskGeometry):
    """``(left, right)`` with ``None`` for an unbounded side, as kernels spell an optional window.

    A side is unbounded when it is a Python int below 0 (the spec's convention); a symbolic
    bound stands for every bound ``>= 0`` (the prover assumes it).
    """
    if g.window is None:
        return None, None
    return tuple(None if isinstance(side, int) and side < 0 else side for side in g.window)


# ---------------------------------------------------------------------------- the description


class _TilingClass(type):
    """Calling a tiling class with tensors runs the kernel's tiling: the class is an implementation.
    An attribute set on a tiling class after its body (``MyKernel.controls = ...``) is checked as
    one written in it."""

    def __call__(cls, *args, **kwargs):
        if not args and not kwargs:
            return super().__call__()
        return run_tiling(super().__call__(), *args, **kwargs)

    def __setattr__(cls, name, value):
        super().__setattr__(name, value)
        if KNOWN_NAMES:  # KernelTiling itself is being built
            _validate(cls)


class KernelTiling(metaclass=_TilingClass):
    """A kernel's tiling, transcribed from its source; see the module docstring."""

    block_m: int = 128
    block_n: int = 128
    division: str = "floor"  # "floor" (Python, CuTe DSL) or "trunc" (C, C++, CUDA, Triton)
    int_bits: int | None = None  # 32: also find where int32 index arithmetic overflows
    masks: tuple[str, ...] = ("dense",)
    kv_unit: str = "blocks"  # "keys": kv_blocks returns key positions [start, end)
    clips_last_tile: bool = True  # keys: the last tile of a range stops at its end (else reads whole tiles)
    num_splits: int = 1  # split-KV parts; with more than one, define split()
    qhead_per_kvhead: int = 1  # packed GQA: query heads of one KV head packed into the rows
    case_dtype: str = "float32"  # the dtype of the battery cases refutations write (the real kernel's)
    controls: tuple = ()  # wrong variants (KernelTiling subclasses) the prover must refute
    breaks: str = ""  # for a wrong variant: what it gets wrong

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _validate(cls)

    # -- what a kernel's description defines

    def kv_blocks(self, m_block, g):
        """``(n_min, n_max)``: the key blocks query block ``m_block`` visits (half-open)."""
        raise NotImplementedError(f"{type(self).__name__} must define kv_blocks(m_block, g)")

    def masked(self, m_block, n_block, g):
        """Whether the kernel applies the element-wise mask on tile ``(m_block, n_block)``."""
        return True

    q_blocks = None  # optional: q_blocks(n_block, g) -> (m_min, m_max), the backward's range
    element_mask = None  # optional: element_mask(i, j, g) -> does the kernel's own mask keep score (i, j)
    split = None  # optional: split(m_block, split_idx, g) -> (n_min, n_max) of one split-KV part

    def row_position(self, row):
        """The query position of packed row ``row`` (packed GQA: ``row // qhead_per_kvhead``)."""
        return row if self.qhead_per_kvhead == 1 else ops.floordiv(row, self.qhead_per_kvhead)

    def requires(self, g):
        """The shapes the kernel accepts (e.g. ``g.len_q == g.len_k``); proofs assume it."""
        return True

    # -- integer helpers in the kernel's own division semantics

    def div(self, a, b):
        """``a / b`` as the kernel's language divides integers (see ``division``)."""
        return ops.truncdiv(a, b) if self.division == "trunc" else ops.floordiv(a, b)

    def ceil_div(self, a, b):
        """``self.div(a + b - 1, b)``: the kernel's division of ``a + b - 1`` (as ``cute::ceil_div``, ``tl.cdiv``)."""
        return self.div(a + b - 1, b)

    @classmethod
    def overrides(cls) -> list[str]:
        """The methods this class defines itself (what a wrong variant replaces)."""
        return [name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")]


OPTIONAL_HOOKS = ("q_blocks", "split", "element_mask")  # None unless the kernel has one
KNOWN_NAMES: dict[str, bool] = {}  # the public names of KernelTiling: True for a hook (method), False for a setting
HELPER_CUTOFF = 0.8  # a helper method this close to a known name is taken for a misspelt one


def _check_names(cls):
    """Refuse a public name KernelTiling does not know, with the closest known one. A data
    attribute must be a known setting; a method may be the transcription's own helper (FA3's
    ``get_n_block_min_max``) unless its name is a near-miss of a known one (``kv_block``)."""
    for name, value in vars(cls).items():
        if name.startswith("_") or name in KNOWN_NAMES:
            continue
        method = callable(value) or isinstance(value, (staticmethod, classmethod, property))
        close = difflib.get_close_matches(name, KNOWN_NAMES, n=1, cutoff=HELPER_CUTOFF if method else 0.5)
        if method and not close:
            continue
        hint = f"did you mean `{close[0]}`?" if close else "known: " + ", ".join(sorted(KNOWN_NAMES))
        kind = "method" if method else "attribute"
        raise TypeError(f"{cls.__name__}.{name}: KernelTiling has no {kind} {name!r}; {hint}")


def _validate(cls):
    """Clear errors for a malformed description, naming the attribute."""
    _check_names(cls)
    for name, hook in KNOWN_NAMES.items():
        value = getattr(cls, name)
        if hook and not (callable(value) or value is None):
            raise TypeError(f"{cls.__name__}.{name}: is a method of KernelTiling, got {value!r}")
        if not hook and callable(value) and not isinstance(value, type):
            raise TypeError(f"{cls.__name__}.{name}: is a setting of KernelTiling (a value), got a method")
    def positive(name):
        value = getattr(cls, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TypeError(f"{cls.__name__}.{name}: expected an int >= 1, got {value!r}")

    for name in ("block_m", "block_n", "num_splits", "qhead_per_kvhead"):
        positive(name)
    choices = {"division": ("floor", "trunc"), "int_bits": (None, 32), "kv_unit": ("blocks", "keys"),
               "case_dtype": ("float32", "float16", "bfloat16")}
    for name, allowed in choices.items():
        if getattr(cls, name) not in allowed:
            raise TypeError(f"{cls.__name__}.{name}: expected one of {allowed}, got {getattr(cls, name)!r}")
    unknown = [m for m in cls.masks if m not in MASK_FAMILIES]
    if isinstance(cls.masks, str) or unknown:
        raise TypeError(f"{cls.__name__}.masks: expected a tuple of names from {tuple(MASK_FAMILIES)}, "
                        f"got {cls.masks!r}")
    if cls.num_splits > 1 and cls.split is None:
        raise TypeError(f"{cls.__name__}.num_splits = {cls.num_splits}: define split(m_block, split_idx, g)")


KNOWN_NAMES.update((name, callable(value) or isinstance(value, classmethod) or name in OPTIONAL_HOOKS)
                   for klass in KernelTiling.__mro__[:-1] for name, value in vars(klass).items()
                   if not name.startswith("_"))


# ---------------------------------------------------------------------------- kernel integers


INT32 = (-(2**31), 2**31 - 1)


class TilingError(ValueError):
    """A transcription mistake the prover cannot read, as one line naming the class and the method."""


def _division_refused(symbol):
    return TilingError(f"'{symbol}' on a kernel integer: write self.div(a, b) (the kernel's declared division, "
                       "'trunc' or 'floor') or self.ceil_div(a, b)")


_BOOL_REFUSED = ("a symbolic length or index met a Python if/and/or/not, min() or max(): compute on values with "
                 "ops.where, ops.minimum, ops.maximum, ops.and_ (a Python if may test g.causal, g.window is None "
                 "and window_size(g)'s None sides)")


class _Checked:
    """The value a kernel computes (an exact Z3 Int) and whether any value on the way left int32.

    Every hook of a tiling runs on these: ``+ - * %`` and comparisons are overloaded, the rest of
    :mod:`attnformal.ops` dispatches here through ``__attn_ops__``; ``/``, ``//`` and ``bool()`` are
    refused (they have no meaning the prover could pick for the kernel). Up to the first operation
    whose exact result leaves int32, int32 arithmetic computes these same values, so ``overflow``
    is true exactly when the kernel's int32 arithmetic overflows on the way to this value.
    """

    __slots__ = ("value", "overflow")

    def __init__(self, value, overflow=None):
        self.value, self.overflow = value, z3.BoolVal(False) if overflow is None else overflow

    @classmethod
    def lift(cls, x):
        if isinstance(x, _Checked):
            return x
        if isinstance(x, bool) or not isinstance(x, int):
            raise TilingError(f"kernel integer arithmetic mixes a kernel integer with {type(x).__name__} {x!r}"
                              + (": write self.div(a, b) or self.ceil_div(a, b), not '/'" if isinstance(x, float)
                                 else ""))
        return cls(z3.IntVal(x))

    @classmethod
    def result(cls, value, *operands):
        out_of_range = z3.Or(value < INT32[0], value > INT32[1])
        return cls(value, z3.Or(out_of_range, *(x.overflow for x in operands)))

    def _arith(self, other, op, reflected=False):
        a, b = self, self.lift(other)
        if reflected:
            a, b = b, a
        return self.result(op(a.value, b.value), a, b)

    def __add__(self, other):
        return self._arith(other, lambda a, b: a + b)

    def __radd__(self, other):
        return self._arith(other, lambda a, b: a + b, reflected=True)

    def __sub__(self, other):
        return self._arith(other, lambda a, b: a - b)

    def __rsub__(self, other):
        return self._arith(other, lambda a, b: a - b, reflected=True)

    def __mul__(self, other):
        return self._arith(other, lambda a, b: a * b)

    def __rmul__(self, other):
        return self._arith(other, lambda a, b: a * b, reflected=True)

    def __mod__(self, other):
        return self - _CheckedOps.truncdiv(self, other) * other  # C's %: the sign of the dividend

    def __neg__(self):
        return self.result(-self.value, self)

    def __truediv__(self, other):
        raise _division_refused("/")

    __rtruediv__ = __truediv__

    def __floordiv__(self, other):
        raise _division_refused("//")

    __rfloordiv__ = __floordiv__

    def _compare(self, other, op):
        a, b = self, self.lift(other)
        return _Flag(op(a.value, b.value), z3.Or(a.overflow, b.overflow))

    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    def __eq__(self, other):
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other):
        return self._compare(other, lambda a, b: a != b)

    __hash__ = None

    def __bool__(self):
        raise TilingError(_BOOL_REFUSED)

    def __index__(self):
        raise TilingError(_BOOL_REFUSED.replace("a Python if/and/or/not, min() or max()", "range() or an index"))


def _wrap32(value):
    """``value`` as two's-complement int32 arithmetic leaves it: reduced into ``[-2**31, 2**31)``."""
    return value - 2**32 * ((value + 2**31) / 2**32)  # Z3's integer division floors for a positive divisor


class _Wrapped(_Checked):
    """A kernel integer in int32 semantics: every result wraps around, as PTX's ``add.s32``/``mul.lo.s32``
    and CuTe DSL's ``Int32`` compute (C and C++ leave signed overflow undefined; nvcc emits these)."""

    __slots__ = ()

    @classmethod
    def result(cls, value, *operands):
        return cls(_wrap32(value))


class _Flag:
    """A condition on kernel integers, with the overflow of its operands."""

    __slots__ = ("value", "overflow")

    def __init__(self, value, overflow):
        self.value, self.overflow = value, overflow

    def __bool__(self):
        raise TilingError(_BOOL_REFUSED)


def _flag(x):
    return x if isinstance(x, _Flag) else _Flag(z3.BoolVal(x) if isinstance(x, bool) else x, z3.BoolVal(False))


def _kind(*xs) -> type:
    """The kernel-integer class of the operands (exact-and-checked, or wrapping)."""
    return next((type(x) for x in xs if isinstance(x, _Checked)), _Checked)


class _CheckedOps:
    """:mod:`attnformal.ops` on kernel integers."""

    @staticmethod
    def and_(xs):
        xs = [_flag(x) for x in xs]
        return _Flag(z3.And(*(x.value for x in xs)), z3.Or(*(x.overflow for x in xs)))

    @staticmethod
    def or_(xs):
        xs = [_flag(x) for x in xs]
        return _Flag(z3.Or(*(x.value for x in xs)), z3.Or(*(x.overflow for x in xs)))

    @staticmethod
    def not_(x):
        x = _flag(x)
        return _Flag(z3.Not(x.value), x.overflow)

    @staticmethod
    def where(cond, a, b):
        if isinstance(a, _Flag) or isinstance(b, _Flag):  # a choice between conditions
            cond, a, b = _flag(cond), _flag(a), _flag(b)
            return _Flag(z3.If(cond.value, a.value, b.value), z3.Or(cond.overflow, a.overflow, b.overflow))
        kind = _kind(a, b)
        cond, a, b = _flag(cond), kind.lift(a), kind.lift(b)
        return kind(z3.If(cond.value, a.value, b.value),
                    z3.Or(cond.overflow, z3.If(cond.value, a.overflow, b.overflow)))

    @staticmethod
    def maximum(a, b):
        kind = _kind(a, b)
        a, b = kind.lift(a), kind.lift(b)
        return _CheckedOps.where(a >= b, a, b)

    @staticmethod
    def minimum(a, b):
        kind = _kind(a, b)
        a, b = kind.lift(a), kind.lift(b)
        return _CheckedOps.where(a <= b, a, b)

    @staticmethod
    def floordiv(a, b):
        kind = _kind(a, b)
        a, b = kind.lift(a), kind.lift(b)
        return kind.result(ops.floordiv(a.value, b.value), a, b)

    @staticmethod
    def truncdiv(a, b):
        kind = _kind(a, b)
        a, b = kind.lift(a), kind.lift(b)
        return kind.result(ops.truncdiv(a.value, b.value), a, b)

    @staticmethod
    def shr(a, k):
        return _CheckedOps.floordiv(a, 2**k)

    @staticmethod
    def shl(a, k):
        return _kind(a).lift(a) * 2**k


_Checked.__attn_ops__ = _Flag.__attn_ops__ = _CheckedOps


# -- calling a tiling's hooks on kernel integers


def _author(tiling, hook: str) -> str:
    """The user's class to name in an error about ``hook``: the one defining it, never a generated control."""
    classes = [c for c in type(tiling).__mro__[:-2] if not vars(c).get("_generated")]
    return next((c.__name__ for c in classes if hook in vars(c)), classes[0].__name__ if classes else "KernelTiling")


def _explain(error: Exception) -> str:
    text = str(error)
    if isinstance(error, TilingError):
        return text
    if "cannot unpack non-iterable NoneType" in text:
        return "g.window is None in a mask family without a window: test `g.window is None` first, or read " \
               "window_size(g), whose sides are None when unbounded"
    if "Symbolic expressions cannot be cast to concrete Boolean" in text:
        return _BOOL_REFUSED
    return f"{type(error).__name__}: {text}"


def call_hook(tiling, hook: str, family: str, *args):
    """``tiling.<hook>(*args)``; a mistake in it becomes one :class:`TilingError` line naming the class."""
    try:
        return getattr(tiling, hook)(*args)
    except NotImplementedError:
        raise TilingError(f"{_author(tiling, hook)} must define {hook}(...): see docs/kernel-tilings.md") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError, z3.Z3Exception) as error:
        raise TilingError(f"{_author(tiling, hook)}.{hook} (mask family {family}): {_explain(error)}") from None


class _KernelView:
    """A tiling's hooks for one family, evaluated on kernel integers of one semantics (``kind``):
    exact and overflow-checked (:class:`_Checked`) or int32 wrap-around (:class:`_Wrapped`)."""

    def __init__(self, tiling, family, sides, kind=_Checked):
        self.tiling, self.family, self.kind = tiling, family, kind
        self.g = family.geometry(*(x if isinstance(x, int) else kind(x) for x in sides))

    def _call(self, hook, *args):
        args = (self.kind(a) if isinstance(a, z3.ExprRef) else a for a in args)  # a split's index stays an int
        return call_hook(self.tiling, hook, self.family.name, *args, self.g)

    def range(self, hook, *args) -> tuple:
        """A hook's half-open range, as two kernel integers."""
        out = self._call(hook, *args)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TilingError(f"{_author(self.tiling, hook)}.{hook} (mask family {self.family.name}): expected a "
                              f"pair (lo, hi), a half-open range; got {_described(out)}")
        return tuple(self._integer(hook, x) for x in out)

    def condition(self, hook, *args) -> _Flag:
        out = self._call(hook, *args) if args else call_hook(self.tiling, hook, self.family.name, self.g)
        if not isinstance(out, (bool, _Flag)):
            raise TilingError(f"{_author(self.tiling, hook)}.{hook} (mask family {self.family.name}): expected a "
                              f"condition (a comparison, ops.and_/or_/not_, True or False), got {type(out).__name__}")
        return _flag(out)

    def _integer(self, hook, x):
        try:
            return self.kind.lift(x)
        except TilingError as error:
            raise TilingError(f"{_author(self.tiling, hook)}.{hook} (mask family {self.family.name}): {error}") from None

    def parts(self, m) -> list[tuple]:
        """The ranges the key loop of query block ``m`` walks (its split-KV parts, or ``kv_blocks``)."""
        if self.tiling.num_splits == 1:
            return [self.range("kv_blocks", m)]
        return [self.range("split", m, index) for index in range(self.tiling.num_splits)]


def _described(out) -> str:
    if isinstance(out, (tuple, list)):
        return f"{len(out)} values"
    return "one value" if isinstance(out, (_Checked, int)) else type(out).__name__


def _terms(pairs) -> list[tuple]:
    return [tuple(x.value for x in pair) for pair in pairs]

# ---------------------------------------------------------------------------- one tiling, one family, symbolically


class _Symbolic:
    """The shape variables of one mask family and the spec's geometry over them (Z3 Ints)."""

    def __init__(self, tiling: KernelTiling, family: MaskFamily):
        self.tiling, self.family = tiling, family
        self.len_q, self.len_k = z3.Ints("Sq Sk")
        bounded_left, bounded_right = _WINDOWS[family.window]
        self.left = z3.Int("L") if bounded_left else -1
        self.right = z3.Int("R") if bounded_right else -1
        self.g = family.geometry(self.len_q, self.len_k, self.left, self.right)  # the spec's, on Z3 Ints
        self.rows = self.len_q * tiling.qhead_per_kvhead  # packed rows of one KV head
        self.kernel = self.view(_Checked)  # the kernel's hooks, on kernel integers

    def view(self, kind) -> _KernelView:
        return _KernelView(self.tiling, self.family, (self.len_q, self.len_k, self.left, self.right), kind)

    def parts(self, m) -> list[tuple]:
        return _terms(self.kernel.parts(m))

    def range(self, hook, *args) -> tuple:
        return _terms([self.kernel.range(hook, *args)])[0]

    def masked(self, m, n):
        return self.kernel.condition("masked", m, n).value

    @property
    def inputs(self):
        """The free shape variables: lengths and the bounded window sides."""
        return [x for x in (self.len_q, self.len_k, self.left, self.right) if not isinstance(x, int)]

    def hypotheses(self, *extra):
        requires = self.kernel.condition("requires").value
        return (("lengths and bounded window sides >= 0", z3.And(*(x >= 0 for x in self.inputs))),
                *((("requires(g)", requires),) if not z3.is_true(requires) else ()), *extra)

    def shape(self) -> dict:
        shown = {"Sq": self.len_q, "Sk": self.len_k}
        if self.family.window:
            shown["window"] = _WindowShown(self.left, self.right)
        return shown

    def in_row_block(self, row, m):
        bm = self.tiling.block_m
        return z3.And(0 <= row, row < self.rows, m * bm <= row, row < (m + 1) * bm)

    def allowed(self, row, j):
        return may_attend(self.tiling.row_position(row), j, self.g)


@dataclass(frozen=True)
class _WindowShown:
    """A window in a counterexample: ``(3, -)`` for an unbounded right side."""

    left: object
    right: object

    def render(self, model) -> str:
        sides = [("-" if isinstance(s, int) else str(model.eval(s, model_completion=True))) for s in
                 (self.left, self.right)]
        return f"({sides[0]}, {sides[1]})"


def parts(tiling: KernelTiling, m_block, g) -> list[tuple]:
    """The ranges the key loop of query block ``m_block`` walks: its split-KV parts (or stages), else
    ``kv_blocks`` alone."""
    if tiling.num_splits == 1:
        return [tiling.kv_blocks(m_block, g)]
    return [tiling.split(m_block, index, g) for index in range(tiling.num_splits)]


def keys_of(tiling: KernelTiling, lo, hi):
    """``(first, end)``: the keys the tiles of the range ``[lo, hi)`` read (empty unless ``lo < hi``)."""
    if tiling.kv_unit == "blocks":
        return lo * tiling.block_n, hi * tiling.block_n
    if tiling.clips_last_tile:
        return lo, hi
    return lo, lo + tiling.ceil_div(hi - lo, tiling.block_n) * tiling.block_n  # whole tiles from lo


def tile_at(tiling: KernelTiling, lo, n):
    """``(first key, tile argument of masked)`` of tile ``n`` of a range starting at ``lo``."""
    if tiling.kv_unit == "blocks":
        return n * tiling.block_n, n
    first = lo + n * tiling.block_n
    return first, first  # a key loop's tile is named by its first key (Triton's start_n)


# -- the obligations: each returns (claim, extra hypotheses, shown terms) or None when it does not apply


def complete(s: _Symbolic):
    t = s.tiling
    m, row, j = z3.Ints("m_block row j")
    premise = z3.And(s.in_row_block(row, m), s.allowed(row, j))
    read = [keys_of(t, lo, hi) + (lo < hi,) for lo, hi in s.parts(m)]
    shown = {"m_block": m, **({"n_block": j / t.block_n} if t.kv_unit == "blocks" else {}),
             "i": t.row_position(row), "j": j, **({"row": row} if t.qhead_per_kvhead > 1 else {}),
             **_ranges_shown(s, m)}
    visited = z3.Or(*(z3.And(nonempty, first <= j, j < end) for first, end, nonempty in read))
    return z3.Implies(premise, visited), (), shown


def in_bounds(s: _Symbolic):
    t = s.tiling
    m = z3.Int("m_block")
    launched = z3.And(0 <= m, m * t.block_m < s.rows)
    inside = [z3.Implies(lo < hi, z3.And(0 <= first, end <= _key_limit(t, s)))
              for (lo, hi), (first, end) in ((part, keys_of(t, *part)) for part in s.parts(m))]
    return z3.Implies(launched, z3.And(*inside)), (), {"m_block": m, **_ranges_shown(s, m)}


def _ranges_shown(s: _Symbolic, m) -> dict:
    """The ranges of query block ``m`` as a counterexample shows them (in the kernel's own unit)."""
    unit = "key blocks" if s.tiling.kv_unit == "blocks" else "keys"
    ranges = s.parts(m)
    if len(ranges) == 1:
        return {unit: _RangeShown(*ranges[0])}
    return {f"part {index} ({unit})": _RangeShown(lo, hi) for index, (lo, hi) in enumerate(ranges)}


def _key_limit(t, s):
    """The keys a tile may read: ``len_k``, rounded up to whole blocks for a block loop (its last
    block is ragged and read under the mask)."""
    return s.len_k if t.kv_unit == "keys" else t.ceil_div(s.len_k, t.block_n) * t.block_n


def mask_safe(s: _Symbolic):
    t = s.tiling
    own_mask = t.element_mask is not None
    if "masked" not in _defined(t) and not own_mask:
        return None
    m, n, row, j = z3.Ints("m_block n_block row j")
    claims = []
    for lo, hi in s.parts(m):
        first, end = keys_of(t, lo, hi)
        tile_first, tile_name = tile_at(t, lo, n)
        in_tile = z3.And(s.in_row_block(row, m), lo < hi, 0 <= n, tile_first >= first, tile_first < end,
                         tile_first <= j, j < tile_first + t.block_n, j < end)
        masked = s.masked(m, tile_name) if "masked" in _defined(t) else z3.BoolVal(True)
        claims.append(z3.Implies(z3.And(in_tile, z3.Not(masked)), s.allowed(row, j)))
        if own_mask:  # where the kernel masks, its own mask keeps exactly the allowed pairs
            kept = s.kernel.condition("element_mask", t.row_position(row), j).value
            claims.append(z3.Implies(z3.And(in_tile, masked), kept == s.allowed(row, j)))
    shown = {"m_block": m, "tile": n, "i": t.row_position(row), "j": j}
    return z3.And(*claims), (), shown


def splits(s: _Symbolic):
    t = s.tiling
    if t.num_splits == 1:
        return None
    m, j = z3.Ints("m_block j")
    first, end = keys_of(t, *s.range("kv_blocks", m))
    read = [keys_of(t, lo, hi) + (lo < hi,) for lo, hi in s.parts(m)]
    whole = z3.And(first <= j, j < end)
    in_part = [z3.And(nonempty, a <= j, j < b) for a, b, nonempty in read]
    inside = [z3.Implies(p, whole) for p in in_part]
    disjoint = [z3.Not(z3.And(p, q)) for p, q in itertools.combinations(in_part, 2)]
    covered = z3.Implies(whole, z3.Or(*in_part))
    premise = z3.And(0 <= m, m * t.block_m < s.rows, 0 <= j)
    shown = {"m_block": m, "key": j, "keys of kv_blocks": _RangeShown(first, end),
             **{f"keys of part {index}": _RangeShown(a, b) for index, (a, b, _) in enumerate(read)}}
    return z3.Implies(premise, z3.And(*inside, *disjoint, covered)), (), shown


def backward_complete(s: _Symbolic):
    t = s.tiling
    if t.q_blocks is None:
        return None
    n, row, j = z3.Ints("n_block row j")
    lo, hi = s.range("q_blocks", n)
    premise = z3.And(0 <= row, row < s.rows, n * t.block_n <= j, j < (n + 1) * t.block_n, s.allowed(row, j))
    claim = z3.And(lo * t.block_m <= row, row < hi * t.block_m)  # lo <= row // block_m < hi
    shown = {"n_block": n, "m_block": row / t.block_m, "i": t.row_position(row), "j": j, "m_min": lo, "m_max": hi}
    return z3.Implies(premise, claim), (), shown


def backward_in_bounds(s: _Symbolic):
    t = s.tiling
    if t.q_blocks is None:
        return None
    n = z3.Int("n_block")
    lo, hi = s.range("q_blocks", n)
    visits = z3.And(0 <= n, n * t.block_n < s.len_k, lo < hi)
    return z3.Implies(visits, z3.And(0 <= lo, (hi - 1) * t.block_m < s.rows)), (), {"n_block": n, "m_min": lo,
                                                                                   "m_max": hi}


@dataclass(frozen=True)
class _RangeShown:
    lo: object
    hi: object

    def render(self, model) -> str:
        return f"[{render_value(model, self.lo)}, {render_value(model, self.hi)})"


NOT_REPLAYED = ("backward complete", "backward in bounds", "int32")  # see _with_replay
OBLIGATIONS = (
    ("complete", "every tile holding an allowed pair is visited", complete),
    ("in bounds", "no tile reads a key outside the tensor", in_bounds),
    ("mask-safe", "an unmasked tile is FULL on its real rows", mask_safe),
    ("splits", "the parts read disjoint keys, inside the range, and cover it", splits),
    ("backward complete", "q_blocks visits every query block whose tile holds an allowed pair", backward_complete),
    ("backward in bounds", "q_blocks stays inside the query blocks", backward_in_bounds),
    ("int32", "the kernel's int32 arithmetic (wrapping) computes the proven values", lambda s: int32_semantics(s)),
)


def _defined(tiling) -> set[str]:
    """The hooks a tiling (or a class above it, below KernelTiling) defines."""
    return {name for cls in type(tiling).__mro__[:-2] for name in cls.overrides()}  # [:-2]: KernelTiling, object


def check_family(tiling: KernelTiling, family: MaskFamily, budget: Budget) -> list[tuple[str, Proof, _Symbolic]]:
    """Every obligation that applies, for one family: ``[(name, proof, symbols)]``."""
    return list(each_check(tiling, family, budget))


def each_check(tiling: KernelTiling, family: MaskFamily, budget: Budget, names=None):
    """:func:`check_family` one obligation at a time (``names``: only those), for callers that stop early."""
    for name, theorem, build in OBLIGATIONS:
        if names is not None and name not in names:
            continue
        s = _Symbolic(tiling, family)
        built = build(s)
        if built is None:
            continue
        claim, extra, shown = built
        query = Query(claim, s.hypotheses(*extra), {**s.shape(), **shown}, case=f"{family.name}")
        proof = check_z3(f"[{family.name}] {name}: {theorem}", [query], budget=budget, keep_model=True)
        if proof.status == REFUTED:
            total = LEAST_INT32_RLIMIT if name == "int32" else LEAST_RLIMIT
            smallest, shortfall = _smallest_counterexample(query, s, budget, total, proof.model)
            if smallest is not None:
                proof = proof.but(countermodel=render(smallest, query.show), model=smallest)
            if shortfall:  # still a counterexample (the solver's own model, or a smaller one): only not the least
                proof = proof.but(detail="; ".join(filter(None, (proof.detail, f"not shown to be the smallest "
                                                                                f"counterexample: {shortfall[1]}"))))
        yield name, proof, s


def _smallest_counterexample(query: Query, s: _Symbolic, budget: Budget, total: int, found):
    """:func:`least`'s ``(model, shortfall)`` for the least ``len_q + len_k + window bounds``, from the
    counterexample ``found``."""
    return least([*(formula for _, formula in query.hypotheses), z3.Not(query.claim)], [z3.Sum(*s.inputs)], budget,
                 total=total, start=found)


# Deterministic budgets (Z3 resource units, rlimit) of the queries outside check_z3, about 10x what the
# costliest one needs on the shipped tilings (docs/kernel-tilings.md, "Budgets"). Each also draws on the
# obligation's Budget, whose wall clock stays the only time limit (an outer safety net).
LEAST_STEP_RLIMIT = 50_000_000  # one check of least's bisection: FA2Forward's smallest counterexamples, 5.2 M
# the whole bisection of one search (the 10 s it had on the wall clock, as units): past it the model found so far
# stands, "not shown to be the smallest" (the split-KV window families spent over 100 M units minimising)
LEAST_RLIMIT = 20_000_000
# the int32 obligation's search: its wrapped arithmetic makes each unit slow (the split-KV families spent 35-70 s
# of 20 M units and still stopped short); its counterexamples are past 2**29 whichever the search shows
LEAST_INT32_RLIMIT = 3_000_000
# a search's wall-clock net, as the obligation's: a check that Z3 does not stop at its units (FA3SplitKV's
# window_left once ran 73 min in CI, 40 s here) leaves the model found so far, "interrupted by time"
LEAST_WALL_S = 120.0
WASTE_RLIMIT = 1_000_000  # waste's z3.Optimize: 76 k at most (FA2Forward)


def least(formulas, objectives, budget: Budget, limit: int | None = None, total: int = LEAST_RLIMIT, start=None):
    """A model of ``formulas`` that minimises each non-negative objective in turn (lexicographically).

    Bisection on one incremental solver: on these queries it is one to two orders of magnitude
    faster than ``z3.Optimize``. Each check may use ``limit`` units (default ``LEAST_STEP_RLIMIT``), the
    whole search ``total`` and ``LEAST_WALL_S`` seconds (a net). ``start``: a model of the formulas
    already found, the search's first upper bound (finding one again cost the int32 searches 8 M units).
    Returns ``(model, shortfall)``:
    ``(None, None)`` when the formulas have no model, ``(least model, None)``, or -- when a check ran
    out of its budget -- the best model found so far (None if none) and :func:`_ran_out`'s
    ``(status, what ran out)``.
    """
    limit = LEAST_STEP_RLIMIT if limit is None else limit
    end = time.monotonic() + LEAST_WALL_S
    solver = z3.Solver()
    solver.add(*formulas)
    model, spent = start, 0
    if model is None:
        verdict, spent = budget.check(solver, limit=limit, seconds=LEAST_WALL_S)
        if verdict != z3.sat:
            return None, None if verdict == z3.unsat else _ran_out(budget, solver, spent, limit, LEAST_WALL_S)
        model = solver.model()
    for objective in objectives:
        low, high = 0, model.eval(objective, model_completion=True).as_long()
        while low < high:
            middle = (low + high) // 2
            left, seconds = total - spent, end - time.monotonic()
            if left <= 0:
                return model, (UNKNOWN, f"the search's deterministic budget ran out ({spent} of {total} units)")
            if seconds <= 0:
                return model, (INTERRUPTED, f"interrupted by time: the search's wall-clock net ({LEAST_WALL_S:g} s) "
                                            f"ran out")
            verdict, used = budget.check(solver, objective <= middle, limit=min(limit, left), seconds=seconds)
            spent += used
            if verdict == z3.sat:
                model = solver.model()
                high = model.eval(objective, model_completion=True).as_long()
            elif verdict == z3.unsat:
                low = middle + 1
            else:
                return model, _ran_out(budget, solver, used, min(limit, left), LEAST_WALL_S)
        solver.add(objective == high)
    return model, None


def _ran_out(budget: Budget, solver, used: int, limit: int, net: float | None = None) -> tuple[str, str]:
    """``(status, what ran out)`` of a check that came back unknown: a wall-clock net (interrupted: the
    obligation's, or the search's ``net``), the query's own ``limit``, or the obligation's budget (unknown)."""
    status, detail = budget.unknown_reason(solver)
    if status == INTERRUPTED and net is not None and budget.left() > 0:
        detail = f"interrupted by time: the search's wall-clock net ({net:g} s) ran out"
    if status == UNKNOWN and used >= limit:
        detail = f"the query's deterministic budget ran out ({used} of {limit} units; {solver.reason_unknown()})"
    return status, detail


# ---------------------------------------------------------------------------- waste


def waste(tiling: KernelTiling, family: MaskFamily, budget: Budget) -> Proof | None:
    """The most visited SKIP tiles of one query block, over all shapes (Z3 Optimize).

    Measured against ``schedule.kv_block_range`` (exactly the non-SKIP key blocks, obligation 5);
    for key-position loops and packed rows the tiles do not line up with the schedule's, so
    nothing is reported.
    """
    if tiling.kv_unit != "blocks" or tiling.qhead_per_kvhead != 1:
        return None
    start_time = time.perf_counter()
    s = _Symbolic(tiling, family)
    m = z3.Int("m_block")
    lo, hi = s.range("kv_blocks", m)
    need_lo, need_hi = schedule.kv_block_range(m, s.g, tiling.block_m, tiling.block_n)
    below = ops.maximum(0, ops.minimum(hi, need_lo) - lo)
    above = ops.maximum(0, hi - ops.maximum(lo, need_hi))
    wasted = ops.where(need_lo < need_hi, below + above, ops.maximum(0, hi - lo))
    claim = f"[{family.name}] waste: the most visited SKIP tiles of one query block"
    opt = z3.Optimize()
    opt.add(*(f for _, f in s.hypotheses()), 0 <= m, m * tiling.block_m < s.len_q)
    most = opt.maximize(wasted)
    verdict, used = budget.check(opt, limit=WASTE_RLIMIT)
    seconds = time.perf_counter() - start_time
    if verdict != z3.sat:  # Optimize answers sat only with the optimum: running out is unknown, never a bound
        status, detail = _ran_out(budget, opt, used, WASTE_RLIMIT) if verdict == z3.unknown else (UNKNOWN, "unsat")
        return Proof(claim, "z3", status, seconds=seconds, queries=1, rlimit=used, detail=f"Optimize: {detail}")
    bound = opt.upper(most)
    if not z3.is_int_value(bound):
        return Proof(claim + ": unbounded (grows with the lengths)", "z3", PROVED, seconds=seconds, queries=1,
                     rlimit=used, detail="waste: unbounded")
    model = opt.model()
    at = ", ".join(f"{k} = {v}" for k, v in render(model, {**s.shape(), "m_block": m}).items())
    value = bound.as_long()
    text = f"waste: {value} SKIP tile(s) per query block at most" + (f" (e.g. {at})" if value else "")
    return Proof(f"{claim}: {value}", "z3", PROVED, seconds=seconds, queries=1, rlimit=used, detail=text)


# ---------------------------------------------------------------------------- int32 overflow


def int32_limit(tiling: KernelTiling, family: MaskFamily, budget: Budget) -> Proof | None:
    """The smallest shape (least ``len_q + len_k + window bounds``, then least block indices) at
    which an index expression of the tiling first leaves int32, on exact integers: information,
    the obligation is :func:`int32_semantics` (whether that overflow changes what the kernel computes).

    Every input is an int32 (``[0, 2**31)``). An output counts only where the kernel computes it:
    ``kv_blocks``/``split`` of a launched query block, ``masked`` on a visited tile, ``q_blocks`` of
    an existing key block.
    """
    if tiling.int_bits is None:
        return None
    start = time.perf_counter()
    s = _Symbolic(tiling, family)
    m, n = z3.Ints("m_block n_block")
    outputs = _outputs(s.kernel, s, m, n)
    claim = f"[{family.name}] int32: the smallest shape at which an index expression overflows"
    premises = [*(z3.And(x >= 0, x <= INT32[1]) for x in (*s.inputs, m, n)), *(f for _, f in s.hypotheses())]
    overflow = z3.Or(*(z3.And(used, value.overflow) for _, used, value in outputs))
    units = budget.used
    model, shortfall = least([*premises, overflow], [z3.Sum(*s.inputs), m + n], budget)
    seconds, spent = time.perf_counter() - start, budget.used - units
    if shortfall:  # an overflowing shape not shown to be the smallest is no answer
        status, detail = shortfall
        found = f"overflows at {_shape_shown(model, s, m, n)}, not shown to be the smallest; " if model else ""
        return Proof(claim, "z3", status, queries=1, seconds=seconds, rlimit=spent, detail=f"int32: {found}{detail}")
    if model is None:
        return Proof(claim + ": none", "z3", PROVED, queries=1, seconds=seconds, rlimit=spent,
                     detail="int32: no index expression overflows for any int32 shape")
    where = next(name.rsplit(" ", 1)[0] for name, used, value in outputs
                 if z3.is_true(model.eval(z3.And(used, value.overflow), model_completion=True)))
    shown = _shape_shown(model, s, m, n)
    return Proof(f"{claim}: {shown} (in {where})", "z3", PROVED, queries=1, seconds=seconds, rlimit=spent,
                 detail=f"int32: first overflow at {shown}, in {where}")


def _shape_shown(model, s: _Symbolic, m, n) -> str:
    return ", ".join(f"{k} = {v}" for k, v in render(model, {**s.shape(), "m_block": m, "n_block": n}).items())


def int32_semantics(s: _Symbolic):
    """The obligation of ``int_bits = 32``: for every int32 input the launch allows, the kernel's
    int32 arithmetic (wrapping) computes the values every other obligation is proved for.

    Those obligations hold over unbounded integers; where the wrapped values equal the exact ones,
    they hold for the int32 kernel. An overflow that changes a range or a masking decision is a
    refutation, shown with both values at the smallest shape."""
    t = s.tiling
    if t.int_bits is None:
        return None
    m, n = z3.Ints("m_block n_block")
    exact, wrapped = _outputs(s.kernel, s, m, n), _outputs(s.view(_Wrapped), s, m, n)
    same = [z3.Implies(used, a.value == b.value) for (_, used, a), (_, _, b) in zip(exact, wrapped)]
    int32_inputs = ("every input is an int32", z3.And(*(x <= INT32[1] for x in (*s.inputs, m, n)), m >= 0, n >= 0))
    shown = {"m_block": m, "n_block": n}
    for (name, _, a), (_, _, b) in zip(exact, wrapped):
        shown[name] = _Int32Shown(a.value, b.value)
    return z3.And(*same), (int32_inputs,), shown


@dataclass(frozen=True)
class _Int32Shown:
    """An output in an int32 counterexample: ``5`` when wrapping keeps it, ``5 (int32: -3)`` when not."""

    exact: object
    wrapped: object

    def render(self, model) -> str:
        exact, wrapped = render_value(model, self.exact), render_value(model, self.wrapped)
        return exact if exact == wrapped else f"{exact} (int32: {wrapped})"


def _outputs(view: _KernelView, s: _Symbolic, m, n):
    """``[(name, used, value)]``: what the kernel computes at query block ``m`` / key block ``n``, in
    ``view``'s semantics (conditions as 0/1)."""
    t = s.tiling
    launched = z3.And(0 <= m, m * t.block_m < s.rows)
    lo, hi = view.range("kv_blocks", m)
    outputs = [("kv_blocks lo", launched, lo), ("kv_blocks hi", launched, hi)]
    if "masked" in _defined(t):
        visited = z3.And(launched, lo.value <= n, n < hi.value)
        flag = view.condition("masked", m, n)
        outputs.append(("masked", visited, _Checked(z3.If(flag.value, 1, 0), flag.overflow)))
    for split_idx in range(t.num_splits if t.num_splits > 1 else 0):
        lo, hi = view.range("split", m, split_idx)
        outputs += [(f"split {split_idx} lo", launched, lo), (f"split {split_idx} hi", launched, hi)]
    if t.q_blocks is not None:
        exists = z3.And(0 <= n, n * t.block_n < s.len_k)
        lo, hi = view.range("q_blocks", n)
        outputs += [("q_blocks lo", exists, lo), ("q_blocks hi", exists, hi)]
    return outputs


# ---------------------------------------------------------------------------- counterexamples become cases


def counterexample_case(proof: Proof, s: _Symbolic, impl: str, folders: ReproFolders, *,
                        max_elements: int = 2**22, seed: int = 0) -> str:
    """Write the battery case of a refutation's shape; return the replay command (or why not)."""
    if proof.model is None:
        return ""
    value = {str(x): proof.model.eval(x, model_completion=True).as_long() for x in s.inputs}
    len_q, len_k = value["Sq"], value["Sk"]
    heads = s.tiling.qhead_per_kvhead
    if max(len_q * len_k, len_q + len_k) * heads > max_elements:  # the scores, or the inputs themselves
        return f"shape too large to replay ({len_q} x {len_k} x {heads} scores)"
    window = None
    if s.family.window:
        window = (value.get("L", -1), value.get("R", -1))
    from attnformal.verify.cases import random_case, shape
    from attnformal.verify.replay import write_reproducer

    import torch

    kwargs = {"causal": s.family.causal, "window": window}
    dtype = s.tiling.case_dtype
    case = random_case(f"tiling-{s.family.name}", shape(batch=1, heads_q=heads, heads_kv=1, len_q=len_q,
                                                        len_k=len_k, head_dim=16), getattr(torch, dtype), "cpu",
                       seed, grad=False, **kwargs)
    name = impl.rpartition(":")[2]
    obligation = proof.claim.split(":")[0].split("] ")[1].replace(" ", "-")
    path = folders.folder(impl) / f"tiling-{name}-{s.family.name}-{obligation}.pt"
    write_reproducer(path, case, impl=impl, check=f"tiling:{obligation}", dtype=dtype, lse=True)
    return f"python -m attnformal.verify --impl {impl} --replay {path}"


class ReproFolders:
    """Where one prove run leaves its reproducers: ``parent/<implementation>/``, as the battery's. The run's
    first write to a folder moves an earlier run's files to ``previous/``, so an old reproducer is never
    mistaken for a new one (each obligation's worker process starts the folders it writes to)."""

    def __init__(self, parent):
        self.parent, self.started = Path(parent), set()

    def folder(self, impl: str) -> Path:
        from attnformal.cli import impl_slug
        from attnformal.verify.outputs import start_folder

        folder = self.parent / impl_slug(impl)
        if folder.resolve() not in self.started:
            start_folder(folder)
            self.started.add(folder.resolve())
        return folder


# ---------------------------------------------------------------------------- the executor


TILING_SUPPORTS = frozenset({"causal", "window", "kv_lens", "softcap"})  # the families a tiling describes


def run_tiling(tiling: KernelTiling, q, k, v, *, scale=None, return_lse=False, **features):
    """The implementation protocol, computed with the tiling's own loop bounds and masking.

    The torch tiled loop: per (batch, KV head, packed query block), the tiles ``kv_blocks`` (or
    each ``split``) names, scores masked by the spec only where ``masked`` says so, folded with
    the spec's ``merge`` and ``finalize``. A key outside the tensor reads as NaN, as unguarded
    memory would; a skipped tile is simply missing. Differentiable (autograd of the forward).
    """
    from attnformal.features import refuse_unsupported
    from attnformal.spec import AttentionSpec

    spec = AttentionSpec.from_inputs(q, k, v, scale=scale, **features)
    _refuse_unsupported(tiling, spec)
    refuse_unsupported(spec, TILING_SUPPORTS, type(tiling).__name__)  # a feature added since: never dropped
    out, lse = _tiled_forward(tiling, spec, q, k, v)
    return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


def _refuse_unsupported(tiling, spec):
    name = type(tiling).__name__
    if spec.attn_mask is not None or spec.dropout_p > 0:
        raise NotImplementedError(f"{name}: a kernel tiling runs index masks only (no attn_mask, no dropout)")
    if spec.group % tiling.qhead_per_kvhead:
        raise NotImplementedError(f"{name}: packs {tiling.qhead_per_kvhead} query heads per KV head; "
                                  f"this call has {spec.group}")
    for b in range(spec.batch):
        g = spec.geometry(b)
        if family_of(g).name not in tiling.masks:
            raise NotImplementedError(f"{name}: mask family {family_of(g).name!r} not in masks={tiling.masks}")
        if not tiling.requires(g):
            raise NotImplementedError(f"{name}: requires(g) rejects len_q={g.len_q}, len_k={g.len_k}, "
                                      f"window={g.window}: the kernel does not accept this shape")


def _tiled_forward(tiling, spec, q, k, v):
    import torch

    from attnformal.kernels.split_kv import combine
    from attnformal.kernels.torch_tiled import compute_dtype
    from attnformal.merge import block_state, empty_state, finalize, merge
    from attnformal.tile import tile_scores

    dtype = compute_dtype(q.dtype)
    pack, group = tiling.qhead_per_kvhead, spec.group
    b_, hq, len_q, d = q.shape
    out = torch.zeros(b_, hq, len_q, spec.head_dim_v, dtype=dtype, device=q.device)
    lse = torch.zeros(b_, hq, len_q, dtype=dtype, device=q.device)
    for b in range(spec.batch):
        g = spec.geometry(b)
        # [Hkv, group, Sq, D] -> packs of `pack` heads whose rows interleave: row r = (position r // pack, head r % pack)
        packed = q[b].to(dtype).reshape(spec.heads_kv, group // pack, pack, len_q, d).transpose(2, 3)
        packed = packed.reshape(spec.heads_kv, group // pack, len_q * pack, d)
        keys, values = (t[b].to(dtype)[:, None] for t in (k, v))  # [Hkv, 1, Sk, D]
        rows_out, lse_out = [], []
        for m in range(ops.cdiv(len_q * pack, tiling.block_m)):
            rows = torch.arange(m * tiling.block_m, min((m + 1) * tiling.block_m, len_q * pack), device=q.device)
            positions = tiling.row_position(rows)
            partials = []
            for lo, hi in parts(tiling, m, g):
                state = empty_state((spec.heads_kv, group // pack, len(rows)), spec.head_dim_v, dtype=dtype,
                                    device=q.device)
                for tile, cols in _tiles(tiling, lo, hi):
                    _guard_read(tiling, m, cols, g.len_k)
                    masked = tiling.masked(m, tile, g)
                    k_tile, v_tile = _read_keys(keys, values, cols, g.len_k, unmasked=not masked)
                    kept = may_attend if tiling.element_mask is None else tiling.element_mask
                    allowed = kept(positions[:, None], cols[None, :], g) if masked else None
                    s, _ = tile_scores(packed[:, :, rows], k_tile, spec.scale, spec.softcap, allowed)
                    state = merge(state, block_state(s, v_tile))
                partials.append(state)
            o, row_lse = finalize(combine(partials))
            rows_out.append(o)
            lse_out.append(row_lse)
        o = torch.cat(rows_out, dim=2).reshape(spec.heads_kv, group // pack, len_q, pack, -1).transpose(2, 3)
        row_lse = torch.cat(lse_out, dim=2).reshape(spec.heads_kv, group // pack, len_q, pack).transpose(2, 3)
        out[b] = o.reshape(hq, len_q, -1)
        lse[b] = row_lse.reshape(hq, len_q)
    return out, lse


def _tiles(tiling, lo, hi):
    """``(tile argument of masked, key indices)`` of each tile the loop visits in ``[lo, hi)``."""
    import torch

    bn = tiling.block_n
    if tiling.kv_unit == "blocks":
        for n in range(lo, hi):
            yield n, torch.arange(n * bn, (n + 1) * bn)
        return
    for first in range(lo, hi, bn):
        yield first, torch.arange(first, min(first + bn, hi) if tiling.clips_last_tile else first + bn)


class OutOfBoundsRead(RuntimeError):
    """The tiling made the executor read a key outside what the *in bounds* obligation allows."""


def _guard_read(tiling, m_block, cols, len_k):
    """Refuse a read outside ``[0, len_k)`` (a block loop: to the end of its ragged last block), as a
    guarded load would report it: the read a refuted *in bounds* names is visible, masked or not."""
    limit = len_k if tiling.kv_unit == "keys" else ops.cdiv(len_k, tiling.block_n) * tiling.block_n
    if len(cols) and (int(cols[0]) < 0 or int(cols[-1]) >= limit):
        raise OutOfBoundsRead(f"{type(tiling).__name__}: query block {m_block} reads keys [{int(cols[0])}, "
                              f"{int(cols[-1]) + 1}) outside [0, {limit}) of the key tensor")


def _read_keys(keys, values, cols, len_k, unmasked):
    """K and V columns ``cols``; a key outside ``[0, len_k)`` that no mask removes reads as NaN, as
    unguarded memory would (one the mask removes reads as 0, which keeps the gradients finite)."""
    import torch

    inside = (cols >= 0) & (cols < len_k)
    safe = torch.where(inside, cols, 0)
    k_tile = torch.where(inside[:, None], keys[:, :, safe], float("nan") if unmasked else 0.0)
    v_tile = torch.where(inside[:, None], values[:, :, safe], 0.0)
    return k_tile, v_tile


# ---------------------------------------------------------------------------- the prover's view


def load_tilings(spec: str) -> list[type]:
    """The tiling classes named by ``FILE.py:ATTR`` or ``MODULE:ATTR`` (a class or a list of them)."""
    from attnformal.impl import load_impl

    value = load_impl(spec, argument="--kernel")
    loaded = list(value) if isinstance(value, (list, tuple)) else [value]
    if not loaded or not all(isinstance(t, type) and issubclass(t, KernelTiling) for t in loaded):
        raise ValueError(f"argument '--kernel': {spec!r} is not a KernelTiling subclass or a list of them")
    return loaded


REPRO_DIR = Path("verify-repro")  # where refutations leave their battery cases (the battery's own default)


def kernel_obligations(specs, repro_dir=REPRO_DIR) -> list[tuple[int, TilingObligation]]:
    """``[(number, obligation)]`` for ``--kernel`` specs, numbered in order; ValueError names a bad one.
    ``repro_dir``: where refutations leave their cases, started afresh by this run (None: nowhere)."""
    tilings = [(cls, spec) for spec in specs for cls in load_tilings(spec)]
    for cls, _ in tilings:
        for tiling in (cls, *cls.controls, _one_tile_short(cls)):
            try:
                read_hooks(tiling)
            except TilingError as error:
                raise ValueError(f"argument '--kernel': {error}") from None
    folders = None if repro_dir is None else ReproFolders(repro_dir)
    return [(number, TilingObligation(cls, spec, folders)) for number, (cls, spec) in enumerate(tilings, start=1)]


def read_hooks(cls: type) -> None:
    """Evaluate every hook of a tiling once per family, symbolically: a transcription mistake (a Python
    ``if`` on a length, ``/``, a range of one value, ``g.window`` unpacked where there is none)
    becomes one :class:`TilingError` line before anything is proved."""
    tiling = cls()
    for family in (MASK_FAMILIES[name] for name in tiling.masks):
        s = _Symbolic(tiling, family)
        s.hypotheses()
        _outputs(s.kernel, s, *z3.Ints("m_block n_block"))
        if tiling.element_mask is not None:
            s.kernel.condition("element_mask", *z3.Ints("i j"))


def implementation_name(cls: type, origin: str) -> str:
    """How ``--impl`` names a tiling class: ``FILE.py:Name`` for a file, else ``module:Name``."""
    where = origin.rpartition(":")[0]
    return f"{where}:{cls.__name__}" if where.endswith(".py") else f"{cls.__module__}:{cls.__qualname__}"


class TilingObligation:
    """One tiling as an obligation of :mod:`attnformal.prove`: its checks and its negative controls."""

    COST = 3

    def __init__(self, cls: type, origin: str, folders: ReproFolders | None = None):
        self.cls, self.origin, self.folders = cls, origin, folders
        self.__name__ = implementation_name(cls, origin)
        self.TITLE = f"kernel {cls.__name__}"
        self.__doc__ = cls.__doc__ or ""
        self.CONTROLS = [TilingControl(variant, cls, origin, folders) for variant in cls.controls]
        self.CONTROLS.append(TilingControl(_one_tile_short(cls), cls, origin, None))

    def checks(self, settings, budget: Budget):
        tiling = self.cls()
        verdicts, overflows = {}, []
        for family in (MASK_FAMILIES[name] for name in tiling.masks):
            for name, proof, s in check_family(tiling, family, budget):
                verdicts.setdefault(family.name, {})[name] = proof.status
                yield _with_replay(proof, s, self.__name__, self.folders, name)
            for report in filter(None, (waste(tiling, family, budget), int32_limit(tiling, family, budget))):
                if report.detail.startswith("int32: first overflow"):
                    overflows.append(f"[{family.name}] {report.detail.removeprefix('int32: first overflow ')}")
                yield report
        yield Proof(f"families of {self.cls.__name__}", "summary", PROVED,
                    detail=_families_line(verdicts, overflows[:1]))


def _families_line(verdicts: dict[str, dict[str, str]], overflows) -> str:
    """``proved for dense, bottom_right; refuted for window (complete, mask-safe)``, and the first overflow."""
    proved = [family for family, checks in verdicts.items() if all(v == PROVED for v in checks.values())]
    failed = [f"{family} ({', '.join(name if v == REFUTED else f'{name}: {v}' for name, v in checks.items() if v != PROVED)})"
              for family, checks in verdicts.items() if family not in proved]
    parts = [f"proved for {', '.join(proved) or 'no family'}"] + ([f"not for {'; '.join(failed)}"] if failed else [])
    return "; ".join(parts + [f"first int32 overflow {text}" for text in overflows])


_BASE_VERDICTS: dict[tuple, str] = {}  # (tiling class, family, check): status, once per process


def base_verdict(cls: type, family: MaskFamily, check: str, budget: Budget) -> str:
    """What the base tiling's ``check`` gives for one family (the reference a control is judged against)."""
    key = (cls, family.name, check)
    if key not in _BASE_VERDICTS:
        found = [proof.status for _, proof, _ in each_check(cls(), family, budget, names=(check,))]
        _BASE_VERDICTS[key] = found[0] if found else f"no such check for {cls.__name__}"
    return _BASE_VERDICTS[key]


class TilingControl:
    """A wrong variant of ``base``: refuted only by a refutation in a family and check that the base
    tiling proves. A variant refuted only where the base fails too shows nothing about the checks:
    it is reported as *not a control*, and the run fails."""

    def __init__(self, variant: type, base: type, origin: str, folders: ReproFolders | None):
        self.variant, self.base, self.origin, self.folders = variant, base, origin, folders
        self.name = variant.__name__
        self.breaks = variant.breaks or "(no description)"
        self.replaces = ", ".join(f"{base.__name__}.{hook}" for hook in variant.overrides()) or base.__name__

    def run(self, settings, budget: Budget) -> Proof:
        tiling = self.variant()
        impl = implementation_name(self.variant, self.origin) if self.folders else None
        also_in_base = []
        everything_but_int32 = [name for name, _, _ in OBLIGATIONS if name != "int32"]
        searched = [(family, names) for names in (everything_but_int32, ("int32",))  # int32 last: its queries cost most
                    for family in (MASK_FAMILIES[name] for name in tiling.masks)]
        for family, names in searched:
            for name, proof, s in each_check(tiling, family, budget, names):
                if proof.status != REFUTED:
                    continue
                base = base_verdict(self.base, family, name, budget)
                if base == PROVED:
                    return _with_replay(proof, s, impl, self.folders, name)
                also_in_base.append(f"[{family.name}] {name} (the base tiling: {base})")
        why = (f"refuted only where {self.base.__name__} is not proved either: {'; '.join(also_in_base)}"
               if also_in_base else "no check refuted it")
        return Proof(f"{self.name} is refuted", "z3", UNKNOWN, detail=f"not a control: {why}")


def _with_replay(proof: Proof, s: _Symbolic, impl, folders: ReproFolders | None, obligation) -> Proof:
    """The proof, with the battery case of a refutation whose effect the executor's output shows.

    An ``in bounds`` case fails on the executor, which refuses the read (:func:`_guard_read`). Not for
    ``backward`` (the executor's backward is autograd of its forward, not the tiling's ``q_blocks``)
    nor ``int32`` (its shapes have ~2**31 keys, and the executor computes on Python ints).
    """
    if proof.status != REFUTED or impl is None or folders is None or obligation in NOT_REPLAYED:
        return proof
    command = counterexample_case(proof, s, impl, folders)
    return proof.but(detail="; ".join(filter(None, (proof.detail, f"replay: {command}")))) if command else proof


def _one_tile_short(cls: type) -> type:
    """The generic control: the same tiling with the last tile of every range dropped."""
    step = 1 if cls.kv_unit == "blocks" else cls.block_n

    def kv_blocks(self, m_block, g):
        lo, hi = cls.kv_blocks(self, m_block, g)
        return lo, hi - step

    def split(self, m_block, split_idx, g):
        lo, hi = cls.split(self, m_block, split_idx, g)
        return lo, ops.minimum(hi, cls.kv_blocks(self, m_block, g)[1] - step)

    body = {"kv_blocks": kv_blocks, "controls": (), "__module__": cls.__module__, "_generated": True,
            "breaks": "the generic control: every range one tile short at the top"}
    if cls.num_splits > 1:
        body["split"] = split
    return type(f"{cls.__name__}OneTileShort", (cls,), body)
