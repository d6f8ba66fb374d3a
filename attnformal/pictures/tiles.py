"""Tile maps: query blocks x key blocks of one shape, each tile coloured by its class.

The picture of a schedule (:func:`schedule_map`) or of a kernel's own tiling (:func:`tiling_map`)
at one shape, in block units (every tile a cell, as the FlashAttention papers draw them):

* fill: each tile's class (skip, partial, full): the schedule's own ``tile_class``, or for a kernel
  tiling the spec's ``schedule.tile_class`` at its block sizes, with the region outside the tensor (rows past ``Sq``, keys past ``Sk``) hatched;
* dashed outline: the allowed pairs, each row's interval from ``masks.key_interval``;
* bars: the keys each query block visits -- ``TileSchedule.split_ranges`` (one bar per split part),
  or the tiling's own ``kv_blocks``/``split``; a kernel's tiles computed without the mask (its
  ``masked`` says no) are hatched;
* for a refutation (:func:`refutation_map`): the tile and the ``(i, j)`` of the counterexample, in red.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from attnformal import ops, schedule
from attnformal.masks import MaskGeometry, key_interval
from attnformal.pictures import require_matplotlib, save

CLASS_COLOURS = {schedule.SKIP: "#eeeeee", schedule.PARTIAL: "#f2b447", schedule.FULL: "#4a7fb5"}
PART_COLOURS = ("#111111", "#c2185b", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f")
MARK = "#d62728"
MAX_BLOCKS = 256  # per direction; beyond it a map is unreadable (and refused with the numbers)


@dataclass
class Mark:
    """What a refutation points at: query block ``m_block``, the tile ``[first, first + width)`` of keys, ``(i, j)``."""

    text: str
    m_block: int | None = None
    tile: tuple[int, int] | None = None  # keys [first, end) of the offending tile
    i: int | None = None
    j: int | None = None


@dataclass
class TileMap:
    """Everything a tile map shows, computed by the project's functions; :func:`draw` only draws it."""

    title: str
    g: MaskGeometry
    block_m: int
    block_n: int
    classes: list[list[int]]  # [query block][key block]: schedule.tile_class
    parts: list[list[tuple[int, int]]]  # [query block]: keys [first, end) of each part that is not empty
    unmasked: list[tuple[int, int, int]] = field(default_factory=list)  # (query block, first key, end key)
    mark: Mark | None = None

    @property
    def num_splits(self) -> int:
        return max([len(p) for p in self.parts] + [1])


class TooLarge(ValueError):
    """A shape with more tiles than a picture can show (a usage error on --shape; a refutation at Sk near 2^31)."""


def _check_size(g: MaskGeometry, block_m: int, block_n: int):
    rows, cols = ops.cdiv(g.len_q, block_m), ops.cdiv(g.len_k, block_n)
    if rows > MAX_BLOCKS or cols > MAX_BLOCKS:
        raise TooLarge(f"argument '--shape': {rows} x {cols} tiles of {block_m} x {block_n}; expected at most "
                         f"{MAX_BLOCKS} per direction (a larger block or a smaller shape)")


def classes_of(classify, g: MaskGeometry, block_m: int, block_n: int) -> list[list[int]]:
    """``classify(bm, bn)`` of every tile, on int tensors (a whole grid in one call)."""
    import torch

    bm = torch.arange(ops.cdiv(g.len_q, block_m))[:, None]
    bn = torch.arange(ops.cdiv(g.len_k, block_n))[None, :]
    return torch.as_tensor(classify(bm, bn)).expand(bm.shape[0], bn.shape[1]).tolist()


def schedule_map(sched: schedule.TileSchedule, g: MaskGeometry, title: str | None = None) -> TileMap:
    """The tile map of the project's schedule: its classes and ``split_ranges`` at one shape."""
    _check_size(g, sched.block_m, sched.block_n)
    parts = [[(r.start * sched.block_n, r.stop * sched.block_n) for r in sched.split_ranges(m, g) if r.start < r.stop]
             for m in range(sched.num_q_blocks(g))]
    name = title or (f"TileSchedule({sched.block_m}, {sched.block_n}"
                     + (f", num_splits={sched.num_splits})" if sched.num_splits > 1 else ")"))
    classes = classes_of(lambda bm, bn: sched.tile_class(bm, bn, g), g, sched.block_m, sched.block_n)
    return TileMap(name, g, sched.block_m, sched.block_n, classes, parts)


