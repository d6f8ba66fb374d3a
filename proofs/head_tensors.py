"""Obligation 19 -- the index tensors the kernels gather with mean what the spec says (checked).

Obligation 6 proves ``spec.kv_head_of`` on Z3 integers for all head counts; the kernels do not
call it on integers but gather K and V with the torch tensor ``spec.kv_heads()`` (and scatter dK,
dV back with it), and align ALiBi with the tensor ``spec.key_lengths(batches)``. Torch cannot
run on symbols, so these are checked exhaustively on a bounded domain, against the meaning
stated independently in :mod:`attnformal.proofs.meaning` -- **checked**, never proved:

* **(a) ``spec.kv_heads()``**: for all ``Hq, Hkv <= 32`` with ``Hkv`` dividing ``Hq``, entry ``h``
  is the KV head of the group ``k*G .. (k+1)*G - 1`` that holds ``h`` (``G = Hq / Hkv``), and the
  tensor has ``Hq`` entries.
* **(b) ``spec.key_lengths(batches)``**: for ``B <= 3``, ``Sk <= 3``, no ``kv_lens`` and every
  ``kv_lens`` vector, and every batch group the kernels form (``spec.batch_groups()``) and all
  elements at once: entry ``n`` is ``kv_lens[batches[n]]`` (``Sk`` without ``kv_lens``).
"""

from __future__ import annotations

import itertools

from attnformal.logic import Budget, Control, Settings, check_exhaustively
from attnformal.proofs import meaning
from attnformal.spec import AttentionSpec

TITLE = "Torch index tensors (kv_heads, key_lengths)"
# Compared with the meaning, never with the integer definition kv_heads is built from.
STATED_WITHOUT = ("attnformal.spec.kv_head_of",)
MAX_HEADS = 32
MAX_BATCH, MAX_KEYS = 3, 3


def checks(settings: Settings, budget: Budget):
    yield kv_heads_tensor(budget)
    yield key_lengths_tensor(budget)


def _spec(batch, heads_q, heads_kv, len_k, **values):
    """A validated spec (as the kernels get it) of these shapes."""
    import torch

    q = torch.zeros(batch, heads_q, 1, 1)
    k = torch.zeros(batch, heads_kv, len_k, 1)
    return AttentionSpec.from_inputs(q, k, k, **values)


def kv_heads_tensor(budget: Budget):
    def cases():
        for heads_kv in range(1, MAX_HEADS + 1):
            for heads_q in range(heads_kv, MAX_HEADS + 1, heads_kv):
                got = _spec(1, heads_q, heads_kv, 1).kv_heads().tolist()
                expected = [meaning.kv_head(h, heads_q=heads_q, heads_kv=heads_kv) for h in range(heads_q)]
                yield f"Hq={heads_q}, Hkv={heads_kv}", got == expected, {"Hq": heads_q, "Hkv": heads_kv,
                                                                         "kv_heads": got, "meaning": expected}

    return check_exhaustively("(a) spec.kv_heads()[h] = the KV head of h's group of G = Hq/Hkv consecutive heads",
                              cases(), domain=f"all Hq, Hkv <= {MAX_HEADS} (Hkv | Hq)", budget=budget)


def key_lengths_tensor(budget: Budget):
    import torch

    def cases():
        for batch, len_k in itertools.product(range(1, MAX_BATCH + 1), range(MAX_KEYS + 1)):
            for kv_lens in [None, *(list(t) for t in itertools.product(range(len_k + 1), repeat=batch))]:
                spec = _spec(batch, 1, 1, len_k, kv_lens=kv_lens)
                for group in [tuple(range(batch)), *spec.batch_groups()]:
                    got = spec.key_lengths(torch.tensor(group)).tolist()
                    expected = [meaning.key_length(b, len_k=len_k, kv_lens=kv_lens) for b in group]
                    yield f"B={batch}, Sk={len_k}, kv_lens={kv_lens}, batches {list(group)}", got == expected, \
                        {"kv_lens": kv_lens, "batches": list(group), "key_lengths": got, "meaning": expected}

    return check_exhaustively("(b) spec.key_lengths(batches)[n] = kv_lens[batches[n]] (Sk without kv_lens)", cases(),
                              domain=f"B <= {MAX_BATCH}, Sk <= {MAX_KEYS}, every kv_lens, every batch group",
                              budget=budget)


# ---- negative controls


def _interleaved_heads(self, device=None):
    """BROKEN: query head h reads KV head h % Hkv (interleaved, not grouped)."""
    import torch

    return torch.arange(self.heads_q, device=device) % self.heads_kv


def _first_element_lengths(self, batches):
    """BROKEN: every batch element gets element batches[0]'s key length."""
    return _KEY_LENGTHS(self, batches[:1]).expand(len(batches))


_KEY_LENGTHS = AttentionSpec.key_lengths

CONTROLS = (
    Control("kv_heads h % Hkv", "spec.kv_heads() maps query head h to h % Hkv", AttentionSpec, "kv_heads",
            _interleaved_heads, kv_heads_tensor),
    Control("key_lengths of the first element", "spec.key_lengths gives every element batches[0]'s length",
            AttentionSpec, "key_lengths", _first_element_lengths, key_lengths_tensor),
)
