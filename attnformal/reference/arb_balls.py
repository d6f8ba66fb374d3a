"""The same ball operations as :mod:`attnformal.reference.fp64_balls`, in Arb at any precision.

A ball is a numpy object array of ``flint.arb``; Arb's own arithmetic is rigorous, so each
operation is one line. Precision is ``flint.ctx.prec`` at the time of the call (the caller
sets it). Exact operands are float64 torch tensors (or floats), converted exactly.
Products go through ``arb_mat`` one matrix at a time (leading dimensions are looped).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flint import arb, arb_mat

ZERO = arb(0)
_to_arb = np.frompyfunc(arb, 1, 1)  # float -> arb is exact
_exp = np.frompyfunc(arb.exp, 1, 1)
_tanh = np.frompyfunc(arb.tanh, 1, 1)
_mid = np.frompyfunc(lambda x: float(x.mid()), 1, 1)
_rad = np.frompyfunc(lambda x: upper_float(x.rad()), 1, 1)


def upper_float(x: arb) -> float:
    """A float64 ``>= |x|`` for every point of the ball ``x`` (inf if unbounded)."""
    if not x.is_finite():
        return math.inf
    return math.nextafter(float(x.abs_upper()), math.inf)  # float() is within one ulp


def arb_to_float64(x: arb) -> tuple[float, float]:
    """``(mid, rad)``: a float64 midpoint and a float64 radius that encloses the whole ball."""
    if not x.is_finite():
        return math.nan, math.inf
    mid = float(x.mid())
    return mid, upper_float(x - arb(mid))


_to_float64 = np.frompyfunc(arb_to_float64, 1, 2)


def from_tensor(t: torch.Tensor) -> np.ndarray:
    """Exact float64 values as an object array of arb."""
    return np.asarray(_to_arb(t.detach().cpu().double().numpy()), dtype=object)


def _as_arb(t):
    return from_tensor(t) if isinstance(t, torch.Tensor) else arb(t)


def exact(t: torch.Tensor) -> np.ndarray:
    return from_tensor(t)


def const(value: arb) -> arb:
    """A scalar ball computed elsewhere in Arb."""
    return value


def _matmul_objects(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lead = a.shape[:-2]
    out = np.empty(lead + (a.shape[-2], b.shape[-1]), dtype=object)
    if out.size == 0 or a.shape[-1] == 0:  # arb_mat takes no empty matrix: no entries, or sums of no terms
        out.fill(arb(0))
        return out
    for idx in np.ndindex(*lead):
        product = arb_mat(a[idx].tolist()) * arb_mat(b[idx].tolist())
        out[idx] = np.array(product.tolist(), dtype=object).reshape(out.shape[-2:])
    return out


def dot(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return _matmul_objects(from_tensor(a), from_tensor(b))


def matmul(a: np.ndarray, b: torch.Tensor) -> np.ndarray:
    return _matmul_objects(a, from_tensor(b))


def sum_dim(a: np.ndarray, dim: int) -> np.ndarray:
    return np.sum(a, axis=dim, keepdims=True, initial=ZERO)


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def sub_exact(a, t):
    return a - _as_arb(t)


def rsub_exact(t, a):
    return _as_arb(t) - a


def mul(a, b):
    return a * b


def mul_exact(a, t):
    return a * _as_arb(t)


def div_exact(a, t: float):
    return a / arb(t)


def div(a, b):
    return a / b


def where(mask: torch.Tensor, a: np.ndarray, other: float = 0.0) -> np.ndarray:
    return np.where(mask.cpu().numpy(), a, arb(other))


def exp(a):
    return _exp(a)


def tanh(a):
    return _tanh(a)


def transpose(a):
    return np.swapaxes(a, -1, -2)


def select(a, dim: int, index: torch.Tensor):
    return np.take(a, index.cpu().numpy(), axis=dim)


def cat(parts, dim: int):
    return np.concatenate(parts, axis=dim)


def reshape(a, shape):
    return a.reshape(shape)


def mid(a) -> torch.Tensor:
    """Float64 approximations of the midpoints (for choosing the exact softmax shift)."""
    return torch.from_numpy(_mid(a).astype(np.float64))


def to_arb(a) -> np.ndarray:
    return a


def enclosure_radius(a) -> float:
    """The largest radius of the balls (before any rounding to float64)."""
    return float(np.max(_rad(a), initial=0.0))


def to_float64(a) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 midpoints and radii enclosing the balls (the rounding of the midpoint included)."""
    mids, rads = _to_float64(a)
    return (torch.from_numpy(np.asarray(mids, dtype=np.float64)),
            torch.from_numpy(np.asarray(rads, dtype=np.float64)))
