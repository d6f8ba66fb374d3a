"""The float64 tier's fast paths change no midpoint and widen no radius.

The radius formulas of :mod:`attnformal.reference.fp64_balls` are evaluated in place, ``exp64``
skips its clamp and range replacements when they are no-ops, :class:`Balls` results of the ball
arithmetic skip the search for exact values (they have no radius 0), a ball times a float goes
through ``mul_exact``, a ball minus an exact shift through ``sub_exact``, and the tiled backward
places the first part of each sum instead of adding it to zeros. The *textbook* versions below are
the formulas as the module docstrings prove them, written out of place (the code before the fast
paths): the fast paths must give the same bits (the in-place rewrites) or radii no larger
(``mul_exact``: 3 roundings charged, not 5; ``sub_exact``: 2, not 3), with the same midpoints, in
this process (one torch build: both sides are this project's own float64 arithmetic).
"""

from __future__ import annotations

import math

import pytest
import torch

from attnformal.reference import balls, certified_attention, tiled
from attnformal.reference import fp64_balls as fb
from attnformal.reference.balls import Balls
from attnformal.reference.tiled import Tiling
from attnformal.schedule import TileSchedule
from reference_cases import case, sinks_alibi_bias

U, up, mag, Ball = fb.U, fb.up, fb.mag, fb.Ball


# ---------------------------------------------------------------- the textbook formulas


def textbook_dot(a, b, *given_magnitudes):
    n = a.shape[-1]
    return Ball(a @ b, up(fb.gamma(n) * (mag(a) @ mag(b)), n + 1))


def textbook_matmul(a, b, *given_magnitudes):
    n = a.mid.shape[-1]
    return Ball(a.mid @ b, up((fb.gamma(n) * mag(a.mid) + a.rad) @ mag(b), n + 2))


def textbook_sum_dim(a, dim, *given_magnitudes):
    n = a.mid.shape[dim]
    return Ball(a.mid.sum(dim, keepdim=True), up((a.rad + fb.gamma(n) * mag(a.mid)).sum(dim, keepdim=True), n + 2))


def textbook_add(a, b):
    c = a.mid + b.mid
    return Ball(c, up(U * mag(c) + a.rad + b.rad, 3))


def textbook_sub(a, b):
    c = a.mid - b.mid
    return Ball(c, up(U * mag(c) + a.rad + b.rad, 3))


def textbook_sub_exact(a, t):
    c = a.mid - t
    return Ball(c, up(U * mag(c) + a.rad, 2))


def textbook_rsub_exact(t, a):
    c = t - a.mid
    return Ball(c, up(U * mag(c) + a.rad, 2))


def textbook_mul(a, b, *given_magnitudes):
    c = a.mid * b.mid
    return Ball(c, up(U * mag(c) + mag(a.mid) * b.rad + a.rad * (mag(b.mid) + b.rad), 5))


def textbook_mul_exact(a, t):
    c = a.mid * t
    return Ball(c, up(U * mag(c) + a.rad * (mag(t) if isinstance(t, torch.Tensor) else max(abs(t), fb.FLOOR)), 3))


def textbook_div_exact(a, t):
    c = a.mid / t
    return Ball(c, up(U * mag(c) + a.rad / abs(t), 3))


def textbook_exp64(x):
    clamped = x.clamp(fb.EXP_MIN, fb.EXP_MAX)
    k = torch.round(clamped * fb.INV_LN2)
    r = (clamped - k * fb.LN2_HI) - k * fb.LN2_LO
    p = torch.full_like(r, fb.TAYLOR[-1])
    for c in reversed(fb.TAYLOR[:-1]):
        p = p * r + c
    y = p * ((k.to(torch.int64) + 1023) << 52).view(torch.float64)
    y = torch.where(x < fb.EXP_MIN, 0.0, y)
    return torch.where(x > fb.EXP_MAX, math.inf, y)


def textbook_exp(a):
    e = textbook_exp64(a.mid)
    rad = up(mag(e) * (a.rad * (1.0 + a.rad) + fb.EPS_EXP), 4 + 16)
    return Ball(e, torch.where(a.rad <= 1.0, rad, math.inf))


def textbook_tanh(a):
    e = textbook_exp64(-2.0 * a.mid.abs())
    return Ball(torch.copysign((1.0 - e) / (1.0 + e), a.mid), up(a.rad + fb.EPS_TANH, 1))


def textbook_scaled(a, t):
    """A ball times a float as a ball product with an exact scalar ball, then the 0/1 facts."""
    other = Balls(torch.as_tensor(t, dtype=torch.float64))
    product = Balls.of(fb.mul(a.ball, other.ball))
    if t == 1.0:
        return balls._keep(product, torch.tensor(True), a)
    if t == 0.0:
        finite = torch.isfinite(a.mid) & torch.isfinite(a.rad)
        return balls._keep(product, finite, Balls(torch.zeros_like(product.mid)))
    return product


