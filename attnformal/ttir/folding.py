"""The merge theorem: a key loop folds each tile into its ``(m, l, acc)`` with the spec's own functions.

The spec's :func:`attnformal.merge.block_state` and :func:`attnformal.merge.merge` are run on *value trees*,
the interpreter's float vocabulary (:class:`Trees`, an ops family), with the loop's carried values, its
score tile and its V tile as leaves. The kernel's yielded values are trees over the same leaves. Both are
then read as Z3 IEEE terms of the IR's float width (:class:`IEEE`): ``exp``, ``log`` uninterpreted, a
reduction an uninterpreted function of its row (a ``λ``-term over the reduced axis), ``dot`` one of its row,
column and accumulator. Equal terms for every lane mean the kernel performs the spec's IEEE operations in the
spec's order, whatever ``exp`` is; the merge obligations (monoid, loop invariant, masked rows) then hold of
the loop. A kernel that computes the same real-number merge another way (``exp2`` with a log2(e) scale,
another association of the sums) is not proved here: the theorem is op for op, not real-valued (refuted
where a valuation separates the two, else unknown).
"""

from __future__ import annotations

import math
import re

import z3

from attnformal.ttir.interpret import OpNode, Unsupported


class TreeTile:
    """A tile of value trees: ``shape`` and ``at(lane) -> tree``; numpy broadcasting between tiles."""

    def __init__(self, shape, at):
        self.shape, self.at = tuple(shape), at

    @staticmethod
    def rows(tensor):
        """An interpreter tensor as a tile; a row vector ``[n]`` as ``[n, 1]``, as the spec keeps its row states."""
        if len(tensor.shape) == 1:
            return TreeTile(tensor.shape + (1,), lambda lane: tensor.at(lane[:1]))
        return TreeTile(tensor.shape, tensor.at)

    @staticmethod
    def of(x):
        return x if isinstance(x, TreeTile) else TreeTile((), lambda lane, c=float(x): ("const", c))

    def _binary(self, other, op, swap=False):
        a, b = TreeTile.of(self), TreeTile.of(other)
        a, b = (b, a) if swap else (a, b)
        shape = _broadcast_shape(a.shape, b.shape)
        return TreeTile(shape, lambda lane: ("op", op, a.at(_source_lane(lane, a.shape)),
                                             b.at(_source_lane(lane, b.shape))))

    __add__ = lambda self, other: self._binary(other, "arith.addf")
    __radd__ = lambda self, other: self._binary(other, "arith.addf", swap=True)
    __sub__ = lambda self, other: self._binary(other, "arith.subf")
    __rsub__ = lambda self, other: self._binary(other, "arith.subf", swap=True)
    __mul__ = lambda self, other: self._binary(other, "arith.mulf")
    __rmul__ = lambda self, other: self._binary(other, "arith.mulf", swap=True)
    __truediv__ = lambda self, other: self._binary(other, "arith.divf")
    __matmul__ = lambda self, other: Trees.matmul(self, other)

    def swapaxes(self, first, second):
        """The transpose of a tile's last two axes (the only swap the spec takes)."""
        if sorted(a % len(self.shape) for a in (first, second)) != [len(self.shape) - 2, len(self.shape) - 1]:
            raise Unsupported(f"swapaxes({first}, {second})", "the spec's tile")
        return TreeTile(self.shape[:-2] + self.shape[:-3:-1], lambda lane: self.at(lane[:-2] + lane[:-3:-1]))


def _broadcast_shape(a, b):
    a, b = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    return tuple(max(x, y) for x, y in zip(a, b))


def _source_lane(lane, shape):
    """The lane of an operand of ``shape`` that a broadcast result lane reads (size-1 axes read lane 0)."""
    lane = lane[len(lane) - len(shape):]
    return tuple(z3.IntVal(0) if n == 1 else x for x, n in zip(lane, shape))


def _map(op, *tiles):
    tiles = [TreeTile.of(t) for t in tiles]
    shape = tiles[0].shape
    for t in tiles[1:]:
        shape = _broadcast_shape(shape, t.shape)
    return TreeTile(shape, lambda lane: op(*[t.at(_source_lane(lane, t.shape)) for t in tiles]))


