"""``chunk_size``: chunked local attention (FA3's ``attention_chunk``): query ``i`` sees key ``j`` only
when both lie in the same chunk of ``C`` positions, positions aligned bottom-right.

Query ``i`` sits at key position ``i + off`` (``off = n - Sq``, ``n`` the batch element's key
length), so its chunk is ``floor((i + off) / C)`` and it sees the keys of
``[C floor((i + off) / C), C floor((i + off) / C) + C - 1]``: one interval, whose ends never
decrease with ``i`` (obligation 10 proves both). ANDed with every other mask.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.features.base import Feature, is_int


class ChunkSize(Feature):
    name, role = "chunk_size", "interval"
    summary = "int C >= 1: query i sees key j only if (i + Sk - Sq) // C == j // C (same chunk, bottom-right)"
    edge_bug = ("chunk_off_by_one", "a chunk boundary is off by one key")
    slow_tiles = True  # floordiv(i + off, C) with C and the block sizes symbolic: nonlinear

    def validate(self, value, problem, values):
        from attnformal.spec import SpecError

        if value is None:
            return None
        if not is_int(value) or value < 1:
            raise SpecError("chunk_size", "None or an int >= 1 (keys per chunk)", repr(value))
        return int(value)

    def narrow(self, i, lo, hi, value, g):
        start = ops.floordiv(i + g.offset, value) * value  # first key position of query i's chunk
        return ops.maximum(lo, start), ops.minimum(hi, start + value - 1)

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--chunk-size", type=cli.integer(minimum=1), metavar="C",
                            help="chunked attention: C keys a chunk, bottom-right")

    def from_arguments(self, args):
        return args.chunk_size

    def example(self, shape):
        return {"chunk_size": 16}

    def strategy(self, shape):
        from hypothesis import strategies as st

        return st.none() | st.integers(1, max(1, shape.len_k + 1))

    def prover_values(self):
        import z3

        return [("no chunk", None), ("chunk_size=C", z3.Int("C"))]

    def domain(self, value):
        return (("C >= 1", value >= 1),)


FEATURE = ChunkSize()
