"""What the spec's head map and score features mean, stated once more, literally, from the spec's text.

Like :mod:`attnformal.proofs.mask_meaning` for the masks, this module shares no code with the
definitions it is compared with (it imports Z3 and SymPy, nothing of attnformal; a test checks
that), so that ``spec.kv_heads``, ``score_bias``, ``tile_scores`` have something to be checked
against other than themselves. From the spec (:mod:`attnformal.spec`) and the features' modules:

* **GQA / MQA**: the ``Hq`` query heads are cut into ``Hkv`` consecutive groups of ``G = Hq / Hkv``;
  group ``k`` -- query heads ``k*G .. (k+1)*G - 1`` -- reads KV head ``k`` (``repeat_interleave``'s
  layout: the oracle's and flash-attention's).
* **ALiBi** (flash-attention's convention): query ``i`` and key ``j`` of batch element ``b`` get
  ``-slope[b, h] * |i + Sk_b - Sq - j|``, ``Sk_b`` the element's own key length (``kv_lens[b]``,
  else ``Sk``): 0 on the bottom-right diagonal. flash-attention, commit
  0251105a2fb19d2957484b7f023cd8c115286ced: ``csrc/flash_attn/src/alibi.h`` line 65
  (``-= alibi_slope * abs(row_idx + max_seqlen_k - max_seqlen_q - col_idx)``, the kernel given the
  batch element's actual lengths) and ``tests/test_flash_attn.py``, ``attn_bias_from_alibi_slopes``
  (``-slopes * abs(row_idx + sk - sq - col_idx)``, ``sk`` the key padding mask's count per element).
* **bias**: a tensor broadcast to ``[B, Hq, Sq, Sk]`` by numpy's rule (shapes aligned on the right,
  a dimension of size 1 -- or a missing one -- repeated): entry ``[b, h, i, j]`` reads the tensor at
  each kept index, 0 where it has size 1.
* **Order**: ``s = scale * q . k``, then capped ``softcap * tanh(s / softcap)`` (with a softcap), then
  every bias added (ALiBi and ``bias``: flash-attention's ``attention_ref`` adds ``attn_bias`` after
  the softcap), then the mask.
"""

from __future__ import annotations

import sympy
import z3


def kv_head(h, *, heads_q, heads_kv):
    """The KV head query head ``h`` reads: the ``k`` whose group ``k*G .. (k+1)*G - 1`` holds ``h``."""
    group = heads_q // heads_kv
    return next(k for k in range(heads_kv) if k * group <= h < (k + 1) * group)


def key_length(b, *, len_k, kv_lens):
    """Batch element ``b``'s key length: ``kv_lens[b]``, or ``Sk`` when none is given."""
    return len_k if kv_lens is None else kv_lens[b]


def alibi(i, j, *, slope, len_q, kv_len):
    """ALiBi's bias ``-slope * |i + kv_len - len_q - j|`` (Z3 terms or numbers)."""
    distance = i + kv_len - len_q - j
    return -slope * (z3.If(distance >= 0, distance, -distance) if z3.is_expr(distance) else abs(distance))


def broadcast_entry(table, shape, index):
    """Entry ``index`` (of the full ``[B, Hq, Sq, Sk]``) of ``table`` (nested lists of ``shape``), broadcast."""
    kept = index[len(index) - len(shape):]  # right-aligned: missing leading dimensions are repeated
    entry = table
    for size, position in zip(shape, kept):
        entry = entry[0 if size == 1 else position]
    return entry


def score(raw, *, softcap, biases):
    """The final (unmasked) score of a pair whose scaled score is ``raw``: capped first, then biased."""
    capped = raw if softcap is None else softcap * sympy.tanh(raw / softcap)
    return capped + sum(biases)
