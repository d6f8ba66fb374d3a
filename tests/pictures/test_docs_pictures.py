"""The pictures README.md and docs/ show are what the shipped commands draw today: each is regenerated
(tools/docs_pictures.py) and compared with the committed one by size and content, never bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnformal.pictures import tiles
from attnformal.scale import plot

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import docs_pictures  # noqa: E402

# name -> colours the picture must show (a tile class, the counterexample's red, a colour map's ends, each series')
SIGNS = {"tile-map-schedule.png": [tiles.CLASS_COLOURS[1], tiles.CLASS_COLOURS[2], tiles.PART_COLOURS[1]],
         "tile-map-refutation.png": [tiles.CLASS_COLOURS[1], tiles.MARK],
         "tile-map-fa2-window.png": [tiles.CLASS_COLOURS[1], tiles.MARK],
         "error-map.png": ["#b40426"],  # coolwarm's hot end: the errors far beyond the tolerance
         "sweep.png": list(plot.IMPL_COLOURS)}


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    return docs_pictures.regenerate(tmp_path_factory.mktemp("pictures"))


@pytest.mark.parametrize("name", sorted(docs_pictures.PICTURES))
def test_a_shown_picture_is_what_its_command_draws(name, regenerated, png):
    new, shown = png(regenerated[name]), png(ROOT / "docs" / "pictures" / name)
    for got, committed in zip(new.size, shown.size):
        assert abs(got - committed) <= 0.1 * committed, (name, new.size, shown.size)
    for colour in SIGNS[name]:
        assert new.share(colour) > 1e-4 and shown.share(colour) > 1e-4, (name, colour)


def test_every_picture_is_shown_somewhere():
    shown = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert set(docs_pictures.PICTURES) == set(SIGNS)
    assert all(f"pictures/{name}" in shown for name in docs_pictures.PICTURES)
