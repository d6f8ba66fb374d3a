"""Hypothesis strategies for attention problems, from small keyword-only pieces.

    from hypothesis import given, strategies as st
    from attnformal import strategies as attn
    from attnformal.testing import assert_attention_close

    @given(attn.problems(dtype=torch.bfloat16, causal=st.sampled_from([None, "bottom_right"])))
    def test_my_kernel(problem):
        ref = problem.reference()  # float64 values and the battery's error model
        assert_attention_close(problem.call(my_kernel), ref.values["out"], **ref.tolerance("out"))

:func:`shapes` draws a :class:`~attnformal.verify.cases.Shape`, :func:`windows` a window,
:func:`masks` the mask arguments for a shape, :func:`problems` a whole
:class:`AttentionProblem` (tensors drawn from a seed, so a failure shrinks to a small
shape and replays exactly). Every argument takes a value or a strategy; arguments are
checked when the strategy is built, and the error says what to pass instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from attnformal.features import FEATURES, MASK_ROLES, feature, varlen, with_role
from attnformal.masks import CAUSAL_MODES
from attnformal.spec import SUPPORTED_DTYPES, AttentionSpec
from attnformal.verify.cases import Shape, generator, randn, value_offsets

VALUE_KINDS = ("normal", "large", "tiny", "zeros")
_VALUE_SCALE = {"normal": 1.0, "large": 30.0, "tiny": 1e-6, "zeros": 0.0}


@dataclass(frozen=True)
class AttentionProblem:
    """Inputs and keyword arguments of one protocol call (and dO for the backward): q, k, v, dO padded
    ``[B, H, S, D]``, or packed ``[T, H, D]`` when ``kwargs`` holds ``cu_seqlens_q/k``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    kwargs: dict = field(default_factory=dict)
    seed: int = 0

    @property
    def spec(self) -> AttentionSpec:
        return AttentionSpec.from_inputs(self.q, self.k, self.v, **self.kwargs)

    def call(self, impl, **extra):
        """``impl(q, k, v, **kwargs, **extra)``."""
        return impl(self.q, self.k, self.v, **self.kwargs, **extra)

    def reference(self, *, backward: bool = False, certified: bool = False):
        """The float64 reference with the battery's error model (:func:`attnformal.testing.reference_attention`);
        with ``backward``, gradients for ``grad_out`` too."""
        from attnformal.testing import reference_attention

        return reference_attention(self.q, self.k, self.v, self.grad_out if backward else None, certified=certified,
                                   **self.kwargs)


def _as_strategy(fn: str, name: str, value, valid, expected: str, example: str) -> SearchStrategy:
    """``value`` itself if it is a strategy, else ``just(value)`` once it passes ``valid``."""
    if isinstance(value, SearchStrategy):
        return value
    if not valid(value):
        raise InvalidArgument(f"{fn}({name}={value!r}): expected {expected} or a strategy of them; "
                              f"for example {name}={example}")
    return st.just(value)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_positive_or_none(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0)


def _count(fn, name, value, low, example):
    return _as_strategy(fn, name, value, lambda x: _is_int(x) and x >= low, f"an int >= {low}", example)


def shapes(*, batch=st.integers(1, 2), heads_kv=st.integers(1, 2), group=st.integers(1, 3),
           len_q=st.integers(0, 48), len_k=st.integers(0, 48), head_dim=st.sampled_from([4, 16, 59]),
           head_dim_v=None) -> SearchStrategy[Shape]:
    """Shapes ``(B, Hq = Hkv * group, Hkv, Sq, Sk, D, Dv)``; ``head_dim_v=None`` draws Dv = D."""
    fn = "shapes"
    parts = {"batch": _count(fn, "batch", batch, 1, "2"), "heads_kv": _count(fn, "heads_kv", heads_kv, 1, "2"),
             "group": _count(fn, "group", group, 1, "st.integers(1, 4)"),
             "len_q": _count(fn, "len_q", len_q, 0, "st.integers(0, 64)"),
             "len_k": _count(fn, "len_k", len_k, 0, "st.integers(0, 64)"),
             "head_dim": _count(fn, "head_dim", head_dim, 1, "64")}
    dv = None if head_dim_v is None else _count(fn, "head_dim_v", head_dim_v, 1, "st.sampled_from([16, 64])")

    @st.composite
    def draw_shape(draw):
        x = {name: draw(s) for name, s in parts.items()}
        d_v = x["head_dim"] if dv is None else draw(dv)
        return Shape(x["batch"], x["heads_kv"] * x["group"], x["heads_kv"], x["len_q"], x["len_k"], x["head_dim"], d_v)

    return draw_shape()


