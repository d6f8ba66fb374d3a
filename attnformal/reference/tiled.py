"""The certified float64 reference, tile by tile: forward and backward in memory linear in the length.

The spec's own functions run on :class:`~attnformal.reference.balls.Balls` (rigorous float64
balls), exactly as the kernels run them on tensors, and the work is a grid of tasks
``(batch group, query chunk, key part)``:

* **forward task**: each query block of the chunk folds the key tiles of the part,
  ``state = merge(state, block_state(tile_scores(tile)))`` -> one partial state per row (the
  first part's fold starts from the sink state, ``merge.initial_state``, with sinks);
* the driver combines the parts' states in part order (``split_kv.combine``, i.e. the spec's
  ``merge``; the monoid laws of obligation 2 make any split valid) and finalises
  (``merge.finalize``) -> out, lse; then ``delta = rowsum(dO * out)``;
* **backward task**: ``tile.tile_grads_and_dbias`` on each tile (P recomputed from the certified
  lse, FlashAttention-2 style) -> the chunk's dQ rows and the part's dK, dV rows per query head
  (and the tiles' d bias);
* the driver adds dQ over parts and dK, dV over chunks, and sums each GQA group; ``d sinks`` is
  ``tile.sink_grads`` of the certified lse and delta, summed over batches and rows; ``d bias`` is
  summed down to the bias's shape.

Tiles are visited as :class:`~attnformal.schedule.TileSchedule` says (``kv_range``: SKIP tiles
never; ``tile_class``: FULL tiles unmasked) -- the proven schedule. Nothing of size ``Sq x Sk``
exists: the peak is the inputs and results (``O((Sq + Sk)(D + Dv))``) plus a few tiles -- except
``d bias``, accumulated at ``[B, Hq, Sq, Sk]`` before it is summed to the bias's own shape.

Tasks run on an executor (:mod:`attnformal.distributed`): in this process, or on a cluster.
The result is **bitwise identical** wherever they run: the task grid depends on the problem
and the :class:`Tiling` only (never on the number of workers), every reduction happens in the driver in a fixed
order, and each task runs on one torch thread, so each float operation sees the same operands
in the same order (on workers of the same CPU type and torch build; elsewhere the results are
still rigorous enclosures of the same exact values, so they overlap).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnformal import ops
from attnformal.kernels.split_kv import combine
from attnformal.masks import may_attend
from attnformal.merge import SoftmaxState, block_state, finalize, initial_state, merge
from attnformal.reference import fp64_balls as fb
from attnformal.reference.balls import Balls, cat, exact_state
from attnformal.schedule import FULL, TileSchedule
from attnformal.spec import AttentionSpec
from attnformal.tile import sink_grads, tile_grads_and_dbias, tile_scores

TASK_THREADS = 1  # torch threads inside a task: parallelism comes from tasks, results from one path


@dataclass(frozen=True)
class Tiling:
    """Tiles and tasks: the schedule's tiles, query rows and keys per task (multiples of the tiles).

    The defaults use large tiles (Python's cost per tile is fixed) and tasks of a few seconds.
    The result depends on the tiling (rounding follows the merge order), never on the executor.
    """

    schedule: TileSchedule = TileSchedule(block_m=256, block_n=512)
    chunk_rows: int = 2048
    part_keys: int = 4096

    def __post_init__(self):
        if self.chunk_rows % self.schedule.block_m or self.part_keys % self.schedule.block_n:
            raise ValueError(f"Tiling: chunk_rows ({self.chunk_rows}) and part_keys ({self.part_keys}) must be "
                             f"multiples of block_m ({self.schedule.block_m}) and block_n ({self.schedule.block_n})")


@dataclass(frozen=True)
class Problem:
    """What every task reads: the spec and the exact inputs (float64, CPU), shared once per worker."""

    spec: AttentionSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor | None
    kappa: fb.Ball | None  # 1 / (1 - p) with dropout
    tiling: Tiling = Tiling()

    @property
    def schedule(self) -> TileSchedule:
        return self.tiling.schedule

    def tasks(self) -> list[Task]:
        """The task grid, in the order every reduction follows: group, then chunk, then part."""
        spec, rows, keys = self.spec, self.tiling.chunk_rows, self.tiling.part_keys
        return [Task(batches, (r0, min(r0 + rows, spec.len_q)), (k0, min(k0 + keys, spec.len_k)))
                for batches in spec.batch_groups()
                for r0 in range(0, spec.len_q, rows)
                for k0 in range(0, max(spec.len_k, 1), keys)]

    @property
    def parts(self) -> int:
        return max(1, math.ceil(self.spec.len_k / self.tiling.part_keys))


@dataclass(frozen=True)
class Task:
    batches: tuple[int, ...]  # batch elements sharing one mask geometry
    rows: tuple[int, int]  # query rows [r0, r1)
    keys: tuple[int, int]  # keys [k0, k1)


@contextmanager
def _torch_threads(n: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class _Tiles:
    """The tiles of one task: inputs as exact balls or tensors, masks and dropout weights per tile."""

    def __init__(self, problem: Problem, task: Task):
        self.p, self.task = problem, task
        self.spec, self.schedule = problem.spec, problem.schedule
        self.b = list(task.batches)
        self.g = self.spec.geometry(task.batches[0])
        self.heads = self.spec.kv_heads()  # GQA: K and V repeated per query head
        # each input of the task's batches (K and V per query head) with its magnitude, made once per task:
        # a tile is then a view of rows, not a copy per tile product
        queries = {"q": problem.q, "grad_out": problem.grad_out}
        keys = {"k": problem.k, "v": problem.v}
        self.inputs = {name: self._with_magnitude(x[self.b]) for name, x in queries.items() if x is not None}
        self.inputs.update({name: self._with_magnitude(x[self.b][:, self.heads]) for name, x in keys.items()})

    @staticmethod
    def _with_magnitude(x):
        return x, fb.mag(x)

    def query_blocks(self):
        r0, r1 = self.task.rows
        bm = self.schedule.block_m
        return range(r0 // bm, math.ceil(r1 / bm))

    def key_blocks(self, bm):
        """The schedule's visited key blocks of ``bm`` that lie in this task's part."""
        k0, k1 = self.task.keys
        bn = self.schedule.block_n
        visited = self.schedule.kv_range(bm, self.g)
        return range(max(visited.start, k0 // bn), min(visited.stop, math.ceil(k1 / bn)))

    def rows(self, bm):
        return _span(bm, self.schedule.block_m, self.spec.len_q)

    def cols(self, bn):
        return _span(bn, self.schedule.block_n, self.spec.len_k)

    def q(self, bm):
        return self._exact("q", self.rows(bm))

    def grad_out(self, bm):
        return self._exact("grad_out", self.rows(bm))

    def kv(self, name, bn):
        return self._exact(name, self.cols(bn))

    def _exact(self, name, span):
        """Rows ``span`` of input ``name`` as exact balls, with their magnitude."""
        x, magnitude = self.inputs[name]
        return Balls(x[:, :, span], magnitude=magnitude[:, :, span])

    def allowed(self, bm, bn):
        """The tile's mask, or None for a FULL tile (the schedule's proven classification)."""
        if self.schedule.tile_class(bm, bn, self.g) == FULL:
            return None
        rows, cols = self.rows(bm), self.cols(bn)
        allowed = may_attend(torch.arange(rows.start, rows.stop)[:, None], torch.arange(cols.start, cols.stop), self.g)
        if self.spec.attn_mask is not None:
            allowed = allowed & self.spec.attn_mask[:, :, rows, cols][self.b]
        return allowed

    def weights(self, bm, bn):
        """Dropout weights: 1/(1-p) (a ball) where kept, exactly 0 where dropped."""
        if self.p.kappa is None:
            return None
        keep = self.spec.dropout_mask[:, :, self.rows(bm), self.cols(bn)][self.b]
        return ops.where(keep, Balls.of(self.p.kappa), 0.0)

    def bias(self, bm, bn):
        """The tile's score bias (ALiBi, ``bias``) as balls, or None."""
        from attnformal.reference.certified import score_bias

        bias = score_bias(fb, self.spec, self.rows(bm), self.cols(bn), self.b)
        return None if bias is None else Balls.of(bias)

    def sinks(self, bm):
        """Each row's sink logit as exact balls ``[Bg, Hq, rows, 1]``, or None."""
        if self.spec.sinks is None:
            return None
        rows = self.rows(bm)
        sinks = self.spec.sinks.detach().cpu().double()[None, :, None, None]
        return Balls(sinks.expand(len(self.b), -1, rows.stop - rows.start, 1).contiguous())

    def scores(self, bm, bn):
        s, _ = tile_scores(self.q(bm), self.kv("k", bn), self.spec.scale, self.spec.softcap,
                           self.allowed(bm, bn), self.bias(bm, bn))
        return s


