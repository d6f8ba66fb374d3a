"""``cu_seqlens_q``, ``cu_seqlens_k``: packed variable-length batches (the *layout* role).

As ``flash_attn_varlen_func`` takes them: q ``[Tq, Hq, D]``, k ``[Tk, Hkv, D]``, v ``[Tk, Hkv, Dv]``
hold ``B`` sequences back to back; ``cu_seqlens_q`` (``B + 1`` ints, from 0, non-decreasing, last
``Tq``) says where each starts, ``cu_seqlens_k`` likewise for the keys. Sequence ``b`` has
``len_q(b) = cu_q[b + 1] - cu_q[b]`` queries and ``len_k(b)`` keys (either may be 0), and its
query ``i`` / key ``j`` sit at packed row ``cu_q[b] + i`` / ``cu_k[b] + j`` (:func:`packed_index`).

Semantics: sequence ``b`` is the unpacked problem :meth:`AttentionSpec.sequence` ``(b)`` -- batch
1, its own lengths, every feature's value for it (:meth:`Feature.sequence_value`: a per-batch
feature's entry ``b``, row ``b`` of ``[B, Hq]`` ALiBi slopes, the ``[Hq]`` sinks unchanged) -- so
every mask family and ALiBi align with the sequence's own lengths (bottom-right causal: ``j <= i +
len_k(b) - len_q(b)``) and no new mask code exists. Every sequence shares the sinks, so ``d sinks``
is the sum over the sequences (autograd sums it where the same tensor enters every sequence's call;
:func:`pack` sums such results). Returns: ``out`` ``[Tq, Hq, Dv]`` and ``lse`` ``[Tq, Hq]`` (the padded protocol's
convention, "``out`` without its value axis", token-major like ``out``; flash-attn's own lse is
``[Hq, Tq]`` and its adapter transposes it).

Execution: :func:`run_packed` is the one pack/unpack helper. Every consumer computes sequence by
sequence through the index map (as FA2's varlen kernel does: a tile never straddles two sequences);
obligation ``varlen`` proves the map a bijection and that no query meets a key of another sequence.
Mask, dropout and bias *data* (``attn_mask``, ``dropout_mask``, ``bias``: ``[B, Hq, Sq, Sk]``) have no
packed shape, so they are refused with a packed batch.
"""

from __future__ import annotations

from attnformal.features.base import Feature, element, is_int

LAYOUT = "[T, H, D] (packed: T tokens of all sequences)"
PADDED_ONLY = ("attn_mask", "dropout_mask", "dropout_p", "bias")  # data on the padded grid: refused when packed


# ---- the index map (ops-agnostic: ints, torch index tensors, Z3 Ints and arrays)


def sequence_start(cu, b):
    """Packed index of the first token of sequence ``b``."""
    return element(cu, b)


def sequence_length(cu, b):
    """Tokens in sequence ``b``."""
    return element(cu, b + 1) - element(cu, b)


def packed_index(cu, b, i):
    """Packed row of token ``i`` of sequence ``b``: ``cu[b] + i`` (the map every consumer uses)."""
    return sequence_start(cu, b) + i


# ---- the declarations


