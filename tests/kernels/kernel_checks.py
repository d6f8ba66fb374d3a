"""Helpers of the kernel tests: seeded problems and dtype-scaled comparison with the oracle."""

from __future__ import annotations

import torch

# (rtol, atol as a fraction of the reference's largest magnitude) per input dtype. fp64 kernels
# must match the fp64 oracle to rounding; lower precisions are bounded by their output rounding.
TOLERANCES = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (2e-5, 2e-6),
    torch.bfloat16: (2**-7, 2**-8),
    torch.float16: (2**-10, 2**-11),
}


def make_problem(*, seed, batch=2, heads_q=4, heads_kv=2, len_q=37, len_k=53, head_dim=8, head_dim_v=None,
                 dtype=torch.float64):
    """Seeded q, k, v, dO with distinct values in every batch and head."""
    gen = torch.Generator().manual_seed(seed)
    head_dim_v = head_dim if head_dim_v is None else head_dim_v

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return (draw(batch, heads_q, len_q, head_dim), draw(batch, heads_kv, len_k, head_dim),
            draw(batch, heads_kv, len_k, head_dim_v), draw(batch, heads_q, len_q, head_dim_v))


def assert_matches(name, got, ref, dtype, tolerances=TOLERANCES):
    """``|got - ref| <= atol + rtol |ref|`` element-wise, with a message that says where it is not."""
    rtol, atol_fraction = tolerances[dtype]
    got, ref = got.double(), ref.double()
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    same_inf = (got == ref) & torch.isinf(ref)
    assert not torch.isnan(got).any(), f"{name}: NaN at {torch.nonzero(torch.isnan(got))[:5].tolist()}"
    finite = torch.isfinite(ref)
    assert bool((same_inf | finite).all()), f"{name}: infinities differ from the reference"
    if not finite.any():
        return
    atol = atol_fraction * ref[finite].abs().max().clamp_min(1.0).item()
    err = torch.where(finite, (got - ref).abs(), 0.0)
    bad = err > atol + rtol * ref.abs()
    if bad.any():
        worst = torch.argmax(torch.where(finite, err, -1.0)).item()
        index = list(torch.unravel_index(torch.tensor(worst), err.shape))
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {err.numel()} elements over tolerance (rtol={rtol}, atol={atol:.2e}); "
            f"worst |diff|={err.flatten()[worst]:.3e} at {[int(i) for i in index]} "
            f"(got {got.flatten()[worst].item():.6g}, reference {ref.flatten()[worst].item():.6g})")
