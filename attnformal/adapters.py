"""Adapters: existing attention kernels behind the implementation protocol.

Each adapter validates the call with :meth:`AttentionSpec.from_inputs`, translates the
protocol's arguments into the kernel's own, and raises ``NotImplementedError`` (with the
reason) for what the kernel cannot do, so the battery reports it as *unsupported*.
Optional packages are imported only when their adapter is called.

Masks reach a kernel in its own native form where it has one (SDPA's ``is_causal``,
flash_attn's ``causal``/``window_size``, torch_npu's ``sparse_mode`` from
:func:`attnformal.npu.npu_mask_args`); otherwise as the dense boolean mask of the spec
(``spec.allowed()``), so no second copy of the mask rule is written here.

``ALIASES`` gives the short names the command line accepts (``--impl sdpa-math``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import math
import os
import sys
import warnings

import torch

from attnformal.aliases import FUNCTIONS
from attnformal.features import mask_features, refuse_unsupported
from attnformal.spec import AttentionSpec


def adapter(supports):
    """Decorator: a protocol function from ``translate(spec, q, k, v, return_lse)``; the call is validated
    once, here, and an active feature outside ``supports`` is refused (``NotImplementedError`` naming it)."""
    supports = frozenset(supports)

    def wrap(translate):
        @functools.wraps(translate)
        def impl(q, k, v, *, return_lse=False, **protocol):
            spec = AttentionSpec.from_inputs(q, k, v, **protocol)
            refuse_unsupported(spec, supports, _name(translate))
            return translate(spec, q, k, v, return_lse)

        impl.SUPPORTS = supports
        return impl

    return wrap


def _name(translate) -> str:
    if isinstance(translate, functools.partial):
        return f"{translate.func.__name__}{translate.args}"
    return translate.__name__


# Every mask feature: what an adapter that takes the spec's dense mask (``spec.allowed()``) computes.
DENSE_MASKS = frozenset({"causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask"})


def _optional(module: str):
    """Import an optional package, or report the adapter as unsupported."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise NotImplementedError(f"{module} is not installed") from None


def _masked(spec: AttentionSpec) -> bool:
    """Whether any mask feature (an index rule, per-batch lengths, mask data) is active."""
    return bool(_active_masks(spec))


def _masked_beyond(spec: AttentionSpec, *native: str) -> bool:
    """Whether a mask feature other than ``native`` (those the kernel takes natively) is active."""
    return bool(_active_masks(spec) - set(native))


def _active_masks(spec: AttentionSpec) -> set[str]:
    return {f.name for f in mask_features() if f.active(getattr(spec, f.name))}


def _refuse(condition, reason):
    if condition:
        raise NotImplementedError(reason)


# ---------------------------------------------------------------- torch SDPA, one backend at a time