class CuSeqlens(Feature):
    """One side's cumulative lengths; ``side`` is ``"q"`` or ``"k"``."""

    role = "layout"
    # A sequence's boundary is this feature's edge: a key of another sequence leaking in (check mask.packed).
    edge_bug = ("packed_boundary_leak", "a query attends a key of another packed sequence (a cu_seqlens "
                                        "boundary crossed)")

    def __init__(self, side: str):
        self.side = side
        self.name = f"cu_seqlens_{side}"
        tokens = "Tq" if side == "q" else "Tk"
        self.summary = (f"B+1 ints, 0 = cu[0] <= ... <= cu[B] = {tokens}: sequence b's "
                        f"{'queries' if side == 'q' else 'keys'} are packed rows cu[b] .. cu[b+1]-1")

    def validate(self, value, problem, values):
        if value is None:
            return None
        total = problem.len_q if self.side == "q" else problem.len_k
        cu = cumulative_lengths(self.name, value, problem.batch, total)
        if self.side == "k":
            _check_key_lengths(cu, values)
        return cu

    def conflict(self, values):
        # Sinks ([Hq]) and ALiBi's slopes (row b: Feature.sequence_value) have a value per sequence; a
        # bias, like the masks, is laid out on the padded [B, Hq, Sq, Sk] grid, which a packed batch lacks.
        padded = [name for name in PADDED_ONLY if _active(name, values)]
        if padded:
            return f"{padded[0]} has the padded shape [B, Hq, Sq, Sk]; a packed batch has none (unpack it)"
        return None

    def sequence_lengths(self, value, b, len_q, len_k):
        """``(len_q, len_k)`` of sequence ``b``: this side's from the cumulative lengths."""
        length = sequence_length(value, b)
        return (length, len_k) if self.side == "q" else (len_q, length)

    def to_json(self, value):
        return None if value is None else list(value)

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument(f"--cu-seqlens-{self.side}", action=cli.IntList, metavar="0,N,...",
                            form="comma-separated cumulative lengths, from 0",  # --shape's Sq, Sk: then Tq, Tk
                            help=f"packed: cumulative {'query' if self.side == 'q' else 'key'} lengths")

    def from_arguments(self, args):
        return getattr(args, self.name)

    def from_json(self, data):
        return None if data is None else tuple(data)

    def strategy(self, shape):
        """Cumulative lengths of ``shape.batch`` sequences of 0 .. ``Sq`` (``Sk``) tokens each, as a list or an
        int32 tensor. Never None: the two sides come together (``strategies.problems(packed=True)``)."""
        import itertools

        import torch
        from hypothesis import strategies as st

        most = shape.len_q if self.side == "q" else shape.len_k
        lengths = st.lists(st.integers(0, most), min_size=shape.batch, max_size=shape.batch)

        def cumulative(drawn):
            lengths, as_tensor = drawn
            cu = [0, *itertools.accumulate(lengths)]
            return torch.tensor(cu, dtype=torch.int32) if as_tensor else cu

        return st.tuples(lengths, st.booleans()).map(cumulative)


def _check_key_lengths(cu_k, values):
    """A ``length`` feature (kv_lens) may only shorten each sequence: at most ``len_k(b)`` keys."""
    from attnformal.features import with_role
    from attnformal.spec import SpecError

    for f in with_role("length"):
        value = values.get(f.name)
        if not f.active(value):
            continue
        for b in range(len(cu_k) - 1):
            length = sequence_length(cu_k, b)
            if not f.key_length(f.geometry_value(value, b), length) <= length:
                raise SpecError(f.name, f"at most each packed sequence's key count (sequence {b} has {length})",
                                repr(list(value)))


def _active(name, values):
    from attnformal.features import feature

    return name in values and feature(name).active(values[name])


def cumulative_lengths(name: str, value, batch: int, total: int) -> tuple[int, ...]:
    """``value`` as ``batch + 1`` cumulative lengths ending at ``total``, or a :class:`SpecError`."""
    import torch

    from attnformal.spec import SpecError

    values = value.tolist() if isinstance(value, torch.Tensor) else value
    if isinstance(value, torch.Tensor) and value.dtype not in (torch.int32, torch.int64):
        raise SpecError(name, "an int32 tensor or a list of ints", f"dtype {value.dtype}")
    if not isinstance(values, (list, tuple)) or len(values) != batch + 1 or not all(is_int(n) for n in values):
        raise SpecError(name, f"{batch + 1} ints (B + 1, cumulative)", repr(value))
    if values[0] != 0 or values[-1] != total or any(a > b for a, b in zip(values, values[1:])):
        raise SpecError(name, f"non-decreasing ints from 0 to {total} (the packed token count)", repr(list(values)))
    return tuple(int(n) for n in values)


CU_SEQLENS_Q, CU_SEQLENS_K = CuSeqlens("q"), CuSeqlens("k")


# ---- packed inputs and the one pack/unpack helper


def packed(keywords: dict) -> bool:
    """Whether a call passes a packed batch (either cumulative-length keyword)."""
    return any(keywords.get(f.name) is not None for f in (CU_SEQLENS_Q, CU_SEQLENS_K))


