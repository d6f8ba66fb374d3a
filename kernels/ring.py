"""Ring attention (context parallel) on CPU processes: key slices on ranks, states merged around a ring.

W ranks -- processes in a ``torch.distributed`` gloo group, started once and reused -- each hold
one contiguous slice of the keys and values, and the queries.

Forward. Each rank folds its key slice tile by tile, ``state = merge(state, block_state(tile))``
(the spec's functions, in :func:`attnformal.kernels.split_kv.fold_row`: one part, no sink), into
a partial state for every query row. The W partial states are combined over ``torch.distributed``
by a ring reduce-scatter whose operator is the spec's ``merge``: the query rows are cut into W
chunks; at step ``t`` rank ``r`` sends its running state of chunk ``(r - t) mod W`` to rank
``r + 1`` and merges the one it receives from rank ``r - 1`` into its own. After ``W - 1`` steps
rank ``r`` holds chunk ``(r + 1) mod W`` over all keys and finalises it (``merge.finalize``).
Each chunk is folded starting from a different rank, so the chunks see the key slices in
different orders and groupings: that every order gives the same state is the monoid theorem --
``merge`` is associative and commutative with the empty state as identity, obligation 2 of
``python -m attnformal.prove`` (and obligation 1 that a merge of disjoint key sets is the state
of their union).

Backward (FlashAttention-2). Every rank gets dO, out and lse, computes ``delta = rowsum(dO * out)``
and ``tile.tile_grads`` over its key slice for all rows: its dK and dV are complete; the dQ
partials are summed over the ranks with ``all_reduce``.

``attention`` is the implementation protocol (alias ``ring``: 3 ranks, uneven slices);
:func:`make_attention` builds one for another world size, or with another ``combine`` -- the
cross-rank merge, replaceable so that tests can plant a bug in it. CPU tensors only; compute in
float32 (float64 for float64 inputs). The ranks start on the first call (a few seconds).
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import tempfile
import types
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from attnformal import ops
from attnformal.kernels import protocol_entry
from attnformal.kernels.split_kv import fold_row
from attnformal.kernels.torch_tiled import compute_dtype
from attnformal.masks import may_attend
from attnformal.merge import SoftmaxState, block_state, empty_state, finalize, merge
from attnformal.spec import AttentionSpec
from attnformal.tile import tile_grads, tile_scores

# The protocol features this kernel computes; any other active one is refused.
SUPPORTS = frozenset({"causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask", "softcap",
                      "dropout_p", "dropout_mask"})
WORLD_SIZE = 3
BLOCK = 128  # rows and keys per tile inside a rank
RESULT_TIMEOUT_S = 600


def make_attention(world_size: int = WORLD_SIZE, combine=merge):
    """The protocol over ``world_size`` ranks; ``combine(received, own)`` merges states across ranks."""

    @protocol_entry(SUPPORTS)
    def ring_attention(q, k, v, spec: AttentionSpec, schedule):
        """Ring attention over a gloo process group: key slices per rank, states merged around the ring."""
        if q.device.type != "cpu":
            raise NotImplementedError("the ring runs on CPU processes (gloo); move the inputs to the CPU")
        return _RingAttention.apply(q, k, v, spec, world_size, combine)

    return ring_attention


def _bounds(n: int, world: int, index: int) -> tuple[int, int]:
    """The ``index``-th of ``world`` contiguous, nearly equal slices of ``range(n)``."""
    return index * n // world, (index + 1) * n // world


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec, world, combine):
        q, k, v = (t.detach() for t in (q, k, v))  # what crosses to the ranks is data, not graph
        results = _pool(world).run(_forward_rank, [(spec, q, *_key_slice(spec, k, v, world, r), combine)
                                                   for r in range(world)])
        chunks = sorted(results)  # (chunk index, out rows, lse rows)
        out = torch.cat([o for _, o, _ in chunks], 2).to(q.dtype)
        lse = torch.cat([s for _, _, s in chunks], 2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.world = spec, world
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = (t.detach() for t in ctx.saved_tensors)
        spec, world = ctx.spec, ctx.world
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        grad_out, grad_lse = (None if t is None else t.detach() for t in (grad_out, grad_lse))
        jobs = [(spec, q, *_key_slice(spec, k, v, world, r), grad_out, out, lse, grad_lse) for r in range(world)]
        results = _pool(world).run(_backward_rank, jobs)
        dq = torch.cat([r[0] for r in results], 2)
        dk = torch.cat([r[1] for r in results], 2)
        dv = torch.cat([r[2] for r in results], 2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def _key_slice(spec, k, v, world, rank):
    k0, k1 = _bounds(spec.len_k, world, rank)
    return k[:, :, k0:k1].contiguous(), v[:, :, k0:k1].contiguous(), (k0, k1)


# ---------------------------------------------------------------- what one rank computes


class _Slice:
    """One rank's tiles: all query rows against its keys ``[k0, k1)``, in blocks of BLOCK."""

    def __init__(self, spec: AttentionSpec, q, k, v, keys):
        self.spec, self.keys = spec, keys
        self.dtype = compute_dtype(q.dtype)
        self.heads = spec.kv_heads()
        self.q = q.to(self.dtype)
        self.k, self.v = (t.to(self.dtype)[:, self.heads] for t in (k, v))  # GQA: one copy per query head

    def row_blocks(self):
        return [slice(r, min(r + BLOCK, self.spec.len_q)) for r in range(0, self.spec.len_q, BLOCK)]

    def key_blocks(self):
        k0, k1 = self.keys
        return [slice(c, min(c + BLOCK, k1)) for c in range(k0, k1, BLOCK)]

    def local(self, t, cols):
        return t[:, :, cols.start - self.keys[0]:cols.stop - self.keys[0]]

    def allowed(self, rows, cols):
        """The spec's mask on global indices: the index rule per batch, and the explicit mask."""
        i = torch.arange(rows.start, rows.stop)[:, None]
        j = torch.arange(cols.start, cols.stop)[None, :]
        allowed = torch.stack([torch.as_tensor(may_attend(i, j, self.spec.geometry(b))).expand(len(i), len(j[0]))
                               for b in range(self.spec.batch)])[:, None]
        if self.spec.attn_mask is not None:
            allowed = allowed & self.spec.attn_mask[:, :, rows, cols]
        return allowed

    def weights(self, rows, cols):
        if self.spec.dropout_mask is None:
            return None
        return self.spec.dropout_mask[:, :, rows, cols].to(self.dtype) / (1.0 - self.spec.dropout_p)

    def state(self, rows) -> SoftmaxState:
        spec = self.spec
        empty = empty_state((spec.batch, spec.heads_q, rows.stop - rows.start), spec.head_dim_v, dtype=self.dtype)
        return fold_row([self.key_blocks()], empty, lambda cols: self.tile_state(rows, cols))  # one part, no sink

    def tile_state(self, rows, cols) -> SoftmaxState:
        s, _ = tile_scores(self.q[:, :, rows], self.local(self.k, cols), self.spec.scale, self.spec.softcap,
                           self.allowed(rows, cols))
        return block_state(s, self.local(self.v, cols), self.weights(rows, cols))