def _sdpa(backend_name, spec, q, k, v, return_lse):
    """SDPA with one backend pinned (``backend_name`` of ``SDPBackend``), or torch's choice (None)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    _refuse(return_lse, "torch SDPA does not return the log-sum-exp")
    _refuse(spec.dropout_mask is not None, "torch SDPA draws its own dropout mask and cannot replay a given one")
    # SDPA's is_causal is top-left (the same as bottom-right when Sq == Sk), and its fused kernels
    # skip the masked blocks; every other mask goes in as the spec's dense mask, read in full.
    square = spec.len_q == spec.len_k
    native_causal = (spec.causal == "top_left" or (spec.causal == "bottom_right" and square)) \
        and not _masked_beyond(spec, "causal")
    mask = None
    if not native_causal and _masked(spec):
        mask = spec.allowed(q.device)
    bias = spec.dense_score_bias(q.dtype, q.device)
    if bias is not None:  # SDPA adds a float attn_mask to the scaled scores: ALiBi and bias go in there
        allowed = mask if mask is not None else torch.ones((), dtype=torch.bool, device=q.device)
        if native_causal:
            allowed = allowed & spec.allowed(q.device)
            native_causal = False  # SDPA takes is_causal or attn_mask, not both
        mask = bias.masked_fill(~allowed, float("-inf"))
    pinned = contextlib.nullcontext() if backend_name is None else sdpa_kernel(getattr(SDPBackend, backend_name))
    # A backend that refuses the inputs says why in warnings; they become the unsupported reason.
    with pinned, warnings.catch_warnings(record=True) as reasons:
        warnings.simplefilter("always")
        try:
            return scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=spec.dropout_p,
                                                is_causal=native_causal, scale=spec.scale,
                                                enable_gqa=spec.group > 1)
        except RuntimeError as err:
            if _TORCH_CANNOT_RUN_HERE in str(err):
                raise NotImplementedError(f"SDPA {backend_name} backend cannot run {q.dtype} here: torch's CPU "
                                          f"kernel needs AVX-512 but ATEN_CPU_CAPABILITY is "
                                          f"{os.environ.get('ATEN_CPU_CAPABILITY')!r} ({err})") from None
            if not any(words in str(err) for words in ("No available kernel", "No viable backend")):
                raise
            why = "; ".join(str(w.message).partition(" (Triggered")[0] for w in reasons) or str(err)
            raise NotImplementedError(f"SDPA {backend_name} backend refuses these inputs: {why}") from None


# torch's CPU flash kernel packs bf16/fp16 for AMX/AVX-512 when the CPU has them, even when
# ATEN_CPU_CAPABILITY selects a lower vector path, and then fails: the kernel cannot run in that
# configuration (torch 2.13 on an AMX CPU under ATEN_CPU_CAPABILITY=default or avx2).
_TORCH_CANNOT_RUN_HERE = "pack_vnni2 is only supported when avx512 is supported"

SDPA_SUPPORTS = DENSE_MASKS | {"dropout_p", "alibi_slopes", "bias"}  # no softcap, no sinks; its own dropout mask
sdpa = adapter(SDPA_SUPPORTS)(functools.partial(_sdpa, None))
sdpa_math = adapter(SDPA_SUPPORTS)(functools.partial(_sdpa, "MATH"))
sdpa_flash = adapter(SDPA_SUPPORTS)(functools.partial(_sdpa, "FLASH_ATTENTION"))
sdpa_efficient = adapter(SDPA_SUPPORTS)(functools.partial(_sdpa, "EFFICIENT_ATTENTION"))
sdpa_cudnn = adapter(SDPA_SUPPORTS)(functools.partial(_sdpa, "CUDNN_ATTENTION"))


# ---------------------------------------------------------------- flex_attention, eager and compiled


def _flex(compiled, spec, q, k, v, return_lse):
    from torch.nn.attention.flex_attention import flex_attention

    _refuse(0 in (spec.len_q, spec.len_k), "flex_attention needs at least one query and one key")
    if compiled and q.device.type == "cpu":
        _refuse(return_lse, "compiled flex_attention on CPU does not return lse (torch limitation)")
        _refuse(q.requires_grad or k.requires_grad or v.requires_grad,
                "compiled flex_attention on CPU is inference only (torch limitation)")
        _refuse(q.dtype == torch.float64, "compiled flex_attention on CPU supports fp16, bf16 and fp32 only")
    kernel = _compiled_flex() if compiled else flex_attention
    result = kernel(q, k, v, score_mod=_score_mod(spec, q), block_mask=_block_mask(spec, q.device),
                    scale=spec.scale, enable_gqa=spec.group > 1, **_flex_lse_request(return_lse))
    if not return_lse:
        return result
    out, aux = result
    return out, getattr(aux, "lse", aux)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _flex_lse_request(return_lse):
    if not return_lse:
        return {}
    from torch.nn.attention import flex_attention as flex_module

    if hasattr(flex_module, "AuxRequest"):
        return {"return_aux": flex_module.AuxRequest(lse=True)}
    return {"return_lse": True}


def _block_mask(spec: AttentionSpec, device):
    """The spec's dense mask as a flex BlockMask (None when nothing is masked)."""
    if not _masked(spec):
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    allowed = spec.allowed(device)
    heads = spec.heads_q if spec.attn_mask is not None else None
    if heads is None:
        allowed = allowed[:, :1]

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed[b, 0 if heads is None else h, q_idx, kv_idx]

    return create_block_mask(mask_mod, spec.batch, heads, spec.len_q, spec.len_k, device=device)


def _score_mod(spec: AttentionSpec, q):
    """The spec's score changes as a flex score_mod: softcap, then the score bias (ALiBi, ``bias``) read from
    the spec's own dense ``score_bias`` table, as the SDPA adapter adds it (None when there are neither)."""
    cap = spec.softcap
    bias = spec.dense_score_bias(torch.promote_types(q.dtype, torch.float32), q.device)  # [B, Hq, Sq, Sk]
    if cap is None and bias is None:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        return score if bias is None else score + bias[b, h, q_idx, kv_idx]

    return score_mod


