"""Cases: concrete, seeded attention problems, and the generators that build them.

A :class:`Case` is everything one call of the implementation protocol needs (q, k, v, the
keyword arguments, dO for the backward) plus a name and the seed it was drawn from. Inputs
are drawn in float64 from a seeded generator and rounded once to the dtype under test; the
references read the rounded values, so input rounding is never counted as error.

Random values are distinct per batch and head, and each (batch, KV head) gets its own value
offset: a head or batch read from the wrong place then shifts the output by a large,
identifiable amount instead of hiding among look-alike draws.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from attnformal.spec import AttentionSpec


class Shape(NamedTuple):
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    head_dim: int
    head_dim_v: int

    def describe(self) -> str:
        b, hq, hkv, sq, sk, d, dv = self
        heads = f"H={hq}" if hq == hkv else f"Hq={hq} Hkv={hkv}"
        dims = f"D={d}" if d == dv else f"D={d} Dv={dv}"
        return f"B={b} {heads} Sq={sq} Sk={sk} {dims}"


def shape(batch=2, heads_q=2, heads_kv=None, len_q=32, len_k=None, head_dim=32, head_dim_v=None) -> Shape:
    """A :class:`Shape` with the usual defaults (MHA, Sk = Sq, Dv = D)."""
    return Shape(batch, heads_q, heads_kv or heads_q, len_q, len_q if len_k is None else len_k,
                 head_dim, head_dim_v or head_dim)


def derive_seed(*parts) -> int:
    """A stable 31-bit seed from a run seed and names (same inputs -> same seed, on any machine)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