def check_packed(q, k, v, keywords):
    """``(batch, heads_q, Tq, head_dim, heads_kv, Tk, head_dim_v)`` of a packed call, or a SpecError."""
    import torch

    from attnformal.spec import SpecError, describe

    for f in (CU_SEQLENS_Q, CU_SEQLENS_K):
        if keywords.get(f.name) is None:
            other = CU_SEQLENS_K if f is CU_SEQLENS_Q else CU_SEQLENS_Q
            raise SpecError(f.name, f"cumulative lengths too (a packed batch, since {other.name} is given)", None)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise SpecError(name, f"a 3-D tensor {LAYOUT} with cu_seqlens_q/k", describe(t))
    tokens_q, heads_q, head_dim = q.shape
    tokens_k, heads_kv, _ = k.shape
    if head_dim == 0:
        raise SpecError("q", "a head dim D >= 1", describe(q))
    if k.shape[2] != head_dim:
        raise SpecError("k", f"shape [Tk, Hkv, D={head_dim}] (head dim of q)", describe(k))
    if heads_kv == 0 or heads_q % heads_kv:
        raise SpecError("k", f"a KV head count that divides Hq={heads_q} (GQA groups)", f"Hkv={heads_kv}")
    if tuple(v.shape[:2]) != (tokens_k, heads_kv) or v.shape[2] == 0:
        raise SpecError("v", f"shape [Tk={tokens_k}, Hkv={heads_kv}, Dv>=1] (as k)", describe(v))
    cu_q = keywords["cu_seqlens_q"]
    count = len(cu_q) if isinstance(cu_q, (list, tuple, torch.Tensor)) and len(cu_q) >= 2 else None
    if count is None:
        raise SpecError("cu_seqlens_q", "B + 1 >= 2 cumulative lengths (int32)", repr(cu_q))
    return count - 1, heads_q, tokens_q, head_dim, heads_kv, tokens_k, v.shape[2]


def query_rows(spec, b, i):
    """Packed rows of queries ``i`` of sequence ``b`` (the map :func:`run_packed` gathers and scatters by)."""
    return packed_index(spec.cu_seqlens_q, b, i)


def key_rows(spec, b, j):
    """Packed rows of keys (and values) ``j`` of sequence ``b``."""
    return packed_index(spec.cu_seqlens_k, b, j)


def unpack(t, rows):
    """The packed ``[T, H, D]`` tensor's ``rows`` as a padded-layout ``[1, H, len(rows), D]``."""
    return t.index_select(0, rows).transpose(0, 1).unsqueeze(0).contiguous()


def run_packed(spec, q, k, v, compute):
    """Run a packed problem sequence by sequence: ``compute(sequence_spec, q_b, k_b, v_b)`` returns
    ``(out [1, Hq, len_q(b), Dv], lse [1, Hq, len_q(b)])`` in the padded layout; the results go back to
    their packed rows: ``(out [Tq, Hq, Dv], lse [Tq, Hq])``. Differentiable (index_select, index_copy)."""
    results = []
    for b, (q_rows, k_rows) in enumerate(sequence_rows(spec, q.device)):
        out, lse = compute(spec.sequence(b), unpack(q, q_rows), unpack(k, k_rows), unpack(v, k_rows))
        results.append({"out": out, "lse": lse})
    packed = pack(spec, results)
    return packed["out"], packed["lse"]


def sequence_rows(spec, device=None):
    """``(query rows, key rows)`` index tensors of every sequence, in order (the map of theorem 16)."""
    import torch

    for b in range(spec.batch):
        len_q, len_k = spec.sequence_lengths(b)
        yield (query_rows(spec, b, torch.arange(len_q, device=device)),
               key_rows(spec, b, torch.arange(len_k, device=device)))


QUERY_SIDE = ("out", "lse", "dq", "grad")  # results (and grad_out) on query rows; the rest (dk, dv) on key rows
SHARED = ("dsinks",)  # gradients of a value every sequence shares (the [Hq] sinks): on no row, summed


def pack(spec, results: list[dict]) -> dict:
    """Per-sequence results in the padded layout (one dict per sequence, name -> ``[1, H, len, ...]``; a
    name ``<x>_...`` goes with ``x``) on their packed rows: name -> ``[T, H, ...]``; a :data:`SHARED` one
    is summed over the sequences (a plain sum: a certified ball needs its rounding added). Differentiable."""
    import torch

    rows = list(sequence_rows(spec, next(iter(results[0].values())).device))
    packed = {}
    for name in results[0]:
        if name.partition("_")[0] in SHARED:
            packed[name] = sum(r[name] for r in results)
            continue
        side = 0 if name.partition("_")[0] in QUERY_SIDE else 1
        pieces = torch.cat([r[name][0].transpose(0, 1) for r in results])
        total = spec.len_q if side == 0 else spec.len_k
        packed[name] = pieces.new_zeros((total, *pieces.shape[1:])).index_copy(0, torch.cat([r[side] for r in rows]),
                                                                               pieces)
    return packed
