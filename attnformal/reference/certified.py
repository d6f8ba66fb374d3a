"""Certified attention: reference values with a rigorous bound on their own error.

:func:`certified_attention` returns float64 values of out, lse and (given ``grad_out``)
dQ, dK, dV, each element with a radius such that the exact value, for the exact binary
inputs, lies within ``value +- radius``. Two tiers compute the same pipeline:

* **float64 balls** (:mod:`~attnformal.reference.fp64_balls`): torch float64 with a proven
  rounding bound for each operation; about 10^-13 relative, at 2-3 times the cost of the
  fp64 oracle. Its one assumption: BLAS float64 matmul is a classical binary64 product.
* **Arb balls** (:mod:`~attnformal.reference.arb_balls`): python-flint's Arb at ``prec`` bits,
  rigorous by construction, for radii below what float64 can express, and for what the
  float64 tier cannot certify (overflow, exotic constants).

With ``max_radius`` the precision is raised (float64, then Arb at 128, 256, ... bits) until
every enclosure's radius is at most ``max_radius`` (absolute).

The float64 tier runs **tiled** by default (:mod:`~attnformal.reference.tiled`): the spec's own
``block_state``/``merge``/``finalize``/``tile_grads`` on float64 balls, tile by tile, in memory
linear in the sequence length, as tasks an executor may spread over a cluster. The Arb tier,
and the float64 tier with ``dense=True`` (an independent cross-check of the tiled one: no
merge, no schedule), run the same steps written once in :func:`_rows`: the FlashAttention-2
formulas, dense, per block of query rows::

    s = scale q k^T (softcapped) + bias (ALiBi, bias), E = exp(s - shift),
    l = sum E [+ exp(sink - shift)], P = E / l
    out = kappa (P o keep) v,  lse = shift + log l            (kappa = 1 / (1 - p))
    dP = kappa keep o (dO v^T),  D = rowsum(dO o out),  dB = P o (dP - D),  dS = dB [o (1 - tanh^2)]
    dQ = scale dS k,  dK = scale dS^T q,  dV = kappa (P o keep)^T dO
    dsinks = -sum_{b, rows} p_sink D  (p_sink = exp(sink - shift) / l),  dbias = dB summed to bias's shape

The shift is any exact float (softmax does not depend on it); the row maximum of the
midpoints keeps ``exp`` in range. Masks come from ``spec.allowed()`` and heads from
``spec.kv_heads()``; nothing of the kernels' tile code is used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from flint import arb, ctx

from attnformal import ops
from attnformal.features.alibi import alibi_bias
from attnformal.features import FEATURES, refuse_unsupported
from attnformal.reference import arb_balls, fp64_balls
from attnformal.spec import AttentionSpec, SpecError, require_dropout_mask

FIELDS = ("out", "lse", "dq", "dk", "dv")
PARAMETER_FIELDS = ("dsinks", "dbias")  # gradients of the sinks and the bias, when the problem has them
ARB_START_PREC = 128
ARB_MAX_PREC = 4096
FP64_CHUNK_ELEMENTS = 2**20  # scores per block of query rows: keeps temporaries in cache-sized pieces
ARB_CHUNK_ELEMENTS = 2**14


class CertificationError(RuntimeError):
    """The requested radius was not reached at the highest precision tried."""


@dataclass(frozen=True)
class CertifiedResult:
    """Float64 reference values and rigorous bounds: ``|exact - out| <= out_radius`` element-wise.

    ``dq``/``dk``/``dv`` and their radii are None without ``grad_out``. ``lse`` is ``-inf``
    with radius 0 on rows with no allowed key. ``tier`` is ``"float64"`` or ``"arb-<bits>"``;
    ``enclosure_radius`` is the largest radius before rounding to float64 (what
    ``max_radius`` bounds); ``enclosures`` holds the Arb balls themselves on the Arb tier
    (name -> object array of ``flint.arb``; None marks an exact -inf lse), for comparisons
    finer than float64.
    """

    spec: AttentionSpec
    tier: str
    enclosure_radius: float
    out: torch.Tensor
    out_radius: torch.Tensor
    lse: torch.Tensor
    lse_radius: torch.Tensor
    dq: torch.Tensor | None = None
    dq_radius: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dk_radius: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    dv_radius: torch.Tensor | None = None
    dsinks: torch.Tensor | None = None
    dsinks_radius: torch.Tensor | None = None
    dbias: torch.Tensor | None = None
    dbias_radius: torch.Tensor | None = None
    enclosures: dict | None = None

    def fields(self) -> tuple[str, ...]:
        """The names of the values present (``out``, ``lse`` and, with gradients, ``dq``, ``dk``, ``dv``
        and ``dsinks``, ``dbias`` when the problem has sinks or a bias)."""
        return tuple(name for name in (*FIELDS, *PARAMETER_FIELDS) if getattr(self, name) is not None)

    def contains(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """Bool tensor: ``values`` (any float dtype) provably within the ball of each element.

        ``fl(|x - mid|) <= fl(rad (1 - 2u))`` implies ``|x - mid| <= rad`` (each side rounds by
        at most a factor ``1 +- u``); equal infinities (lse of empty rows) count as inside.
        """
        mid, rad = getattr(self, name), getattr(self, f"{name}_radius")
        x = values.detach().to("cpu", torch.float64)
        inside = (x - mid).abs() <= rad * (1.0 - 2 * fp64_balls.U)
        return inside | (torch.isinf(mid) & (x == mid))


def certified_attention(q, k, v, grad_out=None, *, max_radius: float | None = None,
                        prec: int | None = None, progress: Callable[[int, int], None] | None = None,
                        executor=None, tiling=None, dense: bool = False, **protocol) -> CertifiedResult:
    """Certified out, lse (and dQ, dK, dV for ``grad_out``) of the implementation protocol.

    ``q, k, v`` as in the protocol (any supported dtype; their values are taken exactly),
    ``grad_out`` ``[B, Hq, Sq, Dv]``; ``protocol`` is ``scale, causal, window, attn_mask,
    kv_lens, softcap, dropout_p, dropout_mask`` (dropout needs its keep-mask to replay).
    ``max_radius``: absolute bound every enclosure must meet (precision is raised until it
    does, or :class:`CertificationError`). ``prec``: force the Arb tier at ``prec`` bits.
    ``progress(done, total)`` is called after each task (block of query rows on the dense path).
    ``executor``: where the float64 tier's tasks run (:mod:`attnformal.distributed`; default:
    this process); the result is bitwise the same. ``tiling``: a :class:`~attnformal.reference.tiled.Tiling`
    (tile and task sizes). ``dense``: the float64 tier without tiles.
    """
    spec = AttentionSpec.from_inputs(q, k, v, **protocol)
    if spec.packed:
        return _certified_packed(spec, q, k, v, grad_out, max_radius=max_radius, prec=prec, executor=executor,
                                 tiling=tiling, dense=dense)
    inputs = exact_inputs(spec, q, k, v, grad_out)
    if max_radius is not None and not max_radius > 0:
        raise SpecError("max_radius", "a positive float or None", repr(max_radius))
    if prec is not None and (not isinstance(prec, int) or not 64 <= prec <= ARB_MAX_PREC):
        raise SpecError("prec", f"None or an int number of bits in [64, {ARB_MAX_PREC}]", repr(prec))
    if prec is None:
        result = _try_fp64(spec, inputs, progress, executor, tiling, dense)
        if result is not None and _meets(result, max_radius):
            return result
        prec = ARB_START_PREC
    while True:
        result = _run(arb_balls, spec, inputs, progress, prec)
        if _meets(result, max_radius):
            return result
        if prec >= ARB_MAX_PREC:
            wanted = "a finite radius" if max_radius is None else f"max_radius={max_radius:.3g}"
            raise CertificationError(f"radius {result.enclosure_radius:.3g}, not {wanted}, at {prec} bits")
        prec *= 2


def _certified_packed(spec, q, k, v, grad_out, *, max_radius, **options) -> CertifiedResult:
    """A packed batch: each sequence certified as its own problem (its own features' values,
    ``spec.sequence(b)``), the balls put back on its packed rows; ``d sinks``, shared by every sequence, is
    the sum of theirs, a ball sum (so each sequence meets ``max_radius / B`` when there is one)."""
    from attnformal.features import varlen

    if grad_out is not None and tuple(grad_out.shape) != (spec.len_q, spec.heads_q, spec.head_dim_v):
        raise SpecError("grad_out", f"a float tensor [Tq, Hq, Dv] = {[spec.len_q, spec.heads_q, spec.head_dim_v]} "
                                    "(packed)", _describe(grad_out))
    summed = grad_out is not None and spec.sinks is not None
    if summed and max_radius is not None:
        max_radius = max_radius / spec.batch
    results = []
    for b, (q_rows, k_rows) in enumerate(varlen.sequence_rows(spec, q.device)):
        one = spec.sequence(b)
        protocol = {"scale": one.scale, **{f.name: getattr(one, f.name) for f in FEATURES}}
        sub_grad = None if grad_out is None else varlen.unpack(grad_out, q_rows)
        results.append(certified_attention(varlen.unpack(q, q_rows), varlen.unpack(k, k_rows),
                                           varlen.unpack(v, k_rows), sub_grad, max_radius=max_radius, **options,
                                           **protocol))
    names = [n for name in results[0].fields() if name not in PARAMETER_FIELDS for n in (name, f"{name}_radius")]
    packed = varlen.pack(spec, [{n: getattr(r, n) for n in names} for r in results])
    enclosure = max(r.enclosure_radius for r in results)
    if summed:
        balls = [fp64_balls.Ball(r.dsinks, r.dsinks_radius) for r in results]
        packed["dsinks"], packed["dsinks_radius"] = functools.reduce(fp64_balls.add, balls)
        enclosure = max(enclosure, sum(r.enclosure_radius for r in results))  # bounds the sum's before rounding
    return CertifiedResult(spec=spec, tier=", ".join(sorted({r.tier for r in results})),
                           enclosure_radius=enclosure, **packed)


def _meets(result: CertifiedResult, max_radius) -> bool:
    finite = math.isfinite(result.enclosure_radius)
    return finite and (max_radius is None or result.enclosure_radius <= max_radius)


def _try_fp64(spec, inputs, progress, executor, tiling, dense):
    try:
        if dense:
            return _run(fp64_balls, spec, inputs, progress, None)
        return _run_tiled(spec, inputs, progress, executor, tiling)
    except fp64_balls.OutOfRange:
        return None


def _run_tiled(spec, x: dict, progress, executor, tiling) -> CertifiedResult:
    from attnformal.distributed import InProcess
    from attnformal.reference.tiled import Problem, Tiling, tiled_balls

    kappa = None
    if spec.dropout_mask is not None:
        with _arb_precision(ARB_START_PREC):
            kappa = fp64_balls.const(1 / (1 - arb(spec.dropout_p)))
    problem = Problem(spec, x["q"], x["k"], x["v"], x.get("grad_out"), kappa, tiling or Tiling())
    balls = {name: b.ball for name, b in tiled_balls(problem, executor or InProcess(), progress).items()}
    balls["lse"] = fp64_balls.Ball(balls["lse"].mid[..., 0], balls["lse"].rad[..., 0])
    for name in ("dk", "dv"):
        if name in balls:
            balls[name] = _sum_query_heads(fp64_balls, spec, balls[name])
    values = {}
    for name, ball in balls.items():
        values[name], values[f"{name}_radius"] = ball
    enclosure = max(fp64_balls.enclosure_radius(ball) for ball in balls.values())
    return CertifiedResult(spec=spec, tier="float64", enclosure_radius=enclosure, **values)


# ---------------------------------------------------------------- inputs


def reference_supports() -> set[str]:
    """The features the certified and mpmath references compute: every mask (through ``spec.allowed``),
    dropout, and the score and state features they implement by name (softcap, ALiBi, bias, sinks)."""
    return ({f.name for f in FEATURES if f.role in ("interval", "length", "data", "dropout")}
            | {"softcap", "alibi_slopes", "bias", "sinks"})


def exact_inputs(spec: AttentionSpec, q, k, v, grad_out) -> dict:
    """Float64 CPU copies (exact for every supported dtype), checked finite; a feature the references
    do not compute is refused (``NotImplementedError``)."""
    refuse_unsupported(spec, reference_supports(), "the certified and mpmath references")
    tensors = {"q": q, "k": k, "v": v}
    if grad_out is not None:
        expected = (spec.batch, spec.heads_q, spec.len_q, spec.head_dim_v)
        if not isinstance(grad_out, torch.Tensor) or tuple(grad_out.shape) != expected \
                or not grad_out.is_floating_point():
            raise SpecError("grad_out", f"a float tensor of shape [B, Hq, Sq, Dv] = {list(expected)}",
                            _describe(grad_out))
        tensors["grad_out"] = grad_out
    require_dropout_mask(spec)
    exact = {}
    for name, t in tensors.items():
        t64 = t.detach().to("cpu", torch.float64)
        if not bool(torch.isfinite(t64).all()):
            raise SpecError(name, "finite values (the reference is defined for finite inputs)",
                            "a tensor containing inf or NaN")
        exact[name] = t64
    return exact


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"tensor of shape {tuple(t.shape)}, dtype {str(t.dtype).removeprefix('torch.')}"


# ---------------------------------------------------------------- the pipeline


@contextmanager
def _arb_precision(bits: int):
    saved = ctx.prec
    ctx.prec = bits
    try:
        yield
    finally:
        ctx.prec = saved


def _run(bk, spec: AttentionSpec, x: dict, progress, prec) -> CertifiedResult:
    """Run the pipeline with ball backend ``bk`` over blocks of query rows; assemble the result."""
    with _arb_precision(prec or ARB_START_PREC):  # the float64 tier uses Arb only for per-row log
        kappa = bk.const(1 / (1 - arb(spec.dropout_p))) if spec.dropout_mask is not None else None
        heads = spec.kv_heads()
        k, v = x["k"][:, heads], x["v"][:, heads]  # GQA: repeat K and V per query head
        allowed = spec.allowed("cpu")
        keep = spec.dropout_mask.cpu() if spec.dropout_mask is not None else None
        grad_out = x.get("grad_out")
        sinks = None if spec.sinks is None else spec.sinks.detach().cpu().double()[None, :, None, None]
        budget = FP64_CHUNK_ELEMENTS if bk is fp64_balls else ARB_CHUNK_ELEMENTS
        rows = max(1, budget // max(1, spec.batch * spec.heads_q * spec.len_k))
        parts, summed = [], {}
        starts = range(0, max(spec.len_q, 1), rows)  # one (empty) block when Sq = 0
        for n, r0 in enumerate(starts):
            sl = slice(r0, min(r0 + rows, spec.len_q))
            part = _rows(bk, spec, x["q"][:, :, sl], k, v, None if grad_out is None else grad_out[:, :, sl],
                         allowed[:, :, sl], None if keep is None else keep[:, :, sl], kappa,
                         score_bias(bk, spec, sl), sinks)
            parts.append(part)
            for name in ("dk", "dv", "dsinks"):  # sums over all query rows
                if name in part:
                    summed[name] = part[name] if name not in summed else bk.add(summed[name], part[name])
            if progress is not None:
                progress(n + 1, len(starts))
        balls = {"out": bk.cat([p["out"] for p in parts], 2),
                 "lse": np.concatenate([p["lse"] for p in parts], 2)}
        if grad_out is not None:
            balls["dq"] = bk.cat([p["dq"] for p in parts], 2)
            balls["dk"], balls["dv"] = (_sum_query_heads(bk, spec, summed[g]) for g in ("dk", "dv"))
            if "dsinks" in summed:
                balls["dsinks"] = bk.reshape(summed["dsinks"], (spec.heads_q,))
            if spec.bias is not None:
                balls["dbias"] = sum_to_shape(bk, bk.cat([p["dbias"] for p in parts], 2), tuple(spec.bias.shape))
        return _result(bk, spec, balls, prec)


def _rows(bk, spec: AttentionSpec, q, k, v, grad_out, allowed, keep, kappa, bias=None, sinks=None) -> dict:
    """Forward (and backward) for one block of query rows, all batches and heads at once.

    ``bias``: the block's score bias (balls) or None; ``sinks``: ``[1, Hq, 1, 1]`` float64 or None.
    """
    s = bk.mul_exact(bk.dot(q, k.mT), spec.scale)
    t = None
    if spec.softcap is not None:
        t = bk.tanh(bk.div_exact(s, spec.softcap))
        s = bk.mul_exact(t, spec.softcap)
    if bias is not None:
        s = bk.add(s, bias)
    shift = _row_shift(bk.mid(s), allowed, sinks)
    e = bk.where(allowed, bk.exp(bk.sub_exact(s, shift)))
    nonempty = allowed.any(-1, keepdim=True)
    l = bk.sum_dim(e, -1)
    seen = nonempty
    if sinks is not None:  # the sink's term joins the denominator; -inf (no sink) adds exactly 0
        finite = torch.isfinite(sinks).expand_as(shift)
        sink = torch.where(finite, sinks, 0.0).expand_as(shift).contiguous()
        sink_term = bk.where(finite, bk.exp(bk.sub_exact(bk.exact(sink), shift)))
        l = bk.add(l, sink_term)
        seen = nonempty | finite
    l_safe = bk.where(seen, l, other=1.0)
    p = bk.div(e, l_safe)  # empty rows: E = 0 exactly, so P = 0
    kept = p if keep is None else bk.where(keep, p)
    out = bk.matmul(kept, v)
    if kappa is not None:
        out = bk.mul(out, kappa)
    out = bk.where(nonempty, out)  # the empty-row rule, exactly (radius 0 too)
    part = {"out": out, "lse": _lse(bk, shift, l, seen)}
    if grad_out is None:
        return part
    dp = bk.dot(grad_out, v.mT)
    if kappa is not None:
        dp = bk.mul(bk.where(keep, dp), kappa)
    delta = bk.sum_dim(bk.mul_exact(out, grad_out), -1)
    ds = bk.mul(p, bk.sub(dp, delta))
    if spec.bias is not None:
        part["dbias"] = ds  # a bias is added to the final scores: its gradient is dS before the softcap's
    if sinks is not None:  # d sink = -p_sink D per row, summed over batches and rows
        per_row = bk.mul_exact(bk.mul(bk.div(sink_term, l_safe), delta), -1.0)
        part["dsinks"] = bk.sum_dim(bk.sum_dim(per_row, 0), 2)
    if t is not None:
        ds = bk.mul(ds, bk.rsub_exact(1.0, bk.mul(t, t)))  # d softcap / d s = 1 - tanh^2
    dv = bk.matmul(bk.transpose(kept), grad_out)
    part["dq"] = bk.where(nonempty, bk.mul_exact(bk.matmul(ds, k), spec.scale))
    part["dk"] = bk.mul_exact(bk.matmul(bk.transpose(ds), q), spec.scale)
    part["dv"] = dv if kappa is None else bk.mul(dv, kappa)
    return part


def _row_shift(s_mid: torch.Tensor, allowed: torch.Tensor, sinks=None) -> torch.Tensor:
    """The exact float each row's scores are shifted by: their largest midpoint (or sink), 0 if none."""
    shift = ops.rowmax(s_mid.masked_fill(~allowed, -math.inf))  # -inf for a row of no keys (Sk = 0)
    if sinks is not None:
        shift = torch.maximum(shift, sinks)
    return torch.where(torch.isfinite(shift), shift, 0.0)


