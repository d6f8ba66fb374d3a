"""Golden files: seeded inputs, their certified reference outputs and gradients, and a checker.

Format (version 1): one NumPy ``.npz`` archive holding

* ``meta`` -- a JSON string: ``format`` ("attnformal-golden"), ``version`` (1), ``dtype``,
  ``seed``, ``spec`` (``AttentionSpec.to_json()``), ``generator`` (how the inputs were drawn),
  ``reference`` (tier, largest enclosure radius, what a radius means) and ``arrays``
  (shape, dtype and SHA-256 of every array below);
* inputs as the exact bits of their dtype: ``q_bits``, ``k_bits``, ``v_bits``, ``grad_out_bits``
  (uint16 for float16/bfloat16, uint32 for float32, uint64 for float64), and every tensor
  feature the spec has (``attn_mask`` / ``dropout_mask`` as bool; ``sinks``, ``alibi_slopes``,
  ``bias`` as float64, exact: their values whatever dtype they came in);
* reference values in float64 with their radii: ``out``, ``lse``, ``dq``, ``dk``, ``dv`` (and
  ``dsinks``, ``dbias`` with sinks or a bias) and ``out_radius`` ...: the exact value (for the
  exact inputs) lies within ``value +- radius``, rigorously (see :mod:`attnformal.reference.certified`).

Inputs: ``q, k, v, grad_out ~ N(0, 1) * input_scale`` rounded to ``dtype``, then the dropout
keep-mask (``Bernoulli(1 - p)``) and the attention mask (``Bernoulli(density)``), drawn in
that order from ``torch.Generator().manual_seed(seed)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import secrets
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnformal import __version__
from attnformal.cli import atomic_path, output_file
from attnformal.features import FEATURES
from attnformal.reference import fp64_balls
from attnformal.reference.certified import FIELDS, PARAMETER_FIELDS, CertifiedResult, certified_attention
from attnformal.spec import AttentionSpec, SpecError
from attnformal.testing import tolerance_for

FORMAT, VERSION = "attnformal-golden", 1
BITS = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}
_SIGNED = {np.uint16: torch.int16, np.uint32: torch.int32, np.uint64: torch.int64}
INPUTS = ("q", "k", "v", "grad_out")
RADIUS_MEANING = "|exact - value| <= radius for every element, exact = the spec evaluated on the exact input bits"
SAMPLED_GROUPS = 2  # (batch, KV head) groups a load recomputes: 2 / (B Hkv) of generate's work
RADIUS_SLACK = 16  # a stored radius may be this many times the recomputed one (tiling, the ball sum of dk, dv)


class GoldenError(ValueError):
    """A golden file that cannot be used; the message names the file and the problem."""

    def __init__(self, path, problem: str):
        super().__init__(f"golden file {str(path)!r}: {problem}")


@dataclass(frozen=True)
class Golden:
    """A loaded and validated golden file."""

    path: Path
    meta: dict
    spec: AttentionSpec
    inputs: dict  # q, k, v, grad_out in their dtype
    reference: dict  # name -> (value, radius), float64
    sample: tuple = (None, ())  # (seed, the (batch, KV head) groups recomputed), see load()

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.meta["dtype"])

    def protocol_kwargs(self) -> dict:
        """The implementation-protocol keywords of this case (masks included)."""
        return protocol_kwargs(self.spec)


def protocol_kwargs(spec: AttentionSpec) -> dict:
    """The implementation-protocol keywords that reproduce ``spec``: its active features only (with their mask
    tensors), so an implementation written before a feature existed is never handed that feature's keyword."""
    return {"scale": spec.scale, **{f.name: f.from_json(f.to_json(value)) if not f.tensor else value
                                    for f, value in zip(FEATURES, spec.values().values()) if f.active(value)}}


def _tensor_features(spec: AttentionSpec) -> dict:
    """``{name: numpy array}`` of the spec's tensor features: bool masks as they are, floats as float64."""
    arrays = {}
    for f in FEATURES:
        value = getattr(spec, f.name)
        if f.tensor and value is not None:
            value = value.detach().cpu()
            arrays[f.name] = (value if value.dtype == torch.bool else value.double()).contiguous().numpy().copy()
    return arrays


