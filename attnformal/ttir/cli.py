"""``python -m attnformal.prove --triton FILE.py:KERNEL`` (or ``MODULE:ATTR``; repeated for several): the TTIR
theorems, one line each."""

from __future__ import annotations

import sys

from attnformal.logic import PROVED, RLIMIT_UNIT
from attnformal.ttir.launch import LAUNCHES
from attnformal.ttir.theorems import Limits, load_attr, prove_launch


def launch_for(target: str):
    """The launch description of a kernel: by ``module:attr``, or by the attribute's name for a file copy."""
    if target in LAUNCHES:
        return LAUNCHES[target]
    attr = target.rpartition(":")[2]
    matches = [launch for name, launch in LAUNCHES.items() if name.rpartition(":")[2] == attr]
    if len(matches) != 1:
        raise ValueError(f"argument '--triton': no launch description for {target!r}; known: {', '.join(LAUNCHES)}")
    return matches[0]


def prove_triton(target: str, limits: Limits = Limits(), out=sys.stdout) -> int:
    try:
        launch = launch_for(target)
        fn = load_attr(target)
    except (ValueError, ImportError, AttributeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ok = True
    print(f"kernel {target}", file=out)
    for config, proofs in prove_launch(launch, fn=fn, limits=limits):
        print(f"config {_named(config)}", file=out)
        for proof in proofs:
            ok &= proof.status == PROVED
            extra = proof.detail or (proof.countermodel or "")
            print(f"  {proof.status:8} {proof.rlimit / RLIMIT_UNIT:7.1f} M units {proof.seconds:6.1f} s  {proof.claim}  {extra}",
                  file=out)
    return 0 if ok else 1


def _named(config: dict) -> str:
    """``CAUSAL=2 HAS_SOFTCAP``: the causal mode and the feature flags that are on (the configurations differ there)."""
    return " ".join([f"CAUSAL={config.get('CAUSAL')}"] + [name for name, value in config.items() if value is True])
