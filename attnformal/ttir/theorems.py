"""Theorems over a kernel's TTIR, for every program of the grid and every runtime argument.

Each theorem is decided by Z3 on the symbolic run of :mod:`attnformal.ttir.interpret`, under the
launch description's facts (lengths, grid, table contents) and the stated preconditions:

* **no-wrap** -- no integer op of the IR wraps in its width and no divisor is zero, on any lane
  (so the exact integer model used by every other theorem is the machine's);
* **bounds** -- no load or store that its mask lets through leaves its tensor;
* **address** -- each lane of a tiled load/store touches exactly the element the layout assigns to
  its logical index: the program's batch and head (``kv_head_of`` for K and V), row
  ``block * BLOCK + lane`` of the query block or of the key loop's block, feature ``lane``; and its
  mask lets a lane through iff that element exists (no row or column dropped);
* **masking** -- the scores reaching the softmax (a row max, or an ``exp(s - shift)``) are, lane by
  lane, the raw score ``q_i . k_j`` or ``-inf``, and raw iff the spec's
  :func:`~attnformal.masks.may_attend` ``(i, j)``;
* **coverage** -- the block loop (innermost: over key blocks, or dK/dV's over query blocks) runs over
  exactly the host's range (obligation 11 makes the split ranges a partition of the visited blocks,
  obligation 5 the visited blocks all that hold allowed keys), and a loop around it (dK/dV's over the
  query heads of a group) over exactly the range the launch states;
* **writes** -- every element of every output is written by exactly one program and lane.
* **merge** -- the key loop carrying the launch's softmax state starts from merge's unit and each
  iteration yields the spec's ``merge(state, block_state(s, v))``, op for op in the IR's IEEE arithmetic;
  or, for a state the launch states by its meaning (a base-2 or log-sum-exp fold), has the same ``out`` and
  ``lse`` as the spec's merge, in real arithmetic.

An IR the interpreter cannot model gives one *unknown* naming the op and line.
"""

from __future__ import annotations

import importlib
import itertools
import math
import time
from dataclasses import dataclass

import z3

from attnformal.logic import (DEFAULT_WALL_S, PROVED, REFUTED, RLIMIT_UNIT, UNKNOWN, VACUOUS, Budget, Proof,
                              TermIndex)
from attnformal.masks import may_attend
from attnformal.ttir import folding
from attnformal.ttir.interpret import Tensor, Unsupported, interpret, memory, signed_range
from attnformal.ttir.launch import MAX_ELEMENTS, LaunchDescription, TensorRole
from attnformal.ttir.lower import lower

TOOL = "z3+ttir"
QUERY_UNITS = 100 * RLIMIT_UNIT  # per query; placeholder, set from measurement


class Setting:
    """One configuration of one launch: the sizes, the program's coordinates, and the facts about them."""

    def __init__(self, launch: LaunchDescription, config: dict, trace, prefix=""):
        self.launch, self.config, self.trace, self.prefix = launch, config, trace, prefix
        self.counter = itertools.count()
        self.sizes = {name: z3.Int(name) for name in launch.sizes}
        self.facts = list(launch.constraints(self.sizes, config))
        self.facts += [z3.Int(param) == self.sizes[size] for param, size in launch.arguments.items()]
        pids = trace.program_ids
        grid = launch.grid(self.sizes, config)
        self.facts += [z3.And(0 <= p, p < n) for p, n in zip(pids, grid)]
        self.program, program_facts = launch.program(self.sizes, config, pids, self.fresh)
        self.facts += program_facts + trace.definitions
        self.accessed = {a.arg: launch.tensors[a.arg] for a in trace.accesses if a.arg in launch.tensors}
        self.facts += [self.numel(role) <= MAX_ELEMENTS for role in self.accessed.values()]  # each fits in a device's memory
        self.assumed = ["the shapes and grid the host admits (the launch's constraints)",
                        f"every tensor the kernel accesses holds at most 2**{MAX_ELEMENTS.bit_length() - 1} elements",
                        "the host's tables hold their contracts ("
                        + ", ".join(name for name, role in launch.tensors.items() if role.contract) + ")"]
        self.assumed += [name for name, _ in launch.preconditions(self.sizes, config)]
        self.assumed += [f"the float parameter {name} is positive (a masked -inf times it stays -inf)"
                         for name in launch.positive]
        self.facts += [fact for _, fact in launch.preconditions(self.sizes, config)]

    def fresh(self, stem):
        return z3.Int(f"{self.prefix}{stem}~{next(self.counter)}")

    def coordinates(self, loop):
        """The program's coordinates, with those the launch gives an iteration of ``loop`` (and its outer ones): by
        default the key block ``bn`` whose first key the induction variable is (``LaunchDescription.key_step``)."""
        if loop is None:
            return dict(self.program)
        inside = {"bn": loop.iv / self.launch.key_step(self.config)} if self.launch.in_loop is None else \
            self.launch.in_loop(self.sizes, self.config, self.program, loop)
        return {**self.program, **inside}

    def lane(self, shape, stem="lane"):
        lane = tuple(self.fresh(f"{stem}{k}") for k in range(len(shape)))
        return lane, [z3.And(0 <= x, x < n) for x, n in zip(lane, shape)]

    def size(self, name):
        return self.sizes[name] if name in self.sizes else z3.IntVal(int(name))

    def dims(self, role: TensorRole):
        return [self.size(d) for d in role.dims]

    def numel(self, role):
        """The elements the tensor spans: its row-major size, or with strides ``1 + sum((n - 1) * stride)``."""
        if role.strides is None:
            return math.prod(self.dims(role))
        return 1 + z3.Sum([(n - 1) * self.size(t) for n, t in zip(self.dims(role), role.strides)])

    def layout(self, role, index):
        if role.strides is not None:
            return z3.Sum([x * self.size(t) for x, t in zip(index, role.strides)])
        offset = z3.IntVal(0)
        for x, n in zip(index, self.dims(role)):
            offset = offset * n + x
        return offset

    def table_facts(self, terms, context=None):
        """The contracts of the table entries the terms read, at the candidate indices the theorem names
        (``context["at"][table]``), as ``offset == layout(index) => contract`` (Z3 then only has to match
        the kernel's offset)."""
        facts, context, subterms = [], context or {}, TermIndex(terms, quantified=True)
        for name, role in self.launch.tensors.items():
            if role.contract is None:
                continue
            for application in subterms.applications(memory(name)):
                offset = application.arg(0)
                for index in context.get("at", {}).get(name, ()):
                    in_range = [z3.And(0 <= x, x < n) for x, n in zip(index, self.dims(role))]
                    facts.append(z3.Implies(z3.And(offset == self.layout(role, index), *in_range),
                                            role.contract(index, application, self.sizes, self.config, context)))
        return facts


@dataclass(frozen=True)
class Limits:
    """What each query may spend: Z3 resource units (deterministic; the verdict rests on them) and a
    wall-clock safety net far above what they take (attnformal.logic.Budget)."""

    units: int = QUERY_UNITS
    seconds: float = DEFAULT_WALL_S

    def budget(self) -> Budget:
        return Budget(seconds=self.seconds, rlimit=self.units)


def decide(claim, hypotheses, goal, setting, limits, show=(), context=None, premise=()) -> Proof:
    """``hypotheses => goal`` for all values: unsat of its negation (with the tables' contracts). A refutation
    shows the smallest launch found (:func:`_small_counterexample`). A proof is vacuous when the hypotheses and
    ``premise`` (facts the goal assumes inside itself) have no model."""
    start = time.perf_counter()
    base = setting.facts + list(hypotheses)
    tables = setting.table_facts(base + [goal], context)
    budget = limits.budget()
    for share, solver in zip((0.4, 0.5), _solvers()):  # a second strategy only when the first gives up
        solver.add(*base, *tables, z3.Not(goal))
        verdict, _ = budget.check(solver, share=share)
        if verdict != z3.unknown:
            break
    if verdict == z3.unsat:
        return _unless_vacuous(Proof(claim, TOOL, PROVED, **_spent(setting, start, budget)), base + tables + list(premise),
                               limits)
    model = _small_counterexample(base + tables + [z3.Not(goal)], setting, budget)
    if model is None and verdict == z3.sat:
        model = solver.model()
    if model is not None:
        shown = {name: str(model.eval(term, model_completion=True)) for name, term in _shown(setting, show)}
        return Proof(claim, TOOL, REFUTED, countermodel=shown, **_spent(setting, start, budget))
    status, detail = budget.unknown_reason(solver)
    return Proof(claim, TOOL, status, detail=f"z3: {detail}", **_spent(setting, start, budget))


SMALL_LAUNCHES = (2, 16, 256, 2 ** 16)  # bounds on every length tried in turn for the smallest refutation


