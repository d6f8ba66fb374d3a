"""``prefix_lens``: prefix-LM attention: keys ``j < prefix_lens[b]`` are visible to every query of
batch element ``b``; the other keys follow the causal rule (Ascend sparse modes 5/6; flex's prefix-LM).

Needs a causal mode (without one every key is visible already: the call is refused as a likely
mistake). The union of the prefix and the causal keys is one interval,
``[0, max(hi_causal(i), min(P, n) - 1)]`` (``n`` the batch element's key length), whose upper end
never decreases with ``i``; obligation 10 proves it. A window or a chunk with it would make the
prefix and the local keys two intervals, so those combinations are refused.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.features.base import Feature, int_list


COMPANIONS = ("causal", "window", "chunk_size")  # the features whose values decide if a prefix is accepted


class PrefixLens(Feature):
    name, role, per_batch = "prefix_lens", "interval", True
    summary = "[B] ints in [0, Sk]: keys j < prefix_lens[b] are visible to every query (needs causal)"
    edge_bug = ("prefix_wrong", "the prefix-LM prefix is applied wrongly (its length, or another batch's)")

    def validate(self, value, problem, values):
        from attnformal.spec import SpecError

        if value is None:
            return None
        lens = int_list("prefix_lens", value, problem.batch, 0, problem.len_k, "one prefix length per batch",
                        f"lengths in [0, Sk={problem.len_k}]")
        why = self.conflict(values)
        if why is not None:
            raise SpecError("prefix_lens", why, ", ".join(f"{name}={values.get(name)!r}" for name in COMPANIONS))
        return lens

    def conflict(self, values):
        if values.get("causal") is None:
            return "a causal mode with it ('top_left' or 'bottom_right': the keys past the prefix follow it)"
        if any(values.get(other) is not None for other in ("window", "chunk_size")):
            return "no window and no chunk_size with it (prefix and local keys would be two intervals per row)"
        return None

    def narrow(self, i, lo, hi, value, g):
        # The prefix widens the causal interval [0, hi]: the refused combinations keep lo at 0 here.
        return lo, ops.maximum(hi, ops.minimum(value, g.len_k) - 1)

    def to_json(self, value):
        return None if value is None else list(value)

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--prefix-lens", action=cli.IntList,
                            form="comma-separated ints, one prefix length per batch", metavar="P,...",
                            help="prefix-LM: keys j < P[b] seen by all (needs --causal)")

    def from_arguments(self, args):
        return args.prefix_lens

    def example(self, shape):
        return {"causal": "bottom_right", "prefix_lens": [shape.len_k // 2, shape.len_k]}

    def strategy(self, shape):
        from hypothesis import strategies as st

        lens = st.lists(st.integers(0, shape.len_k), min_size=shape.batch, max_size=shape.batch)
        return st.none() | lens

    def prover_values(self):
        import z3

        return [("no prefix", None), ("prefix_lens", z3.Array("prefix_lens", z3.IntSort(), z3.IntSort()))]

    def domain(self, value):
        return (("prefix_lens[b] >= 0", value >= 0),)


FEATURE = PrefixLens()
