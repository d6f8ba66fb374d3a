"""``alibi_slopes``: ALiBi's score bias ``-slope[b, h] * |i + Sk_b - Sq - j|``, as flash-attention.

Bottom-right aligned with the batch element's own key length (``kv_lens``), added to the scores
after scale and softcap, before the mask: flash-attention ``tests/test_flash_attn.py``
(``attn_bias_from_alibi_slopes``, ``attention_ref``: ``scores + attn_bias`` after the softcap) and
``csrc/flash_attn/src/alibi.h`` (``-= slope * abs(row + seqlen_k - seqlen_q - col)`` with the
batch's actual lengths), commit 0251105a2fb19d2957484b7f023cd8c115286ced. With ``causal``,
flash-attention's kernel adds ``slope * j`` instead, which differs by a per-row constant: the
same ``out``, an ``lse`` shifted by ``slope * (i + Sk - Sq)``. The slopes are constants: no gradient.
"""

from __future__ import annotations

from attnformal import ops
from attnformal.features.base import Feature, float_tensor, seeded


def alibi_bias(i, j, slope, len_q, len_k):
    """ALiBi's score bias ``-slope * |i + len_k - len_q - j|``: 0 on the bottom-right diagonal."""
    distance = i + len_k - len_q - j
    return -slope * ops.maximum(distance, -distance)


class AlibiSlopes(Feature):
    name, role, tensor = "alibi_slopes", "bias", True
    summary = "float [Hq] or [B, Hq]: ALiBi bias -slope * |i + Sk - Sq - j| on the scores (flash-attention)"

    def validate(self, value, problem, values):
        import torch

        from attnformal.spec import SpecError

        if value is None:
            return None
        expected = f"[Hq={problem.heads_q}] or [B={problem.batch}, Hq={problem.heads_q}]"
        float_tensor("alibi_slopes", value, expected, problem.device)
        if tuple(value.shape) not in ((problem.heads_q,), (problem.batch, problem.heads_q)):
            raise SpecError("alibi_slopes", f"shape {expected}", f"shape {tuple(value.shape)}")
        if not bool(torch.isfinite(value).all()):
            raise SpecError("alibi_slopes", "finite slopes", repr(value.tolist()))
        return value.detach().expand(problem.batch, problem.heads_q)

    def one_element(self, value, b, h, full):
        return value[b:b + 1, h:h + 1]

    def sequence_value(self, value, b):
        """Row ``b`` ``[1, Hq]`` of the validated ``[B, Hq]`` slopes: sequence ``b``'s own (as flash-attention's
        varlen kernel reads ``alibi_slopes[b]``); without it a batch-1 sequence would read row 0."""
        return None if value is None else value[b:b + 1]

    def score_bias(self, value, spec, batches, rows: slice, cols: slice, dtype):
        import torch

        device = batches.device
        i = torch.arange(rows.start, rows.stop, device=device)[:, None]
        j = torch.arange(cols.start, cols.stop, device=device)[None, :]
        len_k = spec.key_lengths(batches)[:, None, None, None]
        slope = value.to(device=device, dtype=dtype)[batches][:, :, None, None]
        return alibi_bias(i, j, slope, spec.len_q, len_k)

    def add_argument(self, parser):
        from attnformal import cli

        parser.add_argument("--alibi-slopes", action=cli.FloatList, metavar="X,...",
                            form="comma-separated floats, one ALiBi slope per query head",
                            help="ALiBi slope per query head (flash-attention)")

    def from_arguments(self, args):
        import torch

        return None if args.alibi_slopes is None else torch.tensor(args.alibi_slopes, dtype=torch.float64)

    def strategy(self, shape):
        from hypothesis import strategies as st

        def slopes(per_batch, gen):
            import torch

            size = (shape.batch, shape.heads_q) if per_batch else (shape.heads_q,)
            # ALiBi's slopes are 2^-k (k = 8h/Hq, h = 1..Hq): exact in every dtype.
            return 2.0 ** -torch.randint(1, 9, size, generator=gen, dtype=torch.float64)

        return st.none() | seeded(slopes, st.booleans())


FEATURE = AlibiSlopes()
