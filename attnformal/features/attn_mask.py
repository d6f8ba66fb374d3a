"""``attn_mask``: a bool tensor broadcastable to ``[B, Hq, Sq, Sk]`` (True: may attend), ANDed on top."""

from __future__ import annotations

from attnformal.features.base import Feature


class AttnMask(Feature):
    name, role, tensor = "attn_mask", "data", True
    summary = "bool [B, Hq, Sq, Sk] (broadcastable), True = may attend; ANDed with the index masks"

    def validate(self, value, problem, values):
        import torch

        from attnformal.spec import SpecError, describe

        if value is None:
            return None
        if not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
            raise SpecError("attn_mask", "a bool tensor (True = may attend) or None", describe(value))
        try:
            expanded = value.expand(problem.full)
        except RuntimeError:
            raise SpecError("attn_mask", f"a shape broadcastable to [B, Hq, Sq, Sk] = {list(problem.full)}",
                            describe(value)) from None
        if value.device != problem.device:
            raise SpecError("attn_mask", f"the device of q ({problem.device})", describe(value))
        return expanded

    def geometry_value(self, value, b):
        return value is not None  # a geometry only asks whether there is one

    def active(self, value) -> bool:
        return value is not None and value is not False


FEATURE = AttnMask()
