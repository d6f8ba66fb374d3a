"""``window``: ``(left, right)`` keys around the bottom-right-aligned diagonal; negative: unbounded side."""

from __future__ import annotations

from collections.abc import Sequence

from attnformal import ops
from attnformal.features.base import Feature, is_int


class Window(Feature):
    name, role = "window", "interval"
    summary = "(left, right): i + off - left <= j <= i + off + right, off = Sk - Sq; a negative bound is unbounded"
    edge_bug = ("window_off_by_one", "a sliding-window boundary is off by one key")

    def validate(self, value, problem, values):
        from attnformal.spec import SpecError

        if value is None:
            return None
        if not isinstance(value, Sequence) or len(value) != 2 or not all(is_int(w) for w in value):
            raise SpecError("window", "None or a pair of ints (left, right); a negative bound is unbounded",
                            repr(value))
        return (int(value[0]), int(value[1]))

    def narrow(self, i, lo, hi, value, g):
        left, right = value
        lo = ops.where(left < 0, lo, ops.maximum(lo, i + g.offset - left))
        hi = ops.where(right < 0, hi, ops.minimum(hi, i + g.offset + right))
        return lo, hi

    def to_json(self, value):
        return None if value is None else list(value)

    def from_json(self, data):
        return None if data is None else tuple(data)

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--window", action=cli.IntList, count=2, form="2 comma-separated ints L,R",
                            metavar="L,R", help="sliding window (-1: unbounded on that side)")

    def from_arguments(self, args):
        return None if args.window is None else tuple(args.window)

    def example(self, shape):
        return {"window": (8, 0)}

    def prover_values(self):
        import z3

        return [("no window", None), ("window=(L, R)", tuple(z3.Ints("L R")))]


FEATURE = Window()