def _row_reduction(combiner):
    def reduce(s):
        return TreeTile(s.shape[:-1] + (1,), lambda lane: ("reduce", (combiner,), s, len(s.shape) - 1, lane[:-1]))
    return reduce


class Trees:
    """The ops family of :class:`TreeTile`: each spec operation as the TTIR op Triton lowers it to
    (``maximum`` is ``tl.maximum``'s ``arith.maxnumf``, ``is_neg_inf(x)`` is ``x == -inf``)."""

    where = staticmethod(lambda c, a, b: _map(lambda c, a, b: ("select", c, a, b, "spec"), c, a, b))
    maximum = staticmethod(lambda a, b: _map(lambda a, b: ("op", "arith.maxnumf", a, b), a, b))
    minimum = staticmethod(lambda a, b: _map(lambda a, b: ("op", "arith.minnumf", a, b), a, b))
    exp = staticmethod(lambda x: _map(lambda x: ("op", "math.exp", x), x))
    log = staticmethod(lambda x: _map(lambda x: ("op", "math.log", x), x))
    is_neg_inf = staticmethod(lambda x: _map(lambda x: ("cmpf", "oeq", x, ("const", -math.inf)), x))
    rowmax = staticmethod(_row_reduction("arith.maxnumf"))
    rowsum = staticmethod(_row_reduction("arith.addf"))

    @staticmethod
    def matmul(p, v):
        zero = TreeTile.of(0.0)
        return TreeTile(p.shape[:-1] + v.shape[-1:], lambda lane: ("dot", p, v, zero, lane))


TreeTile.__attn_ops__ = Trees
LN2 = TreeTile((), lambda lane: ("ln2",))  # ln 2, exactly (read by :class:`Reals`; a base-2 fold's scale)


_PREDICATES = {
    "oeq": z3.fpEQ, "olt": z3.fpLT, "ole": z3.fpLEQ, "ogt": z3.fpGT, "oge": z3.fpGEQ,
    "one": lambda a, b: z3.And(z3.Not(z3.fpEQ(a, b)), z3.Not(z3.fpIsNaN(a)), z3.Not(z3.fpIsNaN(b))),
    "une": lambda a, b: z3.Not(z3.fpEQ(a, b)),
    "ord": lambda a, b: z3.Not(z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b))),
    "uno": lambda a, b: z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b)),
}
_RNE = z3.RNE()
_BINARY = {"arith.addf": lambda a, b: z3.fpAdd(_RNE, a, b), "arith.subf": lambda a, b: z3.fpSub(_RNE, a, b),
           "arith.mulf": lambda a, b: z3.fpMul(_RNE, a, b), "arith.divf": lambda a, b: z3.fpDiv(_RNE, a, b),
           "arith.maxnumf": z3.fpMax, "arith.minnumf": z3.fpMin,
           "arith.maximumf": lambda a, b: z3.If(z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b)), z3.fpNaN(a.sort()),
                                                z3.fpMax(a, b)),
           "arith.minimumf": lambda a, b: z3.If(z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b)), z3.fpNaN(a.sort()),
                                                z3.fpMin(a, b))}
_UNARY = {"arith.negf": z3.fpNeg, "math.absf": z3.fpAbs, "math.sqrt": lambda x: z3.fpSqrt(_RNE, x)}
_UNINTERPRETED = ("math.exp", "math.exp2", "math.log", "math.log2")


def unfused(tree):
    """A ``dot`` with an accumulator ``c`` other than 0 read as ``c + dot(a, b, 0)``: Triton's combine pass folds
    ``acc + tl.dot(a, b)`` into the dot's accumulator, and how a dot sums (where the accumulator enters included)
    is not modelled either way."""
    if tree[0] != "dot" or tree[3].at(tree[4]) == ("const", 0.0):
        return tree
    _, a, b, c, lane = tree
    node = OpNode(("op", "arith.addf", c.at(lane), ("dot", a, b, TreeTile.of(0.0), lane)))
    node.loc = getattr(tree, "loc", None)
    return node


