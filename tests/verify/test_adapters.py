"""Adapters: aliases, missing packages reported as unsupported, and the torch_npu translation."""

import importlib.util
import math
import sys
import types
from itertools import pairwise

import pytest
import torch

from attnformal import adapters
from attnformal.npu import INT_MAX, npu_keeps
from attnformal.verify import Settings, run_battery
from attnformal.verify.report import render


def test_aliases_and_targets_resolve():
    assert adapters.resolve("sdpa-math") is adapters.sdpa_math
    assert adapters.resolve("attnformal.kernels.torch_tiled:attention").__name__ == "attention"
    with pytest.raises(ValueError, match="argument '--impl'"):
        adapters.resolve("sdpa-maths")


@pytest.mark.parametrize("alias, package", sorted(adapters.REQUIRES.items()))
def test_an_alias_whose_package_is_missing_is_a_usage_error(alias, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    with pytest.raises(ValueError, match=f"argument '--impl': {alias} needs the package {package}"):
        adapters.resolve(alias)


@pytest.mark.parametrize("message, refused", [
    ("pack_vnni2 is only supported when avx512 is supported", True),  # torch's kernel cannot run here
    ("some other kernel error", False),  # a real failure stays a failure
])
def test_sdpa_reports_a_kernel_torch_cannot_run_under_this_capability(monkeypatch, message, refused):
    def failing_sdpa(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", failing_sdpa)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    q = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    expected = (NotImplementedError, "cannot run torch.bfloat16 here.*ATEN_CPU_CAPABILITY is 'avx2'") if refused \
        else (RuntimeError, message)
    with pytest.raises(expected[0], match=expected[1]):
        adapters.sdpa_flash(q, q, q)


@pytest.mark.parametrize("package, adapter", [("flash_attn", adapters.flash_attn), ("xformers", adapters.xformers),
                                              ("torch_npu", adapters.npu_fusion_attention)])
def test_an_adapter_called_without_its_package_refuses_not_crashes(package, adapter):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(NotImplementedError, match=f"{package}[.a-z]* is not installed"):
        adapter(q, q, q)


def fake_npu_fusion_attention(mask_means_attend=False, pse_inside_scale=False):
    """npu_fusion_attention's documented contract in plain torch: BNSD, scale defaults to 1, the
    sparse modes of :func:`attnformal.npu.npu_keeps` (atten_mask True = masked out), ``pse`` added
    after the scale unless ``pse_type = 1`` (then inside it), softmax max and sum returned as
    [B, N, S, 8]. ``pse_inside_scale``: the negative control, every pse read as pse_type 1."""
    def npu_fusion_attention(query, key, value, head_num, input_layout, *, atten_mask=None, scale=1.0,
                             keep_prob=1.0, pre_tockens=INT_MAX, next_tockens=INT_MAX, sparse_mode=0, pse=None,
                             pse_type=1, actual_seq_qlen=None, actual_seq_kvlen=None):
        if input_layout == "TND":  # cumulative lengths without the leading 0; the mode applies per sequence
            outs, maxes, sums = [], [], []
            for (q0, q1), (k0, k1) in zip(pairwise([0, *actual_seq_qlen]), pairwise([0, *actual_seq_kvlen])):
                one = [t[a:b].transpose(0, 1)[None] for t, a, b in ((query, q0, q1), (key, k0, k1), (value, k0, k1))]
                out, m, l, *_ = npu_fusion_attention(*one, head_num, "BNSD", atten_mask=atten_mask, scale=scale,
                                                     pre_tockens=pre_tockens, next_tockens=next_tockens,
                                                     sparse_mode=sparse_mode)
                outs.append(out[0].transpose(0, 1))
                maxes.append(m[0].transpose(0, 1))
                sums.append(l[0].transpose(0, 1))
            return torch.cat(outs), torch.cat(maxes), torch.cat(sums), None, 0, 0, 0
        assert input_layout == "BNSD" and head_num == query.shape[1] and keep_prob == 1.0
        len_q, len_k = query.shape[2], key.shape[2]
        per_position = None
        if sparse_mode in (0, 1) and atten_mask is not None:
            per_position = ~atten_mask if mask_means_attend else atten_mask
        if sparse_mode in (2, 3, 4):
            assert atten_mask.shape == (2048, 2048) and bool((atten_mask == atten_mask.new_ones(2048, 2048).triu(1)).all())
        keep = npu_keeps(torch.arange(len_q)[:, None], torch.arange(len_k)[None, :], sparse_mode=sparse_mode,
                         pre_tokens=pre_tockens, next_tokens=next_tockens, len_q=len_q, len_k=len_k,
                         atten_mask=per_position)
        group = query.shape[1] // key.shape[1]
        k, v = (t.repeat_interleave(group, 1).float() for t in (key, value))
        s = query.float() @ k.transpose(-1, -2)
        if pse is not None and (pse_type == 1 or pse_inside_scale):
            s = s + pse.float()
        s = scale * s
        if pse is not None and pse_type != 1 and not pse_inside_scale:
            s = s + pse.float()
        s = s.masked_fill(~keep, -math.inf)
        m = s.amax(-1, keepdim=True) if len_k else s.sum(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, 0.0)
        e = torch.exp(s - m)
        l = e.sum(-1, keepdim=True)
        out = (e / torch.where(l > 0, l, 1.0)) @ v
        return out.to(query.dtype), m.expand(*m.shape[:3], 8), l.expand(*l.shape[:3], 8), None, 0, 0, 0
    return npu_fusion_attention


def npu_battery(monkeypatch, only=("hand.*", "fwd.gqa", "mask.*", "lse.values", "softmax.*"), **fake):
    monkeypatch.setitem(sys.modules, "torch_npu", types.SimpleNamespace(
        npu_fusion_attention=fake_npu_fusion_attention(**fake)))
    return run_battery(Settings(impl=adapters.npu_fusion_attention, impl_name="fake npu", dtypes=(torch.float32,),
                                only=only))


def test_npu_adapter_passes_scale_sparse_modes_and_the_inverted_mask(monkeypatch):
    """The documented NPU semantics behind the adapter's mapping (npu_mask_args) pass the battery."""
    report = npu_battery(monkeypatch)
    assert report.passed, render(report)


def test_npu_adapter_test_fails_when_the_mask_convention_is_wrong(monkeypatch):
    """Negative control: a kernel reading the mask as True = attend is caught."""
    assert not npu_battery(monkeypatch, mask_means_attend=True).passed


def test_npu_adapter_maps_alibi_and_bias_to_pse_and_refuses_sinks(monkeypatch):
    """ALiBi and bias as pse (pse_type 0: added after the scale) pass; sinks are refused (no parameter);
    the negative control reads every pse inside the scale and is caught."""
    only = ("fwd.alibi", "fwd.bias", "fwd.sinks")
    report = npu_battery(monkeypatch, only=only)
    assert report.passed, render(report)
    assert {r.check: r.status for r in report.results}["fwd.sinks"] == "unsupported"
    assert not npu_battery(monkeypatch, only=only, pse_inside_scale=True).passed


def test_npu_tnd_call_is_judged_by_the_packed_check(monkeypatch):
    """A packed batch goes to the NPU as TND; the same call with sparse mode 2 (top-left) for 3 is caught."""
    from attnformal import npu

    monkeypatch.setitem(sys.modules, "torch_npu", types.SimpleNamespace(
        npu_fusion_attention=fake_npu_fusion_attention()))
    settings = Settings(impl=adapters.npu_fusion_attention, impl_name="fake npu", dtypes=(torch.float32,),
                        only=("mask.packed",))
    assert [r.status for r in run_battery(settings).results] == ["pass"]
    mapped = npu.npu_varlen_args
    monkeypatch.setattr(npu, "npu_varlen_args", lambda spec: {**mapped(spec), "sparse_mode": 2}
                        if mapped(spec)["sparse_mode"] == 3 else mapped(spec))
    assert [r.status for r in run_battery(settings).results] == ["FAIL"]


TRITON_ON_CPU = """
import os, torch
from attnformal.adapters import triton_flash
q = torch.randn(1, 1, 20, 16)
out = triton_flash(q, q, q)
print(os.environ.get("TRITON_INTERPRET"), tuple(out.shape))
"""

TRITON_IMPORTED_WITHOUT_INTERPRETER = """
import torch
import attnformal.kernels.triton_flash
from attnformal.adapters import triton_flash
q = torch.randn(1, 1, 20, 16)
try:
    triton_flash(q, q, q)
except NotImplementedError as err:
    print("unsupported:", err)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
                    reason="needs triton, and a machine without CUDA")
def test_triton_adapter_runs_cpu_tensors_under_the_interpreter():
    import os
    import subprocess

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = lambda code: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,  # noqa: E731
                                      text=True, check=True).stdout
    assert run(TRITON_ON_CPU).split() == ["1", "(1,", "1,", "20,", "16)"]
    # Too late to switch to the interpreter once the kernels are decorated: unsupported, with the reason.
    assert "run only under the Triton interpreter" in run(TRITON_IMPORTED_WITHOUT_INTERPRETER)


def fake_flash_attn_dense(q, k, v, *, softmax_scale, causal, window_size, softcap, alibi_slopes, flip_window=False):
    """One batch element of flash_attn's documented contract in plain torch: q ``[Sq, Hq, D]``, k, v
    ``[Sk, Hkv, D]``; bottom-right causal and window ``(left, right)`` (-1: unbounded); softcap on the
    scaled scores; ALiBi ``slopes [Hq]``: ``-slope * |i + Sk - Sq - j|``, or ``+slope * j`` with causal
    (``mask.h``); an empty row gives out 0 and lse ``+inf`` (``softmax.h``, unsplit). ``flip_window``: the
    negative control, left and right read the other way round. Returns out ``[Sq, Hq, D]``, lse ``[Hq, Sq]``."""
    len_q, len_k = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, 1) for t in (k, v))
    s = softmax_scale * torch.einsum("ihd,jhd->hij", q.float(), k)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    diagonal = torch.arange(len_q)[:, None] + len_k - len_q  # the key on row i's bottom-right diagonal
    j = torch.arange(len_k)[None, :]
    if alibi_slopes is not None:
        slope = alibi_slopes.float()[:, None, None]
        s = s + (slope * j if causal else -slope * (diagonal - j).abs())
    left, right = window_size[::-1] if flip_window else window_size
    keep = torch.ones(len_q, len_k, dtype=torch.bool)
    if causal:
        keep &= j <= diagonal
    if left >= 0:
        keep &= j >= diagonal - left
    if right >= 0:
        keep &= j <= diagonal + right
    s = s.masked_fill(~keep, -math.inf)
    row_max = s.amax(-1, keepdim=True) if len_k else s.sum(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(row_max), row_max, 0.0))
    total = e.sum(-1, keepdim=True)
    out = torch.einsum("hij,jhd->ihd", e / torch.where(total > 0, total, 1.0), v)
    lse = torch.where(total > 0, torch.log(total) + torch.where(torch.isfinite(row_max), row_max, 0.0), math.inf)
    return out.to(q.dtype), lse[..., 0]


def fake_flash_attn(**control):
    """A stand-in ``flash_attn`` module: flash_attn_func ([B, S, H, D], lse [B, Hq, Sq]) and
    flash_attn_varlen_func (packed, lse [Hq, Tq]) over :func:`fake_flash_attn_dense`."""
    def keywords(scale, causal, window_size, softcap, alibi_slopes, b):
        slopes = None if alibi_slopes is None else alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        return dict(softmax_scale=scale, causal=causal, window_size=window_size, softcap=softcap,
                    alibi_slopes=slopes, **control)

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        assert dropout_p == 0.0 and q.dtype in (torch.float16, torch.bfloat16)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        parts = [fake_flash_attn_dense(q[b], k[b], v[b], **keywords(scale, causal, window_size, softcap,
                                                                     alibi_slopes, b)) for b in range(q.shape[0])]
        out = torch.stack([o for o, _ in parts])
        return (out, torch.stack([lse for _, lse in parts]), None) if return_attn_probs else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False):
        assert cu_seqlens_q.dtype == torch.int32 and dropout_p == 0.0
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        spans = list(zip(pairwise(cu_seqlens_q.tolist()), pairwise(cu_seqlens_k.tolist())))
        assert max_seqlen_q == max(b - a for (a, b), _ in spans) and max_seqlen_k == max(b - a for _, (a, b) in spans)
        parts = [fake_flash_attn_dense(q[q0:q1], k[k0:k1], v[k0:k1], **keywords(scale, causal, window_size, softcap,
                                                                                alibi_slopes, b))
                 for b, ((q0, q1), (k0, k1)) in enumerate(spans)]
        out = torch.cat([o for o, _ in parts])
        return (out, torch.cat([lse for _, lse in parts], dim=1), None) if return_attn_probs else out

    return types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


FLASH_ATTN_CHECKS = ("hand.*", "fwd.gqa", "fwd.lengths", "fwd.empty", "mask.*", "lse.values", "fwd.softcap",
                     "fwd.alibi", "softmax.*")


def flash_attn_battery(monkeypatch, impl, only=FLASH_ATTN_CHECKS, **control):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn(**control))
    monkeypatch.setattr(adapters, "FLASH_ATTN_DEVICES", ("cuda", "cpu"))
    return run_battery(Settings(impl=impl, impl_name="fake flash_attn", dtypes=(torch.bfloat16,), only=only))


@pytest.mark.parametrize("impl", [adapters.flash_attn, adapters.flash_attn_varlen], ids=lambda f: f.__name__)
def test_flash_attn_adapters_pass_with_flash_attns_documented_semantics(monkeypatch, impl):
    """Layouts, the bottom-right masks, softcap, ALiBi and lse (transposed, +inf on empty rows) as flash_attn
    documents them pass the battery through the adapters; the negative control swaps the window's sides."""
    only, key = (("mask.packed",), "mask.packed") if impl is adapters.flash_attn_varlen else (FLASH_ATTN_CHECKS,
                                                                                             "lse.values")
    report = flash_attn_battery(monkeypatch, impl, only)
    assert report.passed, render(report)
    assert {r.check: r.status for r in report.results}[key] == "pass", render(report)  # really run, not refused
    assert not flash_attn_battery(monkeypatch, impl, only, flip_window=True).passed


def test_flash_attn_lse_of_an_empty_row_is_the_specs(monkeypatch):
    """flash_attn's lse is +inf on a row with no key; the adapter gives the spec's -inf (without it, caught)."""
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn())
    monkeypatch.setattr(adapters, "FLASH_ATTN_DEVICES", ("cuda", "cpu"))
    q, k = torch.randn(1, 2, 5, 16, dtype=torch.bfloat16), torch.randn(1, 2, 2, 16, dtype=torch.bfloat16)
    out, lse = adapters.flash_attn(q, k, k, causal="bottom_right", return_lse=True)
    assert torch.equal(lse[0, :, :3], torch.full((2, 3), -math.inf)) and bool(torch.isfinite(lse[0, :, 3:]).all())
    assert bool((out[0, :, :3] == 0).all())
    monkeypatch.setattr(adapters, "_spec_lse", lambda lse: lse)
    assert not flash_attn_battery(monkeypatch, adapters.flash_attn, ("mask.fully_masked_rows", "lse.values")).passed


def test_flex_adds_alibi_and_bias_after_the_softcap(monkeypatch):
    """flex_attention's score_mod: softcap, then the spec's score bias. Controls: the bias left out, and the
    bias added inside the cap, both fail the same checks."""
    settings = Settings(impl=adapters.flex_eager, impl_name="flex", dtypes=(torch.float32,),
                        only=("fwd.alibi", "fwd.bias"))
    report = run_battery(settings)
    assert report.passed and {r.status for r in report.results} == {"pass"}, render(report)

    def bias_inside_the_cap(spec, q):
        bias = spec.dense_score_bias(torch.float32)
        cap = spec.softcap
        return lambda score, b, h, i, j: (score + bias[b, h, i, j]) if cap is None else \
            cap * torch.tanh((score + bias[b, h, i, j]) / cap)

    for wrong in (lambda spec, q: None, bias_inside_the_cap):
        monkeypatch.setattr(adapters, "_score_mod", wrong)
        assert not run_battery(settings).passed
