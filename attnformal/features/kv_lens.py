"""``kv_lens``: one key length per batch element; keys past it are padding, and bottom-right
alignment uses it in place of ``Sk``."""

from __future__ import annotations

from attnformal.features.base import Feature, int_list


class KvLens(Feature):
    name, role, per_batch = "kv_lens", "length", True
    summary = "[B] ints in [0, Sk]: batch b has kv_lens[b] keys (the rest are padding)"
    edge_bug = ("kv_lens_ignored", "per-batch key lengths (kv_lens) are not applied")

    def validate(self, value, problem, values):
        if value is None:
            return None
        return int_list("kv_lens", value, problem.batch, 0, problem.len_k, "one key length per batch",
                        f"lengths in [0, Sk={problem.len_k}]")

    def key_length(self, value, len_k):
        return value

    def to_json(self, value):
        return None if value is None else list(value)

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--kv-lens", action=cli.IntList, form="comma-separated ints, one key length per batch",
                            metavar="N,...", help="one key length per batch")

    def from_arguments(self, args):
        return args.kv_lens

    def example(self, shape):
        return {"kv_lens": [shape.len_k, shape.len_k // 2]}

    def prover_values(self):
        import z3

        return [("no kv_lens", None), ("kv_lens", z3.Array("kv_lens", z3.IntSort(), z3.IntSort()))]


FEATURE = KvLens()
