"""Shared helpers of the reference tests: seeded cases and exact comparisons in Arb/mpmath."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch
from flint import arb, ctx, fmpz

from attnformal.reference.golden import make_inputs


def case(shape, dtype=torch.bfloat16, seed=0, *, input_scale=1.0, dropout_p=0.0, attn_mask_density=None,
         **protocol):
    """``(inputs, protocol kwargs)``: seeded q, k, v, grad_out (and masks) plus the keywords."""
    x = make_inputs(shape if len(shape) == 7 else (*shape, shape[5]), dtype, seed, input_scale=input_scale,
                    dropout_p=dropout_p, attn_mask_density=attn_mask_density)
    kwargs = dict(protocol, dropout_p=dropout_p)
    for name in ("attn_mask", "dropout_mask"):
        if name in x:
            kwargs[name] = x.pop(name)
    return x, kwargs


def mpf_to_arb(x) -> arb:
    """The exact value of an mpmath number as an Arb ball of radius 0."""
    sign, man, exp, _ = x._mpf_
    old = ctx.prec
    ctx.prec = max(old, 4 * mpmath.mp.prec + 64)
    try:
        value = arb((fmpz(-man if sign else man), exp)) if man else arb(0)
    finally:
        ctx.prec = old
    assert value.is_exact()
    return value


def mp_inside_float_balls(values: np.ndarray, mid: torch.Tensor, rad: torch.Tensor) -> np.ndarray:
    """Bool array: each mpmath value within ``mid +- rad`` (float64 balls), compared exactly."""
    inside = np.zeros(values.shape, dtype=bool)
    for idx in np.ndindex(*values.shape):
        x, m, r = values[idx], float(mid[idx]), float(rad[idx])
        if math.isinf(m):
            inside[idx] = x == m and r == 0
        else:
            with mpmath.workprec(4000):  # float64 values are exact at this precision
                inside[idx] = abs(x - mpmath.mpf(m)) <= mpmath.mpf(r)
    return inside


def mp_inside_arb_balls(values: np.ndarray, balls: np.ndarray) -> np.ndarray:
    """Bool array: each mpmath value inside the Arb ball (None marks an exact -inf)."""
    inside = np.zeros(values.shape, dtype=bool)
    for idx in np.ndindex(*values.shape):
        ball = balls[idx]
        inside[idx] = (values[idx] == -mpmath.inf) if ball is None else ball.contains(mpf_to_arb(values[idx]))
    return inside


def sinks_alibi_bias(batch: int, heads_q: int, len_q: int, len_k: int, dtype=torch.float32, seed: int = 20) -> dict:
    """Seeded ``sinks`` (one head without: -inf), per-batch ``alibi_slopes`` and a ``[Hq, 1, Sk]`` bias."""
    gen = torch.Generator().manual_seed(seed)
    sinks = torch.randn(heads_q, generator=gen, dtype=torch.float64)
    sinks[-1] = -math.inf
    slopes = torch.rand(batch, heads_q, generator=gen, dtype=torch.float64)
    bias = torch.randn(heads_q, 1, len_k, generator=gen, dtype=torch.float64)
    return {"sinks": sinks.to(dtype), "alibi_slopes": slopes.to(dtype), "bias": bias.to(dtype)}
