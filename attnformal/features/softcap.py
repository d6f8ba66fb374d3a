"""``softcap``: ``cap * tanh(s / cap)`` on the scaled scores, before the mask."""

from __future__ import annotations

import math

from attnformal import ops
from attnformal.features.base import Feature


def apply_softcap(s, cap):
    """``cap * tanh(s / cap)``: bounds the logits to ``(-cap, cap)`` smoothly."""
    return cap * ops.tanh(s / cap)


class Softcap(Feature):
    name, role = "softcap", "scores"
    summary = "float > 0: scores become softcap * tanh(s / softcap) (after scale, before the mask)"

    def validate(self, value, problem, values):
        from attnformal.spec import SpecError

        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise SpecError("softcap", "None or a finite float > 0", repr(value))
        return float(value)

    def modify_scores(self, s, value):
        return apply_softcap(s, value)

    def example(self, shape):
        return {"softcap": 20.0}

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--softcap", type=cli.number(above=0), metavar="C", help="tanh softcap of the scores")

    def from_arguments(self, args):
        return args.softcap


FEATURE = Softcap()
