"""The feature declaration: everything about one protocol keyword, written once.

A :class:`Feature` is one keyword of the implementation protocol (``causal``, ``window``,
``kv_lens``, ...). Its declaration holds the keyword and default, the validation (one-line
:class:`~attnformal.spec.SpecError`), the JSON form (golden files), the command-line flag, the
Hypothesis strategy piece, and its part in the semantics: a *narrowing* of row ``i``'s key
interval (index masks, so every index mask stays one interval per row), a per-element data
mask, or a change of the scores. Every consumer iterates :data:`FEATURES` (see
:mod:`attnformal.features`); an implementation names the features it supports and
:func:`refuse_unsupported` refuses any other active one, so a new feature is never silently
computed without.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple


class Problem(NamedTuple):
    """The shapes a feature's value is validated against."""

    batch: int
    heads_q: int
    len_q: int
    len_k: int
    device: Any

    @property
    def full(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_q, self.len_q, self.len_k)


class Feature:
    """One protocol keyword. Subclasses override what their feature takes part in.

    ``role``: ``"interval"`` (narrows the key interval of a row: :meth:`narrow`), ``"length"``
    (sets the batch element's key length: :meth:`key_length`), ``"data"`` (a per-element mask
    ANDed on top: a tile under it is never FULL), ``"scores"`` (:meth:`modify_scores`),
    ``"bias"`` (an additive score bias that depends on the batch element, head and position:
    :meth:`score_bias`, added after the ``"scores"`` features), ``"state"`` (a change of the
    softmax state: the sink, see :mod:`attnformal.features.sinks`) or ``"dropout"``. ``per_batch``:
    the value is one entry per batch element, and a geometry takes element ``b``. ``tensor``: the
    value is data (out of equality and JSON; travels as an array).
    """

    name: str = ""
    default: Any = None
    role: str = ""
    per_batch: bool = False
    tensor: bool = False
    summary: str = ""  # one line: what the value means (docs, CLI help)
    # The battery's bug class for a mask violated at this feature's edge of the key interval
    # (id, title); diagnosis attributes such violations to it (None: no edge of its own).
    edge_bug: tuple[str, str] | None = None
    # The prover's tile queries with this feature are slow (floor division by a symbolic size): its
    # families are classified in an obligation of their own, with their own time budget.
    slow_tiles: bool = False

    def validate(self, value, problem: Problem, values: dict):
        """The checked value (``values``: the features validated before this one)."""
        return value

    def active(self, value) -> bool:
        """Whether ``value`` changes the problem (inactive features are ignored everywhere)."""
        return value is not None

    def conflict(self, values: dict) -> str | None:
        """Why this (active) feature cannot go with the other ``values``, or None: validation refuses
        such a call, and the prover skips such a combination."""
        return None

    # ---- semantics

    def geometry_value(self, value, b):
        """What a batch element's :class:`~attnformal.masks.MaskGeometry` holds for this feature; a per-batch
        feature has no value for ``b=None`` (the geometry shared by all elements leaves it out)."""
        if not self.per_batch or value is None:
            return value
        return None if b is None else element(value, b)

    def sequence_value(self, value, b: int):
        """This feature's value for packed sequence ``b`` on its own (a batch-1 problem,
        :meth:`~attnformal.spec.AttentionSpec.sequence`): a per-batch feature's entry ``b``; any other value
        as it is (a per-head value is every sequence's)."""
        if self.per_batch and value is not None:
            return value[b:b + 1]
        return value

    def narrow(self, i, lo, hi, value, g):
        """``(lo, hi)`` of row ``i`` after this feature (``role == "interval"``), written on ``ops``."""
        raise NotImplementedError(f"feature {self.name} has no key interval")

    def key_length(self, value, len_k):
        """The batch element's key length (``role == "length"``)."""
        return len_k

    def modify_scores(self, s, value):
        """The scores after this feature (``role == "scores"``)."""
        return s

    def score_bias(self, value, spec, batches, rows: slice, cols: slice, dtype):
        """This feature's additive bias on a tile (``role == "bias"``): ``[len(batches) | 1, Hq | 1,
        rows, cols]`` (broadcastable) for the batch elements ``batches`` (an index tensor)."""
        raise NotImplementedError(f"feature {self.name} has no score bias")

    def one_element(self, value, b: int, h: int, full):
        """The value for batch element ``b`` and query head ``h`` alone (a one-element problem: the
        golden files' spot check); ``full`` is ``[B, Hq, Sq, Sk]``. Tensors here broadcast to it."""
        if self.per_batch:
            return [value[b]]
        if self.tensor:
            return value.expand(full)[b:b + 1, h:h + 1]
        return value

    # ---- JSON (golden files) and command line

    def to_json(self, value):
        return value

    def from_json(self, data):
        return data

    def add_argument(self, parser) -> None:
        """Add this feature's flag to an argparse parser (``reference generate``); none by default."""

    def from_arguments(self, args):
        """The protocol value read back from parsed arguments."""
        return self.default

    # ---- Hypothesis and the prover

    def example(self, shape) -> dict | None:
        """Protocol keywords that turn this feature on for a :class:`~attnformal.verify.cases.Shape`
        (with any companion it needs): the battery's capability probe. None: probed elsewhere or not at all."""
        return None

    def strategy(self, shape):
        """A Hypothesis strategy of values for a :class:`~attnformal.verify.cases.Shape` (None: not drawn)."""
        return None

    def prover_values(self):
        """``(label, value)`` pairs the prover covers, inactive first: every mode, and Z3 symbols for
        numbers (so a proof holds for all of them). Only index-mask features need more than ``None``."""
        return [(f"no {self.name}", None)]

    def domain(self, value):
        """``(label, formula)`` hypotheses on a symbolic geometry value: the range validation allows."""
        return ()