def unmasked(tree, comparisons):
    """The scores a mask's selects choose from: each select's branch that is not the ``-inf`` fill (of a select
    between a masked and an unmasked tile, as a tile-class ``if`` makes, both branches, which must agree)."""
    if tree[0] != "select":
        return tree
    kept = [unmasked(branch, comparisons) for branch in tree[2:4] if branch != ("const", -math.inf)]
    if not kept or any(first_difference(kept[0], other, comparisons) for other in kept[1:]):
        raise Unsupported("a select between two different score tiles", tree[4])
    return kept[0]


class IEEE:
    """Value trees as Z3 floating-point terms of one width (a conversion between widths is unsupported)."""

    def __init__(self, trace, width):
        self.comparisons = trace.comparisons
        self.sort = {16: z3.FloatHalf(), 32: z3.Float32(), 64: z3.Float64()}[width]
        self.depth = 0  # of bound variables: one per nested reduction or dot
        self._conditions = {}  # a select's Z3 condition's id -> (condition, its IEEE reading): shared DAGs read once

    def leaf(self, name, lane):
        return z3.Function(name, *[z3.IntSort()] * len(lane), self.sort)(*lane)

    def value(self, tree):
        tree = unfused(tree)
        kind = tree[0]
        if kind == "const":
            return z3.FPVal(tree[1], self.sort)
        if kind == "param":
            return z3.Const(f"param_{tree[1]}", self.sort)
        if kind == "opaque":
            return self.leaf(f"carried_{tree[1]}", tree[2])
        if kind == "load":
            access, lane = tree[1], tree[2]
            return self.leaf(f"{access.arg}#{access.number}", lane)
        if kind == "select":
            return z3.If(self.condition(tree[1]), self.value(tree[2]), self.value(tree[3]))
        if kind == "op":
            return self.operation(tree[1], [self.value(a) for a in tree[2:]])
        if kind == "reduce":
            return self.reduction(*tree[1:])
        if kind == "dot":
            return self.dot(*tree[1:])
        raise Unsupported(f"float value {kind}", "the merge theorem")

    def operation(self, name, args):
        if name in _BINARY:
            return _BINARY[name](*args)
        if name in _UNARY:
            return _UNARY[name](*args)
        if name in _UNINTERPRETED:
            return z3.Function(name, self.sort, self.sort)(*args)
        raise Unsupported(f"float op {name}", "the merge theorem")

    def condition(self, cond):
        """A select's condition: the spec's ``("cmpf", ...)``, or a Z3 Bool whose cmpf lanes are read as IEEE."""
        if isinstance(cond, tuple):
            return _PREDICATES[cond[1]](self.value(cond[2]), self.value(cond[3]))
        if cond.get_id() not in self._conditions:
            pairs = [(app, self.compare(app)) for app in _applications(cond, self.comparisons)]
            self._conditions[cond.get_id()] = cond, z3.substitute(cond, *pairs) if pairs else cond
        return self._conditions[cond.get_id()][1]

    def compare(self, app):
        predicate, a, b = self.comparisons[app.decl().name()]
        if predicate not in _PREDICATES:
            raise Unsupported(f"cmpf {predicate}", "the merge theorem")
        lane = tuple(app.children())
        return _PREDICATES[predicate](self.value(a.at(lane)), self.value(b.at(lane)))

    def bound(self, extent, body):
        """``λ x. body(x)`` on ``0 <= x < extent`` (+0 elsewhere): one row or column of a tile."""
        self.depth += 1
        try:
            x = z3.Int(f"bound{self.depth}")
            inside = z3.And(0 <= x, x < extent)
            return z3.Lambda([x], z3.If(inside, body(x), z3.FPVal(0.0, self.sort)))
        finally:
            self.depth -= 1

    def reduction(self, combiners, source, axis, lane):
        if len(combiners) != 1:
            raise Unsupported(f"a reduction combining with {combiners}", "the merge theorem")
        row = self.bound(source.shape[axis], lambda x: self.value(source.at(lane[:axis] + (x,) + lane[axis:])))
        return z3.Function(f"reduce[{combiners[0]}]", row.sort(), self.sort)(row)

    def dot(self, a, b, c, lane):
        row = self.bound(a.shape[-1], lambda k: self.value(a.at((lane[0], k))))
        column = self.bound(b.shape[0], lambda k: self.value(b.at((k, lane[1]))))
        return z3.Function("dot", row.sort(), column.sort(), self.sort, self.sort)(row, column, self.value(c.at(lane)))


