"""A symbolic interpreter of TTIR over Z3: one run covers every program and every runtime argument.

Values are tensors, a tensor being a *function of its element indices* (a scalar has shape
``()``), so ``make_range``, ``splat``, ``broadcast``, ``expand_dims``, ``trans`` and ``reshape`` are
index maps and a whole tile is one symbolic lane. Elements are:

* integers: exact Z3 ``Int`` terms. The IR's width is kept beside each term and every op that can
  wrap records a *no-wrap* obligation (the exact result lies in the width's signed range; a
  divisor is not zero): when those are proved the exact terms equal the machine's wrap-around
  values, and when one is refuted the kernel overflows (Alive2's poison, made an obligation);
* booleans (``i1``): Z3 ``Bool``;
* pointers: ``Ptr(argument, element offset)``, so every access names the tensor it touches;
* floats: value trees that keep provenance (which load, which lane; ``dot`` and reductions as
  value ops over the tensors they read; a ``select`` its source line), enough to say which scores
  a ``select`` lets through and where.

``scf.for`` runs its body once with a fresh induction variable constrained to the loop range and its
constant step (an arbitrary iteration); its floating-point carried values are opaque there and after it.
Loads and stores are recorded as :class:`Access` with their mask and path condition. An op or a
form without a handler raises :class:`Unsupported` naming the op and its source line: the
theorems then report *unknown*, never proved.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import z3

from attnformal.ttir.parse import Function, Op


class Unsupported(Exception):
    def __init__(self, what: str, loc: str):
        super().__init__(f"unsupported {what} at {loc}")
        self.what, self.loc = what, loc


@dataclass(frozen=True)
class Ptr:
    arg: str  # the kernel parameter the pointer derives from
    offset: Any  # Z3 Int, in elements of the pointee


@dataclass(frozen=True)
class BlockPtr:
    """``tt.make_tensor_ptr``: a tile of a strided view. Lane ``x`` of the tile is the element at
    ``base + sum((offsets[k] + x[k]) * strides[k])``, inside the view where ``0 <= offsets[k] + x[k] < shape[k]``."""

    base: Ptr
    shape: tuple  # Z3 Ints, one per dimension
    strides: tuple
    offsets: tuple
    block: tuple  # the tile's shape (ints)

    def moved(self, offsets):
        return BlockPtr(self.base, self.shape, self.strides, tuple(offsets), self.block)


@dataclass(frozen=True)
class Kind:
    """An element type: ``int`` (with width), ``bool``, ``ptr`` (pointee), ``float`` (width), ``block`` (a
    :class:`BlockPtr`)."""

    name: str
    width: int = 0


@dataclass
class Tensor:
    shape: tuple
    kind: Kind
    at: Callable[[tuple], Any]  # element at a lane (a tuple of Z3 Ints, one per dimension)

    def __post_init__(self):
        """``at`` memoised by the lane's terms (Z3 shares equal terms): an element asked twice, as
        ``arith.remsi`` asks its operands and concrete evaluation asks each element of a tile, is built
        once. The lanes are kept with their elements so that their term ids stay theirs."""
        build, built = self.at, {}

        def at(lane):
            key = tuple(x.get_id() for x in lane)
            if key not in built:
                built[key] = lane, build(lane)
            return built[key][1]
        self.at = at


@dataclass
class Loop:
    iv: Any
    lower: Any
    upper: Any
    loc: str
    path: list
    outer: Loop | None = None  # the scf.for around this one
    carried: list = field(default_factory=list)  # (initial, in-body placeholder, yielded) Tensor per iter_arg
    results: list = field(default_factory=list)  # the loop's results after it: opaque, one per iter_arg
    step: int = 1  # a positive constant (``range(0, end, BLOCK_N)`` steps by the block)

    def iteration(self, value):
        """Whether ``value`` is the induction variable of one of the loop's iterations."""
        inside = z3.And(self.lower <= value, value < self.upper)
        return inside if self.step == 1 else z3.And(inside, (value - self.lower) % self.step == 0)