def tiling_map(tiling, g: MaskGeometry, title: str | None = None, mark: Mark | None = None) -> TileMap:
    """The tile map of a kernel's own tiling (a :class:`~attnformal.tiling.KernelTiling`) at one shape: the
    spec's classes at its block sizes, the ranges its ``kv_blocks``/``split`` visit, the tiles it leaves unmasked."""
    from attnformal.tiling import _tiles, keys_of, parts

    if tiling.qhead_per_kvhead != 1:
        raise ValueError(f"{type(tiling).__name__}: packs {tiling.qhead_per_kvhead} query heads per row block; "
                         "a tile map draws one query position per row")
    _check_size(g, tiling.block_m, tiling.block_n)
    ranges, unmasked = [], []
    for m in range(ops.cdiv(g.len_q, tiling.block_m)):
        visited = [(lo, hi) for lo, hi in parts(tiling, m, g) if lo < hi]
        ranges.append([keys_of(tiling, lo, hi) for lo, hi in visited])
        for lo, hi in visited:
            for tile, cols in _tiles(tiling, lo, hi):
                if not tiling.masked(m, tile, g):
                    unmasked.append((m, int(cols[0]), int(cols[-1]) + 1))
    classes = classes_of(lambda bm, bn: schedule.tile_class(bm, bn, g, tiling.block_m, tiling.block_n), g,
                         tiling.block_m, tiling.block_n)
    return TileMap(title or type(tiling).__name__, g, tiling.block_m, tiling.block_n, classes, ranges, unmasked, mark)


# ---------------------------------------------------------------------------- a refutation's shape


def _ints(countermodel) -> dict[str, int]:
    return {k: int(v) for k, v in countermodel.items() if re.fullmatch(r"-?\d+", str(v))}


def _window(text: str | None):
    """``"(3, -)"`` (a counterexample's window) -> ``(3, -1)``: the spec's unbounded side."""
    if text is None:
        return None, None
    left, right = (part.strip() for part in text.strip("()").split(","))
    return (-1 if left == "-" else int(left)), (-1 if right == "-" else int(right))


OBLIGATION_TEXT = {
    "complete": "(i, j) is allowed, but its tile is never visited",
    "mask-safe": "(i, j) is not allowed, but its tile is computed without the mask",
    "in bounds": "a visited tile reads keys outside the tensor",
    "splits": "the split parts do not partition the visited keys at key j",
}


def refutation_map(tiling_cls, proof) -> TileMap | None:
    """The map of a refuted check of ``tiling_cls`` at its counterexample's shape (None without one)."""
    from attnformal.tiling import MASK_FAMILIES

    if not proof.countermodel or proof.case not in MASK_FAMILIES:
        return None
    values = _ints(proof.countermodel)
    if "Sq" not in values or "Sk" not in values:
        return None
    g = MASK_FAMILIES[proof.case].geometry(values["Sq"], values["Sk"], *_window(proof.countermodel.get("window")))
    obligation = proof.claim.split("] ", 1)[-1].split(":", 1)[0]
    tiling = tiling_cls()
    j = values.get("j", values.get("key"))
    tile = None
    if j is not None:
        first = j - j % tiling.block_n
        tile = (first, first + tiling.block_n)
    mark = Mark(f"{obligation} refuted: {OBLIGATION_TEXT.get(obligation, proof.claim)}", values.get("m_block"),
                tile, values.get("i"), j)
    return tiling_map(tiling, g, f"{tiling_cls.__name__} [{proof.case}]", mark)


# ---------------------------------------------------------------------------- drawing


def describe(g: MaskGeometry) -> str:
    shown = [f"Sq = {g.len_q}", f"Sk = {g.len_k}"]
    shown += [f"{name} = {value}" for name, value in g.values.items() if value is not None and value is not False]
    return ", ".join(shown)