SMALL_COUNTS = ("B", "Hq", "Hkv")  # the counts a model is then shrunk in, each to <= 2, else <= 16 (a case's size)


def _small_counterexample(query, setting, budget):
    """A model of the refutation with every length <= the first bound that admits one (Z3 finds those
    fast where the unbounded nonlinear query is slow), its batch and head counts then shrunk where the
    refutation allows (a replayed case's size), or None."""
    for bound in SMALL_LAUNCHES:
        solver = z3.Solver()
        solver.add(*query, *[size <= bound for size in setting.sizes.values()])
        verdict, _ = budget.check(solver, share=0.25)
        if verdict == z3.sat:
            return _shrunk(solver, setting, budget)
    return None


def _shrunk(solver, setting, budget):
    model = solver.model()
    for name in (n for n in SMALL_COUNTS if n in setting.sizes):
        size = setting.sizes[name]
        for tighter in (2, 16):
            if model.eval(size, model_completion=True).as_long() <= tighter:
                break
            smaller = _model_with(solver, size <= tighter, budget)
            if smaller is not None:
                model = smaller
                break
    return model


def _model_with(solver, fact, budget):
    """A model of the solver's query and ``fact`` (within a small share of the budget), or None; the solver is
    left as it was."""
    solver.push()
    solver.add(fact)
    verdict, _ = budget.check(solver, share=0.05)
    model = solver.model() if verdict == z3.sat else None
    solver.pop()
    return model


def _spent(setting, start, budget):
    return dict(hypotheses=tuple(setting.assumed), seconds=time.perf_counter() - start, queries=1,
                rlimit=budget.used)


def _unless_vacuous(proof, premise, limits):
    """A proof whose premise is unsatisfiable proves nothing: VACUOUS when Z3 finds it so."""
    solver = z3.Solver()
    solver.add(*premise)
    verdict, _ = limits.budget().check(solver)
    if verdict == z3.unsat:
        return proof.but(status=VACUOUS, detail="the premise is unsatisfiable")
    if verdict == z3.unknown:
        return proof.but(detail="premise satisfiability not decided within the budget")
    return proof


def _solvers():
    """Equations solved away first (offsets are sums of products of the arguments), then Z3's default."""
    yield z3.Then("simplify", "propagate-values", "solve-eqs", "simplify", "smt").solver()
    yield z3.Solver()


def _shown(setting, extra):
    sizes = [(n, t) for n, t in setting.sizes.items() if n not in ("nM", "nN")]
    pids = [(f"program_id({axis})", p) for axis, p in zip("xyz", setting.trace.program_ids)]
    return sizes + pids + list(extra)


# ------------------------------------------------------------------------ the theorems

def no_wrap(setting, limits):
    """Each int op's result fits its width. The ops of one loop and source line are first proved in one query, with
    one premise check (a model of all their premises at once is one of each), within a small budget; if that fails,
    each is decided alone within the full one."""
    loops = {}
    for record in setting.trace.no_wrap:
        loops.setdefault((id(record.loop), record.loc), []).append(record)
    proved = {}
    for records in loops.values():
        proved.update(_no_wrap_together(setting, records, limits))
    for record in setting.trace.no_wrap:
        yield proved[id(record)] if id(record) in proved else _no_wrap_alone(setting, record, limits)


TOGETHER_UNITS = RLIMIT_UNIT  # for the query of one loop and line's no-wrap claims: twice what an easy group takes


def _no_wrap_claim(record):
    return f"no-wrap: {record.what} at {record.loc}"


def _no_wrap_alone(setting, record, limits):
    lane, ranges = setting.lane(record.shape)
    claim, hypotheses, context = _no_wrap_claim(record), ranges + record.path, _table_context(setting, record.loop)
    termwise = _termwise(record, lane)
    if termwise is not None:
        proof = decide(claim, hypotheses, termwise, setting, limits, context=context)
        if proof.status == PROVED:
            return proof
    return decide(claim, hypotheses, record.holds(lane), setting, limits, _lane_shown(lane), context=context)


