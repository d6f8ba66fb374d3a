"""Kernels that run the spec's schedule and merge: a torch tiled executor and a Triton kernel.

Installed as ``attnformal.kernels``. Each kernel's ``attention`` is the implementation
protocol of :mod:`attnformal.verify`, built by :func:`protocol_entry`.
"""

from __future__ import annotations

from attnformal.features import refuse_unsupported
from attnformal.features.varlen import run_packed
from attnformal.spec import AttentionSpec


def protocol_entry(supports):
    """Decorator: the implementation protocol around ``run(q, k, v, spec, schedule) -> (out, lse)``.

    ``supports``: the protocol features ``run`` computes; an active feature outside it is refused
    with ``NotImplementedError`` naming it, so a feature added later is never silently dropped.
    The call is validated once, here; ``schedule=None`` is passed through for the kernel's
    default. The kernels replay a given dropout mask but draw none of their own.
    """
    supports = frozenset(supports)

    def wrap(run):
        def attention(q, k, v, *, scale=None, return_lse=False, schedule=None, **features):
            spec = AttentionSpec.from_inputs(q, k, v, scale=scale, **features)
            refuse_unsupported(spec, supports, run.__module__)
            if spec.dropout_p > 0 and spec.dropout_mask is None:
                raise NotImplementedError(f"{run.__module__} draws no dropout mask of its own: "
                                          "pass dropout_mask to replay")
            if spec.packed:  # sequence by sequence: no tile ever straddles two sequences
                out, lse = run_packed(spec, q, k, v, lambda one, *qkv: run(*qkv, one, schedule))
            else:
                out, lse = run(q, k, v, spec, schedule)
            return (out, lse) if return_lse else out

        # Name and document it as ``run``, but keep the protocol's own signature visible (no __wrapped__).
        attention.__name__, attention.__qualname__ = run.__name__, run.__qualname__
        attention.__module__, attention.__doc__ = run.__module__, run.__doc__
        attention.SUPPORTS = supports
        return attention

    return wrap