def textbook_difference(a, b):
    return Balls.of(fb.sub(a.ball, b.ball))


class TextbookAccumulation:
    """The tiled backward's sums as plain ball additions into exact zeros."""

    def __call__(self, total, rows, part):
        index = (slice(None), slice(None), rows)
        summed = total[index] + part
        total.mid[index], total.rad[index] = summed.mid, summed.rad


TEXTBOOK = {"dot": textbook_dot, "matmul": textbook_matmul, "sum_dim": textbook_sum_dim, "add": textbook_add,
            "sub": textbook_sub, "sub_exact": textbook_sub_exact, "rsub_exact": textbook_rsub_exact,
            "mul": textbook_mul, "mul_exact": textbook_mul_exact, "div_exact": textbook_div_exact,
            "exp64": textbook_exp64, "exp": textbook_exp, "tanh": textbook_tanh}


@pytest.fixture
def textbook(monkeypatch):
    """Switch the float64 tier to the textbook formulas, and every fast path of :class:`Balls` off."""
    def install():
        for name, fn in TEXTBOOK.items():
            monkeypatch.setattr(fb, name, fn)
        monkeypatch.setattr(balls, "_scaled", textbook_scaled)
        monkeypatch.setattr(balls, "_difference", textbook_difference)
        monkeypatch.setattr(tiled, "_Accumulation", TextbookAccumulation)
        monkeypatch.setattr(Balls, "result", classmethod(lambda cls, ball, terms=1: cls(ball.mid, ball.rad)))
    return install


# ---------------------------------------------------------------- operation by operation


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64)


def same_radii(fast: torch.Tensor, slow: torch.Tensor) -> bool:
    """The same bits, but a NaN radius (not certified, whatever its sign or payload) matches any NaN: which
    operand's NaN an add returns depends on the operand order, which a one-pass add may swap."""
    differ = bits(fast) != bits(slow)
    return bool((fast[differ].isnan() & slow[differ].isnan()).all())