# ---------------------------------------------------------------- inputs


def make_inputs(shape, dtype: torch.dtype, seed: int, *, input_scale: float = 1.0, dropout_p: float = 0.0,
                attn_mask_density: float | None = None, packed: bool = False) -> dict:
    """Seeded ``q, k, v, grad_out`` (and masks) for ``shape = (B, Hq, Hkv, Sq, Sk, D, Dv)``; ``packed``: the
    packed layout ``[T, H, D]`` with ``Sq``, ``Sk`` the token counts Tq, Tk (cu_seqlens say how they split)."""
    batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v = shape
    gen = torch.Generator().manual_seed(seed)
    sizes = {"q": (batch, heads_q, len_q, head_dim), "k": (batch, heads_kv, len_k, head_dim),
             "v": (batch, heads_kv, len_k, head_dim_v), "grad_out": (batch, heads_q, len_q, head_dim_v)}
    if packed:
        sizes = {name: (size[2], size[1], size[3]) for name, size in sizes.items()}
    x = {name: (torch.randn(size, generator=gen, dtype=torch.float64) * input_scale).to(dtype)
         for name, size in sizes.items()}
    full = (batch, heads_q, len_q, len_k)
    if dropout_p > 0:
        x["dropout_mask"] = torch.rand(full, generator=gen) >= dropout_p
    if attn_mask_density is not None:
        x["attn_mask"] = torch.rand(full, generator=gen) < attn_mask_density
    return x


def default_prec(dtype: torch.dtype) -> int | None:
    """Arb bits for a dtype's golden file: float64 kernels need radii below float64's own
    rounding, which the float64 tier (~1e-13 relative) does not give; None = float64 tier."""
    return 128 if dtype == torch.float64 else None


def generate(inputs: dict, *, max_radius=None, prec=None, progress=None, executor=None,
             **protocol) -> CertifiedResult:
    """The certified reference (out, lse, gradients for ``inputs['grad_out']``) of a case.

    ``executor`` (:mod:`attnformal.distributed`) runs the float64 tier's tiles; the Arb tier
    (``prec``, and float64 inputs by default) runs in this process.
    """
    masks = {name: inputs[name] for name in ("attn_mask", "dropout_mask") if name in inputs}
    if prec is None and max_radius is None:
        prec = default_prec(inputs["q"].dtype)
    return certified_attention(inputs["q"], inputs["k"], inputs["v"], inputs["grad_out"], max_radius=max_radius,
                               prec=prec, progress=progress, executor=executor, **masks, **protocol)


# ---------------------------------------------------------------- writing


def save(path, inputs: dict, result: CertifiedResult, *, seed: int, generator: dict) -> None:
    """Write a golden file atomically: a temporary file in the same folder, renamed over ``path``
    (:func:`attnformal.cli.atomic_path`); a cancelled or failed write leaves no file behind, and
    a folder, device, pipe or socket at ``path`` is refused (:func:`attnformal.cli.output_file`)."""
    spec = result.spec
    dtype = str(inputs["q"].dtype).removeprefix("torch.")
    arrays = {f"{name}_bits": _to_bits(inputs[name]) for name in INPUTS}
    arrays.update(_tensor_features(spec))
    for name in result.fields():
        arrays[name] = getattr(result, name).numpy()
        arrays[f"{name}_radius"] = getattr(result, f"{name}_radius").numpy()
    meta = {"format": FORMAT, "version": VERSION, "dtype": dtype, "seed": seed, "spec": spec.to_json(),
            "generator": generator, "attnformal": __version__,
            "reference": {"tier": result.tier, "enclosure_radius": result.enclosure_radius,
                          "radius": RADIUS_MEANING},
            "arrays": {name: _describe(a) for name, a in arrays.items()}}
    with atomic_path(output_file(path)) as partial, open(partial, "wb") as f:
        np.savez_compressed(f, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)
        f.flush()
        os.fsync(f.fileno())