FLEX_SUPPORTS = DENSE_MASKS | {"softcap", "alibi_slopes", "bias"}  # no dropout, no sinks
flex_eager = adapter(FLEX_SUPPORTS)(functools.partial(_flex, False))
flex_compiled = adapter(FLEX_SUPPORTS)(functools.partial(_flex, True))


# ---------------------------------------------------------------- the project's own kernels


def torch_tiled(q, k, v, *, schedule=None, **kwargs):
    """attnformal's torch tiled kernel: its default schedule (128 x 128 tiles), or ``schedule`` (which
    ``python -m attnformal.scale`` passes: the one it predicts the work from)."""
    from attnformal.kernels.torch_tiled import attention

    return attention(q, k, v, schedule=schedule, **kwargs)


def torch_tiled_small(q, k, v, **kwargs):
    """attnformal's torch tiled kernel with 16 x 16 tiles: many tiles, ragged edges everywhere."""
    from attnformal.kernels.torch_tiled import attention
    from attnformal.schedule import TileSchedule

    return attention(q, k, v, schedule=TileSchedule(block_m=16, block_n=16), **kwargs)


def torch_tiled_split(q, k, v, **kwargs):
    """attnformal's torch tiled kernel, split-KV: 32 x 32 tiles in 3 partial states merged at the end."""
    from attnformal.kernels.torch_tiled import attention
    from attnformal.schedule import TileSchedule

    return attention(q, k, v, schedule=TileSchedule(block_m=32, block_n=32, num_splits=3), **kwargs)


def ring(q, k, v, **kwargs):
    """attnformal's ring attention: key slices on 3 gloo ranks (processes), states merged around the ring."""
    from attnformal.kernels.ring import attention

    return attention(q, k, v, **kwargs)


def triton_flash(q, k, v, **kwargs):
    """attnformal's Triton kernel; CPU tensors run it under the Triton interpreter."""
    if q.device.type == "cpu" and "attnformal.kernels.triton_flash" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton reads it when the kernels are decorated
    try:
        from attnformal.kernels.triton_flash import attention
    except ImportError as err:
        raise NotImplementedError(f"attnformal.kernels.triton_flash is not available: {err}") from None
    return attention(q, k, v, **kwargs)


# ---------------------------------------------------------------- flash_attn (CUDA)


# Both adapters follow flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced
# (flash_attn/flash_attn_interface.py, csrc/flash_attn/src/). FLASH_ATTN_DEVICES: where flash_attn runs
# (tests/verify/test_adapters.py adds "cpu" for a stand-in module written from its documentation).
FLASH_ATTN_DEVICES = ("cuda",)


def _flash_attn_common(spec, q, return_lse, lengths) -> dict:
    """The refusals and keywords both flash_attn entry points share; ``lengths``: ``(len_q, len_k)`` per
    sequence. ALiBi: fp32 ``[B, Hq]``, row ``b`` for batch element (sequence) ``b`` with its own lengths
    (``flash_fwd_kernel.h`` reads ``alibi_slopes[bidb * batch_stride + bidh]``, ``binfo.actual_seqlen_k/q``);
    with causal the kernel adds ``slope * j`` instead (``mask.h``): the same out, an lse shifted per row,
    so that lse is refused."""
    _refuse(q.device.type not in FLASH_ATTN_DEVICES, "flash_attn runs on CUDA only")
    _refuse(q.dtype not in (torch.float16, torch.bfloat16), "flash_attn supports fp16 and bf16 only")
    _refuse(spec.head_dim_v != spec.head_dim, "flash_attn needs Dv = D")
    _refuse(spec.causal == "top_left" and any(lq != lk for lq, lk in lengths),
            "flash_attn's causal mask is bottom-right")
    alibi = spec.alibi_slopes
    _refuse(return_lse and alibi is not None and spec.causal is not None,
            "flash_attn's causal ALiBi adds slope * j: its lse is shifted per row (out alone is the spec's)")
    left, right = spec.window if spec.window is not None else (-1, -1)
    return dict(dropout_p=spec.dropout_p, softmax_scale=spec.scale, causal=spec.causal is not None,
                window_size=(max(left, -1), max(right, -1)), softcap=spec.softcap or 0.0,
                alibi_slopes=None if alibi is None else alibi.to(q.device, torch.float32).contiguous(),
                return_attn_probs=return_lse)


def _spec_lse(lse):
    """flash_attn's lse in the spec's convention: a row with no allowed key has lse ``+inf`` there
    (``softmax.h``: ``sum == 0`` gives ``Split ? -INFINITY : INFINITY``, so it depends on the kernel's
    split heuristic), ``-inf`` (log 0) in the spec."""
    return lse.masked_fill(lse == math.inf, -math.inf)


