"""The attention spec: one dataclass that fully describes a problem, and its semantics.

Layout ``[B, H, S, D]``: q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Sk, D]``, v ``[B, Hkv, Sk, Dv]``.

For batch ``b``, query head ``h``, query row ``i`` and key ``j``::

    s[i, j]  = scale * q[b, h, i] . k[b, g(h), j]          g(h) = h // (Hq // Hkv)   (GQA/MQA)
    s[i, j]  = softcap * tanh(s[i, j] / softcap)            if softcap (after scale, before mask)
    s[i, j] += -alibi_slopes[b, h] * |i + Sk_b - Sq - j|    if alibi_slopes (after softcap)
    s[i, j] += bias[b, h, i, j]                             if bias (broadcast; after softcap)
    allowed  = may_attend(i, j, geometry(b)) and attn_mask[b, h, i, j]
    Z[i]     = exp(sinks[h]) + sum_{allowed j} exp(s[i, j])  (the sink's term only with sinks)
    p[i, j]  = exp(s[i, j]) / Z[i] at allowed keys, 0 elsewhere
    lse[i]   = log Z[i]                                     (natural log)
    out[i]   = sum_j p[i, j] * keep[i, j] / (1 - dropout_p) * v[b, g(h), j]

Empty-row rule: a row with no allowed key has ``out = 0``, ``lse = -inf`` (``sinks[h]`` with a
sink) and zero gradients for q, k, v, never NaN. Dropout never changes ``lse``: it acts on
probabilities, after the denominator, with a keep-mask that is replayed exactly; it never
applies to the sink. The features' own modules (:mod:`attnformal.features`) say the rest:
ALiBi's alignment (flash-attention's, cited there), the gradients of sinks and bias.
"""

from __future__ import annotations

import math
from typing import Any

from attnformal import ops
from attnformal.features import FEATURES, Problem, feature, varlen, with_role
from attnformal.features.softcap import apply_softcap
from attnformal.masks import MaskGeometry

__all__ = ["SUPPORTED_DTYPES", "AttentionSpec", "SpecError", "apply_softcap", "describe", "kv_head_of"]

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64")
CORE_FIELDS = ("batch", "heads_q", "heads_kv", "len_q", "len_k", "head_dim", "head_dim_v", "scale")


class SpecError(ValueError):
    """A problem with the caller's arguments; the message names the argument."""

    def __init__(self, argument: str, expected: str, got: Any):
        self.argument = argument
        super().__init__(f"argument '{argument}': expected {expected}, got {got}")


def kv_head_of(h, heads_q, heads_kv):
    """The KV head that query head ``h`` reads: consecutive groups of ``Hq // Hkv`` share one."""
    return ops.floordiv(h, ops.floordiv(heads_q, heads_kv))  # ops: also on Z3 Ints, for all head counts


