"""The battery: every check, in the order the report lists them.

Groups (one module each):

* :mod:`.hand` -- cases whose exact answer is known in closed form;
* :mod:`.accuracy` -- comparisons with the reference over shapes, masks, structured and
  extreme inputs, lse, and the error's growth with sequence length;
* :mod:`.ranges` -- the dtype's range: masked scores far above the allowed ones, V and dO past
  float16's range;
* :mod:`.structure` -- properties that hold exactly whatever the tolerance: the
  probabilities themselves (V = identity), metamorphic relations, repeatability;
* :mod:`.packed` -- packed variable-length batches (cu_seqlens), each sequence as if alone;
* :mod:`.gradients` -- dQ, dK, dV against the reference, finite differences, invariants;
* :mod:`.dropout` -- p = 0, replay of a given keep-mask, statistics of the kernel's own;
* :mod:`.score_state` -- attention sinks, ALiBi and the additive bias: closed forms, the
  reference, their gradients and relations;
* :mod:`.regimes` -- the shape regimes a kernel may choose its path by (Sq 1, 2, 13, 128 against
  Sk 1 ... thousands), under each feature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

CHECKS: list[Check] = []


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable
    doc: str
    fixed_dtype: torch.dtype | None = None  # runs once, in this dtype, whatever --dtypes asks
    full_only: bool = False  # belongs to --profile full only (long sequences)
    names_causes: bool = False  # its probes name classes earlier checks see only as symptoms (run after --fail-fast)

    @property
    def group(self) -> str:
        return self.name.partition(".")[0]


def check(name: str, *, fixed_dtype=None, full_only=False, names_causes=False):
    """Register a check; its docstring's first line is what the report says it tests."""
    def register(fn):
        doc = (fn.__doc__ or "").strip().splitlines()[0]
        CHECKS.append(Check(name, fn, doc, fixed_dtype, full_only, names_causes))
        return fn
    return register


# Registration, in report order: hand-computable first, then the reference, structure, gradients, dropout.
from attnformal.verify.checks import hand, accuracy, ranges, structure, packed, gradients, dropout, score_state, regimes  # noqa: E402,F401,I001,E501
