"""``sinks``: a per-head logit that joins the softmax denominator and carries no value (gpt-oss).

``out = sum_j e^{s_j} v_j / (e^{sink_h} + sum_j e^{s_j})``, ``lse = log(e^{sink_h} + sum_j e^{s_j})``;
a row with no allowed key gives ``out = 0`` and ``lse = sink_h``. In the merge language the sink
is one more state, :func:`attnformal.merge.sink_state` ``(sink, 1, 0)``, merged into each row's
state (kernels start their fold from it: ``merge.initial_state``); dropout does not apply to
it; ``-inf`` is no sink. Gradient: ``d sink_h = sum_{b, i} p_sink (dlse - rowsum(dO * O))`` with
``p_sink = exp(sink_h - lse)`` (:func:`attnformal.tile.sink_grads`).
"""

from __future__ import annotations

from attnformal.features.base import Feature, float_tensor, seeded


class Sinks(Feature):
    name, role, tensor = "sinks", "state", True
    summary = "float [Hq]: a logit per query head in the softmax denominator, with no value (-inf: none)"

    def validate(self, value, problem, values):
        import torch

        from attnformal.spec import SpecError

        if value is None:
            return None
        expected = f"[Hq={problem.heads_q}] (one logit per query head)"
        float_tensor("sinks", value, expected, problem.device)
        if tuple(value.shape) != (problem.heads_q,):
            raise SpecError("sinks", f"shape {expected}", f"shape {tuple(value.shape)}")
        if bool(torch.isnan(value).any()) or bool(torch.isposinf(value).any()):
            raise SpecError("sinks", "finite logits or -inf (no sink)", repr(value.tolist()))
        return value  # the caller's tensor: its gradient flows back to it

    def one_element(self, value, b, h, full):
        return value[h:h + 1]

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--sinks", action=cli.FloatList, metavar="X,...",
                            form="comma-separated floats, one sink logit per query head (-inf: none)",
                            help="sink logit per query head (-inf: none)")

    def from_arguments(self, args):
        import torch

        return None if args.sinks is None else torch.tensor(args.sinks, dtype=torch.float64)

    def strategy(self, shape):
        from hypothesis import strategies as st

        def logits(gen):
            import torch

            sinks = 2.0 * torch.randn(shape.heads_q, generator=gen, dtype=torch.float64)
            return sinks.masked_fill(torch.rand(shape.heads_q, generator=gen) < 0.25, -float("inf"))  # no sink

        return st.none() | seeded(logits)


FEATURE = Sinks()
