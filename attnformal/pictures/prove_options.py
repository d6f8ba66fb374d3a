"""The pictures of ``attnformal prove``: ``--show-schedule``, ``--picture DIR`` and ``--report FILE.html``.

``prove --show-schedule --shape Sq,Sk [--causal MODE] [--window L,R] [--chunk-size C] [--splits N]`` draws
the project's schedule at one shape (the torch kernel's, or ``--schedule``/``--block-m``/``--block-n``) and
proves nothing; ``prove --kernel ... --picture DIR`` draws one tile map per refuted check and control.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from attnformal import cli

DEFAULT_SCHEDULE = "attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE"


def geometry_features():
    """The index-mask features a single geometry takes from the command line (not the per-batch ones)."""
    from attnformal.features import FEATURES

    return [f for f in FEATURES if f.role == "interval" and not f.per_batch]


def add_options(parser):
    """The picture options of ``prove``; the shape's mask takes each feature's own flag (named in --shape's help)."""
    parser.add_argument("--picture", metavar="DIR", help="tile maps (PNG) of --kernel refutations, --show-schedule")
    parser.add_argument("--show-schedule", action="store_true", help="draw the schedule at --shape; prove nothing")
    flags = []
    for feature in geometry_features():
        feature.add_argument(parser)
        parser._actions[-1].help = argparse.SUPPRESS  # listed in --shape's help: the screen is short
        flags.append(parser._actions[-1].option_strings[0])
    parser.add_argument("--shape", action=cli.IntList, count=2, minimum=0, form="Sq,Sk", metavar="SQ,SK",
                        help=f"the lengths to draw; mask: {', '.join(flags)}; --splits N")
    parser.add_argument("--splits", type=cli.integer(minimum=1), default=1, help=argparse.SUPPRESS)


def check(parser, args):
    """Usage errors of the picture options, before any work."""
    if args.show_schedule and args.shape is None:
        parser.error("argument '--show-schedule': expected --shape Sq,Sk")
    if args.shape is not None and not args.show_schedule:
        parser.error("argument '--shape': draws a schedule; expected --show-schedule with it")
    if args.picture is not None and not (args.kernel or args.show_schedule):
        parser.error("argument '--picture': draws a kernel tiling's refutations or a schedule; expected --kernel "
                     "or --show-schedule with it")
    given = [f.name for f in geometry_features() if f.from_arguments(args) != f.default]
    if given and not args.show_schedule:
        parser.error(f"argument '--{given[0].replace('_', '-')}': the mask of --show-schedule's shape; expected "
                     "--show-schedule with it")
    if args.picture is not None:
        try:
            cli.output_folder(args.picture, "--picture")
        except ValueError as error:
            parser.error(str(error))


def show_schedule(args, chosen, named) -> int:
    """Draw at ``--shape`` each ``--kernel`` tiling of ``chosen``, else each named schedule
    (``[(label, TileSchedule)]``; none named: the torch kernel's)."""
    from attnformal.masks import MaskGeometry
    from attnformal.pictures import PicturesUnavailable, tiles
    from attnformal.prove import load_schedules

    values = {f.name: f.from_arguments(args) for f in geometry_features()}
    g = MaskGeometry(*args.shape, **values)
    shape = f"{args.shape[0]}x{args.shape[1]}"
    if args.kernel:
        maps = [(tiles.tiling_map(obligation.cls(), g), f"tiling-{obligation.cls.__name__}-{shape}.png")
                for _, obligation in chosen]
    else:
        maps = []
        for label, sched in named or load_schedules([DEFAULT_SCHEDULE])[0]:
            sched = dataclasses.replace(sched, num_splits=args.splits)
            title = f"{label}: {sched.block_m} x {sched.block_n}, {sched.num_splits} split(s)"
            maps.append((tiles.schedule_map(sched, g, title), f"schedule-{sched.block_m}x{sched.block_n}-{shape}.png"))
    try:
        for tile_map, name in maps:
            print(f"tile map: {tiles.draw(tile_map, Path(args.picture or '.') / name)}")
    except PicturesUnavailable as error:
        print(f"error: {error}")
        return 2
    return 0


def write_pictures(args, chosen, checks, controls) -> list[str]:
    """``--picture``: the tile maps of the kernel tilings' refutations (printed, and returned)."""
    from attnformal.pictures import PicturesUnavailable, tiles

    if args.picture is None or not args.kernel:
        return []
    not_drawn = []
    try:
        written = tiles.refutation_pictures(chosen, checks, controls, args.picture, not_drawn)
    except PicturesUnavailable as error:
        print(f"no tile maps: {error}")
        return []
    for path in written:
        print(f"tile map: {path}")
    for reason in not_drawn:
        print(f"tile map not drawn, {reason}")
    return written


def html_report(args, chosen, checks, controls, wall, settings, pictures) -> str:
    """``--report FILE.html``: the run with its tile maps (drawn for the page alone when --picture is not given)."""
    import tempfile

    from attnformal.pictures import PicturesUnavailable, tiles
    from attnformal.pictures.html import prove_report

    if pictures or not args.kernel:
        return prove_report(checks, controls, wall, settings, pictures)
    with tempfile.TemporaryDirectory(prefix="attnformal-maps-") as folder:
        try:
            pictures = tiles.refutation_pictures(chosen, checks, controls, folder)
        except PicturesUnavailable:
            pictures = []
        return prove_report(checks, controls, wall, settings, pictures)