def seeded_ball(shape, seed, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    mid = torch.randn(shape, generator=g, dtype=torch.float64) * spread
    rad = torch.rand(shape, generator=g, dtype=torch.float64) * 1e-9 * mid.abs()
    mid.view(-1)[:6] = torch.tensor([0.0, -0.0, 1e-310, -math.inf, 5e-324, 1e300])
    rad.view(-1)[:3] = torch.tensor([0.0, 2.0, math.nan])
    return Ball(mid, rad)


def operations():
    a, b, row = seeded_ball((6, 16), 1), seeded_ball((6, 16), 2), seeded_ball((6, 1), 3)
    t = torch.randn(16, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return {
        "dot": (t.mT, t), "matmul": (a, t), "sum_dim": (a, -1), "sum_dim_0": (a, 0),
        "add": (a, b), "add_row": (row, a), "sub": (a, b), "sub_row": (a, row), "sub_exact": (a, row.mid),
        "rsub_exact": (1.0, a), "mul": (a, b), "mul_row": (row, a), "mul_by_row": (a, row), "mul_exact": (a, 0.3),
        "mul_exact_tensor": (a, b.mid), "div_exact": (a, 7.0), "exp": (a,), "tanh": (a,),
    }


@pytest.mark.parametrize("name", sorted(operations()))
def test_each_fast_operation_gives_the_textbook_bits(name):
    args = operations()[name]
    op = name.removesuffix("_0").removesuffix("_row").removesuffix("_by").removesuffix("_tensor")
    slow = TEXTBOOK[op](*args)
    for fast in (getattr(fb, op)(*args), *given_magnitudes(op, args)):
        assert torch.equal(bits(fast.mid), bits(slow.mid)), f"{name}: a midpoint changed"
        assert same_radii(fast.rad, slow.rad), f"{name}: a radius changed"


def given_magnitudes(op, args):
    """The operation again with its operands' magnitudes passed in (as :class:`Balls` passes them)."""
    if op not in ("dot", "matmul", "mul", "sum_dim"):
        return []
    mids = [x.mid if isinstance(x, Ball) else x for x in args[:2]]
    magnitudes = [fb.mag(mids[0])] if op == "sum_dim" else [fb.mag(x) for x in mids]
    return [getattr(fb, op)(*args, *magnitudes)]


@pytest.mark.parametrize("spread", [1.0, 300.0, 1e4])
def test_exp64_gives_the_textbook_bits_inside_and_outside_its_range(spread):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * spread
    x[:7] = torch.tensor([-math.inf, math.inf, math.nan, -700.5, 709.5, -0.0, 0.0])
    for values in (x, x[7:].clamp(fb.EXP_MIN, fb.EXP_MAX), -x[7:].abs()):
        assert torch.equal(bits(fb.exp64(values)), bits(textbook_exp64(values)))


def test_a_rounded_result_has_no_zero_radius():
    """What lets ``Balls`` skip its search for exact values: each operation's radius is positive (or NaN)
    even at exact zeros, the smallest subnormal and sums of one term."""
    a, b = seeded_ball((6, 16), 6), seeded_ball((6, 16), 7)
    zero = Ball(torch.zeros(6, 16, dtype=torch.float64), torch.zeros(6, 16, dtype=torch.float64))
    column = Ball(zero.mid[:, :1], zero.rad[:, :1])
    results = [fb.add(zero, zero), fb.sub(zero, zero), fb.mul(zero, a), fb.mul_exact(zero, 0.0), fb.exp(zero),
               fb.exp(Ball(torch.full((3,), -1e4, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))),
               fb.tanh(zero), fb.div_exact(zero, 3.0), fb.sum_dim(zero, -1), fb.sum_dim(column, -1),
               fb.dot(zero.mid, zero.mid.mT), fb.dot(zero.mid[:, :1], zero.mid[:, :1].mT), fb.matmul(zero, b.mid.mT),
               fb.rsub_exact(0.0, zero), fb.sub_exact(zero, 0.0)]
    for n, r in enumerate(results):
        assert not bool((r.rad == 0).any()), f"result {n} has a zero radius"


def test_exact_values_are_still_found_in_mixed_balls():
    """A ball that is not marked rounded (a ``where`` of exact and rounded balls) is still searched."""
    s = Balls(torch.tensor([[0.5, -1.0]], dtype=torch.float64)) * Balls(torch.tensor([[1.0, 2.0]],
                                                                                     dtype=torch.float64))
    assert s.rounded
    masked = balls._BallOps.where(torch.tensor([[True, False]]), s, -math.inf)
    assert not masked.rounded
    p = balls._BallOps.exp(masked - Balls(torch.tensor([[0.5]], dtype=torch.float64)))
    assert p.mid[0, 1] == 0.0 and p.rad[0, 1] == 0.0  # exp(-inf) = 0 exactly, found in the mixed ball


# ---------------------------------------------------------------- the whole reference

SMALL = Tiling(TileSchedule(block_m=4, block_n=8), chunk_rows=8, part_keys=16)
CASES = {
    "causal_gqa": lambda: case((2, 4, 2, 21, 37, 8, 5), torch.float16, 1, causal="bottom_right"),
    "softcap_dropout_mask": lambda: case((1, 2, 2, 13, 30, 8), seed=3, input_scale=3.0, softcap=2.5, dropout_p=0.3,
                                         attn_mask_density=0.6),
    "sinks_alibi_bias": lambda: case((2, 2, 1, 13, 37, 8), torch.float32, 6, kv_lens=[37, 9], window=(9, 4),
                                     **sinks_alibi_bias(2, 2, 13, 37)),
    "empty_rows": lambda: case((3, 2, 1, 19, 40, 8), seed=2, causal="top_left", window=(6, 3), kv_lens=[40, 0, 17]),
}


def run(make, tiling):
    x, kwargs = make()
    return certified_attention(x["q"], x["k"], x["v"], x["grad_out"], tiling=tiling, **kwargs)


def compare(fast, slow):
    """``(narrower fields, total fields)``; asserts equal midpoints and no wider radius."""
    narrower = 0
    for field in fast.fields():
        if not isinstance(getattr(fast, field), torch.Tensor) or field.endswith("_radius"):
            continue
        assert torch.equal(bits(getattr(fast, field)), bits(getattr(slow, field))), f"{field}: a midpoint changed"
        new, old = getattr(fast, f"{field}_radius"), getattr(slow, f"{field}_radius")
        wider = (new > old) | (new.isnan() & ~old.isnan())
        assert not bool(wider.any()), f"{field}: radius wider at {wider.nonzero()[:3].tolist()}"
        narrower += int(not torch.equal(new, old))
    return narrower


@pytest.mark.parametrize("tiling", [SMALL, None], ids=["small_tiles", "default_tiles"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_tiled_reference_keeps_its_midpoints_and_widens_no_radius(name, tiling, textbook):
    fast = run(CASES[name], tiling)
    textbook()
    slow = run(CASES[name], tiling)
    assert fast.tier == slow.tier == "float64"
    compare(fast, slow)


def test_the_scores_radius_is_tighter_through_mul_exact(textbook):
    """``scale * (q k^T)`` is charged 3 roundings, not 5 (and ``s - shift`` 2, not 3): the radii of a plain
    case are strictly smaller."""
    fast = run(CASES["causal_gqa"], None)
    textbook()
    assert compare(fast, run(CASES["causal_gqa"], None)) > 0


def test_negative_control_a_widened_radius_is_caught(monkeypatch, textbook):
    """Planted: the fast path's ``up_`` charges twice the roundings; the comparison must refuse it."""
    fast_up = fb.up_
    monkeypatch.setattr(fb, "up_", lambda x, ops: fast_up(x, 2 * ops))
    widened = run(CASES["causal_gqa"], SMALL)
    textbook()
    with pytest.raises(AssertionError, match="radius wider"):
        compare(widened, run(CASES["causal_gqa"], SMALL))