def _pack(state: SoftmaxState) -> torch.Tensor:
    return torch.cat(state, -1)  # one message: [..., m | l | acc]


def _unpack(t: torch.Tensor) -> SoftmaxState:
    return SoftmaxState(t[..., :1], t[..., 1:2], t[..., 2:])


def _forward_rank(rank, world, spec, q, k, v, keys, combine):
    """This rank's partial states, reduce-scattered around the ring with ``combine``; its chunk finalised."""
    part = _Slice(spec, q, k, v, keys)
    rows = part.row_blocks()
    full = _pack(SoftmaxState(*(torch.cat(t, 2) for t in zip(*(part.state(r) for r in rows))))) if rows else \
        torch.zeros(spec.batch, spec.heads_q, 0, 2 + spec.head_dim_v, dtype=part.dtype)
    chunks = [full[:, :, slice(*_bounds(spec.len_q, world, c))] for c in range(world)]
    for step in range(world - 1):
        send, receive = (rank - step) % world, (rank - step - 1) % world
        received = _exchange(chunks[send], torch.empty_like(chunks[receive]), rank, world)
        chunks[receive] = _pack(combine(_unpack(received), _unpack(chunks[receive])))
    mine = (rank + 1) % world
    out, lse = finalize(_unpack(chunks[mine]))
    return mine, out, lse[..., 0]


