"""The battery's own option vocabulary -- dtypes, features, check patterns, campaigns -- shared by
``python -m attnformal.verify`` and the pytest plugin.

The grammar is every command line's (:mod:`attnformal.cli`): list options take names
separated by spaces, commas or both (``--dtypes "float32, bfloat16"``, ``--attn-dtypes
"float32 bfloat16"``), and every name is checked against what exists before the first case
runs: a wrong one is a :class:`~attnformal.cli.UsageError` naming the option and what it
accepts, never a traceback at the end.
"""

from __future__ import annotations

import fnmatch

import torch

from attnformal.cli import DTYPES, UsageError, split_list
from attnformal.distributed import require_engine
from attnformal.verify.calls import FEATURES
from attnformal.verify.checks import CHECKS


def parse_dtypes(values, option="--dtypes") -> tuple[torch.dtype, ...]:
    names = split_list(values)
    unknown = [n for n in names if n not in DTYPES]
    if unknown or not names:
        raise UsageError(option, f"expected names from {', '.join(DTYPES)}, got {', '.join(unknown) or 'none'}")
    return tuple(dict.fromkeys(DTYPES[n] for n in names))


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


def check_campaign(workers: int | None, cluster: str | None, options=("--workers", "--cluster")):
    """``workers`` or ``cluster``, not both, and the engine they need installed (else
    :class:`~attnformal.distributed.EngineMissing`, which says how to install it)."""
    if workers is not None and cluster is not None:
        raise UsageError(options[0], f"expected {options[0]} or {options[1]}, not both")
    if workers or cluster:
        require_engine("/".join(options))