def _applications(cond, names):
    found, stack, seen = [], [cond], set()
    while stack:
        term = stack.pop()
        if term.get_id() in seen:
            continue
        seen.add(term.get_id())
        if z3.is_app(term) and term.decl().name() in names:
            found.append(term)
        stack.extend(term.children())
    return found


def first_difference(kernel, spec, comparisons, loc="the loop"):
    """Where the kernel's value tree first departs from the spec's (depth first): ``(source line, kernel
    node, spec node)``, or None when they agree node for node. Lines come from the kernel's nodes (an op's,
    a select's, a load's), else from the nearest one around. Where one side applies an op the other does not
    (the spec's ``ds * slope`` where the kernel has ``ds``), the node is the one whose operand the other side is."""
    kernel, spec = unfused(_as_comparison(kernel, comparisons)), unfused(_as_comparison(spec, comparisons))
    here = getattr(kernel, "loc", None) or (kernel[4] if kernel[0] == "select" else None) or \
        (kernel[1].loc if kernel[0] == "load" else None)
    if here and here != loc.split(", an operand of the value at ")[0]:
        loc = here if loc == "the loop" else f"{here}, an operand of the value at {loc.split(', an operand')[0]}"
    if kernel[0] != spec[0] or _label(kernel) != _label(spec):
        return loc, kernel, spec
    for a, b in zip(_children(kernel), _children(spec)):
        a, b = _as_comparison(a, comparisons), _as_comparison(b, comparisons)
        if not (isinstance(a, tuple) and isinstance(b, tuple)):
            if not _same_term(a, b):
                return loc, kernel, spec
            continue
        found = first_difference(a, b, comparisons, loc)
        if found and (first_difference(kernel, b, comparisons) is None or first_difference(a, spec, comparisons) is None):
            return loc, kernel, spec  # one side's whole value is an operand of the other's: an op added or left out
        if found:
            return found
    return None


def _as_comparison(tree, comparisons):
    """A Bool that is one cmpf lane, as the spec's ``("cmpf", predicate, a, b)``."""
    if isinstance(tree, z3.BoolRef) and z3.is_app(tree) and tree.decl().name() in comparisons:
        predicate, a, b = comparisons[tree.decl().name()]
        lane = tuple(tree.children())
        return ("cmpf", predicate, a.at(lane), b.at(lane))
    return tree


def _label(tree):
    """What a node is apart from its operands."""
    kind = tree[0]
    if kind == "const":
        return "nan" if math.isnan(tree[1]) else tree[1]
    if kind in ("op", "cmpf", "param"):
        return tree[1]
    if kind == "opaque":
        return tree[1], tuple(str(z3.simplify(x)) for x in tree[2])
    if kind == "load":
        return id(tree[1]), tuple(str(z3.simplify(x)) for x in tree[2])
    if kind == "reduce":
        return tree[1], tree[3], tree[2].shape[tree[3]]
    if kind == "dot":
        return tree[1].shape, tree[2].shape
    return ()


def _children(tree):
    kind = tree[0]
    if kind in ("op", "cmpf"):
        return tree[2:]
    if kind == "select":
        return tree[1:4]
    probe = z3.Int("probe")
    if kind == "reduce":
        _, _, source, axis, lane = tree
        return [source.at(lane[:axis] + (probe,) + lane[axis:])]
    if kind == "dot":
        _, a, b, c, lane = tree
        return [a.at((lane[0], probe)), b.at((probe, lane[1])), c.at(lane)]
    return []


