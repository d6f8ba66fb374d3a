"""What the picture tests share: reading a PNG back (its size, and how much of it has a colour), and the
README's porting bug as a tiling file (its causal bound forgets the bottom-right shift)."""

from __future__ import annotations

from pathlib import Path

import pytest


class PNG:
    def __init__(self, path):
        import matplotlib.image

        self.path = Path(path)
        assert self.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
        self.pixels = matplotlib.image.imread(self.path)[..., :3]  # RGB in [0, 1]

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.pixels.shape[1], self.pixels.shape[0]

    def share(self, colour: str, within: float = 0.04) -> float:
        """The fraction of pixels within ``within`` (per channel) of ``colour`` ("#rrggbb")."""
        import numpy as np

        rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        return float((np.abs(self.pixels - rgb) <= within).all(-1).mean())


@pytest.fixture
def png():
    pytest.importorskip("matplotlib", reason="pictures need matplotlib (the plot extra)")
    return PNG


TOP_LEFT_BOUND = """
from attnformal import ops
from attnformal.tiling import KernelTiling


class TopLeftBound(KernelTiling):
    block_m, block_n = 128, 64
    masks = ("dense", "bottom_right")

    def kv_blocks(self, m_block, g):
        n_max = self.ceil_div(g.len_k, self.block_n)
        if g.causal:
            n_max = ops.minimum(n_max, self.ceil_div((m_block + 1) * self.block_m, self.block_n))
        return 0, n_max
"""


@pytest.fixture
def bound_tiling(tmp_path, monkeypatch):
    """``bound.py:TopLeftBound`` in a fresh working folder (refutations write their cases there)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bound.py").write_text(TOP_LEFT_BOUND)
    return "bound.py:TopLeftBound"
