"""Kernels that run the spec's schedule and merge: a torch tiled executor and a Triton kernel.

Installed as ``attnformal.kernels``. Each kernel's ``attention`` is the implementation
protocol of :mod:`attnformal.verify`, built by :func:`protocol_entry`.
"""

from __future__ import annotations

from attnformal.spec import AttentionSpec


OPTIONAL_FEATURES = ("sinks", "alibi_slopes", "bias")  # a kernel computes them only if it says so


def protocol_entry(run=None, *, supports=frozenset()):
    """The implementation protocol around ``run(q, k, v, spec, schedule) -> (out, lse)``.

    The call is validated once, here; ``schedule=None`` is passed through for the kernel's
    default. The kernels replay a given dropout mask but draw none of their own. A feature of
    ``OPTIONAL_FEATURES`` that is not in ``supports`` raises ``NotImplementedError`` rather than
    being computed without. Use as ``@protocol_entry`` or ``@protocol_entry(supports={...})``.
    """
    if run is None:
        return lambda run: protocol_entry(run, supports=frozenset(supports))

    def attention(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None,
                  softcap=None, dropout_p=0.0, dropout_mask=None, sinks=None, alibi_slopes=None, bias=None,
                  return_lse=False, schedule=None):
        spec = AttentionSpec.from_inputs(q, k, v, scale=scale, causal=causal, window=window,
                                         attn_mask=attn_mask, kv_lens=kv_lens, softcap=softcap,
                                         dropout_p=dropout_p, dropout_mask=dropout_mask, sinks=sinks,
                                         alibi_slopes=alibi_slopes, bias=bias)
        for name in OPTIONAL_FEATURES:
            if getattr(spec, name) is not None and name not in supports:
                raise NotImplementedError(f"{run.__module__} does not implement {name}")
        if spec.dropout_p > 0 and spec.dropout_mask is None:
            raise NotImplementedError(f"{run.__module__} draws no dropout mask of its own: "
                                      "pass dropout_mask to replay")
        out, lse = run(q, k, v, spec, schedule)
        return (out, lse) if return_lse else out

    # Name and document it as ``run``, but keep the protocol's own signature visible (no __wrapped__).
    attention.__name__, attention.__qualname__ = run.__name__, run.__qualname__
    attention.__module__, attention.__doc__ = run.__module__, run.__doc__
    return attention