def _same_term(a, b):
    if isinstance(a, z3.ExprRef) and isinstance(b, z3.ExprRef):
        return z3.simplify(a).eq(z3.simplify(b))
    return False


def render(tree, depth=2):
    """A node and its operands to ``depth`` levels: ``arith.addf(carried l_i, arith.mulf(...))``."""
    kind = tree[0] if isinstance(tree, tuple) else None
    if kind == "const":
        return f"{tree[1]:g}"
    if kind == "opaque":
        return f"carried {tree[1].lstrip('%')}"
    if kind == "load":
        return f"load of {tree[1].arg}"
    if kind == "param":
        return tree[1].lstrip("%")
    if kind is None:
        return "a condition"
    if depth == 0:
        return "..."
    name = {"op": tree[1] if kind == "op" else "", "cmpf": f"cmpf {tree[1] if kind == 'cmpf' else ''}",
            "select": "select", "reduce": f"reduce[{tree[1][0] if kind == 'reduce' else ''}]", "dot": "dot"}[kind]
    return f"{name}({', '.join(render(c, depth - 1) for c in _children(tree))})"


class Concrete:
    """Value trees evaluated in float32/float64 numpy at one valuation: the integers (lengths, program ids,
    lanes, table entries) from a Z3 model of the premise, every load and carried value from ``fill(leaf,
    lane)``, and each uninterpreted function given a real meaning (numpy's exp and log, a reduction's max or
    sum of its row, dot's sum of products plus the accumulator). That is one interpretation of everything
    the IEEE terms leave free, so two trees that evaluate to different bits here are different IEEE terms:
    a countermodel of the merge theorem (NaN equals NaN and +0 differs from -0, as SMT-LIB's equality).
    ``elements`` caches the element trees at concrete indices and the integer conditions, which do not
    depend on the fill: share it between valuations of one model (building a tree is most of the cost)."""

    def __init__(self, model, comparisons, fill, width, elements=None, read_back=lambda load: None):
        import numpy
        self.np, self.model, self.comparisons, self.fill, self.read_back = numpy, model, comparisons, fill, read_back
        self.type = {16: numpy.float16, 32: numpy.float32, 64: numpy.float64}[width]
        self.memo, self.elements = {}, {} if elements is None else elements

    def element(self, tensor, index):
        """``tensor.at(index)`` at integer indices, built once per model."""
        key = (id(tensor), index)
        if key not in self.elements:
            self.elements[key] = tensor, tensor.at(tuple(z3.IntVal(i) for i in index))  # keeps the id alive
        return self.elements[key][1]

    def integer(self, term):
        return self.model.eval(term, model_completion=True).as_long()

    def truth(self, cond):
        if isinstance(cond, tuple):
            return self.compare(cond[1], self.value(cond[2]), self.value(cond[3]))
        key = ("condition", cond.get_id())
        if key not in self.elements:
            self.elements[key] = cond, _applications(cond, self.comparisons)
        applications = self.elements[key][1]
        if not applications:
            if ("truth", key[1]) not in self.elements:
                self.elements["truth", key[1]] = self._integer_truth(cond)
            return self.elements["truth", key[1]]
        pairs = [(app, z3.BoolVal(bool(self.compare(self.comparisons[app.decl().name()][0],
                                                    *[self.value(self.element(t, self.lane(app.children())))
                                                      for t in self.comparisons[app.decl().name()][1:]]))))
                 for app in applications]
        return self._integer_truth(z3.substitute(cond, *pairs))

    def _integer_truth(self, cond):
        return z3.is_true(self.model.eval(cond, model_completion=True))

    def compare(self, predicate, a, b):
        nan = self.np.isnan(a) or self.np.isnan(b)
        ordered = {"oeq": a == b, "olt": a < b, "ole": a <= b, "ogt": a > b, "oge": a >= b, "one": a != b,
                   "ord": True, "une": a != b, "uno": False}[predicate]
        return nan if predicate in ("une", "uno") else (ordered and not nan)

    def lane(self, lane):
        return tuple(self.integer(x) for x in lane)

    def value(self, tree):
        t, np = self.type, self.np
        tree = unfused(tree)
        kind = tree[0]
        if kind in ("const", "ln2"):
            return t(tree[1] if kind == "const" else math.log(2))
        stored = self.read_back(tree) if kind == "load" else None
        if stored is not None:
            return self.value(stored)
        if kind in ("param", "opaque", "load"):
            lane = self.lane(tree[2]) if kind != "param" else ()
            return t(self.fill(tree, lane))
        if kind == "select":
            return self.value(tree[2]) if self.truth(tree[1]) else self.value(tree[3])
        if kind == "op":
            args = [self.value(a) for a in tree[2:]]
            with np.errstate(all="ignore"):
                return t(_NUMPY[tree[1]](np, *args))
        if kind == "reduce":
            _, combiners, source, axis, lane = tree
            key = (id(source), axis, self.lane(lane))
            if key not in self.memo:
                at = self.lane(lane)
                row = [self.value(self.element(source, at[:axis] + (j,) + at[axis:])) for j in range(source.shape[axis])]
                with np.errstate(all="ignore"):
                    self.memo[key] = t(np.fmax.reduce(row) if "max" in combiners[0] else np.sum(row, dtype=t))
            return self.memo[key]
        if kind == "dot":
            _, a, b, c, lane = tree
            key = (id(a), id(b), self.lane(lane))
            if key not in self.memo:
                i, j = self.lane(lane)
                with np.errstate(all="ignore"):
                    self.memo[key] = t(sum(self.value(self.element(a, (i, k))) * self.value(self.element(b, (k, j)))
                                           for k in range(a.shape[-1])) + self.value(self.element(c, (i, j))))
            return self.memo[key]
        raise Unsupported(f"float value {kind}", "the merge theorem")

    def same(self, a, b):
        return (self.np.isnan(a) and self.np.isnan(b)) or a.tobytes() == b.tobytes()