def windows(*, left=st.integers(-1, 16), right=st.integers(-1, 16)) -> SearchStrategy[tuple[int, int]]:
    """Windows ``(left, right)``; a negative bound is unbounded on that side."""
    lefts = _as_strategy("windows", "left", left, _is_int, "an int (negative: unbounded)", "st.integers(-1, 8)")
    rights = _as_strategy("windows", "right", right, _is_int, "an int (negative: unbounded)", "0")
    return st.tuples(lefts, rights)


def masks(shape: Shape, *, causal=st.sampled_from(CAUSAL_MODES), window=st.none() | windows(),
          kv_lens=st.booleans(), attn_mask=st.booleans(), **features) -> SearchStrategy[dict]:
    """The mask keyword arguments for ``shape``: causal, window, per-batch lengths, an explicit mask,
    and every other registered mask feature (``chunk_size``, ``prefix_lens``, ...).

    ``kv_lens`` and ``attn_mask`` are booleans (or strategies of them): whether to draw one. Another
    mask feature is drawn only when asked for by its keyword (a kernel written before it takes no such
    keyword): a value, a strategy, or ``True`` for its declaration's own strategy
    (:meth:`attnformal.features.Feature.strategy`); ``chunk_size=True, prefix_lens=True``. A drawn value
    the other features refuse (:meth:`~attnformal.features.Feature.conflict`: a prefix without causal) is
    dropped.
    """
    fn = "masks"
    causal = _as_strategy(fn, "causal", causal, lambda x: x in CAUSAL_MODES, f"one of {CAUSAL_MODES}",
                          "'bottom_right'")
    window = _as_strategy(fn, "window", window, lambda x: x is None or (isinstance(x, tuple) and len(x) == 2),
                          "None or (left, right)", "windows()")
    kv_lens = _as_strategy(fn, "kv_lens", kv_lens, lambda x: isinstance(x, bool), "a bool", "True")
    attn_mask = _as_strategy(fn, "attn_mask", attn_mask, lambda x: isinstance(x, bool), "a bool", "False")
    _check_features(fn, features, _feature_names(*MASK_ROLES), "mask feature")
    others = _asked(shape, features)

    @st.composite
    def draw_masks(draw):
        kwargs = {"causal": draw(causal), "window": draw(window)}
        kwargs.update({name: draw(strategy) for name, strategy in others.items()})
        if draw(kv_lens):
            kwargs["kv_lens"] = draw(st.lists(st.integers(0, shape.len_k), min_size=shape.batch, max_size=shape.batch))
        if draw(attn_mask):
            seed = draw(st.integers(0, 2**31 - 1))
            kwargs["attn_mask"] = torch.rand(shape.batch, shape.heads_q, shape.len_q, shape.len_k,
                                             generator=generator(seed)) < 0.7
        _drop_conflicts(kwargs, others)
        return {key: value for key, value in kwargs.items() if value is not None}

    return draw_masks()


EXPLICIT_MASKS = ("causal", "window", "kv_lens", "attn_mask")  # the keywords of masks() itself
SCORE_ROLES = ("bias", "state")  # features problems() draws itself: tensors for the shape (sinks, ALiBi, bias)


def _feature_names(*roles: str) -> list[str]:
    return [f.name for f in with_role(*roles) if f.name not in EXPLICIT_MASKS]


def _check_features(fn: str, given: dict, names: list[str], what: str) -> None:
    """An InvalidArgument for a keyword of ``given`` outside ``names``, or a fixed value of a tensor feature
    (a tensor fits one shape: such a feature takes ``True``, its declaration's strategy, or a strategy)."""
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InvalidArgument(f"{fn}({unknown[0]}=...): no {what} of that name; the others are "
                              f"{', '.join(names) or 'none'}")
    for name, value in given.items():
        if feature(name).tensor and not (value is None or isinstance(value, (bool, SearchStrategy))):
            raise InvalidArgument(f"{fn}({name}=...): expected True (drawn by its declaration's strategy), "
                                  f"False or a strategy of values; for example {name}=True")