@dataclass
class Access:
    op: str  # "load" or "store"
    arg: str  # the pointer parameter
    ptr: Tensor
    mask: Tensor | None
    loc: str
    path: list  # Z3 Bools under which the access executes (enclosing if/for conditions)
    value: Tensor | None = None  # what a store writes, what a load returns
    loop: Loop | None = None  # the innermost scf.for around it
    number: int = 0  # its place in the trace: names its loaded values the same in every run (an id() would not)


@dataclass
class NoWrap:
    """An int op's exact result must fit its width (or its divisor be non-zero) on every lane."""

    what: str
    loc: str
    shape: tuple
    holds: Callable[[tuple], Any]
    path: list
    loop: Any = None  # the innermost scf.for around the op
    exact: Callable[[tuple], Any] | None = None  # the exact result on a lane, for an op that must fit
    width: int = 0


@dataclass
class Trace:
    """Everything one symbolic run produced, for the theorems."""

    params: dict  # parameter name -> scalar Tensor
    program_ids: list  # Z3 Ints, axes x, y, z
    accesses: list[Access] = field(default_factory=list)
    no_wrap: list[NoWrap] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    definitions: list = field(default_factory=list)  # Z3 facts defining fresh symbols (div, rem)
    reductions: list = field(default_factory=list)  # (combiners, input Tensor, loc, innermost Loop or None, path)
    exponentials: list = field(default_factory=list)  # (input Tensor, loc, innermost Loop or None, path) of exp, exp2
    comparisons: dict = field(default_factory=dict)  # cmpf's per-lane Bool function name -> (predicate, a, b)

    def mark(self):
        """Where the records end now: :meth:`rewind` drops what a run after it added (a loop body run twice)."""
        return {name: len(getattr(self, name)) for name in _RECORDS}, dict(self.comparisons)

    def rewind(self, mark):
        lengths, comparisons = mark
        for name, length in lengths.items():
            del getattr(self, name)[length:]
        self.comparisons = comparisons


_RECORDS = ("accesses", "no_wrap", "loops", "definitions", "reductions", "exponentials")


# ------------------------------------------------------------------------ types

_TENSOR = re.compile(r'^tensor<((?:\d+x)*)(.+)>$')


def parse_type(text: str) -> tuple[tuple, Kind]:
    text = text.strip()
    match = _TENSOR.match(text)
    shape = ()
    if match:
        shape = tuple(int(d) for d in match.group(1).split("x") if d)
        text = match.group(2)
    if text.startswith("!tt.ptr<"):
        return shape, Kind("ptr", _scalar_kind(text[8:-1]).width)
    return shape, _scalar_kind(text)


def _scalar_kind(text):
    if text == "i1":
        return Kind("bool", 1)
    if re.fullmatch(r'i\d+', text):
        return Kind("int", int(text[1:]))
    if re.fullmatch(r'(f|bf)\d+|f8\w*', text):
        return Kind("float", int(re.sub(r'\D', '', text.split("E")[0]) or 8))
    raise ValueError(f"type {text}")


def signed_range(width):
    return -(2 ** (width - 1)), 2 ** (width - 1) - 1


# ------------------------------------------------------------------------ interpreter

_NAME = re.compile(r'%[\w$.#-]+')


