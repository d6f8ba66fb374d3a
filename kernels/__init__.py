"""Kernels that run the spec's schedule and merge: a torch tiled executor and a Triton kernel.

Installed as ``attnformal.kernels``. Each kernel's ``attention`` is the implementation
protocol of :mod:`attnformal.verify`, built by :func:`protocol_entry`.
"""

from __future__ import annotations

from attnformal.spec import AttentionSpec


def protocol_entry(run):
    """The implementation protocol around ``run(q, k, v, spec, schedule) -> (out, lse)``.

    The call is validated once, here; ``schedule=None`` is passed through for the kernel's
    default. The kernels replay a given dropout mask but draw none of their own.
    """

    def attention(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None,
                  softcap=None, dropout_p=0.0, dropout_mask=None, return_lse=False, schedule=None):
        spec = AttentionSpec.from_inputs(q, k, v, scale=scale, causal=causal, window=window,
                                         attn_mask=attn_mask, kv_lens=kv_lens, softcap=softcap,
                                         dropout_p=dropout_p, dropout_mask=dropout_mask)
        if spec.dropout_p > 0 and spec.dropout_mask is None:
            raise NotImplementedError(f"{run.__module__} draws no dropout mask of its own: "
                                      "pass dropout_mask to replay")
        out, lse = run(q, k, v, spec, schedule)
        return (out, lse) if return_lse else out

    # Name and document it as ``run``, but keep the protocol's own signature visible (no __wrapped__).
    attention.__name__, attention.__qualname__ = run.__name__, run.__qualname__
    attention.__module__, attention.__doc__ = run.__module__, run.__doc__
    return attention