def _exchange(send: torch.Tensor, receive: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Send to the next rank while receiving from the previous one (an empty chunk is skipped by both)."""
    requests = []
    send = send.contiguous()  # kept alive here until the send completes
    if send.numel():
        requests.append(dist.isend(send, (rank + 1) % world))
    if receive.numel():
        requests.append(dist.irecv(receive, (rank - 1) % world))
    for request in requests:
        request.wait()
    return receive


def _backward_rank(rank, world, spec, q, k, v, keys, grad_out, out, lse, grad_lse):
    """dQ rows of this rank's chunk (summed over ranks), dK and dV of its key slice."""
    part = _Slice(spec, q, k, v, keys)
    dtype = part.dtype
    grad_out = grad_out.to(dtype)
    rows_in = {"grad_out": grad_out, "lse": lse.to(dtype)[..., None],
               "delta": ops.rowsum(grad_out * out.to(dtype)),  # D = rowsum(dO * O)
               "grad_lse": None if grad_lse is None else grad_lse.to(dtype)[..., None]}
    dq = torch.zeros(q.shape, dtype=dtype)
    dk = torch.zeros(*part.k.shape[:3], spec.head_dim, dtype=dtype)
    dv = torch.zeros(*part.v.shape, dtype=dtype)
    for rows in part.row_blocks():
        at_rows = {name: None if t is None else t[:, :, rows] for name, t in rows_in.items()}
        for cols in part.key_blocks():
            dq_t, dk_t, dv_t = tile_grads(part.q[:, :, rows], part.local(part.k, cols), part.local(part.v, cols),
                                          **at_rows, scale=spec.scale, softcap=spec.softcap,
                                          allowed=part.allowed(rows, cols), weights=part.weights(rows, cols))
            dq[:, :, rows] += dq_t
            part.local(dk, cols)[...] += dk_t
            part.local(dv, cols)[...] += dv_t
    if dq.numel():
        dist.all_reduce(dq)  # the dQ partials of every key slice
    group_sum = torch.zeros(spec.batch, spec.heads_kv, *dk.shape[2:], dtype=dtype)
    dk_kv = group_sum.index_add(1, part.heads, dk)  # a KV head's gradient: the sum over its query heads
    dv_kv = torch.zeros(spec.batch, spec.heads_kv, *dv.shape[2:], dtype=dtype).index_add(1, part.heads, dv)
    return dq[:, :, slice(*_bounds(spec.len_q, world, rank))], dk_kv, dv_kv


# ---------------------------------------------------------------- the ranks


class _Pool:
    """``world`` rank processes in one gloo group, started once; ``run`` sends each its job."""

    def __init__(self, world: int):
        context = torch.multiprocessing.get_context("spawn")
        self.world = world
        self.store = os.path.join(tempfile.mkdtemp(prefix="attnformal-ring-"), "store")
        self.inboxes = [context.Queue() for _ in range(world)]
        self.outbox = context.Queue()
        self.ranks = [context.Process(target=_serve, args=(r, world, self.store, self.inboxes[r], self.outbox),
                                      daemon=True) for r in range(world)]
        with _main_hidden():
            for process in self.ranks:
                process.start()

    def run(self, fn, jobs: list) -> list:
        """``fn(rank, world, *jobs[rank])`` on every rank, the results in rank order."""
        for inbox, job in zip(self.inboxes, jobs):
            inbox.put((fn, job))
        results = {}
        try:
            for _ in range(self.world):
                rank, result = self.outbox.get(timeout=RESULT_TIMEOUT_S)
                results[rank] = result
        except queue.Empty:
            self.close()
            raise RuntimeError(f"ring attention: a rank gave no result within {RESULT_TIMEOUT_S} s") from None
        failed = [r for r in results.values() if isinstance(r, BaseException)]
        if failed:
            self.close()  # the others may wait in a collective forever
            raise failed[0]
        return [results[r] for r in range(self.world)]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.ranks)

    def close(self):
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.ranks:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        _POOLS.pop(self.world, None)


@contextmanager
def _main_hidden():
    """Spawned ranks need only this module: keep them from re-running the caller's ``__main__``
    (a script without the ``if __name__ == "__main__"`` guard would start the ring again)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _serve(rank, world, store, inbox, outbox):
    torch.set_num_threads(1)  # W ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=RESULT_TIMEOUT_S))
    try:
        while (job := inbox.get()) is not None:
            fn, args = job
            try:
                result = fn(rank, world, *args)
            except Exception as err:  # reported to the caller, which closes the pool
                result = err
            outbox.put((rank, result))
    finally:
        dist.destroy_process_group()


_POOLS: dict[int, _Pool] = {}


def _pool(world: int) -> _Pool:
    pool = _POOLS.get(world)
    if pool is None or not pool.alive():
        pool = _POOLS[world] = _Pool(world)
    return pool


@atexit.register
def _close_pools():
    for pool in list(_POOLS.values()):
        pool.close()


attention = make_attention()
