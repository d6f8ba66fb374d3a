"""The attention spec: one dataclass that fully describes a problem, and its semantics.

Layout ``[B, H, S, D]``: q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Sk, D]``, v ``[B, Hkv, Sk, Dv]``.

For batch ``b``, query head ``h``, query row ``i`` and key ``j``::

    s[i, j]  = scale * q[b, h, i] . k[b, g(h), j]          g(h) = h // (Hq // Hkv)   (GQA/MQA)
    s[i, j]  = softcap * tanh(s[i, j] / softcap)            if softcap (after scale, before mask)
    s[i, j] += -alibi_slopes[b, h] * |i + Sk_b - Sq - j|    if alibi_slopes (after softcap)
    s[i, j] += bias[b, h, i, j]                             if bias (broadcast; after softcap)
    allowed  = may_attend(i, j, geometry(b)) and attn_mask[b, h, i, j]
    Z[i]     = exp(sinks[h]) + sum_{allowed j} exp(s[i, j])  (exp(sinks[h]) only with sinks)
    p[i, j]  = exp(s[i, j]) / Z[i] at allowed keys, 0 elsewhere
    lse[i]   = log Z[i]                                     (natural log)
    out[i]   = sum_j p[i, j] * keep[i, j] / (1 - dropout_p) * v[b, g(h), j]

Empty-row rule: a row with no allowed key has ``out = 0``, ``lse = -inf`` (``lse = sinks[h]``
with a sink) and zero gradients for q, k, v, never NaN. Dropout never changes ``lse``: it acts on
probabilities, after the denominator, with a keep-mask that is replayed exactly.

A **sink** ``sinks[h]`` is a logit that joins the denominator and carries no value (gpt-oss);
dropout does not apply to it; ``-inf`` is no sink. Its gradient is
``d sinks[h] = sum_{b, i} p_sink (dlse - rowsum(dO * out))`` with ``p_sink = exp(sinks[h] - lse)``.
**ALiBi** follows flash-attention: ``-slope * |i + Sk - Sq - j|``, bottom-right aligned with the
batch's own key length (``kv_lens``), added after scale and softcap (flash-attention
``tests/test_flash_attn.py`` ``attention_ref``/``attn_bias_from_alibi_slopes`` and
``csrc/flash_attn/src/alibi.h`` at commit 0251105a2fb19d2957484b7f023cd8c115286ced); the slopes get
no gradient. An additive ``bias`` (Ascend ``pse``) is added at the same point; its gradient is
``dS`` summed over the dimensions it was broadcast along.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from attnformal import ops
from attnformal.masks import CAUSAL_MODES, MaskGeometry

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64")


class SpecError(ValueError):
    """A problem with the caller's arguments; the message names the argument."""

    def __init__(self, argument: str, expected: str, got: Any):
        self.argument = argument
        super().__init__(f"argument '{argument}': expected {expected}, got {got}")


def kv_head_of(h, heads_q, heads_kv):
    """The KV head that query head ``h`` reads: consecutive groups of ``Hq // Hkv`` share one."""
    return ops.floordiv(h, ops.floordiv(heads_q, heads_kv))  # ops: also on Z3 Ints, for all head counts


def apply_softcap(s, cap):
    """``cap * tanh(s / cap)``: bounds the logits to ``(-cap, cap)`` smoothly."""
    return cap * ops.tanh(s / cap)


def alibi_bias(i, j, slope, len_q, len_k):
    """ALiBi's score bias ``-slope * |i + len_k - len_q - j|`` (flash-attention's convention).

    Zero on the bottom-right diagonal ``j = i + len_k - len_q``, falling linearly on both sides.
    """
    distance = i + len_k - len_q - j
    return -slope * ops.maximum(distance, -distance)