@dataclass
class Case:
    """One call of the protocol: inputs, keyword arguments, dO, and where they came from."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict[str, Any] = field(default_factory=dict)
    grad_out: torch.Tensor | None = None
    seed: int = 0
    role: str = "test"  # "control": a variant expected to pass, to localise a failure by difference
    adapted: tuple[str, ...] = ()  # what was changed so that the implementation accepts it (capabilities)
    duplicate: bool = False  # adapted into a case the same check already ran: not run again

    @property
    def spec(self) -> AttentionSpec:
        return AttentionSpec.from_inputs(self.q, self.k, self.v, **self.kwargs)

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    def describe(self) -> str:
        """The name, the shape and every keyword argument that is set."""
        s = self.spec
        parts = [self.name, Shape(s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_k, s.head_dim,
                                  s.head_dim_v).describe()]
        for key, value in self.kwargs.items():
            if isinstance(value, torch.Tensor):
                value = f"tensor{list(value.shape)}"
            parts.append(f"{key}={value}")
        if not self.q.is_contiguous():
            parts.append("non-contiguous")
        return " ".join(str(p) for p in parts if p)

    def with_(self, **changes) -> Case:
        return replace(self, **changes)

    def to_payload(self) -> dict:
        """What a reproducer file stores: exact tensors (views made contiguous) and arguments."""
        return {"name": self.name, "seed": self.seed, "q": self.q.contiguous(), "k": self.k.contiguous(),
                "v": self.v.contiguous(), "grad_out": self.grad_out, "kwargs": self.kwargs,
                "strides": {n: list(getattr(self, n).stride()) for n in ("q", "k", "v")}}

    @classmethod
    def from_payload(cls, payload: dict) -> Case:
        return cls(name=payload["name"], q=payload["q"], k=payload["k"], v=payload["v"],
                   kwargs=payload["kwargs"], grad_out=payload["grad_out"], seed=payload["seed"])


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(gen, *size) -> torch.Tensor:
    return torch.randn(*size, generator=gen, dtype=torch.float64)


def value_offsets(batch: int, heads_kv: int) -> torch.Tensor:
    """``[B, Hkv, 1, 1]`` distinct offsets in [-1, 1]: every (batch, KV head) has its own mean value."""
    n = batch * heads_kv
    steps = torch.linspace(-1.0, 1.0, n, dtype=torch.float64) if n > 1 else torch.zeros(1, dtype=torch.float64)
    return steps.reshape(batch, heads_kv, 1, 1)


def random_case(name: str, sh: Shape, dtype, device, seed: int, *, grad: bool = True, **kwargs) -> Case:
    """Standard-normal q, k, v (plus per-(batch, KV head) value offsets) and dO, rounded to ``dtype``."""
    gen = generator(seed)
    b, hq, hkv, sq, sk, d, dv = sh
    q, k = randn(gen, b, hq, sq, d), randn(gen, b, hkv, sk, d)
    v = randn(gen, b, hkv, sk, dv) + value_offsets(b, hkv)
    grad_out = randn(gen, b, hq, sq, dv) if grad else None
    return make_case(name, q, k, v, dtype, device, seed, grad_out=grad_out, **kwargs)


def make_case(name, q, k, v, dtype, device, seed, *, grad_out=None, role="test", **kwargs) -> Case:
    """A case from float64 inputs: rounded to ``dtype`` and moved to ``device`` (masks too)."""
    def put(t):
        return None if t is None else t.to(device=device, dtype=dtype)

    kwargs = {key: (value.to(device) if isinstance(value, torch.Tensor) else value)
              for key, value in kwargs.items() if value is not None}
    return Case(name, put(q), put(k), put(v), kwargs, put(grad_out), seed, role)


def random_attn_mask(gen, sh: Shape, density: float = 0.7, *, per_head: bool = True) -> torch.Tensor:
    """A bool mask (True = may attend) of shape ``[B, Hq or 1, Sq, Sk]``."""
    heads = sh.heads_q if per_head else 1
    return torch.rand(sh.batch, heads, sh.len_q, sh.len_k, generator=gen) < density


def random_dropout_mask(gen, sh: Shape, p: float) -> torch.Tensor:
    """A bool keep-mask ``[B, Hq, Sq, Sk]``: each entry kept with probability ``1 - p``."""
    return torch.rand(sh.batch, sh.heads_q, sh.len_q, sh.len_k, generator=gen) >= p


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a ``[B, S, H, D]`` buffer, seen through a transpose, every other feature."""
    b, h, s, d = t.shape
    buffer = torch.zeros(b, s, h, 2 * d, dtype=t.dtype, device=t.device)
    view = buffer.transpose(1, 2)[..., ::2]
    view.copy_(t)
    return view


# Memory layouts a kernel meets, each a view of ``[B, H, S, D]`` values (issue 25): a tensor of a call may
# have its own, so a kernel that reads one tensor with another's strides is seen.
def bshd(t: torch.Tensor) -> torch.Tensor:
    """Stored ``[B, S, H, D]`` (flash-attention's layout), seen through a transpose."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def cache_slice(t: torch.Tensor, capacity: int = 3) -> torch.Tensor:
    """The first ``S`` positions of a KV cache of ``capacity * S + 5`` positions: a large batch and head stride."""
    b, h, s, d = t.shape
    cache = torch.zeros(b, h, capacity * s + 5, d, dtype=t.dtype, device=t.device)
    cache[:, :, :s] = t
    return cache[:, :, :s]


def strided_features(t: torch.Tensor) -> torch.Tensor:
    """Every other feature of a buffer twice as wide: a head-dim stride of 2."""
    buffer = torch.zeros(*t.shape[:3], 2 * t.shape[3], dtype=t.dtype, device=t.device)
    buffer[..., ::2] = t
    return buffer[..., ::2]


def packed_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as the two halves of one ``[B, S, 2, H, D]`` buffer (a fused KV projection): same strides,
    different offsets."""
    buffer = torch.stack([k.transpose(1, 2), v.transpose(1, 2)], 2)
    return buffer[:, :, 0].transpose(1, 2), buffer[:, :, 1].transpose(1, 2)