class Interpreter:
    def __init__(self, function: Function, prefix: str = ""):
        self.function, self.prefix = function, prefix
        self.fresh_ids = itertools.count()
        params = {}
        for name, type_ in function.params:
            shape, kind = parse_type(type_)
            if kind.name == "ptr":
                params[name] = _scalar(kind, Ptr(name, z3.IntVal(0)))
            elif kind.name == "int":
                params[name] = _scalar(kind, z3.Int(name))  # runtime arguments are shared by all programs
            elif kind.name == "float":
                params[name] = _scalar(kind, ("param", name))
            elif kind.name == "bool":  # a tensor descriptor's padding flag, as the host sets it
                params[name] = _scalar(kind, z3.Bool(name))
            else:
                raise Unsupported(f"parameter type {type_}", name)
        pids = [z3.Int(f"{prefix}pid_{axis}") for axis in "xyz"]
        self.trace = Trace(params, pids)
        self.loops = []  # the scf.for ops around the op being run, outermost first

    def loop(self):
        return self.loops[-1] if self.loops else None

    def run(self) -> Trace:
        env = {f"%{name}": value for name, value in self.trace.params.items()}
        self.block(self.function.ops, env, [])
        return self.trace

    def fresh(self, stem):
        return z3.Int(f"{self.prefix}{stem}_{next(self.fresh_ids)}")

    def block(self, ops, env, path):
        """Runs ops in order; returns the operands of the block's terminator."""
        for op in ops:
            if op.name in ("scf.yield", "tt.reduce.return", "tt.return"):
                return [env[name] for name in _operands(op.body)]
            handler = HANDLERS.get(op.name)
            if handler is None:
                raise Unsupported(f"op {op.name}", op.loc)
            try:
                results = handler(self, op, env, path)
            except (KeyError, ValueError, IndexError) as error:
                raise Unsupported(f"form of {op.name} ({error})", op.loc) from error
            for name, value in zip(op.results, results):
                env[name] = value
        return []

    def no_wrap(self, op, tensor: Tensor, exact_at, width, path):
        low, high = signed_range(width)
        self.trace.no_wrap.append(NoWrap(f"{op.name} in i{width}", op.loc, tensor.shape,
                                         lambda lane: z3.And(low <= exact_at(lane), exact_at(lane) <= high), path,
                                         self.loop(), exact_at, width))


def _scalar(kind, element):
    return Tensor((), kind, lambda lane: element)


def _operands(text):
    return _NAME.findall(text)


def _types(op):
    """The type list after the last top-level ' : ' of an op's text."""
    return op.body.rsplit(" : ", 1)[1]


def _result_type(op):
    types = _types(op)
    for separator in (" -> ", " to "):
        if separator in types:
            return parse_type(types.rsplit(separator, 1)[1])
    return parse_type(_split_types(types)[-1])


def _split_types(text):
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "<"
        depth -= char == ">"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return parts + [current.strip()]


def _attr_int(op, name):
    return int(re.search(rf'\b{name} = (-?\d+)', op.body).group(1))


# ------------------------------------------------------------------------ handlers (one per op)

HANDLERS: dict[str, Callable] = {}


def handles(*names):
    def register(function):
        for name in names:
            HANDLERS[name] = function
        return function
    return register


@handles("arith.constant")
def _constant(interp, op, env, path):
    shape, kind = _result_type(op)
    text = op.body.rsplit(" : ", 1)[0].strip()
    dense = re.fullmatch(r'dense<(.+)>', text)
    literal = dense.group(1) if dense else text
    if kind.name == "float":
        value = _float_literal(literal, kind.width)
        return [Tensor(shape, kind, lambda lane: ("const", value))]
    if kind.name == "bool":
        return [Tensor(shape, kind, lambda lane: z3.BoolVal(literal == "true"))]
    return [Tensor(shape, kind, lambda lane: z3.IntVal(int(literal)))]


def _float_literal(literal, width):
    if literal.startswith("0x"):
        bits = int(literal, 16)
        if width == 32:
            import struct
            return struct.unpack("<f", struct.pack("<I", bits))[0]
        if width == 64:
            import struct
            return struct.unpack("<d", struct.pack("<Q", bits))[0]
        if width == 16:
            import numpy
            return float(numpy.array([bits], numpy.uint16).view(numpy.float16)[0])
        raise ValueError(f"float literal {literal}")
    return float(literal)


@handles("tt.get_program_id")
def _program_id(interp, op, env, path):
    axis = "xyz".index(op.body.split()[0])
    return [_scalar(Kind("int", 32), interp.trace.program_ids[axis])]


@handles("tt.make_range")
def _make_range(interp, op, env, path):
    shape, kind = _result_type(op)
    start = _attr_int(op, "start")
    return [Tensor(shape, kind, lambda lane: start + lane[0])]