_NUMPY = {"arith.addf": lambda np, a, b: a + b, "arith.subf": lambda np, a, b: a - b,
          "arith.mulf": lambda np, a, b: a * b, "arith.divf": lambda np, a, b: a / b,
          "arith.maxnumf": lambda np, a, b: np.fmax(a, b), "arith.minnumf": lambda np, a, b: np.fmin(a, b),
          "arith.maximumf": lambda np, a, b: np.maximum(a, b), "arith.minimumf": lambda np, a, b: np.minimum(a, b),
          "arith.negf": lambda np, a: -a, "math.absf": lambda np, a: np.abs(a), "math.sqrt": lambda np, a: np.sqrt(a),
          "math.exp": lambda np, a: np.exp(a), "math.exp2": lambda np, a: np.exp2(a),
          "math.log": lambda np, a: np.log(a), "math.log2": lambda np, a: np.log2(a),
          # conversions, met only where the trees are read in real arithmetic (IEEE refuses them first)
          "arith.truncf": lambda np, a: a, "arith.extf": lambda np, a: a}


def fills(loads, unit, seed=0):
    """The valuations of the free float leaves a witness search tries, each ``(description, fill)``: seeded
    standard-normal values with an arbitrary carried state; the same from merge's unit (``unit``: carried
    value name -> its unit, m = -inf, l = acc = 0); and for each load, that tensor -inf and every other load 1
    (rows whose scores are all -inf, as a fully masked row's are), with either state."""
    import zlib

    import numpy

    def valuation(from_unit, minus_inf=None):
        def fill(leaf, lane):
            if leaf[0] == "opaque" and from_unit:
                return unit[leaf[1]]
            if leaf[0] == "load" and minus_inf is not None:
                return -math.inf if leaf[1] is minus_inf else 1.0
            key = repr((leaf[0], leaf[1] if leaf[0] != "load" else leaf[1].loc, lane, seed)).encode()
            return numpy.random.default_rng(zlib.crc32(key)).standard_normal()
        return fill
    yield f"standard-normal values (seed {seed}), an arbitrary carried state", valuation(False)
    yield f"standard-normal loads (seed {seed}) from merge's unit state", valuation(True)
    for access in loads:
        for from_unit in (False, True):
            yield (f"{access.arg} at {access.loc} all -inf, other loads 1, "
                   + ("from the unit state" if from_unit else "an arbitrary carried state"), valuation(from_unit, access))


