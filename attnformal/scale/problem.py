"""What one sweep point is: the swept parameter, the fixed ones, and the mask family.

``--sweep N=512..8192`` varies one of :data:`SWEEP_PARAMS` geometrically and holds the
others at their fixed values; every result is printed beside those fixed values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import torch

from attnformal.spec import AttentionSpec

SWEEP_PARAMS = {
    "N": "sequence length (Sq = Sk)",
    "D": "head dim (D = Dv)",
    "W": "window width (left; window masks)",
    "B": "batch",
}
_MASK_FORMS = "dense, causal, window (its width swept by W), window:W or window:N/K"


@dataclass(frozen=True)
class MaskFamily:
    """``dense``, ``causal`` (top-left), or a sliding window: query i sees keys i-W .. i.

    The window's width is fixed (``window:256``), a fraction of the length (``window:N/8``,
    which grows with N), or the swept parameter (``window`` under ``--sweep W=...``).
    """

    kind: str
    width: int | None = None
    per_n: int | None = None  # width = N // per_n

    @property
    def label(self) -> str:
        if self.kind != "window":
            return self.kind
        return f"window:{self.width}" if self.width is not None else \
            f"window:N/{self.per_n}" if self.per_n is not None else "window:W"

    def kwargs(self, seq: int, swept_width: int | None = None) -> dict:
        """Protocol keyword arguments at sequence length ``seq``."""
        if self.kind == "dense":
            return {}
        if self.kind == "causal":
            return {"causal": "top_left"}
        width = self.width if self.width is not None else \
            seq // self.per_n if self.per_n is not None else swept_width
        return {"window": (width, 0)}


def parse_mask(text: str) -> MaskFamily:
    if text in ("dense", "causal", "window"):
        return MaskFamily(text)
    fixed = re.fullmatch(r"window:(\d+)", text)
    if fixed:
        return MaskFamily("window", width=int(fixed[1]))
    growing = re.fullmatch(r"window:N/(\d+)", text)
    if growing and int(growing[1]) >= 1:
        return MaskFamily("window", per_n=int(growing[1]))
    raise ValueError(f"argument '--mask': expected {_MASK_FORMS}, got {text!r}")


@dataclass(frozen=True)
class Sweep:
    param: str
    values: tuple[int, ...]


def parse_sweep(text: str, per_octave: int = 2, multiple: int = 8) -> Sweep:
    """``P=LO..HI`` (``per_octave`` geometric points per doubling) or ``P=V1,V2,...`` (commas
    and/or spaces between the values).

    Points of ``LO..HI`` at or above ``multiple`` are rounded to multiples of it (a block
    size for N keeps every point free of ragged tiles; 8 suits fused GPU kernels).
    """
    expected = f"P=LO..HI or P=V1,V2,... with P one of {', '.join(SWEEP_PARAMS)}"
    match = re.fullmatch(r"([A-Z])=(\d+)\.\.(\d+)|([A-Z])=(\d+(?:[,\s]+\d+)*)", text.strip())
    if not match or (match[1] or match[4]) not in SWEEP_PARAMS:
        raise ValueError(f"argument '--sweep': expected {expected}, got {text!r}")
    if match[1]:
        lo, hi = int(match[2]), int(match[3])
        if not 1 <= lo < hi:
            raise ValueError(f"argument '--sweep': expected 1 <= LO < HI, got {text!r}")
        steps = math.floor(per_octave * math.log2(hi / lo) + 1e-9)
        values = sorted({_round_size(lo * 2 ** (s / per_octave), multiple) for s in range(steps + 1)} | {hi})
        return Sweep(match[1], tuple(values))
    values = [int(v) for v in re.split(r"[,\s]+", match[5])]
    if len(set(values)) != len(values) or values != sorted(values) or values[0] < 1:
        raise ValueError(f"argument '--sweep': expected increasing values >= 1, got {text!r}")
    return Sweep(match[4], tuple(values))


def _round_size(x: float, multiple: int) -> int:
    return int(round(x / multiple) * multiple) if x >= multiple else int(round(x))


@dataclass(frozen=True)
class Problem:
    """The shape and mask of one point: q ``[B, H, N, D]``, k and v ``[B, Hkv, N, D]``."""

    batch: int
    heads: int
    heads_kv: int
    seq: int
    head_dim: int
    mask: MaskFamily
    width: int | None = None  # the swept window width under --sweep W

    def at(self, param: str, x: int) -> Problem:
        """This problem with the swept parameter set to ``x``."""
        field = {"N": "seq", "D": "head_dim", "W": "width", "B": "batch"}[param]
        return replace(self, **{field: x})

    def trivial(self) -> Problem:
        """The smallest problem of the same family: its time is the fixed per-call cost."""
        return replace(self, batch=1, heads=1, heads_kv=1, seq=1)

    def kwargs(self) -> dict:
        return self.mask.kwargs(self.seq, self.width)

    def spec(self) -> AttentionSpec:
        """The spec the implementation will see (built from meta tensors: no data)."""
        q = torch.empty(self.batch, self.heads, self.seq, self.head_dim, device="meta")
        kv = torch.empty(self.batch, self.heads_kv, self.seq, self.head_dim, device="meta")
        return AttentionSpec.from_inputs(q, kv, kv, **self.kwargs())

    def inputs(self, device, dtype, seed: int, requires_grad: bool):
        """Seeded q, k, v and a gradient for the output, on ``device``."""
        gen = torch.Generator().manual_seed(seed)
        shapes = [(self.batch, h, self.seq, self.head_dim) for h in (self.heads, self.heads_kv, self.heads_kv, self.heads)]
        q, k, v, grad_out = (torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in shapes)
        for t in (q, k, v):
            t.requires_grad_(requires_grad)
        return q, k, v, grad_out

    def describe(self, swept: str) -> str:
        """The fixed shape parameters, printed beside every result (the mask label carries W)."""
        shown = {"B": self.batch, "H": f"{self.heads}/{self.heads_kv}", "N": self.seq, "D": self.head_dim}
        return " ".join(f"{name}={value}" for name, value in shown.items() if name != swept)