def _span(block, size, length):
    return slice(block * size, min((block + 1) * size, length))


def forward_task(problem: Problem, task: Task) -> SoftmaxState:
    """The partial state, over the task's keys, of each of its query rows: ``[Bg, Hq, rows, 1 | Dv]``."""
    with _torch_threads(TASK_THREADS):
        t = _Tiles(problem, task)
        states = []
        for bm in t.query_blocks():
            rows = t.rows(bm)
            state = exact_state((len(t.b), t.spec.heads_q, rows.stop - rows.start), t.spec.head_dim_v)
            if task.keys[0] == 0:  # the sink is merged once per row: into the first part's fold
                state = initial_state(state, t.sinks(bm))
            for bn in t.key_blocks(bm):
                state = merge(state, block_state(t.scores(bm, bn), t.kv("v", bn), t.weights(bm, bn)))
            states.append(state)
        return SoftmaxState(*(cat(list(parts), 2) for parts in zip(*states)))


def backward_task(problem: Problem, item) -> tuple[Balls, Balls, Balls, Balls | None]:
    """``(dq, dk, dv, dbias)`` of the task's tiles: dQ of its rows, dK and dV of its keys, per query
    head, and d bias ``[Bg, Hq, rows, keys]`` of the task's tiles (None without a bias).

    ``item`` is ``(task, lse, delta)`` with the certified lse and ``delta = rowsum(dO * out)``
    of the task's rows, ``[Bg, Hq, rows, 1]``.
    """
    task, lse, delta = item
    with _torch_threads(TASK_THREADS):
        t = _Tiles(problem, task)
        spec, r0, k0 = t.spec, task.rows[0], task.keys[0]
        dq = _zeros(len(t.b), spec.heads_q, task.rows[1] - r0, spec.head_dim)
        dk = _zeros(len(t.b), spec.heads_q, task.keys[1] - k0, spec.head_dim)
        dv = _zeros(len(t.b), spec.heads_q, task.keys[1] - k0, spec.head_dim_v)
        dbias = None if spec.bias is None else _zeros(len(t.b), spec.heads_q, task.rows[1] - r0, task.keys[1] - k0)
        add_at = _Accumulation()
        for bm in t.query_blocks():
            rows = t.rows(bm)
            at = slice(rows.start - r0, rows.stop - r0)
            for bn in t.key_blocks(bm):
                cols = t.cols(bn)
                dq_t, dk_t, dv_t, dbias_t = tile_grads_and_dbias(
                    t.q(bm), t.kv("k", bn), t.kv("v", bn), t.grad_out(bm), lse[:, :, at], delta[:, :, at],
                    scale=spec.scale, softcap=spec.softcap, allowed=t.allowed(bm, bn), weights=t.weights(bm, bn),
                    bias=t.bias(bm, bn))
                keys = slice(cols.start - k0, cols.stop - k0)
                add_at(dq, at, dq_t)
                add_at(dk, keys, dk_t)
                add_at(dv, keys, dv_t)
                if dbias is not None:  # each tile is visited once: a placement, not a sum
                    dbias.mid[:, :, at, keys], dbias.rad[:, :, at, keys] = dbias_t.mid, dbias_t.rad
        return dq, dk, dv, dbias