@handles("tt.splat")
def _splat(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    shape, _ = _result_type(op)
    return [Tensor(shape, source.kind, lambda lane: source.at(()))]


@handles("tt.broadcast")
def _broadcast(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    shape, _ = _result_type(op)
    return [Tensor(shape, source.kind,
                   lambda lane: source.at(tuple(z3.IntVal(0) if n == 1 else x for x, n in zip(lane, source.shape))))]


@handles("tt.expand_dims")
def _expand_dims(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    axis = _attr_int(op, "axis")
    shape, _ = _result_type(op)
    return [Tensor(shape, source.kind, lambda lane: source.at(lane[:axis] + lane[axis + 1:]))]


@handles("tt.trans")
def _trans(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    order = [int(x) for x in re.search(r'array<i32: ([\d, ]+)>', op.body).group(1).split(",")]
    shape, _ = _result_type(op)

    def at(lane):  # result dim k is source dim order[k]
        source_lane = [None] * len(order)
        for k, d in enumerate(order):
            source_lane[d] = lane[k]
        return source.at(tuple(source_lane))
    return [Tensor(shape, source.kind, at)]


@handles("tt.reshape")
def _reshape(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    shape, _ = _result_type(op)

    def at(lane):  # row-major linear index, then unravelled into the source's shape
        flat = z3.IntVal(0)
        for x, n in zip(lane, shape):
            flat = flat * n + x
        source_lane = []
        for n in reversed(source.shape):
            source_lane.append(flat % n)
            flat = flat / n
        return source.at(tuple(reversed(source_lane)))
    return [Tensor(shape, source.kind, at)]


def _binary(name, exact):
    """An integer op: exact on Ints, with a no-wrap obligation in the result's width."""
    def handler(interp, op, env, path):
        a, b = (env[n] for n in _operands(op.body)[:2])
        shape, kind = _result_type(op)
        result = Tensor(shape, kind, lambda lane: exact(a.at(lane), b.at(lane)))
        interp.no_wrap(op, result, result.at, kind.width, path)
        return [result]
    HANDLERS[name] = handler


_binary("arith.addi", lambda x, y: x + y)
_binary("arith.subi", lambda x, y: x - y)
_binary("arith.muli", lambda x, y: x * y)
_binary("arith.maxsi", lambda x, y: z3.If(x >= y, x, y))
_binary("arith.minsi", lambda x, y: z3.If(x <= y, x, y))


def truncating_division(x, y):
    """``arith.divsi`` on exact integers: rounds toward zero (Z3's ``/`` is floor for a positive divisor).
    A zero divisor yields 0 here; the op's obligation refutes it."""
    return z3.If(y > 0, z3.If(x >= 0, x / y, -((-x) / y)),
                 z3.If(y < 0, z3.If(x >= 0, -(x / (-y)), (-x) / (-y)), 0))


@handles("arith.divsi", "arith.remsi")
def _division(interp, op, env, path):
    a, b = (env[n] for n in _operands(op.body)[:2])
    shape, kind = _result_type(op)
    quotient = lambda lane: truncating_division(a.at(lane), b.at(lane))  # noqa: E731
    if op.name == "arith.divsi":
        result = Tensor(shape, kind, quotient)
    else:
        result = Tensor(shape, kind, lambda lane: a.at(lane) - quotient(lane) * b.at(lane))
    low, _ = signed_range(kind.width)
    interp.trace.no_wrap.append(NoWrap(f"{op.name} divisor non-zero, no {low} / -1", op.loc, shape,
                                       lambda lane: z3.And(b.at(lane) != 0,
                                                           z3.Or(a.at(lane) != low, b.at(lane) != -1)), path,
                                       interp.loop()))
    return [result]


@handles("arith.extsi", "arith.index_cast")
def _extend(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    shape, kind = _result_type(op)
    return [Tensor(shape, kind, source.at)]


@handles("arith.extui")
def _extend_unsigned(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    shape, kind = _result_type(op)
    if source.kind.name == "bool":
        return [Tensor(shape, kind, lambda lane: z3.If(source.at(lane), 1, 0))]
    width = source.kind.width
    return [Tensor(shape, kind, lambda lane: z3.If(source.at(lane) < 0, source.at(lane) + 2 ** width,
                                                   source.at(lane)))]


@handles("arith.trunci")
def _truncate(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    shape, kind = _result_type(op)
    if kind.name == "bool":
        raise Unsupported("arith.trunci to i1", op.loc)
    result = Tensor(shape, kind, source.at)
    interp.no_wrap(op, result, source.at, kind.width, path)
    return [result]


_PREDICATES = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "slt": lambda x, y: x < y,
               "sle": lambda x, y: x <= y, "sgt": lambda x, y: x > y, "sge": lambda x, y: x >= y}


@handles("arith.cmpi")
def _compare(interp, op, env, path):
    predicate = op.body.split(",")[0].strip()
    a, b = (env[n] for n in _operands(op.body)[:2])
    shape, _ = parse_type(_types(op))
    if predicate not in _PREDICATES:  # unsigned: the exact Int is not the bit pattern's unsigned value
        raise Unsupported(f"arith.cmpi {predicate}", op.loc)
    compare = _PREDICATES[predicate]
    return [Tensor(shape, Kind("bool", 1), lambda lane: compare(a.at(lane), b.at(lane)))]


def _logical(name, combine):
    def handler(interp, op, env, path):
        a, b = (env[n] for n in _operands(op.body)[:2])
        shape, kind = _result_type(op)
        if kind.name != "bool":
            raise Unsupported(f"{name} on {kind.name}", op.loc)
        return [Tensor(shape, kind, lambda lane: combine(a.at(lane), b.at(lane)))]
    HANDLERS[name] = handler


_logical("arith.andi", z3.And)
_logical("arith.ori", z3.Or)
_logical("arith.xori", lambda x, y: x != y)


@handles("arith.select")
def _select(interp, op, env, path):
    condition, a, b = (env[n] for n in _operands(op.body)[:3])
    shape, kind = _result_type(op)
    return [Tensor(shape, kind, lambda lane: _choose(condition.at(lane if condition.shape else ()),
                                                     a.at(lane), b.at(lane), op))]


def _choose(condition, a, b, op):
    if isinstance(a, tuple) or isinstance(b, tuple):
        return ("select", condition, a, b, op.loc)
    if isinstance(a, Ptr) or isinstance(b, Ptr):
        if a.arg != b.arg:
            raise Unsupported("select between pointers into different tensors", op.loc)
        return Ptr(a.arg, z3.If(condition, a.offset, b.offset))
    return z3.If(condition, a, b)


@handles("tt.addptr")
def _addptr(interp, op, env, path):
    pointer, offset = (env[n] for n in _operands(op.body)[:2])
    shape, kind = parse_type(_split_types(_types(op))[0])
    result = Tensor(shape, kind, lambda lane: Ptr(pointer.at(lane).arg, pointer.at(lane).offset + offset.at(lane)))
    interp.no_wrap(op, result, lambda lane: result.at(lane).offset, 64, path)
    return [result]


@handles("tt.load")
def _load(interp, op, env, path):
    names = _operands(op.body)
    pointer = env[names[0]]
    if pointer.kind.name == "block":
        pointer, mask = _block_tile(interp, op, pointer, path)
        padding = math.nan if re.search(r'padding = 2\b', op.body) else 0.0  # Triton's PaddingOption: 1 zero, 2 nan
        other = None if mask is None else Tensor(pointer.shape, Kind("float", 32), lambda lane: ("const", padding))
    else:
        mask = env[names[1]] if len(names) > 1 else None
        other = env[names[2]] if len(names) > 2 else None
    shape, kind = pointer.shape, Kind(_pointee_kind(op), pointer.kind.width)
    access = Access("load", pointer.at(tuple(z3.IntVal(0) for _ in shape)).arg, pointer, mask, op.loc, list(path),
                    loop=interp.loop(), number=len(interp.trace.accesses))

    def at(lane):
        ptr = pointer.at(lane)
        if kind.name == "float":
            loaded = ("load", access, lane)
            return loaded if mask is None else ("select", mask.at(lane), loaded,
                                                other.at(lane) if other else ("const", 0.0), op.loc)
        loaded = memory(ptr.arg)(ptr.offset)
        if kind.name == "bool":
            loaded = loaded != 0
        if mask is None:
            return loaded
        return z3.If(mask.at(lane), loaded, other.at(lane) if other else z3.IntVal(0))
    interp.trace.accesses.append(access)
    access.value = Tensor(shape, kind, at)
    return [access.value]


def _block_tile(interp, op, block_pointer, path):
    """A block pointer's tile as a tensor of pointers (their i64 offsets must not wrap), and the mask of its
    ``boundaryCheck`` dimensions (None without one: every lane is accessed)."""
    tile = block_pointer.at(())
    pointer = Tensor(tile.block, Kind("ptr", block_pointer.kind.width), lambda lane: Ptr(
        tile.base.arg, tile.base.offset + z3.Sum([(o + x) * s for o, x, s in zip(tile.offsets, lane, tile.strides)])))
    interp.no_wrap(op, pointer, lambda lane: pointer.at(lane).offset, 64, path)
    checked = re.search(r'boundaryCheck = array<i32: ([\d, ]+)>', op.body)
    if checked is None:
        return pointer, None
    dims = [int(d) for d in checked.group(1).split(",")]
    return pointer, Tensor(tile.block, Kind("bool", 1), lambda lane: z3.And(
        [z3.And(0 <= tile.offsets[k] + lane[k], tile.offsets[k] + lane[k] < tile.shape[k]) for k in dims]))


@handles("tt.make_tensor_ptr")
def _make_tensor_ptr(interp, op, env, path):
    block, kind = parse_type(_types(op).strip().removeprefix("!tt.ptr")[1:-1])  # <tensor<128x64xf16>>
    names = _operands(op.body)
    base, *rest = (env[n].at(()) for n in names)
    rank = len(block)
    if len(rest) != 3 * rank:
        raise ValueError(f"{len(rest)} shape, stride and offset operands for a rank-{rank} tile")
    tile = BlockPtr(base, tuple(rest[:rank]), tuple(rest[rank:2 * rank]), tuple(rest[2 * rank:]), block)
    return [_scalar(Kind("block", kind.width), tile)]


@handles("tt.advance")
def _advance(interp, op, env, path):
    names = _operands(op.body)
    pointer = env[names[0]]
    tile = pointer.at(())
    offsets = [o + env[n].at(()) for o, n in zip(tile.offsets, names[1:])]
    for offset in offsets:  # the offsets are i32
        interp.no_wrap(op, _scalar(Kind("int", 32), offset), lambda lane, o=offset: o, 32, path)
    return [_scalar(pointer.kind, tile.moved(offsets))]


def memory(arg):
    """An integer tensor's contents: its element at each offset (one uninterpreted function per argument)."""
    return z3.Function(f"{arg}_value", z3.IntSort(), z3.IntSort())


def _pointee_kind(op):
    pointee = re.search(r'!tt\.ptr<(?:tensor<(?:\d+x)*)?([^>]+)>', op.body).group(1)
    return _scalar_kind(pointee).name


@handles("tt.store")
def _store(interp, op, env, path):
    names = _operands(op.body)
    pointer, value = env[names[0]], env[names[1]]
    if pointer.kind.name == "block":
        pointer, mask = _block_tile(interp, op, pointer, path)
    else:
        mask = env[names[2]] if len(names) > 2 else None
    arg = pointer.at(tuple(z3.IntVal(0) for _ in pointer.shape)).arg
    interp.trace.accesses.append(Access("store", arg, pointer, mask, op.loc, list(path), value, interp.loop(),
                                        len(interp.trace.accesses)))
    return []


class OpNode(tuple):
    """A float op's value tree ``("op", name, *operands)`` or ``("dot", a, b, c, lane)`` that also knows its source
    line (``.loc``)."""


def _float_op(arity):
    def handler(interp, op, env, path):
        args = [env[n] for n in _operands(op.body)[:arity]]
        shape, kind = _result_type(op)

        def at(lane):
            node = OpNode(("op", op.name, *[a.at(lane) for a in args]))
            node.loc = op.loc
            return node
        return [Tensor(shape, kind, at)]
    return handler


for _name in ("arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maxnumf", "arith.minnumf",
              "arith.maximumf", "arith.minimumf"):
    HANDLERS[_name] = _float_op(2)
for _name in ("math.log", "math.log2", "math.absf", "math.sqrt", "arith.negf", "arith.truncf", "arith.extf",
              "arith.sitofp"):
    HANDLERS[_name] = _float_op(1)


@handles("math.exp", "math.exp2")
def _exponential(interp, op, env, path):
    """As any unary float op, and recorded: a softmax's weights are the exponentials of the masked scores."""
    interp.trace.exponentials.append((env[_operands(op.body)[0]], op.loc, interp.loop(), list(path)))
    return _float_op(1)(interp, op, env, path)


@handles("arith.cmpf")
def _compare_float(interp, op, env, path):
    """An unconstrained Bool per lane for the integer theorems (an over-approximation); the merge theorem
    reads it as the IEEE comparison it records (``trace.comparisons``)."""
    predicate = op.body.split(",")[0].strip()
    a, b = (env[n] for n in _operands(op.body)[:2])
    shape, _ = parse_type(_types(op))
    name = f"{interp.prefix}cmpf_{predicate}_{len(interp.trace.comparisons)}"
    interp.trace.comparisons[name] = (predicate, a, b)
    compare = z3.Function(name, *[z3.IntSort()] * len(shape), z3.BoolSort())
    return [Tensor(shape, Kind("bool", 1), lambda lane: compare(*lane))]


@handles("tt.dot")
def _dot(interp, op, env, path):
    a, b, c = (env[n] for n in _operands(op.body)[:3])
    shape, kind = _result_type(op)

    def at(lane):
        node = OpNode(("dot", a, b, c, lane))
        node.loc = op.loc
        return node
    return [Tensor(shape, kind, at)]


@handles("tt.reduce")
def _reduce(interp, op, env, path):
    source = env[_operands(op.body)[0]]
    axis = _attr_int(op, "axis")
    combiners = [o.name for o in op.regions[0].ops if o.name != "tt.reduce.return"]
    shape = source.shape[:axis] + source.shape[axis + 1:]
    interp.trace.reductions.append((tuple(combiners), source, op.loc, interp.loop(), list(path)))
    return [Tensor(shape, Kind("float", 32), lambda lane: ("reduce", tuple(combiners), source, axis, lane))]


@handles("scf.if")
def _if(interp, op, env, path):
    condition = env[_operands(op.body)[0]].at(())
    then = interp.block(op.regions[0].ops, dict(env), path + [condition])
    other = interp.block(op.regions[1].ops, dict(env), path + [z3.Not(condition)]) if len(op.regions) > 1 else []
    return [Tensor(t.shape, t.kind, lambda lane, t=t, e=e: _choose(condition, t.at(lane), e.at(lane), op))
            for t, e in zip(then, other)]


_FOR = re.compile(r'^(%[\w$.#-]+) = (%[\w$.#-]+) to (%[\w$.#-]+) step (%[\w$.#-]+)(?: iter_args\((.*?)\))?')


@handles("scf.for")
def _for(interp, op, env, path):
    """The body once, at an arbitrary iteration. A carried float is opaque there; a carried integer or block pointer
    must move by a loop-invariant step (``curr += BLOCK``, ``tl.advance(p, (BLOCK, 0))``): a first run finds the step,
    and the body is run again with the value of iteration ``k``, ``initial + k * step``."""
    match = _FOR.match(op.body)
    iv_name, lower, upper, step = match.group(1), *(env[n].at(()) for n in match.groups()[1:4])
    if not (z3.is_int_value(z3.simplify(step)) and z3.simplify(step).as_long() >= 1):
        raise Unsupported("scf.for with a step that is not a positive constant", op.loc)
    iv = interp.fresh("iv")
    loop = Loop(iv, lower, upper, op.loc, list(path), interp.loop(), step=z3.simplify(step).as_long())
    inside = path + [loop.iteration(iv)]
    interp.trace.loops.append(loop)
    carried = re.findall(r'(%[\w$.#-]+) = (%[\w$.#-]+)', match.group(5) or "")
    floats = [k for k, (_, init) in enumerate(carried) if env[init].kind.name == "float"]
    moving = [k for k in range(len(carried)) if k not in floats]
    if any(env[carried[k][1]].shape for k in moving):
        raise Unsupported("scf.for carrying a tensor of integers or pointers", op.loc)

    def body(values):
        body_env = dict(env, **{iv_name: _scalar(Kind("int", 32), iv)})
        for k, (name, init) in enumerate(carried):
            initial = env[init]
            body_env[name] = values[k] if k in values else \
                Tensor(initial.shape, initial.kind, lambda lane, n=name: ("opaque", n, lane))
        interp.loops.append(loop)
        yielded = interp.block(op.regions[0].ops, body_env, inside)
        interp.loops.pop()
        return body_env, yielded

    mark = interp.trace.mark()
    probes = {k: _moved(env[carried[k][1]], [interp.fresh("carried") for _ in _coordinates(env[carried[k][1]])])
              for k in moving}
    body_env, yielded = body(probes)
    steps = {k: _step(probes[k], yielded[k], op) for k in moving}
    if moving:
        interp.trace.rewind(mark)
        count = (iv - lower) / loop.step  # the iterations before this one (iv - lower is a multiple of the step)
        body_env, yielded = body({k: _advanced(env[carried[k][1]], steps[k], count) for k in moving})
    loop.carried = [(env[carried[k][1]], body_env[carried[k][0]], yielded[k]) for k in floats]
    trips = z3.If(upper > lower, (upper - lower + loop.step - 1) / loop.step, 0)
    results = [_advanced(env[init], steps[k], trips) if k in steps else
               Tensor(env[init].shape, env[init].kind, lambda lane, n=result: ("opaque", n, lane))
               for k, ((_, init), result) in enumerate(zip(carried, op.results))]
    loop.results = [results[k] for k in floats]
    return results


def _coordinates(value):
    """The integers that move in a carried scalar: an integer's value, a pointer's offset, a block pointer's
    offsets."""
    element = value.at(())
    return list(element.offsets) if value.kind.name == "block" else \
        [element.offset] if value.kind.name == "ptr" else [element]


def _moved(value, coordinates):
    element = value.at(())
    if value.kind.name == "block":
        return _scalar(value.kind, element.moved(coordinates))
    return _scalar(value.kind, Ptr(element.arg, coordinates[0]) if value.kind.name == "ptr" else coordinates[0])


def _advanced(initial, steps, count):
    return _moved(initial, [x + count * d for x, d in zip(_coordinates(initial), steps)])


def _step(probe, yielded, op):
    """What one iteration adds to each coordinate of a carried integer or block pointer; Unsupported unless it is
    the same in every iteration (no coordinate of the probe in it) and a block pointer keeps its view."""
    before, after = _coordinates(probe), _coordinates(yielded)
    same = yielded.kind == probe.kind and (probe.kind.name != "ptr" or probe.at(()).arg == yielded.at(()).arg)
    if probe.kind.name == "block":
        view, moved = probe.at(()), yielded.at(())
        same = same and view.base.arg == moved.base.arg and view.block == moved.block and all(
            a.eq(b) for a, b in zip((view.base.offset, *view.shape, *view.strides),
                                    (moved.base.offset, *moved.shape, *moved.strides)))
    steps = [z3.simplify(y - x) for x, y in zip(before, after)]
    if not same or any(_mentions(d, x) for d in steps for x in before):
        raise Unsupported("scf.for carrying an integer or pointer that does not move by a loop-invariant step", op.loc)
    return steps


def _mentions(term, symbol):
    return term.eq(symbol) or any(_mentions(child, symbol) for child in term.children())


def interpret(function: Function, prefix: str = "") -> Trace:
    return Interpreter(function, prefix).run()


__all__ = ["Access", "Interpreter", "Kind", "Ptr", "Tensor", "Trace", "Unsupported", "interpret"]
