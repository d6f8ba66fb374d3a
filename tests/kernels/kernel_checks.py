"""Helpers of the kernel tests: seeded problems and dtype-scaled comparison with the oracle."""

from __future__ import annotations

import torch

from attnformal.testing import assert_attention_close, tolerance_for


def make_problem(*, seed, batch=2, heads_q=4, heads_kv=2, len_q=37, len_k=53, head_dim=8, head_dim_v=None,
                 dtype=torch.float64):
    """Seeded q, k, v, dO with distinct values in every batch and head."""
    gen = torch.Generator().manual_seed(seed)
    head_dim_v = head_dim if head_dim_v is None else head_dim_v

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return (draw(batch, heads_q, len_q, head_dim), draw(batch, heads_kv, len_k, head_dim),
            draw(batch, heads_kv, len_k, head_dim_v), draw(batch, heads_q, len_q, head_dim_v))


def assert_matches(name, got, ref, dtype):
    """``got`` against the oracle's ``ref`` with the library's per-dtype (rtol, atol) table.

    The atol term is scaled by the reference's largest finite magnitude (at least 1): the size
    of what the kernel sums. The table's atol already allows a kernel that rounds P and dS to
    fp16/bf16 before its products, as FlashAttention-2 does.
    """
    rtol, atol = tolerance_for(dtype)
    finite = ref[torch.isfinite(ref)].double().abs()
    magnitude = max(1.0, finite.max().item()) if finite.numel() else 1.0
    assert_attention_close(got, ref, dtype=dtype, rtol=rtol, atol=atol, magnitude=magnitude, name=name)


def available_kernels() -> dict:
    """``{name: attention}`` of the kernels at hand: torch-tiled, and triton-flash where Triton is installed."""
    from attnformal.kernels import torch_tiled

    kernels = {"torch-tiled": torch_tiled.attention}
    try:
        from attnformal.kernels import triton_flash
    except ImportError:
        return kernels
    return {**kernels, "triton-flash": triton_flash.attention}
