"""``torch.nn.functional.scaled_dot_product_attention`` behind the implementation protocol.

Causal masks SDPA knows natively (top-left, or bottom-right when ``Sq == Sk``, where the two
coincide) go through ``is_causal``, which its fused kernels use to skip masked blocks. Every
other index mask (windows, ``kv_lens``, bottom-right with ``Sq != Sk``) has no SDPA flag, so
it is passed as the spec's own dense ``allowed()`` mask -- an ``Sq x Sk`` tensor that SDPA
reads in full: a sweep shows that cost as it is. ``backend`` pins one SDPA backend with
``torch.nn.attention.sdpa_kernel`` (``None`` lets torch choose); a pinned backend that
cannot run the call raises ``NotImplementedError`` carrying torch's reasons. Softcap,
dropout and the log-sum-exp are not offered by SDPA and raise ``NotImplementedError``.
"""

from __future__ import annotations

import functools
import warnings

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnformal.spec import AttentionSpec

NO_BACKEND_ERRORS = ("No viable backend", "No available kernel")  # torch's words for "none eligible"
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def attention(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None,
              softcap=None, dropout_p=0.0, dropout_mask=None, return_lse=False, backend=None):
    """The protocol on SDPA; ``backend`` is None (torch chooses) or a key of :data:`BACKENDS`."""
    spec = AttentionSpec.from_inputs(q, k, v, scale=scale, causal=causal, window=window,
                                     attn_mask=attn_mask, kv_lens=kv_lens, softcap=softcap,
                                     dropout_p=dropout_p, dropout_mask=dropout_mask)
    for feature, used in (("softcap", spec.softcap is not None), ("dropout", spec.dropout_p > 0),
                          ("return_lse", return_lse)):
        if used:
            raise NotImplementedError(f"SDPA adapter: {feature} is not supported")
    native_causal = spec.causal == "top_left" or (spec.causal == "bottom_right" and spec.len_q == spec.len_k)
    index_mask_needed = spec.window is not None or spec.kv_lens is not None or (spec.causal and not native_causal)
    mask = spec.allowed(q.device) if index_mask_needed or attn_mask is not None else None
    call = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask,
                             is_causal=bool(spec.causal) and mask is None, scale=spec.scale,
                             enable_gqa=spec.heads_q != spec.heads_kv)
    if backend is None:
        return call()
    if backend not in BACKENDS:
        raise ValueError(f"argument 'backend': expected None or one of {sorted(BACKENDS)}, got {backend!r}")
    with warnings.catch_warnings(record=True) as reasons, sdpa_kernel([BACKENDS[backend]]):
        warnings.simplefilter("always")  # torch explains a refused backend in warnings
        try:
            return call()
        except RuntimeError as err:
            if not any(text in str(err) for text in NO_BACKEND_ERRORS):
                raise
            why = "; ".join(str(w.message) for w in reasons) or str(err)
            raise NotImplementedError(f"SDPA backend {backend!r} cannot run this call: {why}") from None


def pinned(backend: str):
    """The adapter with SDPA pinned to one backend."""
    pinned_attention = functools.partial(attention, backend=backend)
    pinned_attention.__name__ = f"sdpa[{backend}]"
    return pinned_attention
