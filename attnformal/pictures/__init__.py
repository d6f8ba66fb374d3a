"""Pictures a reviewer can look at: tile maps of a schedule or a kernel tiling (:mod:`.tiles`),
error maps of a failing battery check (:mod:`.errors`), and one self-contained HTML report that
bundles them with the tables (:mod:`.html`).

Every picture is drawn from the project's own functions (``schedule.tile_class``,
``TileSchedule.kv_range``/``split_ranges``, ``masks.key_interval``, a tiling's ``kv_blocks``/
``masked``), never from a second copy of their logic. matplotlib is optional (the ``plot``
extra): without it :func:`require_matplotlib` raises :class:`PicturesUnavailable` with the
install line, and the commands say so instead of drawing.
"""

from __future__ import annotations

INSTALL = "pip install 'attnformal[plot]'"


class PicturesUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def require_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise PicturesUnavailable(f"pictures need matplotlib: {INSTALL}") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(figure, path) -> str:
    """Write ``figure`` as a PNG at ``path`` (its folder made) and close it; returns the path."""
    from pathlib import Path

    plt = require_matplotlib()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return str(path)