def score_bias(bk, spec: AttentionSpec, rows: slice, cols: slice | None = None, batches=None):
    """The exact score bias of the tile ``rows x cols`` of ``batches`` (all by default) as balls
    ``[len(batches), Hq, rows, cols]``, or None.

    ALiBi's is ``slope * (-|i + Sk_b - Sq - j|)``: the distance is an exact integer (the feature's
    own ``alibi_bias`` at slope 1), the product is rounded once (``mul_exact``); ``bias`` is exact.
    """
    if spec.alibi_slopes is None and spec.bias is None:
        return None
    cols = slice(0, spec.len_k) if cols is None else cols
    batches = list(range(spec.batch)) if batches is None else list(batches)
    full = (len(batches), spec.heads_q, rows.stop - rows.start, cols.stop - cols.start)
    total = bk.exact(torch.zeros(full, dtype=torch.float64))
    if spec.alibi_slopes is not None:
        i = torch.arange(rows.start, rows.stop, dtype=torch.float64)[:, None]
        j = torch.arange(cols.start, cols.stop, dtype=torch.float64)[None, :]
        len_k = spec.key_lengths(torch.tensor(batches, dtype=torch.int64)).double()[:, None, None, None]
        distance = alibi_bias(i, j, 1.0, spec.len_q, len_k).expand(full).contiguous()
        slopes = spec.alibi_slopes.cpu().double()[batches][:, :, None, None]
        total = bk.mul_exact(bk.exact(distance), slopes)
    if spec.bias is not None:
        bias = spec.bias.detach().cpu().double().expand(spec.batch, spec.heads_q, spec.len_q, spec.len_k)
        total = bk.add(total, bk.exact(bias[batches][:, :, rows, cols].contiguous()))
    return total


