"""What the spec's index masks mean, stated once more: declaratively, as the spec text says it.

This module shares no code with :mod:`attnformal.masks` (it imports Z3 and nothing else), so
that :mod:`attnformal.masks` has something to be proven against other than itself. Read off
the spec ("The spec in one screen" in the README; :mod:`attnformal.spec`): for batch element
``b``, query ``i`` and key ``j`` of a problem with ``Sq`` queries and ``Sk`` keys, and
``n = kv_lens[b]`` (``Sk`` when no ``kv_lens`` is given),

* positions exist:              ``0 <= i < Sq`` and ``0 <= j < Sk``;
* ``kv_lens``:                  keys ``j >= kv_lens[b]`` are padding;
* ``causal="top_left"``:        ``j <= i``;
* ``causal="bottom_right"``:    ``j <= i + Sk - Sq``, with ``kv_lens[b]`` in place of ``Sk``;
* ``window=(left, right)``, aligned bottom-right (``kv_lens[b]`` in place of ``Sk`` again):
  ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, a negative bound leaving its side unbounded;
* ``chunk_size=C``: query and key in the same chunk of ``C`` positions, the query at its
  bottom-right-aligned position: ``(i + Sk - Sq) // C == j // C`` (floor division; ``kv_lens[b]``
  in place of ``Sk``);
* ``prefix_lens``: keys ``j < prefix_lens[b]`` are visible to every query, the rest follow the
  causal rule: the causal rule becomes "``j < prefix_lens[b]`` or the causal rule";
* the masks AND together (an explicit ``attn_mask`` is data, ANDed on top by the callers).
"""

from __future__ import annotations

import z3


def allowed(i, j, *, len_q, len_k, kv_len, causal, window, chunk_size=None, prefix_len=None):
    """The spec's index mask for one batch element, as a Z3 formula: every rule above, ANDed.

    ``chunk_size`` is ``C`` (a Z3 Int), or None; ``prefix_len`` is ``prefix_lens[b]``, or None.
    """
    aligned = i + kv_len - len_q  # the key that query i lines up with, bottom-right
    rules = [0 <= i, i < len_q, 0 <= j, j < len_k,  # positions exist
             j < kv_len]  # keys past kv_lens[b] are padding
    if causal == "top_left":
        causal_rule = j <= i
    elif causal == "bottom_right":
        causal_rule = j <= aligned
    elif causal is not None:
        raise NotImplementedError(f"no meaning is stated for causal={causal!r}: add it to {__name__}")
    elif prefix_len is not None:
        raise NotImplementedError("no meaning is stated for a prefix without a causal mode (the spec refuses it)")
    if causal is not None:
        rules.append(causal_rule if prefix_len is None else z3.Or(j < prefix_len, causal_rule))
    if chunk_size is not None:
        rules.append(aligned / chunk_size == j / chunk_size)  # Z3's Int division floors for C >= 1
    if window is not None:
        left, right = window
        rules += [z3.Or(left < 0, aligned - left <= j), z3.Or(right < 0, j <= aligned + right)]
    return z3.And(rules)
