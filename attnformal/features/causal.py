"""``causal``: ``None``, ``"top_left"`` (``j <= i``) or ``"bottom_right"`` (``j <= i + Sk - Sq``)."""

from __future__ import annotations

from attnformal import ops
from attnformal.features.base import Feature

CAUSAL_MODES = (None, "top_left", "bottom_right")


class Causal(Feature):
    name, role = "causal", "interval"
    summary = "None, 'top_left' (j <= i) or 'bottom_right' (j <= i + Sk - Sq: the last query sees the last key)"
    edge_bug = ("causal_off_by_one", "the causal boundary is off by one key")

    def validate(self, value, problem, values):
        from attnformal.spec import SpecError

        if value not in CAUSAL_MODES:
            raise SpecError("causal", "None, 'top_left' or 'bottom_right'", repr(value))
        return value

    def narrow(self, i, lo, hi, value, g):
        return lo, ops.minimum(hi, i if value == "top_left" else i + g.offset)

    def add_argument(self, parser):
        parser.add_argument("--causal", default="none", choices=["none", "top_left", "bottom_right"])

    def from_arguments(self, args):
        return None if args.causal == "none" else args.causal

    def strategy(self, shape):
        from hypothesis import strategies as st

        return st.sampled_from(CAUSAL_MODES)

    def prover_values(self):
        return [(f"causal={mode}", mode) for mode in CAUSAL_MODES]


FEATURE = Causal()