def sum_to_shape(bk, full, shape: tuple):
    """Balls ``[B, Hq, Sq, Sk]`` summed over the dimensions a tensor of ``shape`` was broadcast along."""
    padded = (1,) * (4 - len(shape)) + shape
    for d, n in enumerate(padded):
        if n == 1 and _size(full, d) != 1:
            full = bk.sum_dim(full, d)
    return bk.reshape(full, shape)


def _size(balls, d: int) -> int:
    return balls.mid.shape[d] if hasattr(balls, "mid") else balls.shape[d]


def _lse(bk, shift, l, nonempty) -> np.ndarray:
    """``shift + log l`` per row as Arb balls (None, for an exact -inf, on empty rows)."""
    logs = np.frompyfunc(lambda s, x, seen: arb(s) + x.log() if seen else None, 3, 1)
    return logs(shift.numpy(), bk.to_arb(l), nonempty.numpy())[..., 0]


def _sum_query_heads(bk, spec: AttentionSpec, g):
    """Sum per-query-head gradients ``[B, Hq, ...]`` into their KV heads ``[B, Hkv, ...]``."""
    heads = spec.kv_heads()
    return bk.cat([bk.sum_dim(bk.select(g, 1, torch.nonzero(heads == h)[:, 0]), 1)
                   for h in range(spec.heads_kv)], 1)


def _result(bk, spec, balls: dict, prec) -> CertifiedResult:
    lse_mid, lse_rad, enclosure = _lse_float64(balls["lse"])
    values = {"lse": lse_mid, "lse_radius": lse_rad}
    for name, ball in balls.items():
        if name != "lse":
            values[name], values[f"{name}_radius"] = bk.to_float64(ball)
            enclosure = max(enclosure, bk.enclosure_radius(ball))
    tier = "float64" if prec is None else f"arb-{prec}"
    enclosures = balls if prec is not None else None
    return CertifiedResult(spec=spec, tier=tier, enclosure_radius=enclosure, enclosures=enclosures, **values)


def _lse_float64(lse: np.ndarray):
    """Float64 (mid, radius) of the per-row lse balls, and their largest Arb radius."""
    mids = np.full(lse.shape, -math.inf)
    rads = np.zeros(lse.shape)
    enclosure = 0.0
    for idx, ball in np.ndenumerate(lse):
        if ball is not None:
            mids[idx], rads[idx] = arb_balls.arb_to_float64(ball)
            enclosure = max(enclosure, arb_balls.upper_float(ball.rad()))
    return torch.from_numpy(mids), torch.from_numpy(rads), enclosure

