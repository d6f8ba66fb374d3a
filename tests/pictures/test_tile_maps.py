"""Tile maps: drawn from the schedule's own classification and ranges, and a refutation's tile marked."""

from __future__ import annotations

import pytest

from attnformal import ops
from attnformal.logic import REFUTED, Proof
from attnformal.masks import MaskGeometry
from attnformal.pictures import tiles
from attnformal.prove import main as prove
from attnformal.schedule import FULL, PARTIAL, SKIP, TileSchedule
from attnformal.tiling import load_tilings


def test_a_schedule_map_holds_its_classes_and_split_parts():
    g = MaskGeometry(128, 128, "top_left")
    tile_map = tiles.schedule_map(TileSchedule(64, 64, num_splits=2), g)
    assert tile_map.classes == [[PARTIAL, SKIP], [FULL, PARTIAL]]  # the diagonal tiles are masked
    assert tile_map.parts == [[(0, 64)], [(0, 64), (64, 128)]]  # query block 1's two keys blocks, one per part


def test_a_schedule_with_its_own_classification_is_drawn_with_it():
    class EverythingSkipped(TileSchedule):
        def tile_class(self, bm, bn, g):
            return ops.where(bm >= 0, SKIP, SKIP)

    g = MaskGeometry(128, 128, "top_left")
    assert tiles.schedule_map(EverythingSkipped(64, 64), g).classes == [[SKIP, SKIP], [SKIP, SKIP]]


def test_a_refutation_map_marks_the_missed_tile_and_pair(tmp_path, png, bound_tiling):
    proof = Proof("[bottom_right] complete: every tile holding an allowed pair is visited", "z3", REFUTED,
                  case="bottom_right", countermodel={"Sq": "1", "Sk": "129", "m_block": "0", "n_block": "2",
                                                     "i": "0", "j": "128", "key blocks": "[0, 2)"})
    tile_map = tiles.refutation_map(load_tilings(bound_tiling)[0], proof)
    assert tile_map.parts == [[(0, 128)]]  # the kernel's own kv_blocks at the counterexample's shape
    assert (tile_map.mark.m_block, tile_map.mark.tile, tile_map.mark.i, tile_map.mark.j) == (0, (128, 192), 0, 128)
    picture = png(tiles.draw(tile_map, tmp_path / "refuted.png"))
    assert picture.size[0] > 400 and picture.size[1] > 150
    assert picture.share(tiles.MARK) > 0.001  # the red tile and cross are drawn
    assert picture.share(tiles.CLASS_COLOURS[PARTIAL]) > 0.05


def test_show_schedule_draws_the_named_schedule(tmp_path, png, capsys):
    assert prove(["--show-schedule", "--shape", "300,520", "--causal", "bottom_right", "--window", "200,0",
                  "--block-m", "64", "--block-n", "64", "--splits", "2", "--picture", str(tmp_path)]) == 0
    path = tmp_path / "schedule-64x64-300x520.png"
    assert f"tile map: {path}" in capsys.readouterr().out
    picture = png(path)
    assert picture.share(tiles.CLASS_COLOURS[FULL]) > 0.01 and picture.share(tiles.PART_COLOURS[1]) > 0.001


def test_prove_picture_writes_one_map_per_refuted_check(tmp_path, png, bound_tiling, capsys):
    assert prove(["--kernel", bound_tiling, "--picture", "maps", "--timeout", "600"]) == 1
    out = capsys.readouterr().out
    written = sorted(p.name for p in (tmp_path / "maps").iterdir())
    assert written == ["TopLeftBound-bottom_right-complete.png", "control-TopLeftBoundOneTileShort-dense-complete.png"]
    assert all(f"tile map: maps/{name}" in out for name in written)
    assert png(tmp_path / "maps" / written[0]).share(tiles.MARK) > 0.001


@pytest.mark.parametrize("argv, message", [
    (["--show-schedule"], "argument '--show-schedule': expected --shape Sq,Sk"),
    (["--shape", "4,4"], "argument '--shape': draws a schedule; expected --show-schedule"),
    (["--picture", "x"], "argument '--picture': draws a kernel tiling's refutations"),
    (["--causal", "top_left"], "argument '--causal': the mask of --show-schedule's shape"),
])
def test_picture_options_are_refused_alone(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        prove(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_map_too_large_to_read_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match="argument '--shape': 1 x 300 tiles of 64 x 64"):
        tiles.schedule_map(TileSchedule(64, 64), MaskGeometry(1, 300 * 64))