@adapter({"causal", "window", "softcap", "dropout_p", "alibi_slopes"})  # it draws its own dropout mask
def flash_attn(spec, q, k, v, return_lse):
    """flash_attn.flash_attn_func ([B, S, H, D] layout, causal and window aligned bottom-right)."""
    flash_attn_func = _optional("flash_attn").flash_attn_func
    keywords = _flash_attn_common(spec, q, return_lse, [(spec.len_q, spec.len_k)])
    result = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **keywords)
    if not return_lse:
        return result.transpose(1, 2)
    out, lse, _ = result
    return out.transpose(1, 2), _spec_lse(lse)


@adapter({"causal", "window", "softcap", "dropout_p", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k"})
def flash_attn_varlen(spec, q, k, v, return_lse):
    """flash_attn.flash_attn_varlen_func (packed [T, H, D], cu_seqlens int32; lse [Hq, Tq] transposed to the
    protocol's [Tq, Hq]). Each sequence's causal, window and ALiBi alignment is its own bottom-right, as the
    spec's ``spec.sequence(b)``."""
    varlen_func = _optional("flash_attn").flash_attn_varlen_func
    _refuse(not spec.packed, "flash_attn_varlen_func takes a packed batch (cu_seqlens_q/k)")
    lengths = [spec.sequence_lengths(b) for b in range(spec.batch)]
    keywords = _flash_attn_common(spec, q, return_lse, lengths)
    cu_q, cu_k = (torch.tensor(cu, dtype=torch.int32, device=q.device) for cu in (spec.cu_seqlens_q, spec.cu_seqlens_k))
    result = varlen_func(q, k, v, cu_q, cu_k, max(lq for lq, _ in lengths), max(lk for _, lk in lengths), **keywords)
    if not return_lse:
        return result
    out, lse, _ = result
    return out, _spec_lse(lse.transpose(0, 1))


# ---------------------------------------------------------------- xformers


@adapter(DENSE_MASKS | {"dropout_p"})  # no softcap; it draws its own dropout mask
def xformers(spec, q, k, v, return_lse):
    """xformers.ops.memory_efficient_attention ([B, M, H, K] layout; GQA as [B, M, G, H, K])."""
    xops = _optional("xformers.ops")
    _refuse(return_lse, "the xformers adapter does not return lse")
    bias = None
    if spec.causal == "top_left" and not _masked_beyond(spec, "causal"):
        bias = xops.LowerTriangularMask()
    elif spec.causal == "bottom_right" and not _masked_beyond(spec, "causal"):
        bias = xops.fmha.attn_bias.LowerTriangularFromBottomRightMask()
    elif _masked(spec):
        bias = torch.zeros(spec.batch, spec.heads_q, spec.len_q, spec.len_k, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~spec.allowed(q.device), -math.inf)
    group = spec.group
    qx = q.transpose(1, 2).unflatten(2, (spec.heads_kv, group))  # [B, M, G, H, K]
    kx, vx = (t.transpose(1, 2)[:, :, :, None].expand(-1, -1, -1, group, -1) for t in (k, v))
    if isinstance(bias, torch.Tensor):
        bias = bias.unflatten(1, (spec.heads_kv, group))
    out = xops.memory_efficient_attention(qx, kx, vx, attn_bias=bias, p=spec.dropout_p, scale=spec.scale)
    return out.flatten(2, 3).transpose(1, 2)


# ---------------------------------------------------------------- torch_npu (Ascend)


# no softcap and no sinks (no such parameters); it draws its own dropout mask
@adapter(DENSE_MASKS | {"dropout_p", "alibi_slopes", "bias", "cu_seqlens_q", "cu_seqlens_k"})
def npu_fusion_attention(spec, q, k, v, return_lse):
    """torch_npu.npu_fusion_attention in BNSD layout.

    Its ``scale`` defaults to 1 (so the spec's scale is always passed) and its mask is True
    where attention is *forbidden*. Causal and window masks use the sparse mode that
    :func:`attnformal.npu.npu_mask_args` maps them to (proven by the prover); explicit masks and
    per-batch lengths, or a geometry it does not map, go in whole (sparse mode 1). ALiBi and the
    bias go in as ``pse`` with ``pse_type = 0`` (:func:`attnformal.npu.npu_pse`).
    """
    from attnformal.npu import NPU_PSE_TYPE, npu_pse

    torch_npu = _optional("torch_npu")
    if spec.packed:
        return _npu_tnd(torch_npu, spec, q, k, v, return_lse)
    sparse_mode, pre_tokens, next_tokens, forbidden = _npu_mask(spec, q.device)
    pse = npu_pse(spec, q.device, q.dtype)
    position = {} if pse is None else {"pse": pse, "pse_type": NPU_PSE_TYPE}
    outputs = torch_npu.npu_fusion_attention(q, k, v, spec.heads_q, "BNSD", atten_mask=forbidden, scale=spec.scale,
                                             keep_prob=1.0 - spec.dropout_p, pre_tockens=pre_tokens,
                                             next_tockens=next_tokens, sparse_mode=sparse_mode, **position)
    return _npu_result(outputs, return_lse)


def _npu_tnd(torch_npu, spec, q, k, v, return_lse):
    """A packed batch in TND layout: :func:`attnformal.npu.npu_varlen_args` (cumulative actual_seq_qlen/kvlen,
    the sequence's mask mode; obligation 9 proves both). Modes 2-4 take the compressed triangle."""
    from attnformal.npu import npu_varlen_args

    _refuse(_masked_beyond(spec, "causal", "window"), "a packed batch on the NPU maps causal and window only")
    _refuse(spec.alibi_slopes is not None or spec.bias is not None,
            "a packed batch on the NPU takes no pse here (its TND layout for pse is not documented)")
    arguments = npu_varlen_args(spec)
    n = NPU_COMPRESSED_MASK
    forbidden = None if arguments["sparse_mode"] == 0 else torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    outputs = torch_npu.npu_fusion_attention(q, k, v, spec.heads_q, atten_mask=forbidden, scale=spec.scale,
                                             keep_prob=1.0 - spec.dropout_p, **arguments)
    return _npu_result(outputs, return_lse)


def _npu_result(outputs, return_lse):
    """out, and with ``return_lse`` the lse from npu_fusion_attention's softmax max and sum (``[..., 8]``:
    8 equal copies, in BNSD ``[B, N, S, 8]`` and TND ``[T, N, 8]`` alike)."""
    out, softmax_max, softmax_sum = outputs[:3]
    if not return_lse:
        return out
    return out, softmax_max[..., 0] + torch.log(softmax_sum[..., 0])


NPU_COMPRESSED_MASK = 2048  # sparse modes 2, 3, 4 take this fixed upper-triangular mask


def _npu_mask(spec: AttentionSpec, device):
    """``(sparse_mode, pre_tokens, next_tokens, atten_mask)`` for npu_fusion_attention.

    The index masks use the sparse mode :func:`attnformal.npu.npu_mask_args` proves equivalent;
    an explicit mask, per-batch lengths or a geometry no mode expresses go in whole (mode 1).
    """
    from attnformal.npu import INT_MAX, npu_atten_mask, npu_mask_args

    if not _masked_beyond(spec, "causal", "window"):  # a geometry shared by every batch element
        try:
            mode, pre_tokens, next_tokens = npu_mask_args(spec.geometry())
        except NotImplementedError:
            mode = None
        if mode == 0:
            return 0, pre_tokens, next_tokens, None
        if mode in (2, 3, 4):
            n = NPU_COMPRESSED_MASK
            return mode, pre_tokens, next_tokens, torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return 1, INT_MAX, INT_MAX, npu_atten_mask(spec.allowed(device))


ALIASES = {alias: globals()[function] for alias, function in FUNCTIONS.items()}  # named in attnformal.aliases


# The optional package each adapter needs: without it the alias is a usage error, not a run
# in which every check is unsupported.
REQUIRES = {"triton-flash": "triton", "flash-attn": "flash_attn", "flash-attn-varlen": "flash_attn", "xformers": "xformers",
            "npu": "torch_npu"}


def resolve(target: str):
    """An alias of :data:`ALIASES`, or ``MODULE:FUNC`` / ``FILE.py:FUNC``."""
    if target in ALIASES:
        package = REQUIRES.get(target)
        if package is not None and package not in sys.modules and importlib.util.find_spec(package) is None:
            raise ValueError(f"argument '--impl': {target} needs the package {package}, which is not installed here")
        return ALIASES[target]
    if ":" not in target:
        raise ValueError(f"argument '--impl': expected one of {', '.join(ALIASES)} or MODULE:FUNC or "
                         f"FILE.py:FUNC, got {target!r}")
    from attnformal.impl import load_impl

    impl = load_impl(target)
    if not callable(impl):
        raise ValueError(f"argument '--impl': {target} is a {type(impl).__name__}, not a function")
    return impl
