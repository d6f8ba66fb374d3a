"""What the picture tests share: reading a PNG back (its size, and how much of it has a colour)."""

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
