"""Regenerate the pictures README.md and docs/ show, with the shipped ``attnformal`` commands.

    python tools/docs_pictures.py                 # rewrites docs/pictures/*.png
    python tools/docs_pictures.py OUT_FOLDER      # elsewhere (tests/pictures/test_docs_pictures.py)

Each picture is what one command prints ``tile map: PATH`` for (or writes at a known path), copied
under a stable name. The README's kernel and tiling examples are taken from the README itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (command after `attnformal`, the file it writes, relative to its working folder)
PICTURES = {
    "tile-map-schedule.png": (["prove", "--show-schedule", "--shape", "300,520", "--causal", "bottom_right",
                               "--window", "200,0", "--block-m", "64", "--block-n", "64", "--splits", "2",
                               "--picture", "maps"], "maps/schedule-64x64-300x520.png"),
    "tile-map-refutation.png": (["prove", "--kernel", "my_tiling.py:MyKernelTopLeft", "--picture", "maps",
                                 "--timeout", "600"], "maps/MyKernelTopLeft-bottom_right-complete.png"),
    "tile-map-fa2-window.png": (["prove", "--kernel", "attnformal.tilings.fa2:FA2Forward", "--picture", "maps",
                                 "--timeout", "600"], "maps/FA2Forward-window-mask-safe.png"),
    "error-map.png": (["verify", "--impl", "my_kernel.py:attention_head_1_unscaled", "--only", "fwd.random", "--dtypes",
                       "float32"], "verify-repro/my_kernel.attention_head_1_unscaled/fwd.random-float32.png"),
    "sweep.png": (["scale", "--impl", "my_kernel.py:attention", "--vs", "torch-tiled", "--mask", "causal", "--sweep",
                   "N=256..2048", "--min-time", "0.01", "--clock", "process", "--out", "scale"], "scale/sweep.png"),
}


def readme_block(name: str) -> str:
    """The README's ``file=NAME`` code block."""
    text = (ROOT / "README.md").read_text()
    return re.search(rf"```python file={re.escape(name)}\n(.*?)```", text, re.S).group(1)


def regenerate(folder: Path, names=tuple(PICTURES)) -> dict[str, Path]:
    """Run each picture's command in a scratch folder; copy what it drew to ``folder/NAME``."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    with tempfile.TemporaryDirectory(prefix="attnformal-pictures-") as scratch:
        for example in ("my_tiling.py", "my_kernel.py"):
            (Path(scratch) / example).write_text(readme_block(example))
        for name in names:
            argv, drawn = PICTURES[name]
            done = subprocess.run([sys.executable, "-m", "attnformal.command", *argv], cwd=scratch,
                                  capture_output=True, text=True)
            if done.returncode not in (0, 1) or not (Path(scratch) / drawn).is_file():
                raise RuntimeError(f"{name}: `attnformal {' '.join(argv)}` drew no {drawn}:\n{done.stderr[-2000:]}")
            written[name] = Path(shutil.copyfile(Path(scratch) / drawn, folder / name))
    return written


if __name__ == "__main__":
    for path in regenerate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "pictures").values():
        print(path)
