"""``dropout_p`` and ``dropout_mask``: dropout on the probabilities, replayed from a given keep-mask."""

from __future__ import annotations

from attnformal.features.base import Feature


class DropoutP(Feature):
    name, role, default = "dropout_p", "dropout", 0.0
    summary = "float in [0, 1): probabilities are dropped with this rate (lse unchanged)"

    def validate(self, value, problem, values):
        from attnformal.spec import SpecError

        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise SpecError("dropout_p", "a float in [0, 1)", repr(value))
        return float(value)

    def active(self, value) -> bool:
        return value is not None and value > 0

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--dropout-p", type=cli.number(minimum=0), default=0.0, metavar="P",
                            help="dropout; its seeded keep-mask is in the file")

    def from_arguments(self, args):
        return args.dropout_p


class DropoutMask(Feature):
    name, role, tensor = "dropout_mask", "dropout", True
    summary = "bool keep-mask [B, Hq, Sq, Sk] replayed exactly (needs dropout_p > 0)"

    def validate(self, value, problem, values):
        import torch

        from attnformal.spec import SpecError, describe

        if value is None:
            return None
        if values["dropout_p"] == 0.0:
            raise SpecError("dropout_mask", "None when dropout_p is 0 (a keep-mask needs dropout_p > 0)",
                            describe(value))
        if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or tuple(value.shape) != problem.full:
            raise SpecError("dropout_mask", f"a bool keep-mask of shape [B, Hq, Sq, Sk] = {list(problem.full)}",
                            describe(value))
        if value.device != problem.device:
            raise SpecError("dropout_mask", f"the device of q ({problem.device})", describe(value))
        return value


DROPOUT_P, DROPOUT_MASK = DropoutP(), DropoutMask()