class AttentionSpec:
    """Everything that defines an attention problem, except the numbers in q, k, v.

    Build it with :meth:`from_inputs`, which validates the call. The shape fields
    (``batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v``) and ``scale`` are the
    core; every protocol feature of :data:`attnformal.features.FEATURES` is ``spec.<keyword>``
    (its default when not given). Tensor-valued features (``attn_mask``, ``dropout_mask``) stay
    out of equality and of :meth:`to_json`. Immutable: :meth:`replace` makes a changed copy.
    """

    def __init__(self, *, batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v, scale, **values):
        known = {f.name for f in FEATURES}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"AttentionSpec: unexpected keyword argument {unknown[0]!r} "
                            f"(protocol features: {', '.join(f.name for f in FEATURES)})")
        core = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, len_q=len_q, len_k=len_k, head_dim=head_dim,
                    head_dim_v=head_dim_v, scale=scale)
        object.__setattr__(self, "_core", core)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name):
        d = self.__dict__
        if "_core" in d and name in d["_core"]:
            return d["_core"][name]
        if "_values" in d and name in d["_values"]:
            return d["_values"][name]
        if any(f.name == name for f in FEATURES):
            return feature(name).default
        raise AttributeError(f"AttentionSpec has no attribute {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError("AttentionSpec is immutable: use replace()")

    def values(self) -> dict:
        """Every registered feature's value (its default when not given)."""
        return {f.name: getattr(self, f.name) for f in FEATURES}

    def active(self) -> list[str]:
        """The features this problem uses, in registry order."""
        return [f.name for f in FEATURES if f.active(getattr(self, f.name))]

    def replace(self, **changes) -> AttentionSpec:
        return AttentionSpec(**{**self._core, **self._values, **changes})

    def _key(self):
        compared = tuple((f.name, repr(getattr(self, f.name))) for f in FEATURES if not f.tensor)
        return tuple(self._core.values()), compared

    def __eq__(self, other):
        return isinstance(other, AttentionSpec) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        shown = [f"{k}={v!r}" for k, v in self._core.items()]
        shown += [f"{f.name}={getattr(self, f.name)!r}" for f in FEATURES if not f.tensor]
        return f"AttentionSpec({', '.join(shown)})"

    @property
    def group(self) -> int:
        """Query heads per KV head (1: MHA, Hq: MQA)."""
        return self.heads_q // self.heads_kv

    def geometry(self, b: int | None = None) -> MaskGeometry:
        """The index mask of batch ``b``: every mask feature's value for it, and its own key length.

        ``b`` may also be an index tensor (every batch element at once: the class table) or a
        Z3 Int (the prover's, with per-batch values Z3 arrays). ``b=None``: the per-batch features
        are left out (``Sk`` keys, no prefix): right only when none is given.
        """
        len_q, len_k = self.sequence_lengths(b)
        for f in with_role("length"):
            value = getattr(self, f.name)
            if f.active(value) and b is not None:
                len_k = f.key_length(f.geometry_value(value, b), len_k)
        values = {f.name: f.geometry_value(getattr(self, f.name), b) for f in with_role("interval", "data")}
        causal, window, has_mask = values.pop("causal"), values.pop("window"), values.pop("attn_mask")
        return MaskGeometry(len_q, len_k, causal, window, has_mask, **values)

    def sequence_lengths(self, b=None):
        """``(len_q, len_k)`` of batch element ``b``: a packed sequence's own, else ``(Sq, Sk)``."""
        len_q, len_k = self.len_q, self.len_k
        for f in with_role("layout"):
            value = getattr(self, f.name)
            if f.active(value) and b is not None:
                len_q, len_k = f.sequence_lengths(value, b, len_q, len_k)
        return len_q, len_k

    @property
    def packed(self) -> bool:
        """Whether this is a packed variable-length batch (q ``[Tq, Hq, D]``, ``len_q`` = Tq)."""
        return any(f.active(getattr(self, f.name)) for f in with_role("layout"))

    def sequence(self, b: int) -> AttentionSpec:
        """Packed sequence ``b`` as a problem of its own: batch 1, its own lengths, no layout, and every
        feature's value for it (:meth:`~attnformal.features.Feature.sequence_value`: entry ``b`` of a per-batch
        feature, row ``b`` of ALiBi's slopes, the sinks as they are; see :mod:`attnformal.features.varlen`)."""
        values = {f.name: f.default if f.role == "layout" else f.sequence_value(getattr(self, f.name), b)
                  for f in FEATURES}
        len_q, len_k = self.sequence_lengths(b)
        return AttentionSpec(**{**self._core, "batch": 1, "len_q": len_q, "len_k": len_k}, **values)

    def batch_groups(self) -> list[tuple[int, ...]]:
        """The batch elements grouped by geometry: one schedule serves each group."""
        members: dict = {}
        for b in range(self.batch):
            members.setdefault(self.geometry(b), []).append(b)
        return [tuple(batches) for batches in members.values()]

    def kv_heads(self, device=None):
        """Index tensor ``[Hq]``: the KV head each query head reads."""
        import torch

        return kv_head_of(torch.arange(self.heads_q, device=device), self.heads_q, self.heads_kv)

    def modify_scores(self, s):
        """The scores after every active score feature (softcap, ...), in registry order."""
        for f in with_role("scores"):
            value = getattr(self, f.name)
            if f.active(value):
                s = f.modify_scores(s, value)
        return s

    def key_lengths(self, batches):
        """Each batch element's key length (``kv_lens`` or ``Sk``), for an index tensor ``batches``."""
        import torch

        return torch.as_tensor(self.geometry(batches).len_k, device=batches.device).expand(len(batches))

    def score_bias(self, batches, rows: slice, cols: slice, dtype):
        """The additive score bias of every active ``"bias"`` feature (ALiBi, ``bias``) on the tile
        ``rows x cols`` of batch elements ``batches`` (an index tensor): ``[len(batches), Hq, rows,
        cols]`` in ``dtype``, or None when there is none. Added after :meth:`modify_scores`."""
        total = None
        for f in with_role("bias"):
            value = getattr(self, f.name)
            if f.active(value):
                part = f.score_bias(value, self, batches, rows, cols, dtype).to(dtype)
                total = part if total is None else total + part
        if total is None:
            return None
        return total.expand(len(batches), self.heads_q, rows.stop - rows.start, cols.stop - cols.start)

    def dense_score_bias(self, dtype, device=None):
        """:meth:`score_bias` of the whole problem: ``[B, Hq, Sq, Sk]`` in ``dtype``, or None (for references
        and the adapters and kernels that take the bias as one table)."""
        import torch

        return self.score_bias(torch.arange(self.batch, device=device), slice(0, self.len_q), slice(0, self.len_k),
                               dtype)

    def allowed(self, device=None):
        """Dense bool ``[B, Hq, Sq, Sk]`` of allowed pairs (for references and tests, not kernels)."""
        import torch

        from attnformal.masks import may_attend

        i = torch.arange(self.len_q, device=device)[:, None]
        j = torch.arange(self.len_k, device=device)[None, :]
        per_batch = torch.stack(
            [torch.as_tensor(may_attend(i, j, self.geometry(b))).expand(self.len_q, self.len_k)
             for b in range(self.batch)]
        )[:, None]
        allowed = per_batch.expand(self.batch, self.heads_q, self.len_q, self.len_k)
        for f in with_role("data"):
            value = getattr(self, f.name)
            if f.active(value):
                allowed = allowed & value.to(device)
        return allowed

    def to_json(self) -> dict:
        """The JSON-able part of the spec (tensor features are data and travel separately: ``has_<name>``)."""
        out = dict(self._core)
        for f in FEATURES:
            value = getattr(self, f.name)
            if f.tensor:
                out[f"has_{f.name}"] = value is not None
            else:
                out[f.name] = f.to_json(value)
        return out

    @classmethod
    def from_inputs(cls, q, k, v, *, scale=None, **keywords) -> AttentionSpec:
        """Validate a call of the implementation protocol and describe it.

        Raises :class:`SpecError` naming the first argument that is wrong, and ``TypeError``
        for a keyword that is no registered feature.
        """
        known = {f.name for f in FEATURES}
        for name in keywords:
            if name not in known:
                raise TypeError(f"unexpected keyword argument {name!r} (protocol features: "
                                f"{', '.join(f.name for f in FEATURES)})")
        _check_dtypes(q, k, v)
        if varlen.packed(keywords):
            batch, heads_q, len_q, head_dim, heads_kv, len_k, head_dim_v = varlen.check_packed(q, k, v, keywords)
        else:
            batch, heads_q, len_q, head_dim = _check_qkv(q, k, v)
            heads_kv, len_k, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
        problem = Problem(batch, heads_q, len_q, len_k, q.device)
        values = {}
        for f in FEATURES:
            values[f.name] = f.validate(keywords.get(f.name, f.default), problem, values)
        for f in FEATURES:
            reason = f.active(values[f.name]) and f.conflict(values)
            if reason:
                raise SpecError(f.name, f"no conflicting feature ({reason})", repr(values[f.name]))
        return cls(batch=batch, heads_q=heads_q, heads_kv=heads_kv, len_q=len_q, len_k=len_k,
                   head_dim=head_dim, head_dim_v=head_dim_v, scale=_check_scale(scale, head_dim), **values)


def describe(t) -> str:
    import torch

    if not isinstance(t, torch.Tensor):
        return f"{type(t).__name__}"
    return f"tensor of shape {tuple(t.shape)}, dtype {str(t.dtype).removeprefix('torch.')}, device {t.device}"


def _check_dtypes(q, k, v):
    """Tensors of one supported floating dtype on one device (either layout)."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(name, "a tensor ([B, H, S, D], or [T, H, D] with cu_seqlens_q/k)", describe(t))
        if str(t.dtype).removeprefix("torch.") not in SUPPORTED_DTYPES:
            raise SpecError(name, f"a floating dtype in {SUPPORTED_DTYPES}", describe(t))
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise SpecError(name, f"the dtype of q ({q.dtype})", describe(t))
        if t.device != q.device:
            raise SpecError(name, f"the device of q ({q.device})", describe(t))


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise SpecError(name, "a 4-D tensor [B, H, S, D]", describe(t))
    batch, heads_q, len_q, head_dim = q.shape
    if head_dim == 0:
        raise SpecError("q", "a head dim D >= 1", describe(q))
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise SpecError("k", f"shape [B={batch}, Hkv, Sk, D={head_dim}] (batch and head dim of q)", describe(k))
    heads_kv, len_k = k.shape[1], k.shape[2]
    if heads_kv == 0 or heads_q % heads_kv:
        raise SpecError("k", f"a KV head count that divides Hq={heads_q} (GQA groups)", f"Hkv={heads_kv}")
    if tuple(v.shape[:3]) != (batch, heads_kv, len_k) or v.shape[3] == 0:
        raise SpecError("v", f"shape [B={batch}, Hkv={heads_kv}, Sk={len_k}, Dv>=1] (as k)", describe(v))
    return batch, heads_q, len_q, head_dim


def _check_scale(scale, head_dim) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise SpecError("scale", "a finite float or None (1/sqrt(D))", repr(scale))
    return float(scale)


def require_dropout_mask(spec):
    """A :class:`SpecError` unless a dropout problem carries the keep-mask a reference replays: without
    it the only reference is the no-dropout one, which would pass a kernel that ignores dropout."""
    if spec.dropout_p > 0 and spec.dropout_mask is None:
        raise SpecError("dropout_mask", "the keep-mask to replay when dropout_p > 0 (a reference cannot "
                        "guess an implementation's random draw)", None)
