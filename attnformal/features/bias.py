"""``bias``: an additive score bias broadcastable to ``[B, Hq, Sq, Sk]`` (Ascend ``pse``).

Added to the scores after scale and softcap, before the mask (where flash-attention's
``attention_ref`` adds ``attn_bias``). Finite values only: a pair is masked with ``attn_mask``.
Gradient: ``d bias = dS`` (the gradient of the final scores), summed over the dimensions the
bias was broadcast along; it reaches the caller's tensor through autograd.
"""

from __future__ import annotations

from attnformal.features.base import Feature, float_tensor, seeded


class Bias(Feature):
    name, role, tensor = "bias", "bias", True
    summary = "float broadcastable to [B, Hq, Sq, Sk]: added to the scores after softcap (Ascend pse)"

    def validate(self, value, problem, values):
        import torch

        from attnformal.spec import SpecError, describe

        if value is None:
            return None
        expected = f"broadcastable to [B, Hq, Sq, Sk] = {list(problem.full)}"
        float_tensor("bias", value, expected, problem.device)
        try:
            value.expand(problem.full)
        except RuntimeError:
            raise SpecError("bias", f"a shape {expected}", describe(value)) from None
        if not bool(torch.isfinite(value).all()):
            raise SpecError("bias", "finite values (mask pairs with attn_mask, not with -inf)", describe(value))
        return value  # the caller's tensor, not expanded: its gradient is summed back to its shape

    def score_bias(self, value, spec, batches, rows: slice, cols: slice, dtype):
        full = (spec.batch, spec.heads_q, spec.len_q, spec.len_k)
        return value.expand(full)[batches][:, :, rows, cols].to(dtype)

    def strategy(self, shape):
        from hypothesis import strategies as st

        def bias(rank, kept, gen):
            import torch

            # Each of [B, Hq, Sq, Sk] kept or broadcast (1), and the leading dimensions left out down to ``rank``.
            full = (shape.batch, shape.heads_q, shape.len_q, shape.len_k)
            size = [n if keep else 1 for n, keep in zip(full, kept)][len(full) - rank:]
            return 2.0 * torch.randn(size, generator=gen, dtype=torch.float64)

        return st.none() | seeded(bias, st.integers(0, 4), st.tuples(*[st.booleans()] * 4))


FEATURE = Bias()