@dataclass(frozen=True)
class AttentionSpec:
    """Everything that defines an attention problem, except the numbers in q, k, v.

    Build it with :meth:`from_inputs`, which validates the call; the two tensor-valued
    parts (``attn_mask``, ``dropout_mask``) stay out of equality and of :meth:`to_json`.
    """

    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    head_dim: int
    head_dim_v: int
    scale: float
    causal: str | None = None
    window: tuple[int, int] | None = None
    kv_lens: tuple[int, ...] | None = None
    softcap: float | None = None
    dropout_p: float = 0.0
    attn_mask: Any = field(default=None, compare=False, repr=False)
    dropout_mask: Any = field(default=None, compare=False, repr=False)
    sinks: Any = field(default=None, compare=False, repr=False)  # [Hq] logits, the caller's tensor
    alibi_slopes: Any = field(default=None, compare=False, repr=False)  # [B, Hq] (a [Hq] one expanded)
    bias: Any = field(default=None, compare=False, repr=False)  # the caller's tensor (its gradient flows)

    @property
    def group(self) -> int:
        """Query heads per KV head (1: MHA, Hq: MQA)."""
        return self.heads_q // self.heads_kv

    def geometry(self, b: int | None = None) -> MaskGeometry:
        """The index mask of batch ``b`` (its own key length when ``kv_lens`` is given).

        ``b`` may also be an index tensor (every batch element at once: the class table) or a
        Z3 Int (the prover's, with ``kv_lens`` a Z3 array).
        """
        len_k = self.len_k if self.kv_lens is None or b is None else _element(self.kv_lens, b)
        return MaskGeometry(self.len_q, len_k, self.causal, self.window, self.attn_mask is not None)

    def kv_heads(self, device=None):
        """Index tensor ``[Hq]``: the KV head each query head reads."""
        import torch

        return kv_head_of(torch.arange(self.heads_q, device=device), self.heads_q, self.heads_kv)

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
        if self.attn_mask is not None:
            allowed = allowed & self.attn_mask.to(device)
        return allowed

    def score_bias(self, batches, rows: slice, cols: slice, dtype):
        """The additive score bias (ALiBi plus ``bias``) of batch elements ``batches`` (an index
        tensor) on a tile of ``rows`` and ``cols``: ``[len(batches), Hq, rows, cols]`` in ``dtype``,
        or None when the problem has neither."""
        if self.alibi_slopes is None and self.bias is None:
            return None
        import torch

        device = batches.device
        total = torch.zeros((), dtype=dtype, device=device)
        if self.alibi_slopes is not None:
            i = torch.arange(rows.start, rows.stop, device=device)[:, None]
            j = torch.arange(cols.start, cols.stop, device=device)[None, :]
            lens = self.len_k if self.kv_lens is None else _element(self.kv_lens, batches)[:, None, None, None]
            slope = self.alibi_slopes.to(device=device, dtype=dtype)[batches][:, :, None, None]
            total = total + alibi_bias(i, j, slope, self.len_q, lens).to(dtype)
        if self.bias is not None:
            full = (self.batch, self.heads_q, self.len_q, self.len_k)
            total = total + self.bias.expand(full)[batches][:, :, rows, cols].to(dtype)
        return total.expand(len(batches), self.heads_q, rows.stop - rows.start, cols.stop - cols.start)

    def to_json(self) -> dict:
        """The JSON-able part of the spec (the masks and the bias are data and travel separately)."""
        skip = {"attn_mask", "dropout_mask", "sinks", "alibi_slopes", "bias"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["window"] = list(self.window) if self.window is not None else None
        out["kv_lens"] = list(self.kv_lens) if self.kv_lens is not None else None
        out["has_attn_mask"] = self.attn_mask is not None
        out["has_dropout_mask"] = self.dropout_mask is not None
        out["sinks"] = None if self.sinks is None else self.sinks.tolist()
        out["alibi_slopes"] = None if self.alibi_slopes is None else self.alibi_slopes.tolist()
        out["has_bias"] = self.bias is not None
        return out

    @classmethod
    def from_inputs(cls, q, k, v, *, scale=None, causal=None, window=None, attn_mask=None,
                    kv_lens=None, softcap=None, dropout_p=0.0, dropout_mask=None, sinks=None,
                    alibi_slopes=None, bias=None) -> AttentionSpec:
        """Validate a call of the implementation protocol and describe it.

        Raises :class:`SpecError` naming the first argument that is wrong.
        """
        batch, heads_q, len_q, head_dim = _check_qkv(q, k, v)
        heads_kv, len_k, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
        full = (batch, heads_q, len_q, len_k)
        dropout_p = _check_dropout_p(dropout_p)
        return cls(
            batch=batch, heads_q=heads_q, heads_kv=heads_kv, len_q=len_q, len_k=len_k,
            head_dim=head_dim, head_dim_v=head_dim_v,
            scale=_check_scale(scale, head_dim),
            causal=_check_causal(causal),
            window=_check_window(window),
            kv_lens=_check_kv_lens(kv_lens, batch, len_k),
            softcap=_check_softcap(softcap),
            dropout_p=dropout_p,
            attn_mask=_check_attn_mask(attn_mask, full, q.device),
            dropout_mask=_check_dropout_mask(dropout_mask, dropout_p, full, q.device),
            sinks=_check_sinks(sinks, heads_q, q.device),
            alibi_slopes=_check_alibi_slopes(alibi_slopes, batch, heads_q, q.device),
            bias=_check_bias(bias, full, q.device),
        )


def _element(values, index):
    """``values[index]``; for an index tensor, element by element."""
    if type(index).__module__.partition(".")[0] == "torch":
        import torch

        return torch.as_tensor(values, dtype=torch.int64, device=index.device)[index]
    return values[index]


def _describe(t) -> str:
    import torch

    if not isinstance(t, torch.Tensor):
        return f"{type(t).__name__}"
    return f"tensor of shape {tuple(t.shape)}, dtype {str(t.dtype).removeprefix('torch.')}, device {t.device}"


def _check_qkv(q, k, v):
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise SpecError(name, "a 4-D tensor [B, H, S, D]", _describe(t))
        if str(t.dtype).removeprefix("torch.") not in SUPPORTED_DTYPES:
            raise SpecError(name, f"a floating dtype in {SUPPORTED_DTYPES}", _describe(t))
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise SpecError(name, f"the dtype of q ({q.dtype})", _describe(t))
        if t.device != q.device:
            raise SpecError(name, f"the device of q ({q.device})", _describe(t))
    batch, heads_q, len_q, head_dim = q.shape
    if head_dim == 0:
        raise SpecError("q", "a head dim D >= 1", _describe(q))
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise SpecError("k", f"shape [B={batch}, Hkv, Sk, D={head_dim}] (batch and head dim of q)", _describe(k))
    heads_kv, len_k = k.shape[1], k.shape[2]
    if heads_kv == 0 or heads_q % heads_kv:
        raise SpecError("k", f"a KV head count that divides Hq={heads_q} (GQA groups)", f"Hkv={heads_kv}")
    if tuple(v.shape[:3]) != (batch, heads_kv, len_k) or v.shape[3] == 0:
        raise SpecError("v", f"shape [B={batch}, Hkv={heads_kv}, Sk={len_k}, Dv>=1] (as k)", _describe(v))
    return batch, heads_q, len_q, head_dim


def _check_scale(scale, head_dim) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise SpecError("scale", "a finite float or None (1/sqrt(D))", repr(scale))
    return float(scale)


def _check_causal(causal):
    if causal not in CAUSAL_MODES:
        raise SpecError("causal", "None, 'top_left' or 'bottom_right'", repr(causal))
    return causal


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_window(window):
    if window is None:
        return None
    if not isinstance(window, Sequence) or len(window) != 2 or not all(_is_int(w) for w in window):
        raise SpecError("window", "None or a pair of ints (left, right); a negative bound is unbounded",
                        repr(window))
    return (int(window[0]), int(window[1]))


def _check_kv_lens(kv_lens, batch, len_k):
    if kv_lens is None:
        return None
    import torch

    values = kv_lens.tolist() if isinstance(kv_lens, torch.Tensor) else kv_lens
    if not isinstance(values, Sequence) or len(values) != batch or not all(_is_int(n) for n in values):
        raise SpecError("kv_lens", f"None or {batch} ints (one key length per batch)", repr(kv_lens))
    if any(not 0 <= n <= len_k for n in values):
        raise SpecError("kv_lens", f"lengths in [0, Sk={len_k}]", repr(list(values)))
    return tuple(int(n) for n in values)


def _check_softcap(softcap):
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (0 < softcap < math.inf):
        raise SpecError("softcap", "None or a finite float > 0", repr(softcap))
    return float(softcap)


def _check_dropout_p(p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise SpecError("dropout_p", "a float in [0, 1)", repr(p))
    return float(p)


def _check_attn_mask(mask, full, device):
    if mask is None:
        return None
    import torch

    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise SpecError("attn_mask", "a bool tensor (True = may attend) or None", _describe(mask))
    try:
        expanded = mask.expand(full)
    except RuntimeError:
        raise SpecError("attn_mask", f"a shape broadcastable to [B, Hq, Sq, Sk] = {list(full)}",
                        _describe(mask)) from None
    if mask.device != device:
        raise SpecError("attn_mask", f"the device of q ({device})", _describe(mask))
    return expanded


def _check_dropout_mask(mask, p, full, device):
    if mask is None:
        return None
    import torch

    if p == 0.0:
        raise SpecError("dropout_mask", "None when dropout_p is 0 (a keep-mask needs dropout_p > 0)",
                        _describe(mask))
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != full:
        raise SpecError("dropout_mask", f"a bool keep-mask of shape [B, Hq, Sq, Sk] = {list(full)}",
                        _describe(mask))
    if mask.device != device:
        raise SpecError("dropout_mask", f"the device of q ({device})", _describe(mask))
    return mask


def _check_float_tensor(name, t, expected, device):
    import torch

    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise SpecError(name, f"None or a floating tensor {expected}", _describe(t))
    if t.device != device:
        raise SpecError(name, f"the device of q ({device})", _describe(t))


def _check_sinks(sinks, heads_q, device):
    if sinks is None:
        return None
    import torch

    _check_float_tensor("sinks", sinks, f"[Hq={heads_q}] (one logit per query head)", device)
    if tuple(sinks.shape) != (heads_q,):
        raise SpecError("sinks", f"shape [Hq={heads_q}] (one logit per query head)", _describe(sinks))
    if bool(torch.isnan(sinks).any()) or bool(torch.isposinf(sinks).any()):
        raise SpecError("sinks", "finite logits or -inf (no sink)", repr(sinks.tolist()))
    return sinks


def _check_alibi_slopes(slopes, batch, heads_q, device):
    if slopes is None:
        return None
    import torch

    expected = f"[Hq={heads_q}] or [B={batch}, Hq={heads_q}]"
    _check_float_tensor("alibi_slopes", slopes, expected, device)
    if tuple(slopes.shape) not in ((heads_q,), (batch, heads_q)):
        raise SpecError("alibi_slopes", f"shape {expected}", _describe(slopes))
    if not bool(torch.isfinite(slopes).all()):
        raise SpecError("alibi_slopes", "finite slopes", repr(slopes.tolist()))
    return slopes.detach().expand(batch, heads_q)  # ALiBi slopes are constants: no gradient


def _check_bias(bias, full, device):
    if bias is None:
        return None
    import torch

    _check_float_tensor("bias", bias, f"broadcastable to [B, Hq, Sq, Sk] = {list(full)}", device)
    try:
        bias.expand(full)
    except RuntimeError:
        raise SpecError("bias", f"a shape broadcastable to [B, Hq, Sq, Sk] = {list(full)}", _describe(bias)) from None
    if not bool(torch.isfinite(bias).all()):
        raise SpecError("bias", "finite values (mask pairs with attn_mask, not with -inf)", _describe(bias))
    return bias
