"""The registry of protocol features, in their fixed order (see :mod:`attnformal.features.base`).

The order matters where features compose: index masks narrow the key interval in this order,
and a feature's validation sees the values of the features before it. ``FEATURES`` is a list
so that a test can register a dummy feature for a while (:func:`registered`).
"""

from __future__ import annotations

from attnformal.features import (alibi, attn_mask, bias, causal, chunk, dropout, kv_lens, prefix, sinks, softcap,
                                 varlen, window)
from attnformal.features.base import Feature, Problem, refuse_unsupported, registered

FEATURES: list[Feature] = [
    causal.FEATURE,
    window.FEATURE,
    chunk.FEATURE,
    kv_lens.FEATURE,
    prefix.FEATURE,  # after causal, window and chunk_size: its validation reads them
    attn_mask.FEATURE,
    softcap.FEATURE,
    dropout.DROPOUT_P,
    dropout.DROPOUT_MASK,
    alibi.FEATURE,
    bias.FEATURE,
    sinks.FEATURE,
    varlen.CU_SEQLENS_Q,  # last: their validation checks per-sequence bounds of the features above
    varlen.CU_SEQLENS_K,
]


def feature(name: str) -> Feature:
    """The registered feature with protocol keyword ``name``."""
    for f in FEATURES:
        if f.name == name:
            return f
    raise KeyError(f"no feature named {name!r}; registered: {', '.join(names())}")


def names() -> tuple[str, ...]:
    return tuple(f.name for f in FEATURES)


def with_role(*roles: str) -> tuple[Feature, ...]:
    """The registered features taking part as one of ``roles``, in order (the mask predicate asks for
    them at every index it evaluates: each answer is kept until :func:`registered` changes the registry)."""
    found = BY_ROLE.get(roles)
    if found is None:
        found = BY_ROLE[roles] = tuple(f for f in FEATURES if f.role in roles)
    return found


BY_ROLE: dict[tuple[str, ...], tuple[Feature, ...]] = {}


MASK_ROLES = ("interval", "length", "data")  # the roles that decide which keys a query may attend


def mask_features() -> tuple[Feature, ...]:
    """The registered features that mask keys: index intervals, key lengths and data masks."""
    return with_role(*MASK_ROLES)


def defaults() -> dict:
    """Every protocol keyword with its default: a call that asks for nothing."""
    return {f.name: f.default for f in FEATURES}


__all__ = ["FEATURES", "MASK_ROLES", "Feature", "Problem", "defaults", "feature", "mask_features", "names",
           "refuse_unsupported", "registered",
           "with_role"]