def element(values, index):
    """``values[index]``; for an index tensor, element by element; a Z3 array is selected."""
    if type(index).__module__.partition(".")[0] == "torch":
        import torch

        return torch.as_tensor(values, dtype=torch.int64, device=index.device)[index]
    return values[index]


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def int_list(name: str, value, batch: int, low: int, high: int, what: str, bounds: str) -> tuple[int, ...]:
    """``batch`` ints in ``[low, high]`` (a list, tuple or int tensor), or a :class:`SpecError`
    (``what``: what one int is; ``bounds``: the range as the message states it)."""
    import torch

    from attnformal.spec import SpecError

    values = value.tolist() if isinstance(value, torch.Tensor) else value
    if not isinstance(values, Sequence) or len(values) != batch or not all(is_int(n) for n in values):
        raise SpecError(name, f"None or {batch} ints ({what})", repr(value))
    if any(not low <= n <= high for n in values):
        raise SpecError(name, bounds, repr(list(values)))
    return tuple(int(n) for n in values)


def seeded(build, *parts):
    """A Hypothesis strategy of ``build(*drawn, generator)``: the strategies ``parts`` drawn, and a generator
    seeded by a drawn seed that ``build`` makes its tensor from (a failure shrinks and replays exactly)."""
    import torch
    from hypothesis import strategies as st

    def built(drawn):
        return build(*drawn[:-1], torch.Generator().manual_seed(drawn[-1]))

    return st.tuples(*parts, st.integers(0, 2**31 - 1)).map(built)


def float_tensor(name: str, value, expected: str, device) -> None:
    """A floating tensor on ``device``, or a :class:`SpecError` (``expected``: its shape, in words)."""
    import torch

    from attnformal.spec import SpecError, describe

    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise SpecError(name, f"None or a floating tensor {expected}", describe(value))
    if value.device != device:
        raise SpecError(name, f"the device of q ({device})", describe(value))


def refuse_unsupported(spec, supports, implementation: str) -> None:
    """``NotImplementedError`` naming the first active feature of ``spec`` outside ``supports``."""
    from attnformal.features import FEATURES

    for feature in FEATURES:
        if feature.name not in supports and feature.active(getattr(spec, feature.name)):
            raise NotImplementedError(f"{implementation} does not support {feature.name}")


@contextlib.contextmanager
def registered(feature: Feature):
    """Register ``feature`` (last in the order) for the duration of a ``with`` block: for tests."""
    from attnformal.features import BY_ROLE, FEATURES

    if any(f.name == feature.name for f in FEATURES):
        raise ValueError(f"a feature named {feature.name!r} is already registered")
    FEATURES.append(feature)
    BY_ROLE.clear()
    try:
        yield feature
    finally:
        FEATURES.remove(feature)
        BY_ROLE.clear()
