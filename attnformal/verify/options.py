"""The battery's option vocabulary, shared by ``python -m attnformal.verify`` and the pytest plugin.

Every list option takes names separated by spaces, commas or both (``--dtypes "float32,
bfloat16"``, ``--attn-dtypes "float32 bfloat16"``). Every name is checked against what
exists, and every output path before the first case runs: a wrong one is a
:class:`UsageError` naming the option and what it accepts, never a traceback at the end.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import re
from pathlib import Path

import torch

from attnformal.verify.calls import FEATURES
from attnformal.verify.checks import CHECKS
from attnformal.verify.runner import DTYPE_NAMES


class UsageError(ValueError):
    """A wrong option value; the message starts with ``argument <option>:``."""

    def __init__(self, option: str, text: str):
        super().__init__(f"argument {option}: {text}")


def split_list(values) -> list[str]:
    """Names from a string or a list of strings, separated by spaces and/or commas."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part for value in values for part in value.replace(",", " ").split()]


def parse_dtypes(values, option="--dtypes") -> tuple[torch.dtype, ...]:
    names = split_list(values)
    unknown = [n for n in names if n not in DTYPE_NAMES]
    if unknown or not names:
        raise UsageError(option, f"expected names from {', '.join(DTYPE_NAMES)}, got {', '.join(unknown) or 'none'}")
    return tuple(dict.fromkeys(DTYPE_NAMES[n] for n in names))


def parse_features(values, option="--require") -> frozenset[str]:
    names = split_list(values)
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise UsageError(option, f"unknown features {', '.join(unknown)}; known: {', '.join(FEATURES)}")
    return frozenset(names)


def parse_patterns(values, profile: str, option="--only") -> tuple[str, ...]:
    """Glob patterns of check names; each must match a check that runs in ``profile``."""
    patterns = tuple(split_list(values))
    for pattern in patterns:
        matches = [c for c in CHECKS if fnmatch.fnmatch(c.name, pattern)]
        if not matches:
            groups = sorted({c.group for c in CHECKS})
            raise UsageError(option, f"{pattern!r} matches no check (groups: {', '.join(groups)}; "
                                     f"--list names every check)")
        if profile != "full" and all(c.full_only for c in matches):
            raise UsageError(option, f"{pattern!r} matches only checks of --profile full")
    return patterns


def parse_seconds(text: str) -> float:
    """argparse type of a timeout: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def parse_threads(text: str) -> int:
    """argparse type of --threads: an int >= 0 (0 leaves torch's setting)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def check_device(device: str, option="--device"):
    try:
        torch.empty(0, device=device)
    except Exception as err:  # RuntimeError, or AssertionError from a torch built without CUDA
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(option, f"{device!r} is not usable here: {first}") from None


def check_output_file(path: Path | None, option: str):
    """``path`` can be written: its folder exists and is writable, and it is not a folder itself."""
    if path is None:
        return
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(option, f"{path} is a folder, expected a file name")
    if not folder.is_dir():
        raise UsageError(option, f"the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(option, f"{path} is not writable")


def check_output_dir(path: Path | None, option: str):
    """``path`` is a writable folder, or one that can be created (nothing is created here)."""
    if path is None:
        return
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(option, f"cannot create the folder {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK):
        raise UsageError(option, f"cannot create the folder {path}: {existing} is not writable")


def impl_slug(target: str) -> str:
    """A folder name for an implementation: ``examples/bug.py:attention`` -> ``bug.attention``."""
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        where = Path(where).stem
    text = f"{where}.{name}" if where else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "impl"