class Reals:
    """Value trees as SymPy terms of real arithmetic, for a merge stated up to what a state means (a kernel that
    folds in base 2, or carries its log-sum-exp). ``exp2(x)`` is ``exp(x ln 2)`` and ``log2`` ``log / ln 2``;
    conversions (``truncf``, ``extf``) are exact; scores are finite, so ``x == -inf`` is false. A row sum or a
    ``dot`` is a sum over a bound lane ``j``: its terms are expanded (``exp(a + b) = exp(a) exp(b)``) and what does
    not depend on ``j`` is taken out, so a rescale ``exp(m - m')`` leaves the sum and cancels. What stays inside
    is an application of a sum symbol to a term in ``j``; a row max, a select on integers (a mask, a boundary)
    and anything else the theorem does not look into is a symbol named after its tree. Two trees with the same
    normal form are equal in real arithmetic for every valuation of those symbols."""

    def __init__(self, comparisons, assume=(), read_back=lambda load: None):
        import sympy
        self.sp, self.comparisons, self.depth, self.keys, self.names = sympy, comparisons, 0, {}, {}
        self.assume = tuple(assume)  # (Z3 Bool, its value): an ``if``'s condition, for a case of the theorem
        self.read_back = read_back  # a load node -> the value stored there, where the launch says it reads it back
        self.reals = {"arith.addf": lambda a, b: a + b, "arith.subf": lambda a, b: a - b,
                      "arith.mulf": lambda a, b: a * b, "arith.divf": lambda a, b: a / b, "arith.negf": lambda a: -a,
                      "arith.maxnumf": sympy.Max, "arith.minnumf": sympy.Min, "math.exp": sympy.exp,
                      "math.exp2": lambda a: sympy.exp(a * sympy.log(2)), "math.log": sympy.log,
                      "math.log2": lambda a: sympy.log(a) / sympy.log(2),
                      "arith.truncf": lambda a: a, "arith.extf": lambda a: a}

    def symbol(self, key):
        if key not in self.keys:
            self.keys[key] = self.sp.Symbol(f"v{len(self.keys)}", real=True)
            self.names[self.keys[key]] = key
        return self.keys[key]

    def value(self, tree):
        sp, kind = self.sp, tree[0]
        if kind == "ln2":
            return sp.log(2)
        if kind == "const":
            if not math.isfinite(tree[1]):
                raise Unsupported(f"the constant {tree[1]} in real arithmetic", "the merge theorem")
            return sp.Rational(tree[1])
        stored = self.read_back(tree) if kind == "load" else None
        if stored is not None:
            return self.value(stored)
        if kind in ("param", "opaque", "load"):
            return self.symbol(_key(tree))
        if kind == "select":
            truth = self.truth(tree[1])
            return self.symbol(_key(tree)) if truth is None else self.value(tree[2] if truth else tree[3])
        if kind == "op":
            return self.operation(tree[1], [self.value(a) for a in tree[2:]])
        if kind == "reduce":
            _, combiners, source, axis, lane = tree
            if combiners != ("arith.addf",):
                return self.symbol(_key(tree))
            return self.sum(source.shape[axis], lambda j: self.value(source.at(lane[:axis] + (j,) + lane[axis:])))
        if kind == "dot":
            _, a, b, c, lane = tree
            row_sum = self.sum(a.shape[-1], lambda k: self.value(a.at((lane[0], k))) * self.value(b.at((k, lane[1]))))
            return row_sum + self.value(c.at(lane))
        raise Unsupported(f"float value {kind}", "the merge theorem")

    def operation(self, name, args):
        if name not in self.reals:
            raise Unsupported(f"float op {name} in real arithmetic", "the merge theorem")
        return self.reals[name](*args)

    def truth(self, cond):
        """A select's condition where real arithmetic decides it (the spec's ``m == -inf`` guard: false) or the case
        assumes it, else None (the select is then a symbol)."""
        if isinstance(cond, tuple):
            return {"oeq": False, "une": True, "one": True}.get(cond[1]) if ("const", -math.inf) in cond[2:4] else None
        return next((value for condition, value in self.assume if condition.eq(cond)), None)

    def sum(self, extent, body):
        """``sum_{0 <= j < extent} body(j)`` in normal form."""
        sp = self.sp
        self.depth += 1
        try:
            j = z3.Int(f"sum_lane{self.depth}")
            terms = sp.Add.make_args(self.normal(body(j)))
        finally:
            self.depth -= 1
        token = re.compile(rf"\bsum_lane{self.depth + 1}\b")
        inside = {s for s in set().union(*(t.free_symbols for t in terms)) if token.search(self.names[s])}
        total = 0
        for term in terms:
            outside, within = sp.Integer(1), sp.Integer(1)
            for factor in sp.Mul.make_args(term):
                if isinstance(factor, sp.exp):  # exp(a + b): the parts in j stay inside
                    parts = sp.Add.make_args(factor.args[0])
                    outside *= sp.exp(sp.Add(*[p for p in parts if not p.free_symbols & inside]))
                    within *= sp.exp(sp.Add(*[p for p in parts if p.free_symbols & inside]))
                elif factor.free_symbols & inside:
                    within *= factor
                else:
                    outside *= factor
            total += outside * (extent if within == 1 else sp.Function(f"sum{extent}")(within))
        return total

    def normal(self, term):
        """A sum of products, each product's exponentials merged into one ``exp`` of an expanded exponent."""
        sp = self.sp
        out = 0
        for product in sp.Add.make_args(sp.expand(term, power_exp=True, log=False)):
            merged = sp.powsimp(product, combine="exp")
            rest = [f for f in sp.Mul.make_args(merged) if not isinstance(f, sp.exp)]
            exponent = sp.expand(sp.Add(*[f.args[0] for f in sp.Mul.make_args(merged) if isinstance(f, sp.exp)]))
            out += sp.Mul(*rest) * sp.exp(exponent)
        return out

    def equal(self, a, b):
        """Whether two real terms are equal for every valuation of their symbols: the numerator of their
        difference has normal form 0."""
        numerator, _ = self.sp.fraction(self.sp.together(a - b))
        return self.normal(numerator) == 0