def _asked(shape: Shape, given: dict) -> dict[str, SearchStrategy]:
    """A strategy per asked-for feature (``True``: its declaration's own; ``None``, ``False``: not drawn)."""
    out = {}
    for name, value in given.items():
        value = feature(name).strategy(shape) if value is True else value
        if value is not None and value is not False:
            out[name] = value if isinstance(value, SearchStrategy) else st.just(value)
    return out


def _drop_conflicts(kwargs: dict, asked: dict) -> None:
    """Set to None each asked-for feature the other values refuse (:meth:`~attnformal.features.Feature.conflict`)."""
    for f in FEATURES:
        if f.name in asked and f.active(kwargs.get(f.name)) and f.conflict(kwargs):
            kwargs[f.name] = None


def problems(*, dtype=torch.float32, shapes=shapes(), causal=st.sampled_from(CAUSAL_MODES),
             window=st.none() | windows(), kv_lens=st.booleans(), attn_mask=st.booleans(),
             scale=st.none() | st.floats(0.01, 2.0), softcap=st.none() | st.floats(1.0, 50.0),
             dropout_p=st.just(0.0), values=st.sampled_from(VALUE_KINDS), packed=False, device="cpu",
             **features) -> SearchStrategy[AttentionProblem]:
    """Whole problems: a shape, masks, scale, softcap, dropout replay, score features, and seeded tensors.

    Other mask features (``chunk_size=``, ``prefix_lens=``) go to :func:`masks`. The score features
    (``sinks=``, ``alibi_slopes=``, ``bias=``) are drawn only when asked for: ``True`` for their
    declaration's strategy (:meth:`~attnformal.features.Feature.strategy`: seeded tensors for the drawn
    shape, sometimes None), or a strategy of values; they are rounded to the problem's dtype.

    ``packed`` (a bool or a strategy of them): a packed variable-length batch -- ``cu_seqlens_q/k`` for
    ``B`` sequences of 0 .. ``Sq`` queries and 0 .. ``Sk`` keys each, and q, k, v, dO in the packed
    ``[T, H, D]`` layout; per-batch key counts (``kv_lens``, ``prefix_lens``) are cut to each sequence's
    keys. A drawn feature that refuses another (:meth:`~attnformal.features.Feature.conflict`: a packed
    batch with ``attn_mask``, dropout or a ``bias``) drops the one asked for later: the problem stays padded;
    sinks and ALiBi slopes go with a packed batch (each sequence reads its row of ``[B, Hq]`` slopes).

    ``dropout_p > 0`` comes with a drawn keep-mask to replay. ``values`` picks the input
    scale: ``"normal"`` (N(0, 1)), ``"large"`` (x30: logits in the thousands), ``"tiny"``
    (x1e-6) or ``"zeros"``.
    """
    fn = "problems"
    dtypes = _as_strategy(fn, "dtype", dtype, lambda x: str(x).removeprefix("torch.") in SUPPORTED_DTYPES,
                          f"a torch dtype in {SUPPORTED_DTYPES}", "torch.bfloat16")
    if not isinstance(shapes, SearchStrategy):
        raise InvalidArgument(f"{fn}(shapes={shapes!r}): expected a strategy of Shape; for example shapes=shapes()")
    scale = _as_strategy(fn, "scale", scale, _is_positive_or_none, "None or a float > 0", "0.125")
    softcap = _as_strategy(fn, "softcap", softcap, _is_positive_or_none, "None or a float > 0", "30.0")
    dropout_p = _as_strategy(fn, "dropout_p", dropout_p, lambda x: isinstance(x, float) and 0 <= x < 1,
                             "a float in [0, 1)", "st.sampled_from([0.0, 0.3])")
    values = _as_strategy(fn, "values", values, lambda x: x in VALUE_KINDS, f"one of {VALUE_KINDS}", "'normal'")
    packed = _as_strategy(fn, "packed", packed, lambda x: isinstance(x, bool), "a bool", "st.booleans()")
    mask_names, score_names = _feature_names(*MASK_ROLES), _feature_names(*SCORE_ROLES)
    _check_features(fn, features, mask_names + score_names, "feature")
    mask_features = {name: value for name, value in features.items() if name in mask_names}
    score_features = {name: value for name, value in features.items() if name in score_names}

    @st.composite
    def draw_problem(draw):
        sh = draw(shapes)
        kwargs = draw(masks(sh, causal=causal, window=window, kv_lens=kv_lens, attn_mask=attn_mask,
                            **mask_features))
        kwargs.update({k: v for k, v in (("scale", draw(scale)), ("softcap", draw(softcap))) if v is not None})
        seed = draw(st.integers(0, 2**31 - 1))
        p = draw(dropout_p)
        if p > 0:
            kwargs["dropout_p"] = p
            kwargs["dropout_mask"] = torch.rand(sh.batch, sh.heads_q, sh.len_q, sh.len_k,
                                                generator=generator(seed + 1)) >= p
        scores = _asked(sh, score_features)
        kwargs.update({name: draw(strategy) for name, strategy in scores.items()})
        _drop_conflicts(kwargs, scores)
        if draw(packed):
            _pack(draw, sh, kwargs)
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        return _tensors(sh, kwargs, seed, draw(dtypes), draw(values), device)

    return draw_problem()