def draw(tile_map: TileMap, path) -> str:
    """Draw ``tile_map`` as a PNG at ``path``; returns the path."""
    plt = require_matplotlib()
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    t, g = tile_map, tile_map.g
    rows, cols = len(t.classes), len(t.classes[0]) if t.classes else 0
    width = max(cols, 1)
    height = min(rows, g.len_q / t.block_m) if rows else 1  # up to the last real row: a ragged block is short
    scale = min(0.6, 9.0 / width, 7.0 / max(height, 1))
    figure, ax = plt.subplots(figsize=(width * scale + 4.5, max(1.6, height * scale) + 1.6))
    if rows and cols:
        ax.imshow(t.classes, cmap=ListedColormap([CLASS_COLOURS[c] for c in sorted(CLASS_COLOURS)]), vmin=0, vmax=2,
                  extent=(0, cols, rows, 0), interpolation="nearest", aspect="auto")
    if cols <= 64 and rows <= 64:  # tile edges
        ax.vlines(range(1, cols), 0, rows, color="white", linewidth=1.0)
        ax.hlines(range(1, rows), 0, cols, color="white", linewidth=1.0)
    _outside(ax, t, rows, cols, Rectangle)
    _allowed(ax, t)
    _visited(ax, t)
    for m, first, end in t.unmasked:
        ax.add_patch(Rectangle((first / t.block_n, m), (end - first) / t.block_n, 1, fill=False, hatch="///",
                               edgecolor="#333333", linewidth=0))
    if t.mark is not None:
        _mark(ax, t, Rectangle)
    _block_ticks(ax.set_xticks, cols, [min(1.0, g.len_k / t.block_n - n) for n in range(cols)])
    _block_ticks(ax.set_yticks, rows, [min(1.0, g.len_q / t.block_m - m) for m in range(rows)])
    ax.set_xlim(0, width)
    ax.set_ylim(max(height, 1e-9), 0)
    ax.set_xlabel(f"key block (block_n = {t.block_n} keys)")
    ax.set_ylabel(f"query block\n(block_m = {t.block_m} rows)")
    title = f"{t.title}\n{describe(g)}"
    if t.mark is not None:
        title += f"\n{t.mark.text}"
    ax.set_title(title, fontsize=9, color=MARK if t.mark is not None else "black")
    handles = [Patch(facecolor=CLASS_COLOURS[c], edgecolor="#999999", label=f"{schedule.TILE_CLASS_NAMES[c]} tile")
               for c in sorted(CLASS_COLOURS)]
    handles += [Patch(facecolor="white", edgecolor="#999999", hatch="xx", label="outside the tensor"),
                Patch(facecolor="none", edgecolor="black", linestyle=(0, (4, 2)), label="allowed (i, j): inside")]
    handles += [Line2D([], [], color=PART_COLOURS[s % len(PART_COLOURS)], linewidth=2.5,
                       label="visited keys" + (f", part {s}" if t.num_splits > 1 else "")) for s in range(t.num_splits)]
    if t.unmasked:
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="///", label="computed without the mask"))
    if t.mark is not None:
        handles.append(Line2D([], [], color=MARK, marker="x", linestyle="none", markersize=9,
                              label="counterexample (i, j)\nand its tile"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return save(figure, path)


def _block_ticks(set_ticks, count, real):
    """Block indices at the middle of each block's real part (every k-th when there are many)."""
    every = max(1, count // 16)
    shown = range(0, count, every)
    set_ticks([n + real[n] / 2 for n in shown], [str(n) for n in shown])


def _outside(ax, t: TileMap, rows, cols, Rectangle):
    """Hatch the part of the tile grid outside the tensor (a ragged last block)."""
    q_end, k_end = t.g.len_q / t.block_m, t.g.len_k / t.block_n
    style = {"fill": False, "hatch": "xx", "edgecolor": "#9e9e9e", "linewidth": 0}
    if q_end < rows:
        ax.add_patch(Rectangle((0, q_end), cols, rows - q_end, **style))
    if k_end < cols:
        ax.add_patch(Rectangle((k_end, 0), cols - k_end, min(q_end, rows), **style))


def _allowed(ax, t: TileMap):
    """The allowed pairs: each row's key interval, ``masks.key_interval`` on all rows at once."""
    import torch

    if t.g.len_q == 0:
        return
    rows = torch.arange(t.g.len_q)
    lo, hi = (torch.as_tensor(x).expand(t.g.len_q).to(torch.float64) for x in key_interval(rows, t.g))
    lo, end = lo.clamp(min=0), (hi + 1).clamp(max=t.g.len_k)
    edges = torch.arange(t.g.len_q + 1, dtype=torch.float64) / t.block_m
    lo, end = torch.cat([lo, lo[-1:]]) / t.block_n, torch.cat([end, end[-1:]]) / t.block_n
    some = lo < end  # a row with no allowed key draws nothing
    ax.fill_betweenx(edges.numpy(), lo.numpy(), end.numpy(), where=some.numpy(), step="post", facecolor="none",
                     edgecolor="black", linewidth=1.6, linestyle=(0, (4, 2)))


def _visited(ax, t: TileMap):
    """One bar per query block and split part, across the keys it visits, in the middle of its real rows."""
    for m, ranges in enumerate(t.parts):
        first_row, last_row = m * t.block_m, min((m + 1) * t.block_m, t.g.len_q)
        y = (first_row + last_row) / 2 / t.block_m
        step = 0.5 / max(t.num_splits, 1)
        for s, (first, end) in enumerate(ranges):
            offset = (s - (len(ranges) - 1) / 2) * step
            ax.plot([first / t.block_n, end / t.block_n], [y + offset] * 2, color=PART_COLOURS[s % len(PART_COLOURS)],
                    linewidth=2.5, marker="|", markersize=10, solid_capstyle="butt")


def _mark(ax, t: TileMap, Rectangle):
    mark = t.mark
    if mark.m_block is not None and mark.tile is not None:
        first, end = mark.tile
        ax.add_patch(Rectangle((first / t.block_n, mark.m_block), (end - first) / t.block_n, 1, fill=False,
                               edgecolor=MARK, linewidth=3, zorder=5))
    elif mark.m_block is not None:
        ax.add_patch(Rectangle((0, mark.m_block), max(len(t.classes[0]), 1), 1, fill=False, edgecolor=MARK,
                               linewidth=3, zorder=5))
    if mark.i is not None and mark.j is not None:
        ax.plot([(mark.j + 0.5) / t.block_n], [(mark.i + 0.5) / t.block_m], marker="x", color=MARK, markersize=12,
                markeredgewidth=3, zorder=6)
        right = (mark.j + 0.5) / t.block_n > 0.6 * len(t.classes[0])  # the label goes inwards
        ax.annotate(f"(i, j) = ({mark.i}, {mark.j})", ((mark.j + 0.5) / t.block_n, (mark.i + 0.5) / t.block_m),
                    xytext=(-10 if right else 10, -12), textcoords="offset points", ha="right" if right else "left",
                    va="top", color=MARK, fontsize=9, fontweight="bold", annotation_clip=False)


# ---------------------------------------------------------------------------- what prove writes


def refutation_pictures(chosen, checks, controls, folder, not_drawn: list | None = None) -> list[str]:
    """One tile map per refuted check and refuted control of the ``--kernel`` obligations, in ``folder``.
    A counterexample too large to draw (an int32 wrap at Sk near 2^31) adds its reason to ``not_drawn``."""
    variants = {(number, c.name): c.variant for number, obligation in chosen for c in obligation.CONTROLS}
    classes = {number: obligation.cls for number, obligation in chosen}
    refuted = [(classes[o.number], p, "") for o in checks for p in o.checks if p.status == "refuted"]
    refuted += [(variants[(c.obligation, c.name)], c.proof, "control-") for c in controls
                if c.proof.status == "refuted" and (c.obligation, c.name) in variants]
    written = []
    for cls, proof, prefix in refuted:
        try:
            tile_map = refutation_map(cls, proof)
        except TooLarge as too_large:
            if not_drawn is not None:
                not_drawn.append(f"{prefix}{cls.__name__} [{proof.case}]: {str(too_large).partition(': ')[2]}")
            continue
        if tile_map is not None:
            obligation = proof.claim.split("] ", 1)[-1].split(":", 1)[0].replace(" ", "-")
            written.append(draw(tile_map, Path(folder) / f"{prefix}{cls.__name__}-{proof.case}-{obligation}.png"))
    return written
