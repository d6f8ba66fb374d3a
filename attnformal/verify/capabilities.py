"""What an implementation accepts, learned by probing it, and the nearest case it accepts.

Before the checks of a dtype run, :func:`probe` calls the implementation on tiny cases:
plain ones first, to find the lengths and head dims it takes (any, Sq = Sk only, or
multiples of some block), then one per protocol feature (lse, backward, GQA, MQA, each
causal alignment, windows, ...). A refusal is a ``NotImplementedError``; any other outcome
counts as accepted, and the checks judge it.

:meth:`Capabilities.adapt` turns a check's case into the nearest one the implementation
accepts -- MHA for GQA, the causal alignment it has, Sq = Sk, lengths rounded up to its
block multiple, Dv = D, a head dim it takes -- so that every check runs on something the
kernel accepts, and each case says what was changed (the report's coverage table counts it).
A case whose point would be lost (a single key rounded up to 128) is left as it is, and
is refused like before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnformal.features import FEATURES
from attnformal.verify.calls import Unsupported, call
from attnformal.verify.cases import Shape, generator, non_contiguous, random_attn_mask, random_case, \
    random_dropout_mask, shape

LENGTH_MULTIPLES = (1, 16, 32, 64, 128, 256)
PROBE_HEAD_DIMS = (32, 64, 128, 16)
PROBE_LENGTHS = (37, 71)  # Sq != Sk, odd: a kernel needing any multiple refuses them
SQUARE_BUDGET = 2**22  # scores (B * Hq * S^2) up to which a case made square takes its longer length
PROBE_SEED = 20240917


@dataclass
class Capabilities:
    """What the implementation accepted in one dtype (see the module docstring)."""

    dtype: str
    accepted: bool = True
    refusal: str = ""  # its message when it refuses the dtype altogether
    square: bool = False  # accepts only Sq == Sk
    multiple_q: int = 1  # query lengths it accepts are multiples of this
    multiple_k: int = 1
    lengths: tuple[int, int] = PROBE_LENGTHS  # the plain (Sq, Sk) it accepted
    head_dim: int = 32  # a head dim it accepted
    refused: dict[str, str] = field(default_factory=dict)  # feature -> its message
    head_dims: dict[int, bool] = field(default_factory=dict)  # probed head dims (filled as cases need them)

    def refuses(self, feature: str) -> bool:
        return not self.accepted or feature in self.refused

    def head_dim_ok(self, d: int, impl, device, watch=None) -> bool:
        """Whether the implementation accepts head dim ``d`` (probed once, at the lengths it accepted)."""
        if d not in self.head_dims:
            sq, sk = self.lengths
            case = random_case("probe head dim", shape(1, 1, 1, sq, sk, d), getattr(torch, self.dtype), device,
                               PROBE_SEED, grad=False)
            self.head_dims[d] = refusal(impl, case, watch=watch) is None
        return self.head_dims[d]

    def refused_among(self, features) -> set[str]:
        """The features of a refused case that the implementation refuses on their own (an empty set:
        only the combination is refused; a refused dtype is a refusal of fp64 or of no feature)."""
        if not self.accepted:
            return {"fp64"} & set(features)
        return {f for f in features if f in self.refused}

    def adapt(self, sh: Shape, kw: dict, *, keep=(), incidental=(), identity_values=False,
              head_dim_ok: Callable[[int], bool] | None = None) -> tuple[Shape, dict, tuple[str, ...]]:
        """The nearest ``(shape, kwargs)`` the implementation accepts, and what was changed.

        ``keep``: Shape fields the case's point rests on (left as they are: the case is then
        refused rather than changed); ``incidental``: keyword arguments a generic check may drop
        when refused; ``identity_values``: V is the identity (Dv = Sk); ``head_dim_ok(d)``
        probes a head dim.
        """
        if not self.accepted:
            return sh, kw, ()
        b, hq, hkv, sq, sk, d, dv = sh
        new_kw, notes = dict(kw), []
        if hkv != hq and self.refuses("gqa" if hkv > 1 else "mqa"):
            hkv = hq
            notes.append("MHA for GQA")
        self._adapt_features(new_kw, incidental, notes)
        sq, sk = self._lengths(b, hq, sq, sk, notes)
        if identity_values:
            dv = sk
        if dv != d and self.refuses("head_dim_v"):
            d, dv = (dv, dv) if identity_values else (d, d)
            notes.append("Dv = D")
        if head_dim_ok is not None and not identity_values:
            d, dv = self._head_dims(d, dv, head_dim_ok, notes)
        new = Shape(b, hq, hkv, sq, sk, d, dv)
        if any(getattr(new, name) != getattr(sh, name) for name in keep):
            return sh, kw, ()
        _fit_tensors(new_kw, new)
        return new, new_kw, tuple(notes)

    def _adapt_features(self, kw, incidental, notes):
        causal = kw.get("causal")
        if causal and self.refuses(f"causal_{causal}"):
            other = "top_left" if causal == "bottom_right" else "bottom_right"
            if not self.refuses(f"causal_{other}"):
                kw["causal"] = other
                notes.append(f"causal {other.replace('_', '-')} for {causal.replace('_', '-')}")
        for name in incidental:
            feature = f"causal_{kw[name]}" if name == "causal" and kw.get(name) else name
            if kw.get(name) is not None and self.refuses(feature):
                del kw[name]
                notes.append(f"without {name}")

    def _lengths(self, b, hq, sq, sk, notes) -> tuple[int, int]:
        if self.square and sq != sk:
            small, large = sorted((sq, sk))
            if small == 0:
                sq = sk = 0
            elif b * hq * large * large <= SQUARE_BUDGET or large <= 4 * small:
                sq = sk = large
            else:  # about the same number of scores: a long sequence made square would cost far more
                sq = sk = round(math.sqrt(sq * sk))
            notes.append("Sq = Sk")
        multiple = math.lcm(self.multiple_q, self.multiple_k) if self.square else None
        new_q, new_k = _round_up(sq, multiple or self.multiple_q), _round_up(sk, multiple or self.multiple_k)
        if (new_q, new_k) != (sq, sk):
            notes.append(f"lengths rounded up to a multiple of {max(self.multiple_q, self.multiple_k)}")
        return new_q, new_k

    def _head_dims(self, d, dv, head_dim_ok, notes) -> tuple[int, int]:
        new_d = d if head_dim_ok(d) else _nearest_head_dim(d, head_dim_ok, self.head_dim)
        new_dv = new_d if dv == d else (dv if head_dim_ok(dv) else _nearest_head_dim(dv, head_dim_ok, self.head_dim))
        if (new_d, new_dv) != (d, dv):
            notes.append("head dim rounded to one it accepts")
        return new_d, new_dv

    def summary(self) -> str:
        """One line: what the implementation accepted in this dtype, and what it refused."""
        if not self.accepted:
            return f"{self.dtype}: refused ({self.refusal})"
        parts = ["Sq = Sk only" if self.square else "any Sq, Sk"]
        if self.multiple_q > 1 or self.multiple_k > 1:
            parts.append(f"lengths multiple of {self.multiple_q} (queries), {self.multiple_k} (keys)")
        refused_dims = sorted(d for d, ok in self.head_dims.items() if not ok)
        if refused_dims:
            parts.append(f"refused head dims {', '.join(map(str, refused_dims))}")
        parts.append("refuses " + (", ".join(sorted(self.refused)) if self.refused else "no probed feature"))
        return f"{self.dtype}: " + "; ".join(parts)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def _nearest_head_dim(d: int, head_dim_ok, fallback: int) -> int:
    power = 1 << max(d - 1, 0).bit_length()
    for candidate in (_round_up(d, 8), _round_up(d, 16), _round_up(d, 32), power):
        if head_dim_ok(candidate):
            return candidate
    return fallback


def _fit_tensors(kw: dict, sh: Shape):
    """Masks tiled (or cut) to the adapted lengths; per-batch lengths (kv_lens, prefix_lens) cut to the
    adapted key length."""
    for name in ("attn_mask", "dropout_mask"):
        mask = kw.get(name)
        if isinstance(mask, torch.Tensor) and tuple(mask.shape[2:]) != (sh.len_q, sh.len_k):
            kw[name] = _tile(mask, sh.len_q, sh.len_k)
    for feature in FEATURES:
        if feature.per_batch and kw.get(feature.name) is not None:
            kw[feature.name] = [min(n, sh.len_k) for n in kw[feature.name]]


def _tile(mask: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    old_q, old_k = mask.shape[2], mask.shape[3]
    if 0 in (old_q, old_k):
        return torch.ones(*mask.shape[:2], sq, sk, dtype=mask.dtype, device=mask.device)
    reps = (1, 1, max(1, math.ceil(sq / old_q)), max(1, math.ceil(sk / old_k)))
    return mask.repeat(reps)[:, :, :sq, :sk].contiguous()


# ---------------------------------------------------------------- probing


def refusal(impl, case, *, lse=False, backward=False, watch=None) -> str | None:
    """The implementation's message if it refuses ``case``, else None (a broken contract is no refusal:
    the checks report it)."""
    try:
        call(impl, case, lse=lse, backward=backward, watch=watch)
    except Unsupported as err:
        return str(err)
    except Exception:
        return None
    return None


def probe(impl, dtype: torch.dtype, device, *, watch=None) -> Capabilities:
    """Call ``impl`` on tiny cases in ``dtype`` and record what it refuses (module docstring)."""
    caps = Capabilities(str(dtype).removeprefix("torch."))

    def refused(case, **flags) -> str | None:
        return refusal(impl, case, watch=watch, **flags)

    def make(name, sh, *, grad=False, **kw):
        return random_case(f"probe {name}", sh, dtype, device, PROBE_SEED, grad=grad, **kw)

    base = _find_base(caps, make, refused)
    if base is None:
        return caps
    caps.square, caps.multiple_q, caps.multiple_k, caps.head_dim = base
    sq, sk = caps.lengths
    caps.head_dims[caps.head_dim] = True
    for feature, case, flags in _feature_probes(make, sq, sk, caps.head_dim):
        why = refused(case, **flags)
        if why is not None:
            caps.refused[feature] = why
    return caps


def _find_base(caps: Capabilities, make, refusal):
    """``(square, multiple_q, multiple_k, head_dim)`` of the least restricted plain case accepted."""
    tried: dict[tuple, str | None] = {}

    def attempt(m_q, m_k, square, d):
        # Odd multiples (3m, 5m): a kernel that needs a multiple of 2m refuses them, so m is the true one.
        sq, sk = (PROBE_LENGTHS[0] if m_q == 1 else 3 * m_q), (PROBE_LENGTHS[1] if m_k == 1 else 5 * m_k)
        if square:
            sq = sk = PROBE_LENGTHS[1] if m_q == 1 else 3 * m_q
        if (sq, sk, d) not in tried:
            tried[sq, sk, d] = refusal(make("plain", shape(2, 2, 2, sq, sk, d)))
        if tried[sq, sk, d] is None:
            caps.lengths = (sq, sk)
        return tried[sq, sk, d]

    first = attempt(1, 1, False, 32)
    if first is not None and all(attempt(256, 256, True, d) is not None for d in PROBE_HEAD_DIMS):
        caps.accepted, caps.refusal = False, first  # not even the most restricted shapes: the dtype itself
        return None
    for m in LENGTH_MULTIPLES:
        for square in (False, True):
            for d in PROBE_HEAD_DIMS:
                if attempt(m, m, square, d) is None:
                    if square or m == 1:
                        return square, m, m, d
                    m_q = next(x for x in LENGTH_MULTIPLES if attempt(x, m, False, d) is None)
                    m_k = next(x for x in LENGTH_MULTIPLES if attempt(m_q, x, False, d) is None)
                    return False, m_q, m_k, d
    return None  # unreachable: the most restricted shapes were accepted above


def _feature_probes(make, sq, sk, d):
    """``(feature, case, call flags)``: one case per feature, otherwise the accepted plain one."""
    plain = shape(2, 2, 2, sq, sk, d)
    gen = generator(PROBE_SEED)
    base = make("plain", plain)
    yield "lse", base, {"lse": True}
    yield "backward", make("backward", plain, grad=True), {"backward": True}
    yield "gqa", make("gqa", shape(2, 4, 2, sq, sk, d)), {}
    yield "mqa", make("mqa", shape(2, 2, 1, sq, sk, d)), {}
    yield "causal_top_left", make("causal", plain, causal="top_left"), {}
    yield "causal_bottom_right", make("causal", plain, causal="bottom_right"), {}
    for feature in FEATURES:  # window, kv_lens, softcap, chunk_size, prefix_lens, ...: their own examples
        example = feature.example(plain)
        if example is not None:
            yield feature.name, make(feature.name, plain, **example), {}
    yield "attn_mask", make("attn_mask", plain, attn_mask=random_attn_mask(gen, plain)), {}
    yield "dropout", make("dropout", plain, dropout_p=0.25), {}
    yield "dropout_replay", make("dropout replay", plain, dropout_p=0.25,
                                 dropout_mask=random_dropout_mask(gen, plain, 0.25)), {}
    yield "head_dim_v", make("head_dim_v", shape(2, 2, 2, sq, sk, d, max(d // 2, 1) if d > 1 else 2)), {}
    yield "empty", make("empty", shape(2, 2, 2, 0, 0 if sq == sk else sk, d)), {}
    yield "noncontiguous", base.with_(q=non_contiguous(base.q), k=non_contiguous(base.k),
                                      v=non_contiguous(base.v)), {}