def file_bytes(shape, dtype: torch.dtype, *, attn_mask: bool, dropout: bool) -> int:
    """Bytes of the arrays a golden file of ``shape = (B, Hq, Hkv, Sq, Sk, D, Dv)`` holds,
    uncompressed: the inputs' bits, the masks, and every reference value with its radius."""
    batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v = shape
    q_side, kv_side = batch * heads_q * len_q, batch * heads_kv * len_k
    inputs = (q_side * (head_dim + head_dim_v) + kv_side * (head_dim + head_dim_v)) * dtype.itemsize
    masks = (int(attn_mask) + int(dropout)) * q_side * len_k
    reference = 2 * 8 * (q_side * (head_dim_v + 1 + head_dim) + kv_side * (head_dim + head_dim_v))
    return inputs + masks + reference


def _to_bits(t: torch.Tensor) -> np.ndarray:
    unsigned = BITS[str(t.dtype).removeprefix("torch.")]
    return t.detach().cpu().contiguous().view(_SIGNED[unsigned]).numpy().view(unsigned)


def _from_bits(bits: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.dtype(bits.dtype.name.removeprefix("u")))).view(getattr(torch, dtype))


def _describe(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "dtype": a.dtype.name,
            "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}


# ---------------------------------------------------------------- radii


def allowance(ref: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """What a check allows beyond the golden radius: ``rtol |ref| + atol max|ref|`` (finite parts)."""
    finite = torch.where(torch.isfinite(ref), ref, 0.0).abs()
    return rtol * finite + atol * (float(finite.max()) if ref.numel() else 0.0)


def loose_radius(reference: dict, dtype: torch.dtype) -> str | None:
    """Where the golden radii are too loose to judge a ``dtype`` kernel, or None.

    ``reference`` maps a name to ``(value, radius)``. A radius above the check's default
    allowance for ``dtype`` would more than double what the check lets a kernel get wrong.
    """
    rtol, atol = tolerance_for(dtype)
    worst = None  # (ratio, name, flat index, value, radius)
    for name, (ref, radius) in reference.items():
        ratio = torch.where(radius == 0, 0.0, radius / allowance(ref, rtol, atol)).flatten()
        if ratio.numel() and float(ratio.max()) > max(1.0, worst[0] if worst else 0.0):
            worst = (float(ratio.max()), name, int(torch.argmax(ratio)), ref, radius)
    if worst is None:
        return None
    ratio, name, at, ref, radius = worst
    index = tuple(int(i) for i in np.unravel_index(at, tuple(ref.shape)))
    times = f"{ratio:.3g}x what the check allows there" if math.isfinite(ratio) else \
        f"above what the check allows there, nothing (every midpoint of {name} is 0)"
    return (f"the radii are too loose to judge a {str(dtype).removeprefix('torch.')} kernel: {name}'s radius "
            f"{float(radius.flatten()[at]):.3g} at {index_text(index)} (value {float(ref.flatten()[at]):.6g}) is "
            f"{times} (rtol={rtol:g}, atol={atol:g} x max|ref|)")


def index_text(at: tuple) -> str:
    return "[" + ",".join(map(str, at)) + "]"


# ---------------------------------------------------------------- loading


def load(path, *, verify: bool = True, sample_seed: int | None = None) -> Golden:
    """Read and validate a golden file; any problem raises one :class:`GoldenError`.

    Validation: format and version, every listed array present with its shape, dtype and
    SHA-256, inputs that form a valid case whose spec equals the stored one, reference
    shapes, and radii no looser than ``generate`` accepts for the dtype (:func:`loose_radius`,
    the one rule both use). With ``verify`` also a recomputation of :data:`SAMPLED_GROUPS`
    (batch, KV head) groups drawn with ``sample_seed`` (random when None; the seed is kept in
    ``Golden.sample``): out, lse, dq of their query heads and their dk, dv, whose certified balls
    must overlap the stored ones, which may be at most :data:`RADIUS_SLACK` times wider. The
    SHA-256s only catch accidents (anyone can recompute them); this catches a reference that
    does not belong to the stored spec and inputs, edited values or inflated radii, where sampled.
    """
    path = Path(path)
    if not path.is_file():
        raise GoldenError(path, "no such file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = _read_meta(path, archive)
            arrays = {name: _read_array(path, archive, name, expected, meta["dtype"])
                      for name, expected in meta["arrays"].items()}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        if isinstance(err, GoldenError):
            raise
        raise GoldenError(path, f"not a readable .npz archive, or corrupt ({err})") from None
    inputs = {name: _from_bits(arrays[f"{name}_bits"], meta["dtype"]) for name in INPUTS}
    spec = _rebuild_spec(path, meta, inputs, arrays)
    reference = {name: (torch.from_numpy(arrays[name]), torch.from_numpy(arrays[f"{name}_radius"]))
                 for name in (*FIELDS, *PARAMETER_FIELDS) if name in arrays}
    _check_reference(path, spec, reference)
    loose = loose_radius(reference, getattr(torch, meta["dtype"]))
    if loose is not None:
        raise GoldenError(path, f"{loose}; generate refuses such radii (the file was edited or not written by it)")
    sample = (None, ())
    if verify:
        seed = secrets.randbelow(2**32) if sample_seed is None else sample_seed
        groups = _verify_packed(path, spec, inputs, reference) if spec.packed else \
            _verify_sample(path, spec, inputs, reference, seed)
        sample = (None if spec.packed else seed, groups)
    return Golden(path=path, meta=meta, spec=spec, inputs=inputs, reference=reference, sample=sample)


def _read_meta(path, archive) -> dict:
    if "meta" not in archive.files:
        raise GoldenError(path, "no 'meta' entry (not an attnformal golden file)")
    try:
        meta = json.loads(str(archive["meta"]))
    except json.JSONDecodeError as err:
        raise GoldenError(path, f"'meta' is not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise GoldenError(path, f"'meta' does not declare format {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise GoldenError(path, f"format version {meta.get('version')!r}; this attnformal reads version {VERSION}")
    if meta.get("dtype") not in BITS:
        raise GoldenError(path, f"dtype {meta.get('dtype')!r} is not one of {sorted(BITS)}")
    required = [f"{n}_bits" for n in INPUTS] + list(FIELDS) + [f"{n}_radius" for n in FIELDS]
    listed = meta.get("arrays")
    missing = [n for n in required if not isinstance(listed, dict) or n not in listed]
    if missing:
        raise GoldenError(path, f"'meta' lists no array {missing[0]!r}")
    absent = [n for n in listed if n not in archive.files]
    if absent:
        raise GoldenError(path, f"array {absent[0]!r} is listed in 'meta' but missing from the archive")
    return meta


def _read_array(path, archive, name: str, expected: dict, dtype: str) -> np.ndarray:
    a = archive[name]
    if list(a.shape) != expected.get("shape") or a.dtype.name != expected.get("dtype"):
        raise GoldenError(path, f"array {name!r} is {a.dtype.name}{list(a.shape)}, 'meta' says "
                                f"{expected.get('dtype')}{expected.get('shape')}")
    if hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() != expected.get("sha256"):
        raise GoldenError(path, f"array {name!r} does not match its SHA-256 in 'meta' (corrupt or edited)")
    if name.endswith("_bits") and a.dtype != BITS[dtype]:
        raise GoldenError(path, f"array {name!r} holds {a.dtype.name}, expected the bits of {dtype}")
    return a


def _rebuild_spec(path, meta, inputs, arrays) -> AttentionSpec:
    stored = meta["spec"]
    kwargs = {"scale": stored.get("scale"),
              **{f.name: _mask(arrays, f.name) if f.tensor else f.from_json(stored.get(f.name, f.default))
                 for f in FEATURES}}
    try:
        spec = AttentionSpec.from_inputs(inputs["q"], inputs["k"], inputs["v"], **kwargs)
    except SpecError as err:
        raise GoldenError(path, f"the stored inputs do not form a valid case ({err})") from None
    rebuilt = spec.to_json()
    for key in sorted(set(rebuilt) | set(stored)):
        if rebuilt.get(key) != stored.get(key):
            raise GoldenError(path, f"spec field {key!r} in 'meta' is {stored.get(key)!r}, "
                                    f"but the stored inputs give {rebuilt.get(key)!r}")
    expected = _shapes(spec)["out"]
    if tuple(inputs["grad_out"].shape) != expected:
        raise GoldenError(path, f"grad_out has shape {list(inputs['grad_out'].shape)}, expected {list(expected)}")
    return spec


def _mask(arrays, name):
    return torch.from_numpy(arrays[name]) if name in arrays else None


def _shapes(spec: AttentionSpec) -> dict:
    """The reference arrays' shapes: ``[B, H, S, ...]``, or ``[T, H, ...]`` for a packed batch."""
    rows_q, rows_k = (spec.batch, spec.heads_q, spec.len_q), (spec.batch, spec.heads_kv, spec.len_k)
    if spec.packed:
        rows_q, rows_k = (spec.len_q, spec.heads_q), (spec.len_k, spec.heads_kv)
    return {"out": (*rows_q, spec.head_dim_v), "lse": rows_q, "dq": (*rows_q, spec.head_dim),
            "dk": (*rows_k, spec.head_dim), "dv": (*rows_k, spec.head_dim_v)}


def _check_reference(path, spec: AttentionSpec, reference: dict) -> None:
    shapes = _shapes(spec)
    for name, feature in (("dsinks", "sinks"), ("dbias", "bias")):
        if getattr(spec, feature) is not None:
            shapes[name] = tuple(getattr(spec, feature).shape)
    wanted = [name for name in shapes if name not in reference]
    unexpected = [name for name in reference if name not in shapes]
    if wanted or unexpected:
        raise GoldenError(path, f"reference {(wanted or unexpected)[0]!r} is "
                                f"{'missing' if wanted else 'stored, but the spec has no such input'}")
    for name, (value, radius) in reference.items():
        if tuple(value.shape) != shapes[name] or tuple(radius.shape) != shapes[name]:
            raise GoldenError(path, f"reference {name!r} has shape {list(value.shape)}, "
                                    f"radius {list(radius.shape)}; the spec needs {list(shapes[name])}")
        if value.dtype != torch.float64 or radius.dtype != torch.float64:
            raise GoldenError(path, f"reference {name!r} and its radius must be float64")
        ok_value = torch.isfinite(value) | ((value == -math.inf) & (radius == 0) if name == "lse" else False)
        if not bool(ok_value.all()) or not bool(((radius >= 0) & torch.isfinite(radius)).all()):
            raise GoldenError(path, f"reference {name!r} holds a non-finite value or an invalid radius")


def _verify_sample(path, spec: AttentionSpec, inputs: dict, reference: dict, seed: int) -> tuple:
    """Recompute the (batch, KV head) groups :func:`sampled_groups` draws with ``seed``: out, lse, dq of each
    query head of the group, and dk, dv (the sum over those heads, a ball sum); each stored ball must overlap
    the fresh one and be no wider than :data:`RADIUS_SLACK` times it. Returns the groups."""
    heads = spec.kv_heads()
    groups = sampled_groups(spec, seed)
    full = (spec.batch, spec.heads_q, spec.len_q, spec.len_k)
    for b, g in groups:
        summed = {}
        for h in (int(h) for h in (heads == g).nonzero().flatten()):
            kwargs = protocol_kwargs(spec)
            for f in FEATURES:  # batch element b and query head h on their own
                if f.name in kwargs:  # the active ones
                    kwargs[f.name] = f.one_element(kwargs[f.name], b, h, full)
            x = {name: inputs[name][b:b + 1, hh:hh + 1]
                 for name, hh in (("q", h), ("k", g), ("v", g), ("grad_out", h))}
            fresh = certified_attention(x["q"], x["k"], x["v"], x["grad_out"], **kwargs)
            for name in ("out", "lse", "dq"):
                _compare_ball(path, name, f"batch {b}, head {h}", (t[b:b + 1, h:h + 1] for t in reference[name]),
                              (getattr(fresh, name), getattr(fresh, f"{name}_radius")))
            for name in ("dk", "dv"):  # this query head's share of the group's gradient
                ball = fp64_balls.Ball(getattr(fresh, name), getattr(fresh, f"{name}_radius"))
                summed[name] = ball if name not in summed else fp64_balls.add(summed[name], ball)
        for name, ball in summed.items():
            _compare_ball(path, name, f"batch {b}, KV head {g}", (t[b:b + 1, g:g + 1] for t in reference[name]),
                          ball)
    return groups


def sampled_groups(spec: AttentionSpec, seed: int) -> list[tuple[int, int]]:
    """The (batch, KV head) groups a check recomputes: :data:`SAMPLED_GROUPS` of them (or all there are),
    drawn with ``seed``, so a file edited anywhere may be caught, and the same seed draws the same groups."""
    count = spec.batch * spec.heads_kv
    chosen = random.Random(seed).sample(range(count), min(SAMPLED_GROUPS, count))
    return sorted(divmod(n, spec.heads_kv) for n in chosen)


def _compare_ball(path, name: str, where: str, stored, fresh) -> None:
    """A :class:`GoldenError` unless every stored ball overlaps the fresh one and is no wider than
    :data:`RADIUS_SLACK` times it. ``where``: the sampled group (``batch b, head h``: the tensors are its
    ``[1, 1, ...]`` slices), or ``packed`` (whole tensors)."""
    stored_value, stored_radius = stored
    value, fresh_radius = fresh

    def at(i):
        return f"packed index {i}" if where == "packed" else f"{where}, index {i[2:]}"
    i = _first_apart(stored_value, stored_radius, value, fresh_radius)
    if i is not None:
        raise GoldenError(path, f"the stored {name} does not match the stored spec and inputs at {at(i)}: "
                                f"stored {float(stored_value[i]):.17g} +- {float(stored_radius[i]):.3g}, recomputed {float(value[i]):.17g} +- {float(fresh_radius[i]):.3g}")
    wide = stored_radius > RADIUS_SLACK * fresh_radius + torch.finfo(torch.float64).tiny
    if bool(wide.any()):
        i = tuple(int(n) for n in wide.nonzero()[0])
        raise GoldenError(path, f"the stored {name}'s radius at {at(i)} is "
                                f"{float(stored_radius[i]):.3g}, over {RADIUS_SLACK}x the recomputed "
                                f"{float(fresh_radius[i]):.3g} (radii inflated: the file was edited)")


def _verify_packed(path, spec: AttentionSpec, inputs: dict, reference: dict) -> str:
    """A packed file: the whole batch recomputed (sequences are independent problems; a sample of one
    would need its own slicing of every input), and every stored ball must overlap the fresh one (d sinks,
    the sum over every sequence, too)."""
    fresh = certified_attention(inputs["q"], inputs["k"], inputs["v"], inputs["grad_out"], **protocol_kwargs(spec))
    for name in ("out", "lse", "dq", *(["dsinks"] if "dsinks" in reference else [])):
        _compare_ball(path, name, "packed", reference[name], (getattr(fresh, name), getattr(fresh, f"{name}_radius")))
    return "every sequence"


def _first_apart(stored, radius, value, fresh_radius) -> tuple[int, ...] | None:
    """The first index where the stored ball and the recomputed one do not overlap (slack for the
    rounding of the sum of radii), or None."""
    apart = (stored - value).abs().nan_to_num(nan=0.0) > (radius + fresh_radius) * (1 + 2**-40)
    return tuple(int(n) for n in apart.nonzero()[0]) if bool(apart.any()) else None