def _zeros(*shape) -> Balls:
    """Exact zeros to accumulate into (``0 + b = b`` keeps the first term as it is)."""
    return Balls(torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))


class _Accumulation:
    """``total[:, :, rows] += part`` in ball arithmetic, into exact zeros (:func:`_zeros`).

    The first part of a span is placed as it is (``0 + b = b``, the rule ``Balls`` applies to exact
    zeros, without searching the span for them); later ones are added to balls known to be ``rounded``
    when every part so far was.
    """

    def __init__(self):
        self.rounded = {}  # (id of the total, rows) -> whether the span holds rounded balls only

    def __call__(self, total: Balls, rows: slice, part: Balls) -> None:
        index = (slice(None), slice(None), rows)
        key = (id(total), rows.start, rows.stop)
        if key in self.rounded and self.rounded[key] and part.rounded:  # no exact value to keep: add in place
            fb.add_into(fb.Ball(total.mid[index], total.rad[index]), part.ball)
            return
        if key in self.rounded:
            part = Balls(total.mid[index], total.rad[index], self.rounded[key]) + part
        total.mid[index], total.rad[index] = part.mid, part.rad
        self.rounded[key] = part.rounded


# ---------------------------------------------------------------- the driver


def tiled_balls(problem: Problem, executor, progress=None) -> dict[str, Balls]:
    """out, lse (and dq, dk, dv per query head) as balls, computed by ``executor``'s tasks."""
    spec = problem.spec
    tasks = problem.tasks()
    total = len(tasks) * (2 if problem.grad_out is not None else 1)
    done = _Progress(progress, total)
    out = _zeros(spec.batch, spec.heads_q, spec.len_q, spec.head_dim_v)
    lse = _zeros(spec.batch, spec.heads_q, spec.len_q, 1)
    rows_of = {}  # (batches, rows) -> (lse, delta) of those rows, for the backward tasks
    # d sinks sums over the query rows: exactly 0 where there are none (an empty packed sequence)
    dsinks = _zeros(spec.heads_q) if spec.sinks is not None and problem.grad_out is not None else None
    forward = done.wrap(executor.map(forward_task, problem, tasks))
    for chunk in _batched(zip(tasks, forward), problem.parts):
        task = chunk[0][0]
        o, row_lse = finalize(combine([state for _, state in chunk]))
        _put(out, task, o)
        _put(lse, task, row_lse)
        if problem.grad_out is not None:
            delta = ops.rowsum(Balls(problem.grad_out[:, :, slice(*task.rows)][list(task.batches)]) * o)
            rows_of[task.batches, task.rows] = (row_lse, delta)
            if spec.sinks is not None:
                dsinks = dsinks + _sink_grad(spec, row_lse, delta)
    balls = {"out": out, "lse": lse}
    if problem.grad_out is None:
        return balls
    dq = _zeros(spec.batch, spec.heads_q, spec.len_q, spec.head_dim)
    dk = _zeros(spec.batch, spec.heads_q, spec.len_k, spec.head_dim)
    dv = _zeros(spec.batch, spec.heads_q, spec.len_k, spec.head_dim_v)
    dbias = None if spec.bias is None else _zeros(spec.batch, spec.heads_q, spec.len_q, spec.len_k)
    items = [(task, *rows_of[task.batches, task.rows]) for task in tasks]
    for task, (dq_t, dk_t, dv_t, dbias_t) in zip(tasks, done.wrap(executor.map(backward_task, problem, items))):
        _accumulate(dq, task, task.rows, dq_t)
        _accumulate(dk, task, task.keys, dk_t)
        _accumulate(dv, task, task.keys, dv_t)
        if dbias is not None:
            index = (list(task.batches), slice(None), slice(*task.rows), slice(*task.keys))
            dbias.mid[index], dbias.rad[index] = dbias_t.mid, dbias_t.rad
    grads = {"dq": dq, "dk": dk, "dv": dv}
    if dsinks is not None:
        grads["dsinks"] = dsinks
    if dbias is not None:
        from attnformal.reference.certified import sum_to_shape

        grads["dbias"] = Balls.of(sum_to_shape(fb, dbias.ball, tuple(spec.bias.shape)))
    return {**balls, **grads}


def _sink_grad(spec: AttentionSpec, lse: Balls, delta: Balls) -> Balls:
    """``d sinks`` ``[Hq]`` contributed by some rows: ``tile.sink_grads`` summed over batches and rows."""
    sinks = Balls(spec.sinks.detach().cpu().double()[None, :, None, None].expand(*lse.shape).contiguous())
    per_row = sink_grads(sinks, lse, delta).ball
    return Balls.of(fb.reshape(fb.sum_dim(fb.sum_dim(per_row, 0), 2), (spec.heads_q,)))


def _put(total: Balls, task: Task, part: Balls) -> None:
    index = (list(task.batches), slice(None), slice(*task.rows))
    total.mid[index], total.rad[index] = part.mid, part.rad


def _accumulate(total: Balls, task: Task, span: tuple[int, int], part: Balls) -> None:
    index = (list(task.batches), slice(None), slice(*span))
    summed = Balls(total.mid[index], total.rad[index]) + part
    total.mid[index], total.rad[index] = summed.mid, summed.rad


def _batched(pairs, n: int):
    chunk = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) == n:
            yield chunk
            chunk = []


class _Progress:
    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def wrap(self, results):
        for result in results:
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, self.total)
            yield result

