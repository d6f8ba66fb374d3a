"""What one sweep point is: the swept parameter, the fixed ones, and the mask family.

``--sweep N=512..8192`` varies one of :data:`SWEEP_PARAMS` geometrically and holds the
others at their fixed values; every result is printed beside those fixed values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from attnformal.spec import AttentionSpec

SWEEP_PARAMS = {
    "N": "sequence length (Sq = Sk)",
    "D": "head dim (D = Dv)",
    "W": "window width (left) or chunk size (window, chunk masks)",
    "B": "batch",
}
_MASK_FORMS = "dense, causal, window or chunk (its size swept by W), window:W, window:N/K, chunk:C or chunk:N/K"
SIZED = ("window", "chunk")  # the families with a size: fixed, N/K, or the swept W


@dataclass(frozen=True)
class MaskFamily:
    """``dense``, ``causal`` (top-left), a sliding window (query i sees keys i-W .. i), or chunked
    attention (the ``chunk_size`` feature: query i sees the keys of its own chunk of C).

    The size (window width, chunk size) is fixed (``window:256``), a fraction of the length
    (``window:N/8``, which grows with N), or the swept parameter (``window`` under ``--sweep W=...``).
    """

    kind: str
    width: int | None = None
    per_n: int | None = None  # width = N // per_n

    @property
    def label(self) -> str:
        if self.kind not in SIZED:
            return self.kind
        return f"{self.kind}:{self.width}" if self.width is not None else \
            f"{self.kind}:N/{self.per_n}" if self.per_n is not None else f"{self.kind}:W"

    @property
    def swept(self) -> bool:
        """Whether the size is the swept parameter W."""
        return self.kind in SIZED and self.width is None and self.per_n is None

    def kwargs(self, seq: int, swept_width: int | None = None) -> dict:
        """Protocol keyword arguments at sequence length ``seq``."""
        if self.kind == "dense":
            return {}
        if self.kind == "causal":
            return {"causal": "top_left"}
        size = self.width if self.width is not None else \
            seq // self.per_n if self.per_n is not None else swept_width
        if self.kind == "window":
            return {"window": (size, 0)}
        return {"chunk_size": max(1, size)}  # a chunk holds a key at least (N/K of a short N is 0)


def parse_mask(text: str) -> MaskFamily:
    if text in ("dense", "causal", *SIZED):
        return MaskFamily(text)
    fixed = re.fullmatch(r"(window|chunk):(\d+)", text)
    if fixed and (fixed[1] == "window" or int(fixed[2]) >= 1):
        return MaskFamily(fixed[1], width=int(fixed[2]))
    growing = re.fullmatch(r"(window|chunk):N/(\d+)", text)
    if growing and int(growing[2]) >= 1:
        return MaskFamily(growing[1], per_n=int(growing[2]))
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
    width: int | None = None  # the swept window width or chunk size under --sweep W

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
        import torch  # here, not at import: the command line parses --sweep without torch

        q = torch.empty(self.batch, self.heads, self.seq, self.head_dim, device="meta")
        kv = torch.empty(self.batch, self.heads_kv, self.seq, self.head_dim, device="meta")
        return AttentionSpec.from_inputs(q, kv, kv, **self.kwargs())

    def inputs(self, device, dtype, seed: int, requires_grad: bool):
        """Seeded q, k, v and a gradient for the output, on ``device``."""
        import torch

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