def _key(tree, depth=0):
    """A tree's identity, as a string: equal strings are the same value (loads by access and simplified lane; a
    reduction's or dot's bound lane named by its depth)."""
    kind = tree[0]
    if kind in ("const", "ln2"):
        return repr(tree[1:])
    if kind == "param":
        return f"param {tree[1]}"
    if kind in ("opaque", "load"):
        name = f"carried {tree[1]}" if kind == "opaque" else f"load {tree[1].arg}#{tree[1].number}"
        return f"{name}[{', '.join(str(z3.simplify(x)) for x in tree[2])}]"
    if kind == "select":
        condition = _key(tree[1], depth) if isinstance(tree[1], tuple) else z3.simplify(tree[1])
        return f"select({condition}, {_key(tree[2], depth)}, {_key(tree[3], depth)})"
    if kind in ("op", "cmpf"):
        return f"{tree[1]}({', '.join(_key(a, depth) for a in tree[2:])})"
    x = z3.Int(f"key_lane{depth}")
    if kind == "reduce":
        _, combiners, source, axis, lane = tree
        element = source.at(lane[:axis] + (x,) + lane[axis:])
        return f"reduce{combiners}[{', '.join(str(z3.simplify(i)) for i in lane)}]({_key(element, depth + 1)})"
    if kind == "dot":
        _, a, b, c, lane = tree
        return f"dot({_key(a.at((lane[0], x)), depth + 1)}, {_key(b.at((x, lane[1])), depth + 1)}, {_key(c.at(lane), depth)})"
    raise Unsupported(f"float value {kind}", "the merge theorem")