def _no_wrap_together(setting, records, limits):
    """``{id(record): Proof}`` of the records (of one loop and line) if one query proves them all, else ``{}``."""
    if len(records) < 2:
        return {}
    premises, failures = [], []
    for record in records:
        lane, ranges = setting.lane(record.shape)
        premises.append(z3.And(ranges + record.path))
        failures.append(z3.And(premises[-1], z3.Not(record.holds(lane))))
    small = Limits(units=min(limits.units, TOGETHER_UNITS), seconds=limits.seconds)
    proof = decide(f"{len(records)} no-wrap claims", [], z3.Not(z3.Or(failures)), setting, small,
                   context=_table_context(setting, records[0].loop), premise=premises)
    if proof.status != PROVED:
        return {}
    detail = f"in one query with {len(records) - 1} other no-wrap claims of its loop and line " \
             f"({proof.rlimit / RLIMIT_UNIT:.1f} M units, {proof.seconds:.2f} s for all)" + \
             (f"; {proof.detail}" if proof.detail else "")  # e.g. the premise check's own unknown
    return {id(r): proof.but(claim=_no_wrap_claim(r), detail=detail, seconds=proof.seconds / len(records),
                             rlimit=proof.rlimit // len(records)) for r in records}


def _termwise(record, lane):
    """A sum of n terms fits if each term lies within 1/n of the range: a stronger goal, but Z3 bounds each
    product alone (``b * sb``, ``i * si``) where it loses its way in their sum. None unless the result is a sum."""
    exact = None if record.exact is None else record.exact(lane)
    if exact is None or not z3.is_add(exact):
        return None
    low, high = signed_range(record.width)
    n = exact.num_args()
    return z3.And([z3.And(-(-low // n) <= term, term <= high // n) for term in exact.children()])


def _lane_shown(lane, stem="lane"):
    return [(f"{stem}[{k}]", x) for k, x in enumerate(lane)]


def _mask_at(access, lane):
    return z3.BoolVal(True) if access.mask is None else access.mask.at(lane if access.mask.shape else ())


def bounds(setting, limits, addresses):
    """Tiled accesses: from their address theorem and the layout lemma; table loads the launch names the
    entries of: from the entry read and the layout lemma; the others directly."""
    lemmas = {}
    for access in setting.trace.accesses:
        role = setting.launch.tensors.get(access.arg)
        claim = f"bounds: {access.op} of {access.arg} at {access.loc}"
        if role is None:
            yield Proof(claim, TOOL, UNKNOWN, detail=f"the launch description does not describe {access.arg}")
            continue
        if role.tile is not None and id(access) in addresses:
            where = addresses[id(access)]
        elif access.arg in _table_context(setting, access.loop)["at"]:
            where = _table_entry(setting, access, role, limits)
        else:
            lane, ranges = setting.lane(access.ptr.shape)
            offset = access.ptr.at(lane).offset
            yield decide(claim, ranges + access.path + [_mask_at(access, lane)],
                         z3.And(0 <= offset, offset < setting.numel(role)), setting, limits,
                         _lane_shown(lane) + [("offset", offset)])
            continue
        if access.arg not in lemmas:
            lemmas[access.arg] = _layout_lemma(setting, access.arg, role, limits)
        by = (where, lemmas[access.arg])
        status = next((p.status for p in by if p.status != PROVED), PROVED)
        yield Proof(claim, TOOL, status, hypotheses=tuple(setting.assumed), by=by,
                    detail="" if status == PROVED else f"not proved: {where.claim.split(':')[0]} or the layout lemma")


def _table_context(setting, loop):
    """Where the launch says the tables are read: ``{"at": {table: [index]}}``."""
    return {"at": setting.launch.table_indices(setting.program, loop.iv if loop is not None else None)}


def _table_entry(setting, access, role, limits):
    """A table load reads one of the entries the launch names, each index in range."""
    lane, ranges = setting.lane(access.ptr.shape)
    offset = access.ptr.at(lane).offset
    entries = _table_context(setting, access.loop)["at"][access.arg]
    dims = setting.dims(role)
    goal = z3.Or([z3.And(offset == setting.layout(role, index), *[z3.And(0 <= x, x < n) for x, n in zip(index, dims)])
                  for index in entries])
    return decide(f"table entry: load of {access.arg} at {access.loc} reads {access.arg}[{len(entries)} named entries]",
                  ranges + access.path + [_mask_at(access, lane)], goal, setting, limits,
                  _lane_shown(lane) + [("offset", offset)], context=_table_context(setting, access.loop))


def _layout_lemma(setting, name, role, limits):
    index = [setting.fresh(f"{name}_i") for _ in role.dims]
    ranges = [z3.And(0 <= x, x < n) for x, n in zip(index, setting.dims(role))]
    offset = setting.layout(role, index)
    return decide(f"layout: {name}'s row-major offset of an in-range index lies in [0, numel)", ranges,
                  z3.And(0 <= offset, offset < setting.numel(role)), setting, limits)


def tile_index(setting, role, lane, loop):
    """The logical index the launch assigns to a lane of a tiled access (``loop``: the key loop around it),
    and where it exists."""
    coordinates = setting.coordinates(loop)
    block, size = _tile_block(setting, role, coordinates)
    if block is None or any(name not in coordinates for name in role.program.values()):
        return None
    if role.columns is not None and "bn" not in coordinates:
        return None
    index, exists = [], []
    for axis, n in enumerate(setting.dims(role)):
        if axis in role.program:
            x = coordinates[role.program[axis]]
        elif axis == role.seq:
            x = block * size + lane[role.lanes[0]]
        elif axis == role.columns:
            x = coordinates["bn"] * setting.launch.block(setting.config)[1] + lane[-1]
        elif axis == role.feature:
            x = lane[role.lanes[1]]
        else:
            return None
        index.append(x)
        exists.append(z3.And(0 <= x, x < n))
    return index, z3.And(exists)


def _tile_block(setting, role, coordinates):
    """``(block index, rows per block)`` of a tiled tensor: query blocks ``bm`` of ``BLOCK_M`` rows, key blocks
    ``bn`` of ``BLOCK_N`` (a program's coordinate, or a loop's iteration)."""
    block_m, block_n = setting.launch.block(setting.config)
    name, size = ("bm", block_m) if role.tile == "query" else ("bn", block_n)
    return coordinates.get(name), size


def address(setting, limits, proven):
    for access in setting.trace.accesses:
        role = setting.launch.tensors.get(access.arg)
        if role is None or role.tile is None:
            continue
        lane, ranges = setting.lane(access.ptr.shape)
        placed = tile_index(setting, role, lane, access.loop)
        claim = f"address: {access.op} of {access.arg} at {access.loc}"
        if placed is None or len(access.ptr.shape) != 1 + (role.feature is not None or role.columns is not None):
            yield Proof(claim, TOOL, UNKNOWN, detail="the access's tile shape does not match its layout's axes")
            continue
        index, exists = placed
        mask = _mask_at(access, lane)
        goal = z3.And(mask == exists, z3.Implies(mask, access.ptr.at(lane).offset == setting.layout(role, index)))
        proof = decide(claim, ranges + access.path, goal, setting, limits,
                       _lane_shown(lane) + [("offset", access.ptr.at(lane).offset),
                                            ("expected", setting.layout(role, index)), ("mask", mask)],
                       context=_table_context(setting, access.loop))
        proven[id(access)] = proof
        yield proof


def coverage(setting, limits):
    """Each block of the host's range of this program (``table[coordinates..., 0:2]``) is the iteration of
    exactly one block loop (an innermost loop: the dK/dV kernel's loop over query heads is around one), and
    no loop runs over a block outside it. Where the launch names no table, the spec's: each key that a row of
    the program's query block may attend lies in the block of exactly one iteration."""
    loops = [loop for loop in setting.trace.loops if not any(other.outer is loop for other in setting.trace.loops)]
    if not loops:
        yield Proof("coverage: a key loop", TOOL, UNKNOWN, detail="no scf.for in the IR")
        return
    block = setting.fresh("block")
    step = setting.launch.key_step(setting.config)
    visits = z3.Sum([z3.If(z3.And(*loop.path, loop.iteration(block * step)), 1, 0) for loop in loops])
    where = ", ".join(loop.loc for loop in loops)
    subject = f"the block {'loops' if len(loops) > 1 else 'loop'} at {where} {'visit' if len(loops) > 1 else 'visits'}"
    outer = {id(o): o for loop in loops for o in _outer_loops(loop)}.values()  # in each of their iterations
    iterating = [z3.And(o.iteration(o.iv), *o.path) for o in outer]
    shown = [("block", block), ("visits", visits)] + sum(([(f"loop {k} start", loop.lower), (f"loop {k} end", loop.upper)]
                                                         for k, loop in enumerate(loops)), [])
    if setting.launch.key_loop is None:
        yield _allowed_keys_covered(setting, limits, subject, block, visits, iterating, shown)
        return
    table, coordinates = setting.launch.key_loop
    role = setting.launch.tensors[table]
    index = [setting.program[name] for name in coordinates]
    ends = [memory(table)(setting.layout(role, index + [end])) for end in (0, 1)]
    wanted = z3.If(z3.And(ends[0] <= block, block < ends[1]), 1, 0)
    yield decide(f"coverage: {subject} each block of {table}[{', '.join(coordinates)}, 0:2] once, no other",
                 iterating, visits == wanted, setting, limits,
                 shown + [("table start", ends[0]), ("table end", ends[1])])


def _allowed_keys_covered(setting, limits, subject, block, visits, iterating, shown):
    """Key ``j`` that row ``i`` of the program's query block may attend: its block is visited exactly once."""
    block_m, block_n = setting.launch.block(setting.config)
    i, j, bm = setting.fresh("i"), setting.fresh("j"), setting.program["bm"]
    row = z3.And(bm * block_m <= i, i < bm * block_m + block_m)
    allowed = may_attend(i, j, setting.launch.geometry(setting.sizes, setting.config))
    return decide(f"coverage: {subject} the block of each key a row of the query block may attend once",
                  iterating + [row, allowed, block == j / block_n], visits == 1, setting, limits,
                  [("i", i), ("j", j)] + shown)


def heads(setting, limits):
    """A loop around the block loop (the dK/dV kernel's over the query heads of a group) runs over exactly the
    range the launch states: each iteration once, none missed."""
    if setting.launch.outer_loop is None:
        return
    lower, upper = setting.launch.outer_loop(setting.sizes)
    outer = [loop for loop in setting.trace.loops if any(other.outer is loop for other in setting.trace.loops)]
    if not outer:
        yield Proof("coverage: a loop around the block loop", TOOL, UNKNOWN, detail="no nested scf.for in the IR")
    for loop in outer:
        yield decide(f"coverage: the loop at {loop.loc} runs over [{lower}, {upper}), each once", loop.path,
                     z3.And(loop.lower == lower, loop.upper == upper), setting, limits,
                     [("loop start", loop.lower), ("loop end", loop.upper)])


def _outer_loops(loop):
    while loop.outer is not None:
        loop = loop.outer
        yield loop


def masking(setting, limits):
    """Lane ``(r, c)`` of each softmax input in a key loop -- a row max of the scores, and the scores an
    ``exp(s - shift)`` weighs (the backward has no max) -- is the raw score of ``(i, j)`` iff
    ``may_attend(i, j)``, else -inf."""
    targets = [(source, f"scores reaching the row max at {loc}", loop, path)
               for combiners, source, loc, loop, path in setting.trace.reductions
               if combiners and all("max" in c for c in combiners) and loop is not None]
    targets += [(scores, f"scores weighed by the exp at {loc}", loop, path) for scores, loc, loop, path in
                ((_shifted_scores(source), loc, loop, path) for source, loc, loop, path in setting.trace.exponentials)
                if scores is not None and loop is not None]
    if not targets:
        yield Proof("masking: a softmax over the scores in a key loop", TOOL, UNKNOWN,
                    detail="no row max and no exp(scores - shift)")
    for source, what, loop, path in targets:
        yield _masking_at(setting, source, what, loop, path, limits)


def _shifted_scores(source, part=None):
    """``s`` of an exponential's argument ``s - shift`` where only ``s`` holds scores (the softmax's; a
    softcap's ``exp(-2|x|)`` is not one), as a tensor; else None. ``part``: how the scores are read off one
    lane's argument (:func:`_branch_scores`)."""
    part = part or _score_part
    probe = tuple(z3.Int(f"probe{k}") for k in range(len(source.shape)))
    if part(source.at(probe)) is None:
        return None
    return Tensor(source.shape, source.kind, lambda lane: part(source.at(lane)))


def _score_part(node):
    """``s`` of ``s - shift`` where only ``s`` holds a product, else None."""
    return node[2] if node[0] == "op" and node[1] == "arith.subf" and _has_dot(node[2]) and not _has_dot(node[3]) \
        else None


def _masking_at(setting, source, what, loop, path, limits):
    """The theorem on one softmax input ``source`` of ``loop``, computed under ``path`` (an ``if`` in the loop body,
    as the Triton tutorial's masked diagonal blocks)."""
    lane, ranges = setting.lane(source.shape)
    try:
        kept = _classify(source.at(lane), setting.launch)
    except Unsupported as why:
        return Proof(f"masking: the {what}", TOOL, UNKNOWN, detail=str(why))
    if len(kept.dots) != 1:
        return Proof(f"masking: the {what}", TOOL, UNKNOWN, detail=f"{len(kept.dots)} products reach it")
    i, j, facts = _score_indices(setting, kept.dots[0])
    geometry = setting.launch.geometry(setting.sizes, setting.config)
    allowed = z3.And(may_attend(i, j, geometry), *_pair_flags(setting, "mask", i, j, loop))
    goal = z3.And(z3.Or(kept.raw, kept.neg_inf), kept.raw == allowed, *_read_at(setting, kept.biases, i, j))
    masked_at = f" (masked at {', '.join(dict.fromkeys(kept.selects))})" if kept.selects else " (no mask)"
    exists = z3.And(0 <= i, i < geometry.len_q)  # a padded row past Sq has no softmax in the spec
    data = "".join(f" and {name}[b, h, i, j]" for name, role in setting.launch.tensors.items()
                   if role.pairs == "mask" and name in setting.accessed)
    proof = decide(f"masking: {what} are -inf unless may_attend(i, j){data}, on each row i < Sq{masked_at}",
                   ranges + facts + _iterating(loop) + path + [exists],
                   goal, setting, limits, _lane_shown(lane) + [("i", i), ("j", j), ("score kept", kept.raw)],
                   context=_masking_context(setting, i, j, loop))
    finite = [v for v in kept.fills if v != -math.inf]
    if proof.status == REFUTED and finite:  # the fill in the countermodel too: a replayed case scales scores to it
        proof = proof.but(detail=_finite_fill_detail(finite[0]), countermodel={**(proof.countermodel or {}),
                                                                               "fill": f"{finite[0]:g}"})
    return proof


def _pair_flags(setting, holds, i, j, loop):
    """The flags of pair ``(i, j)`` in each tensor over pairs holding ``holds`` that the kernel reads: its element at
    the program's batch and head is nonzero (where the pair exists; none past the ends)."""
    flags, coordinates = [], setting.coordinates(loop)
    for name, role in setting.launch.tensors.items():
        if role.pairs != holds or name not in setting.accessed:
            continue
        index = [coordinates[role.program[axis]] if axis in role.program else i if axis == role.seq else j
                 for axis in range(len(role.dims))]
        exists = z3.And([z3.And(0 <= x, x < n) for x, n in zip(index, setting.dims(role))])
        flags.append(z3.And(exists, memory(name)(
            setting.layout(role, index)) != 0))
    return flags


def _read_at(setting, reads, i, j):
    """Each bias element added to the score of pair ``(i, j)`` is pair ``(i, j)``'s (its tile's index map)."""
    facts = []
    for access, lane in reads:
        role = setting.launch.tensors[access.arg]
        index, _ = tile_index(setting, role, lane, access.loop)
        facts += [index[role.seq] == i, index[role.columns] == j]
    return facts


def _masking_context(setting, i, j, loop):
    """Where the host's tables are read for score ``(i, j)``: row ``i``'s interval, and the launch's entries."""
    b = setting.program["b"]
    return {"i": i, "j": j, "b": b,
            "at": {"ROW_LO": [(b, i)], "ROW_HI": [(b, i)], **_table_context(setting, loop)["at"]}}


def _finite_fill_detail(fill):
    """A finite fill ``f`` lets a masked key in with weight ``exp(f - m)``: nonzero in fp32 whenever the row's
    max ``m`` is above ``f - 103.28`` (2**-149 = e**-103.28), e.g. a row whose allowed scores are all ``<= f``."""
    return (f"the fill {fill:g} is finite: a masked key keeps weight exp({fill:g} - m) > 0 in fp32 whenever the "
            f"row max m < {fill + 103.28:.2f} (scores spread below {fill:g} + 103.28), and weight 1 in a row "
            "with no allowed key")


# Float arithmetic whose result is a function of the scores its operands hold (never -inf by itself); its other
# operands are constants or parameters (scale, softcap). negf, exp and absf come from the softcap's tanh.
SCORE_ARITHMETIC = ("arith.mulf", "arith.addf", "arith.subf", "arith.divf", "arith.negf", "math.exp", "math.exp2",
                    "math.absf")


@dataclass(frozen=True)
class Kept:
    """What a softmax-input element is: the raw score where ``raw``, ``-inf`` where ``neg_inf``; the products it
    holds, the constants a mask fills with, the lines of the selects on its way, and the bias elements added to it
    (``(load, lane)``)."""

    raw: object
    neg_inf: object
    dots: list = ()
    fills: list = ()
    selects: list = ()
    biases: list = ()

    @staticmethod
    def of(raw, neg_inf, parts, selects=()):
        """A :class:`Kept` holding what each of ``parts`` holds."""
        return Kept(raw, neg_inf, _unique([d for p in parts for d in p.dots]), [f for p in parts for f in p.fills],
                    [*selects, *(s for p in parts for s in p.selects)], [b for p in parts for b in p.biases])


_NEITHER = Kept(z3.BoolVal(False), z3.BoolVal(False))


def _classify(value, launch):
    """:class:`Kept` of a softmax-input element. The launch says which float parameters are positive (a masked
    ``-inf`` times one stays ``-inf``) and which tensors are score biases."""
    kind = value[0]
    if kind == "dot":
        product = Kept(z3.BoolVal(True), z3.BoolVal(False), [value])
        accumulator = value[3].at(value[4])  # Triton's combine pass folds ``acc + dot`` into the dot
        return product if accumulator == ("const", 0.0) else _sum([product, _addend(accumulator, launch)])
    if kind == "const":
        return Kept(z3.BoolVal(False), z3.BoolVal(value[1] == -math.inf), fills=[value[1]])
    if kind == "select":
        one, other = _classify(value[2], launch), _classify(value[3], launch)
        return Kept.of(z3.If(value[1], one.raw, other.raw), z3.If(value[1], one.neg_inf, other.neg_inf), [one, other],
                       [value[4]])
    if kind == "op" and value[1] in SCORE_ARITHMETIC:
        operands = [a for a in value[2:] if isinstance(a, tuple)]
        scored = [a for a in operands if _has_dot(a)]
        if value[1] == "arith.addf" and scored:
            return _sum([_classify(a, launch) if _has_dot(a) else _addend(a, launch) for a in operands])
        if len(scored) == 1 and (value[1] == "arith.mulf" or value[1] == "arith.divf" and scored[0] is operands[0]):
            factor = next(a for a in operands if a is not scored[0])
            if _positive(factor, launch):
                return _classify(scored[0], launch)  # -inf times a positive factor stays -inf
        parts = [_classify(a, launch) for a in scored]
        if parts:  # a function of the scores its operands hold (tanh's quotient has one in each)
            return Kept.of(z3.And(*(p.raw for p in parts)), z3.BoolVal(False), parts)
    if kind in ("opaque", "param", "load"):
        return _NEITHER
    raise Unsupported(f"score expression {kind} {value[1] if kind == 'op' else ''}", "the softmax input")


def _positive(factor, launch):
    """A positive constant, a parameter the launch says is positive, or a product of such (``scale * log2(e)``)."""
    if factor[0] == "op" and factor[1] == "arith.mulf":
        return all(isinstance(a, tuple) and _positive(a, launch) for a in factor[2:])
    return factor[0] == "const" and factor[1] > 0 or factor[0] == "param" and factor[1] in launch.positive


def _addend(value, launch):
    """:class:`Kept` of a term added to the scores that holds none: a constant, a select between such terms (an
    additive mask, ``where(allowed, 0, -inf)``), a parameter (finite), or an element of a score bias (part of the
    score, as the spec adds it before the mask); anything else is not classified."""
    kind = value[0]
    if kind == "const":  # adding 0 keeps the score; a finite other constant is a finite fill (-1e6)
        return Kept(z3.BoolVal(False), z3.BoolVal(value[1] == -math.inf), fills=[value[1]] if value[1] else [])
    if kind == "select":
        one, other = _addend(value[2], launch), _addend(value[3], launch)
        return Kept.of(z3.BoolVal(False), z3.If(value[1], one.neg_inf, other.neg_inf), [one, other], [value[4]])
    if kind == "param":
        return _NEITHER
    if kind == "load" and launch.tensors.get(value[1].arg, TensorRole(())).pairs == "bias":
        return Kept(z3.BoolVal(False), z3.BoolVal(False), biases=[(value[1], value[2])])
    raise Unsupported(f"a score plus a {kind} term (not a tensor the launch names a score bias)", "the softmax input")


def _sum(parts):
    """A sum of scores and addends: the raw score where every addend is finite, ``-inf`` where any term is (scores
    and addends are never ``+inf``)."""
    return Kept.of(z3.And(*[p.raw for p in parts if p.dots], *[z3.Not(p.neg_inf) for p in parts if not p.dots]),
                   z3.Or(*[p.neg_inf for p in parts]), parts)


def _has_dot(value):
    if not (isinstance(value, tuple) and value and isinstance(value[0], str)):
        return False
    return value[0] == "dot" or any(_has_dot(v) for v in value[1:] if isinstance(v, tuple))


def _unique(dots):
    out = []
    for d in dots:
        if not any(d[1] is e[1] and d[2] is e[2] for e in out):
            out.append(d)
    return out


def _score_indices(setting, dot):
    """Query row ``i`` and key ``j`` of a product's lane, from the tiled loads its operands read."""
    _, a, b, _, lane = dot
    k = setting.fresh("k")
    i = _tile_row(setting, a.at((lane[0], k)))
    j = _tile_row(setting, b.at((k, lane[1])))
    return i, j, [k >= 0]


def _tile_row(setting, element):
    """The logical row of the tiled load an operand element comes from (its address theorem's index)."""
    while element[0] in ("select", "op"):  # a masked load's loaded branch; a conversion's operand
        element = element[2]
    if element[0] != "load":
        raise Unsupported(f"product operand {element[0]}", "the softmax input")
    access, lane = element[1], element[2]
    role = setting.launch.tensors[access.arg]
    index, _ = tile_index(setting, role, lane, access.loop)
    return index[role.seq]


def merge(setting, limits):
    """The key loop carrying the launch's state (:class:`~attnformal.ttir.launch.Fold`) starts from its unit (a loop
    around it, from the unit and through it; a loop after another, from that one's results) and each iteration
    yields the spec's update of the state by the tile: op for op in the IR's IEEE arithmetic
    (:mod:`attnformal.ttir.folding`), ``merge(state, block_state(s, v))`` in the forward, ``state + score_grads(s,
    ...)`` in the backward; or, for a fold the launch states by what its state means (``Fold.means``: a base-2
    merge), the same ``out`` and ``lse`` as the spec's merge, in real arithmetic (:class:`folding.Reals`)."""
    fold = setting.launch.fold
    if fold is None:
        yield Proof("merge: the key loop's update is the spec's merge", TOOL, UNKNOWN,
                    detail="the launch description states no fold")
        return
    names = ", ".join(fold.carried)
    loops = [(loop, found[0]) for loop in setting.trace.loops if len(loop.carried) == len(fold.carried)
             for found in [_fold_scores(setting, loop, fold.scores)] if len(found) == 1]
    if not loops or len({id(loop.outer) for loop, _ in loops}) > 1:  # one loop, or loops one after another
        yield Proof(f"merge: a key loop carrying ({names})", TOOL, UNKNOWN,
                    detail=f"{len(loops)} loops carry {len(fold.carried)} values and hold one {fold.scores}, "
                           "not one after another")
        return
    after = None
    for loop, (scores, scores_at) in loops:
        order = yield from _merge_loop(setting, fold, loop, scores, scores_at, limits, after)
        after = (loop, order)


def _merge_loop(setting, fold, loop, scores, scores_at, limits, after):
    """The merge theorem's claims on one key loop (``after``: the key loop it follows, whose results it starts from,
    and where that one carries the fold's values); returns where this one carries them (None: unknown)."""
    names = ", ".join(fold.carried)
    chain = [loop, *(o for o in _outer_loops(loop) if len(o.carried) == len(fold.carried))]
    first = chain[-1]
    order, stores = _stored_order(setting, first, fold)
    if order is None:
        yield Proof(f"merge: the loop at {first.loc} carries ({names})", TOOL, UNKNOWN, detail=stores)
        return None
    tiles = LoopTiles(setting, loop, scores)
    decided = None  # the real-arithmetic step, where the search for the iter_args' places has decided it
    if fold.means is not None and not fold.stored:  # named by what they mean: iter_args in any order
        order, decided = next(((p, cases) for p in itertools.permutations(order)
                               for cases in [_real_meaning(setting, fold, loop, tiles, p)] if cases and cases[0]),
                              (order, None))
        names = f"{names}: iter_args {', '.join(map(str, order))}"
    carried = {id(each): [each.carried[p] for p in order] for each in chain}
    results = {id(each): [each.results[p] for p in order] for each in chain}
    placeholders = tuple(folding.TreeTile.rows(placeholder) for _, placeholder, _ in carried[id(loop)])
    try:
        want = fold.update(placeholders if fold.means is None else fold.means(*placeholders), tiles, setting.config)
    except Unsupported as why:
        yield Proof(f"merge: the loop at {loop.loc}", TOOL, UNKNOWN, detail=str(why))
        return None
    for holds, load in tiles.flags:
        yield _flags_are_pairs(setting, holds, load, limits)
    ieee = folding.IEEE(setting.trace, loop.carried[0][0].kind.width)
    probe = tuple(z3.IntVal(0) for _ in loop.carried[0][1].shape)
    loads = [a for a in setting.trace.accesses if a.op == "load" and a.loop is loop] + tiles.read
    search = (loop, [a for a in {id(a): a for a in loads}.values() if a.value.kind.name == "float"],  # each one's -inf is tried
              {placeholder.at(probe[:len(placeholder.shape)])[1]: unit
               for each in chain for (_, placeholder, _), unit in zip(carried[id(each)], fold.unit)})
    initial = [initial for initial, _, _ in carried[id(first)]]
    if after is None:
        yield _decide_lanes(f"merge: the loop at {first.loc} starts from the unit ({names}) = "
                            f"({', '.join(f'{u:g}' for u in fold.unit)})", initial, list(fold.unit), ieee, first.path,
                            setting, limits, search, where=f"the values entering the loop at {first.loc}")
    elif after[1] is None:
        yield Proof(f"merge: the loop at {first.loc} starts from the ({names}) the loop at {after[0].loc} ends with",
                    TOOL, UNKNOWN, detail=f"the merge of the loop at {after[0].loc} is unknown")
    else:
        previous = [after[0].results[p] for p in after[1]]
        yield _decide_lanes(f"merge: the loop at {first.loc} starts from the ({names}) the loop at {after[0].loc} ends "
                            "with", initial, [folding.TreeTile.rows(t) for t in previous], ieee, first.path, setting,
                            limits, search, where=f"the values entering the loop at {first.loc}")
    for inner, outer in zip(chain, chain[1:]):
        yield _decide_lanes(f"merge: the loop at {outer.loc} carries ({names}) through the loop at {inner.loc} (which "
                            "starts from them and whose results it yields)",
                            [initial for initial, _, _ in carried[id(inner)]] + [out for _, _, out in carried[id(outer)]],
                            [folding.TreeTile.rows(t) for _, t, _ in carried[id(outer)]]
                            + [folding.TreeTile.rows(t) for t in results[id(inner)]],
                            ieee, _iterating(outer), setting, limits, search, where=f"the loop at {outer.loc}")
    reads = ", ".join(dict.fromkeys(f"{a.arg} at {a.loc}" for a in tiles.read))
    if fold.means is not None:
        got = fold.means(*(folding.TreeTile.rows(yielded) for _, _, yielded in carried[id(loop)]))
        yield _decide_real(f"merge: ({names}) after an iteration of the loop at {loop.loc} means what {fold.says} "
                           f"means -- the same out = acc / l and lse = m + log l -- in real arithmetic (s: the scores "
                           f"{scores_at}; reads {reads})", _meaning(got), _meaning(want), setting, limits, search,
                           decided)
    else:
        for name, stored, (_, _, yielded), expected in zip(fold.carried, stores, carried[id(loop)], want):
            yield _decide_lanes(f"merge: {name}{stored} after an iteration of the loop at {loop.loc} is "
                                f"{fold.says}.{name}, op for op (s: the scores {scores_at}; reads {reads})",
                                [yielded], [expected], ieee, _iterating(loop), setting, limits, search)
    return order


def _real_meaning(setting, fold, loop, tiles, order):
    """:func:`_real_cases` of the values ``loop`` carries at positions ``order``, read as the fold's: what they
    mean after an iteration against what the spec's update of them means; None where values of other shapes sit
    in those places."""
    def tiles_of(which):
        return tuple(folding.TreeTile.rows(loop.carried[p][which]) for p in order)
    try:
        kernel = _meaning(fold.means(*tiles_of(2)))
        spec = _meaning(fold.update(fold.means(*tiles_of(1)), tiles, setting.config))
        return _real_cases(setting, loop, zip(kernel, spec))
    except (Unsupported, ValueError, TypeError):
        return None


def _real_cases(setting, loop, pairs):
    """``(equal, trees, lane ranges, lanes, branches)``: whether each pair of tiles is equal on a generic lane in real
    arithmetic (:class:`folding.Reals`), in every case of the ``if``s of ``loop``'s body (:func:`_branch_conditions`)."""
    trees, ranges, lanes = [], [], []
    for k, (a, b) in enumerate(pairs):
        lane, in_range = setting.lane(a.shape, f"{k}_")
        trees.append((a.at(lane), b.at(lane)))
        ranges, lanes = ranges + in_range, lanes + list(lane)
    branches = _branch_conditions(setting, loop)
    cases = [folding.Reals(setting.trace.comparisons, zip([c for c, _ in branches], values), _read_back(setting))
             for values in itertools.product((True, False), repeat=len(branches))]
    equal = all(reals.equal(reals.value(a), reals.value(b)) for reals in cases for a, b in trees)
    return equal, trees, ranges, lanes, branches


def _read_back(setting):
    """``load node -> stored tree or None``: a load of one of the launch's scratch tensors reads what the program's
    last store to that tensor before it wrote, where both are unmasked, in the same loop body under the same
    conditions, and their pointers are equal on the lane."""
    accesses = setting.trace.accesses

    def stored(node):
        load, lane = node[1], node[2]
        if load.arg not in setting.launch.scratch or load.mask is not None:
            return None
        before = accesses[:next(k for k, a in enumerate(accesses) if a is load)]
        stores = [a for a in before if a.op == "store" and a.arg == load.arg and a.loop is load.loop]
        if not stores or stores[-1].mask is not None or stores[-1].ptr.shape != load.ptr.shape or \
                [c.get_id() for c in stores[-1].path] != [c.get_id() for c in load.path]:
            return None
        same = z3.simplify(stores[-1].ptr.at(lane).offset == load.ptr.at(lane).offset)
        return stores[-1].value.at(lane) if z3.is_true(same) else None
    return stored


def _separated(model, setting, kernel, spec, valuation):
    """The float64 values of two trees at a valuation of their leaves, where they differ by more than
    REAL_SEPARATION relative; else None."""
    description, fill = valuation
    concrete = folding.Concrete(model, setting.trace.comparisons, fill, 64, read_back=_read_back(setting))
    got, want = float(concrete.value(kernel)), float(concrete.value(spec))
    if abs(got - want) > REAL_SEPARATION * (abs(got) + abs(want)):
        return {"valuation": f"{description}, in float64", "kernel": repr(got), "spec": repr(want)}
    return None


def _branch_conditions(setting, loop):
    """``[(condition, where it is met)]`` of the ``if``s in ``loop``'s body that a row max or an exponential sits under (the
    Triton tutorial's masked diagonal blocks): the real-arithmetic merge is decided in each case of them."""
    around = {c.get_id() for c in _iterating(loop)}
    found = {}
    for record in setting.trace.reductions + setting.trace.exponentials:  # (..., loc, loop, path)
        if record[-2] is loop:
            found.update({c.get_id(): (c, record[-3]) for c in record[-1] if c.get_id() not in around})
    return list(found.values())


def _meaning(state):
    """What a softmax state stands for, as tiles: ``out = acc / l`` and ``exp(lse) = exp(m) * l``."""
    return state.acc / state.l, folding.Trees.exp(state.m) * state.l


REAL_ASSUMED = ("real arithmetic: exp2(x) = exp(x ln 2), conversions exact, every value finite, l != 0",)
REAL_SEPARATION = 1e-6  # a relative difference that float64 evaluation of both sides cannot come from rounding


def _decide_real(claim, kernel, spec, setting, limits, search, decided=None):
    """Each pair of tiles equal on every lane in real arithmetic, for every value of what they load and carry:
    proved where their normal forms agree (:class:`folding.Reals`); refuted where float64 evaluations at one of two
    standard-normal valuations differ by more than REAL_SEPARATION relative (rounding cannot), else unknown.
    ``decided``: their :func:`_real_cases`, where already computed."""
    start = time.perf_counter()
    loop, loads, unit = search
    try:
        equal, trees, ranges, lanes, branches = decided or _real_cases(setting, loop, zip(kernel, spec))
    except Unsupported as why:
        return Proof(claim, TOOL, UNKNOWN, detail=str(why))
    if equal:
        cased = f", in each case of the ifs at {', '.join(dict.fromkeys(at for _, at in branches))}" if branches else ""
        scratch = tuple(f"{name}: a program's load reads what its last store there wrote (the launch's scratch)"
                        for name in sorted(setting.launch.scratch))
        return Proof(claim + cased, TOOL, PROVED, hypotheses=tuple(setting.assumed) + REAL_ASSUMED + scratch,
                     seconds=time.perf_counter() - start)
    query = setting.facts + ranges + _iterating(loop) + [x == 0 for x in lanes]
    model = _model(query + setting.table_facts(query, _table_context(setting, loop)), limits)
    for a, b in trees if model is not None else ():
        for seed in (0, 1):  # a carried max above the tile's makes some differences vanish at one valuation
            separated = _separated(model, setting, a, b, next(folding.fills(loads, unit, seed)))
            if separated:
                return Proof(claim, TOOL, REFUTED, countermodel=separated, seconds=time.perf_counter() - start)
    return Proof(claim, TOOL, UNKNOWN, seconds=time.perf_counter() - start,
                 detail="their real-arithmetic normal forms differ, and no float64 valuation tried separates them")


def _flags_are_pairs(setting, holds, load, limits):
    """The flag tile a fold weighs by (:meth:`LoopTiles.where_pairs`) holds, on each lane, whether the element of
    the lane's pair ``(b, h, i, j)`` is nonzero, and False past the ends."""
    role = setting.launch.tensors[load.arg]
    lane, ranges = setting.lane(load.ptr.shape)
    placed = tile_index(setting, role, lane, load.loop)
    claim = f"merge: the {holds} flags read at {load.loc} are {load.arg}[b, h, i, j] != 0 (False past the ends)"
    if placed is None:
        return Proof(claim, TOOL, UNKNOWN, detail="no logical index for its lanes")
    index, exists = placed
    element = memory(load.arg)(setting.layout(role, index))
    return decide(claim, ranges + load.path + (_iterating(load.loop) if load.loop else []),
                  (load.value.at(lane) != 0) == z3.And(exists, element != 0), setting, limits, _lane_shown(lane), context=_table_context(setting, load.loop))


def _all(conditions):
    return conditions[0] if len(conditions) == 1 else z3.And(conditions)


def _stored_order(setting, loop, fold):
    """``(positions, says)``: where each of ``fold.carried`` sits among ``loop``'s iter_args, and what the report
    says of it. Where the launch names the tensors they are stored to (``Fold.stored``), the value is the result
    of ``loop`` that tensor's store writes, converted at most (front ends order iter_args differently:
    triton-ascend's puts dK/dV's sums in the order the body assigns them); else they are in order.
    ``(None, why)`` where a store writes no one result of the loop."""
    if not fold.stored:
        return list(range(len(fold.carried))), [""] * len(fold.carried)
    positions, says = [], []
    for tensor in fold.stored:
        stores = [a for a in setting.trace.accesses if a.op == "store" and a.arg == tensor]
        written = [p for p, result in enumerate(loop.results) if len(stores) == 1 and _writes(stores[0].value, result)]
        if len(written) != 1:
            return None, (f"{len(stores)} stores of {tensor}, writing {len(written)} of the results of the loop at "
                          f"{loop.loc} (as they are or converted); the launch says one store writes one")
        positions.append(written[0])
        says.append(f" (stored to {tensor} at {stores[0].loc})")
    return positions, says


def _writes(value, result):
    """Whether every lane of a stored ``value`` is that lane of ``result`` (an opaque loop result), converted at
    most."""
    if value.shape != result.shape:
        return False
    lane = tuple(z3.Int(f"lane_{k}") for k in range(len(value.shape)))
    node, want = value.at(lane), result.at(lane)
    while node[0] == "op" and node[1] in ("arith.truncf", "arith.extf"):
        node = node[2]
    return (node[0] == "opaque" and node[1] == want[1]
            and all(z3.is_true(z3.simplify(a == b)) for a, b in zip(node[2], want[2])))


def _iterating(loop):
    return [loop.iteration(loop.iv), *loop.path]


def _fold_scores(setting, loop, where):
    """``[(scores, where they are read)]`` in ``loop``: the tiles reaching its row max (``"row max"``), or those its
    ``exp(s - shift)`` weighs (``"exp"``)."""
    if where == "row max":
        return [(source, f"reaching the row max at {loc}") for source, loc in _row_max(setting, loop)]
    return [(scores, f"weighed by the exp at {loc}") for scores, loc, at in
            ((_branch_scores(source), loc, at) for source, loc, at, _ in setting.trace.exponentials)
            if at is loop and scores is not None]


def _branch_scores(source):
    """:func:`_shifted_scores`, also of an exponential whose argument an ``if`` chose (``select(c, s1 - shift1,
    s2 - shift2)``: the tutorial's diagonal and off-diagonal blocks), as ``select(c, s1, s2)``."""
    def scores(node):
        if node[0] != "select":
            return _score_part(node)
        branches = [scores(branch) for branch in node[2:4]]
        return None if None in branches else ("select", node[1], *branches, node[4])
    return _shifted_scores(source, scores)


class LoopTiles:
    """What a fold reads in one loop, as tiles of value trees (:class:`folding.TreeTile`; a row vector as ``[n, 1]``):
    the scores ``s``, the scores before their mask (``capped``), a tensor's tile (``tiles["V"]``: its one load in the
    loop, else in the innermost loop around it, else outside every loop), a table's element
    (``tiles.element("SCALARS", 1)``) and a tile chosen by flags (``where_pairs``). ``read`` lists the loads taken;
    ``flags`` the flag loads the fold trusts to be the pairs' flags (the merge theorem proves them so)."""

    def __init__(self, setting, loop, scores):
        self.setting, self.loop, self.read, self.flags = setting, loop, [], []
        self.s = folding.TreeTile.rows(scores)

    def __getitem__(self, tensor):
        return folding.TreeTile.rows(self._load(tensor).value)

    def _load(self, tensor):
        loads = [a for a in self.setting.trace.accesses if a.op == "load" and a.arg == tensor]
        for scope in (self.loop, *_outer_loops(self.loop), None):
            here = [a for a in loads if a.loop is scope]
            if len(here) > 1:
                raise Unsupported(f"{len(here)} loads of {tensor} ({', '.join(a.loc for a in here)})", self.loop.loc)
            if here:
                self.read.append(here[0])
                return here[0]
        raise Unsupported(f"a fold reading {tensor}, which the kernel does not load", self.loop.loc)

    def element(self, tensor, offset):
        loads = [a for a in self.setting.trace.accesses if a.op == "load" and a.arg == tensor and not a.ptr.shape
                 and z3.simplify(a.ptr.at(()).offset).eq(z3.IntVal(offset))]
        if len(loads) != 1:
            raise Unsupported(f"{len(loads)} loads of {tensor}[{offset}]", self.loop.loc)
        self.read.append(loads[0])
        return folding.TreeTile((), lambda lane: loads[0].value.at(()))

    def where_pairs(self, holds, value, other):
        """A tile of ``value`` (a scalar tile) where the kernel's tile of each flag tensor over pairs holding
        ``holds`` (the dropout keep mask) is nonzero, else the constant ``other``. The flags are the kernel's own
        loads, so the trees compare node for node; :func:`_flags_are_pairs` proves each lane's is its pair's."""
        names = [name for name, role in self.setting.launch.tensors.items()
                 if role.pairs == holds and name in self.setting.accessed]
        loads = [self._load(name) for name in names]
        self.flags += [(holds, load) for load in loads]
        return folding.TreeTile(self.s.shape, lambda lane: (
            "select", _all([load.value.at(lane) != 0 for load in loads]), value.at(()), ("const", other),
            f"the {holds} flags"))

    @property
    def capped(self):
        """The scores before their mask and their bias: what a softcap's slope is a function of."""
        comparisons, launch = self.setting.trace.comparisons, self.setting.launch
        return folding.TreeTile(self.s.shape, lambda lane: _unbiased(folding.unmasked(self.s.at(lane), comparisons),
                                                                     launch))


def _unbiased(tree, launch):
    """``x`` of ``x + bias`` (a bias element, 0 where its load is masked off), else the tree."""
    if tree[0] == "op" and tree[1] == "arith.addf" and _is_bias(tree[3], launch):
        return tree[2]
    return tree


def _is_bias(tree, launch):
    if tree[0] == "select":
        return all(_is_bias(branch, launch) or branch == ("const", 0.0) for branch in tree[2:4])
    return tree[0] == "load" and launch.tensors.get(tree[1].arg, TensorRole(())).pairs == "bias"


def _row_max(setting, loop):
    return [(source, loc) for combiners, source, loc, at, _ in setting.trace.reductions
            if at is loop and combiners and all("max" in c for c in combiners) and len(source.shape) == 2]


def _decide_lanes(claim, tensors, expected, ieee, hypotheses, setting, limits, search, where="the loop"):
    """Every lane of each tensor equals the expected value (a constant, or a spec tile: ``[n, 1]`` for a row
    vector), as IEEE terms. Trees equal node for node are left to Z3 (it proves them at once); trees that
    differ are first evaluated at the valuations ``search = (loop, loads, unit)`` names
    (:class:`folding.Concrete`): different bits there are a countermodel, which bit-blasting float32 would
    take minutes to find."""
    goals, ranges, shown, trees, lanes = [], [], [], [], []
    try:
        for k, (tensor, want) in enumerate(zip(tensors, expected)):
            lane, in_range = setting.lane(tensor.shape, f"{k}_")
            spec = ("const", want) if isinstance(want, float) else \
                want.at(lane + (z3.IntVal(0),) * (len(want.shape) - len(lane)))
            trees.append((tensor.at(lane), spec))
            goals.append(ieee.value(trees[-1][0]) == ieee.value(spec))
            ranges += in_range
            lanes += lane
            shown += _lane_shown(lane, f"lane{k}")
        found = next(filter(None, (folding.first_difference(*pair, setting.trace.comparisons, where)
                                   for pair in trees)), None)
    except Unsupported as why:
        return Proof(claim, TOOL, UNKNOWN, detail=str(why))
    context = _table_context(setting, search[0])
    if found is None:
        return decide(claim, ranges + hypotheses, z3.And(goals), setting, limits, shown, context=context)
    loc, kernel, spec = found
    difference = f"first difference at {loc}: the kernel computes {folding.render(kernel)} where the spec " \
                 f"computes {folding.render(spec)}"
    start = time.perf_counter()
    witness = _witness(setting, ranges + hypotheses, z3.And(goals), trees, lanes, ieee, search, limits)
    if witness is not None:
        values, model = witness
        countermodel = {name: str(model.eval(term, model_completion=True)) for name, term in _shown(setting, shown)}
        return Proof(claim, TOOL, REFUTED, countermodel={**countermodel, **values}, detail=difference,
                     **_spent(setting, start, limits.budget()))
    proof = decide(claim, ranges + hypotheses, z3.And(goals), setting, limits, shown, context=context)
    return proof if proof.status == PROVED else proof.but(detail=f"{difference}; {proof.detail}")


WITNESS_LENGTHS = (8, 4096)  # the integer valuation a witness prefers: every length in this range, lane 0


def _witness(setting, hypotheses, goal, trees, lanes, ieee, search, limits):
    """``({valuation, kernel, spec}, integer model)`` where the trees evaluate to different bits, or None. The
    integers come first from a launch whose every length lies in WITNESS_LENGTHS at lane 0, every data mask and
    keep flag set (so the lane's row and the tile's first keys exist and count: a degenerate launch of masked rows
    hides most differences), else from the smallest launch."""
    loop, loads, unit = search
    query = setting.facts + list(hypotheses)
    query += setting.table_facts(query + [goal], _table_context(setting, loop))
    low, high = WITNESS_LENGTHS
    preferred = [low <= n for n in setting.sizes.values()] + [n <= high for n in setting.sizes.values()]
    anywhere = z3.Int("anywhere")
    preferred += [z3.ForAll([anywhere], memory(name)(anywhere) == 1) for name, role in setting.launch.tensors.items()
                  if role.pairs in ("mask", "keep") and name in setting.accessed]  # every pair allowed and kept
    for model in (_model(query + preferred + [x == 0 for x in lanes], limits),
                  _small_counterexample(query, setting, limits.budget())):
        if model is None:
            continue
        elements = {}
        for description, fill in folding.fills(loads, unit):
            concrete = folding.Concrete(model, setting.trace.comparisons, fill, ieee.sort.ebits() + ieee.sort.sbits(),
                                        elements)
            for kernel, spec in trees:
                got, want = concrete.value(kernel), concrete.value(spec)
                if not concrete.same(got, want):
                    return {"valuation": description, "kernel": repr(got), "spec": repr(want)}, model
    return None


def _model(query, limits):
    solver = z3.Solver()
    solver.add(*query)
    verdict, _ = limits.budget().check(solver, share=0.25)
    return solver.model() if verdict == z3.sat else None


def writes(setting, other, limits, addresses):
    """Two programs (``setting`` and ``other``, a second run), each output element: written by one lane of one."""
    stores = [(a, b) for a, b in zip(setting.trace.accesses, other.trace.accesses)
              if a.op == "store" and setting.launch.tensors.get(a.arg, TensorRole(())).output]
    for first, second in stores:
        role = setting.launch.tensors[first.arg]
        claim = f"writes: no two programs or lanes store the same {first.arg} element ({first.loc})"
        if role.strides is not None and id(first) in addresses:
            yield _distinct_elements(claim, setting, other, first, second, role, limits, addresses[id(first)])
        else:
            yield _no_two_stores(claim, setting, other, first, second, limits)
        yield _every_element_written(setting, first, role, limits)


def _pair(setting, other, first, second):
    """Lanes of the two programs' runs of a store, their ranges and paths, and what makes them one lane of one."""
    lane1, r1 = setting.lane(first.ptr.shape, "l1_")
    lane2, r2 = other.lane(second.ptr.shape, "l2_")
    same = z3.And(*[p == q for p, q in zip(setting.trace.program_ids, other.trace.program_ids)],
                  *[x == y for x, y in zip(lane1, lane2)])
    shown = _lane_shown(lane1, "lane1") + _lane_shown(lane2, "lane2") + \
        [(f"other program_id({a})", p) for a, p in zip("xyz", other.trace.program_ids)]
    return lane1, lane2, r1 + r2 + first.path + second.path + other.facts, same, shown


def _no_two_stores(claim, setting, other, first, second, limits):
    lane1, lane2, premise, same, shown = _pair(setting, other, first, second)
    collide = z3.And(_mask_at(first, lane1), _mask_at(second, lane2),
                     first.ptr.at(lane1).offset == second.ptr.at(lane2).offset)
    return decide(claim, premise, z3.Implies(collide, same), _Joint(setting, other), limits, shown)


def _distinct_elements(claim, setting, other, first, second, role, limits, address_proof):
    """A strided output (its strides are arguments: one nonlinear query over both programs is slow): two lanes
    store one element only if they are one lane of one program, from the store's address theorem (a lane stores
    ``layout(index)``), the layout's injectivity in each of the launch's cases, and the tile's index map."""
    lane1, lane2, premise, same, shown = _pair(setting, other, first, second)
    (index1, _), (index2, _) = tile_index(setting, role, lane1, first.loop), tile_index(other, role, lane2, second.loop)
    mapping = decide(f"writes: {first.arg}'s tile index at {first.loc} is one-to-one over programs and lanes",
                     premise + [_mask_at(first, lane1), _mask_at(second, lane2)]
                     + [a == b for a, b in zip(index1, index2)], same, _Joint(setting, other), limits, shown)
    by = (address_proof, mapping, _injective_layout(setting, first.arg, role, limits))
    status = next((p.status for p in by if p.status != PROVED), PROVED)
    return Proof(claim, TOOL, status, hypotheses=tuple(setting.assumed), by=by,
                 detail="" if status == PROVED else "not proved: the address theorem, the index map or the layout's "
                 "injectivity", seconds=sum(p.seconds for p in by), rlimit=sum(p.rlimit for p in by))


def _injective_layout(setting, name, role, limits):
    x = [setting.fresh(f"{name}_x") for _ in role.dims]
    y = [setting.fresh(f"{name}_y") for _ in role.dims]
    ranges = [z3.And(0 <= a, a < n, 0 <= b, b < n) for a, b, n in zip(x, y, setting.dims(role))]
    return _in_each_case(f"layout: {name}'s strides map distinct in-range indices to distinct offsets",
                         ranges + [setting.layout(role, x) == setting.layout(role, y)],
                         z3.And([a == b for a, b in zip(x, y)]), setting, limits, [])


def _in_each_case(claim, hypotheses, goal, setting, limits, show):
    """:func:`decide`, once in each of the launch's cases (``LaunchDescription.cases``) where it names some: proved
    iff proved in every one, else the first case's verdict that is not."""
    if setting.launch.cases is None:
        return decide(claim, hypotheses, goal, setting, limits, show)
    cases = [decide(f"{claim}, where {name}", [*hypotheses, fact], goal, setting, limits, show)
             for name, fact in setting.launch.cases(setting.sizes, setting.config)]
    failed = next((proof for proof in cases if proof.status != PROVED), None)
    if failed is not None:
        return failed
    return Proof(claim, TOOL, PROVED, hypotheses=cases[0].hypotheses, by=tuple(cases),
                 seconds=sum(p.seconds for p in cases), queries=len(cases), rlimit=sum(p.rlimit for p in cases))


def _every_element_written(setting, store, role, limits):
    """The program and lane the grid assigns to an element (block of its row, lane = row % BLOCK) store it."""
    target = [setting.fresh(f"elem{k}") for k in role.dims]
    in_range = [z3.And(0 <= x, x < n) for x, n in zip(target, setting.dims(role))]
    block, size = _tile_block(setting, role, setting.program)
    row = target[role.seq]
    lane = [row - block * size] + ([target[role.feature]] if role.feature is not None else [])
    witness = [setting.program[name] == target[axis] for axis, name in role.program.items()]
    witness += [block * size <= row, row < block * size + size]
    goal = z3.And(_mask_at(store, tuple(lane)), store.ptr.at(tuple(lane)).offset == setting.layout(role, target))
    return decide(f"writes: every {store.arg} element is stored ({store.loc})", in_range + witness + store.path,
                  goal, setting, limits, [(f"element[{k}]", x) for k, x in enumerate(target)])


class _Joint:
    """Two settings' facts at once, for the two-program query."""

    def __init__(self, first, second):
        self.facts, self.assumed, self.sizes, self.trace = first.facts, first.assumed, first.sizes, first.trace
        self.launch, self.config, self.second = first.launch, first.config, second

    def table_facts(self, terms, context=None):
        return self.second.table_facts(terms, context)


# ------------------------------------------------------------------------ driver

THEOREMS = ("no-wrap", "address", "bounds", "masking", "coverage", "writes", "merge")


def prove_launch(launch: LaunchDescription, fn=None, limits=Limits(), theorems=THEOREMS, configs=None,
                 target="cuda"):
    """Every theorem on every configuration: ``[(config, [Proof])]``. ``fn`` overrides the kernel (a planted copy);
    ``target``: whose front end lowers it (:data:`~attnformal.ttir.lower.TARGETS`)."""
    fn = fn if fn is not None else load_attr(launch.kernel)
    results = []
    for config in configs or launch.configs:
        try:
            function = lower(fn, config, launch.pointer_types, target)
            trace, second = interpret(function), interpret(function, prefix="p2_")
        except Unsupported as why:
            results.append((config, [Proof("interpret the TTIR", TOOL, UNKNOWN, detail=str(why))]))
            continue
        setting, other = Setting(launch, config, trace), Setting(launch, config, second, prefix="p2_")
        proofs, addresses = [], {}
        runners = {"no-wrap": lambda: no_wrap(setting, limits),
                   "address": lambda: address(setting, limits, addresses),
                   "bounds": lambda: bounds(setting, limits, addresses),
                   "masking": lambda: masking(setting, limits),
                   "coverage": lambda: itertools.chain(coverage(setting, limits), heads(setting, limits)),
                   "writes": lambda: writes(setting, other, limits, addresses),
                   "merge": lambda: merge(setting, limits)}
        for name in THEOREMS:  # address before bounds and writes, which rest on it
            if name in theorems or (name == "address" and {"bounds", "writes"} & set(theorems)):
                proofs += list(runners[name]())
        results.append((config, proofs))
    return results


def load_attr(target: str):
    """``module:attr`` or ``path/to/file.py:attr``. A file whose module does not import here (the Triton tutorial
    asks for a GPU driver at import) gives its ``@triton.jit`` functions alone (:func:`jit_functions`)."""
    where, _, attr = target.rpartition(":")
    if not where.endswith(".py"):
        return getattr(importlib.import_module(where), attr)
    spec = importlib.util.spec_from_file_location(f"_ttir_kernel_{abs(hash(where))}", where)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 -- any failure of the module's own code: its kernels may still lower
        kernels = jit_functions(where)
        if attr not in kernels:
            raise AttributeError(f"{where} does not import here, and has no @triton.jit function {attr!r}") from None
        return kernels[attr]
    return getattr(module, attr)


def jit_functions(path: str) -> dict:
    """The ``@triton.jit`` functions of a file, compiled without the rest of its module (no host code runs): each
    with its ``jit`` decorator only (an autotune's configs are the launch description's business), seeing ``triton``,
    ``tl`` and each other. Their code keeps the file's name and lines, so Triton reads their source there."""
    import ast

    import triton
    import triton.language as tl

    with open(path) as file:
        tree = ast.parse(file.read(), path)
    kernels = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).endswith("jit") for d in node.decorator_list):
            node.decorator_list = [d for d in node.decorator_list if ast.unparse(d).endswith("jit")]
            kernels.append(node)
    namespace = {"triton": triton, "tl": tl, "__name__": f"_ttir_kernels_{abs(hash(path))}"}
    exec(compile(ast.Module(kernels, type_ignores=[]), path, "exec"), namespace)  # noqa: S102 -- the kernels only
    return {node.name: namespace[node.name] for node in kernels}