PACKING = (varlen.CU_SEQLENS_Q, varlen.CU_SEQLENS_K)


def _pack(draw, sh: Shape, kwargs: dict) -> None:
    """Add drawn ``cu_seqlens_q/k`` to ``kwargs`` unless the other values refuse a packed batch; the per-batch
    features (``kv_lens``, ``prefix_lens``: key counts in [0, Sk]) are cut to each sequence's key count."""
    cu = {f.name: draw(f.strategy(sh)) for f in PACKING}
    if any(f.conflict({**kwargs, **cu}) for f in PACKING):
        return
    kwargs.update(cu)
    keys = _sequence_lengths(cu["cu_seqlens_k"])
    for f in FEATURES:
        if f.per_batch and kwargs.get(f.name) is not None:
            kwargs[f.name] = [min(n, length) for n, length in zip(kwargs[f.name], keys)]


def _sequence_lengths(cu) -> list[int]:
    return [int(cu[b + 1]) - int(cu[b]) for b in range(len(cu) - 1)]


def _tensors(sh: Shape, kwargs, seed, dtype, kind, device) -> AttentionProblem:
    """The problem with seeded float64 inputs rounded to ``dtype``, and the keyword tensors on ``device`` (the
    floating ones -- sinks, slopes, bias -- in ``dtype`` too, as the battery's cases: the reference reads them)."""
    gen = generator(seed)
    inputs = _packed_inputs if varlen.packed(kwargs) else _padded_inputs
    q, k, v, grad_out = (t.to(device=device, dtype=dtype) for t in inputs(gen, sh, kwargs, _VALUE_SCALE[kind]))
    kwargs = {key: _keyword_tensor(val, dtype, device) for key, val in kwargs.items()}
    return AttentionProblem(q, k, v, grad_out, kwargs, seed)


def _keyword_tensor(value, dtype, device):
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)


def _padded_inputs(gen, sh: Shape, kwargs, size):
    """q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Sk, D]``, v (offset per batch and KV head), dO ``[B, Hq, Sq, Dv]``."""
    b, hq, hkv, sq, sk, d, dv = sh
    q, k = size * randn(gen, b, hq, sq, d), size * randn(gen, b, hkv, sk, d)
    v = randn(gen, b, hkv, sk, dv) + value_offsets(b, hkv)
    return q, k, v, randn(gen, b, hq, sq, dv)


def _packed_inputs(gen, sh: Shape, kwargs, size):
    """q ``[Tq, Hq, D]``, k ``[Tk, Hkv, D]``, v (offset per sequence and KV head), dO ``[Tq, Hq, Dv]``."""
    _, hq, hkv, _, _, d, dv = sh
    tq, tk = int(kwargs["cu_seqlens_q"][-1]), int(kwargs["cu_seqlens_k"][-1])
    q, k = size * randn(gen, tq, hq, d), size * randn(gen, tk, hkv, d)
    len_k = torch.tensor(_sequence_lengths(kwargs["cu_seqlens_k"]))
    offsets = value_offsets(sh.batch, hkv)[:, :, 0].repeat_interleave(len_k, dim=0)  # [Tk, Hkv, 1]
    return q, k, randn(gen, tk, hkv, dv) + offsets, randn(gen, tq, hq, dv)
