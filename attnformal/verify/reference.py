"""What a case's results should be, how accurately that is known, and how much error is fair.

:func:`expected_for` returns the reference values of out, lse (and dQ, dK, dV) with

* ``radius``: the reference's own error bound. The certified reference
  (:func:`attnformal.reference.certified_attention`, when installed) gives a rigorous
  radius per element (used for cases of up to 2^17 scores); the fp64 oracle's a-priori bound
  is ``(Sk + D) * 2^-52`` times the abs-sum of the terms below;
* ``magnitude``: how large the rounding errors of a correct kernel can be, per element,
  in units that the dtype's ``atol`` multiplies. Each result is a sum of terms (the output
  ``out_i = sum_j P_ij v_j``; dV, dQ and dK through the FlashAttention-2 formulas). A
  correct kernel rounds each term to the storage dtype at most a few times (FA2 rounds P
  to bf16 before P @ V; a naive kernel rounds the scores ``s`` too, which moves a term by
  ``u |s|`` of itself), which costs about ``u_dtype * sqrt(sum of squared terms)``: the
  root-sum-square of the terms. It accumulates in float32 (float64 for float64 inputs),
  which costs at most ``u_compute * sqrt(n) * sum |terms|``, where the first-order effect of
  an error ``u |s_ij|`` in each score is included, with ``|s_ij| <= scale * |q_i| . |k_j|``.
  Terms may also underflow (P below the compute precision's smallest normal number, results
  below the dtype's subnormal spacing), an absolute error far below anything else. The
  effective magnitude is ``rss + (atol_compute / atol_dtype) * growth(n) * abs_sum + underflow``,
  so one table row (:data:`attnformal.testing.TOLERANCES`) judges the element. lse is
  returned in float32, so it is judged by the float32 row.

:func:`naive_for` is the control of flash-attention's own tests: the same dense
computation in the dtype under test, whose error a good kernel should not exceed by much.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnformal.oracle import oracle_from_spec, oracle_output, oracle_probabilities
from attnformal.spec import AttentionSpec
from attnformal.testing import accumulation_growth, tolerance_for

FORWARD = ("out", "lse")
GRADIENTS = ("dq", "dk", "dv")
PARAMETER_GRADIENTS = {"dsinks": "sinks", "dbias": "bias"}  # gradient -> the keyword tensor it belongs to
CERTIFIED_MAX_SCORES = 2**17  # larger cases use the oracle: the certified path's cost grows with B*H*Sq*Sk
ORACLE_ERROR = 2.0**-52
WIDE_TERMS = 2.0**40  # inputs beyond this get their term sizes in float64 (their squares overflow float32)


@dataclass
class Expected:
    values: dict[str, torch.Tensor]  # float64, on the CPU
    magnitude: dict[str, torch.Tensor]  # effective error magnitude (module docstring)
    radius: dict[str, torch.Tensor | float]
    dtypes: dict[str, torch.dtype]  # the table row each tensor is judged by
    source: str
    probabilities: torch.Tensor = field(repr=False, default=None)  # P before dropout, [B, Hq, Sq, Sk]

    def tolerance(self, name) -> dict:
        """Keyword arguments of :func:`attnformal.testing.compare_attention` for tensor ``name``."""
        return {"dtype": self.dtypes[name], "magnitude": self.magnitude[name], "reference_error": self.radius[name]}


def expected_for(case, *, backward: bool, use_certified: bool = True) -> Expected:
    """The reference for ``case`` (gradients only with ``backward``)."""
    spec = case.spec
    if spec.packed:
        return _packed_expected(case, spec, backward=backward, use_certified=use_certified)
    q, k, v = (t.detach().cpu().double() for t in (case.q, case.k, case.v))
    spec = _on_cpu(spec)
    grad_out = case.grad_out.detach().cpu().double() if backward else None
    values, radius, source = None, None, "fp64 oracle"
    if use_certified and spec.batch * spec.heads_q * spec.len_q * spec.len_k <= CERTIFIED_MAX_SCORES:
        values, radius, source = _certified(case, q, k, v, grad_out)
    oracle, p = _oracle_values(spec, q, k, v, grad_out)
    values = values or oracle
    dtypes = {name: _lse_dtype(case.dtype) if name == "lse" else case.dtype for name in values}
    dtypes.update({name: tensor.dtype for name, tensor in _parameters(case).items() if name in values})
    rss, abs_sum = _term_sizes(spec, q, k, v, p, values["out"], oracle["lse"], grad_out)
    terms = _accumulation(spec)
    floor = _underflow_floor(q, k, v, grad_out, spec)
    magnitude = {name: rss[name] + _compute_share(dtypes[name]) * accumulation_growth(terms[name]) * abs_sum[name]
                 + _underflow_share(dtypes[name], terms[name], floor) for name in values}
    if radius is None:
        radius = {name: (spec.len_k + spec.head_dim) * ORACLE_ERROR * abs_sum[name] for name in values}
    return Expected(values, magnitude, radius, dtypes, source, p)


def _parameters(case) -> dict:
    """``{"dsinks": sinks, "dbias": bias}`` for the differentiable keyword tensors the case has."""
    return {name: case.kwargs[kw] for name, kw in PARAMETER_GRADIENTS.items() if case.kwargs.get(kw) is not None}


def _packed_expected(case, spec, *, backward, use_certified) -> Expected:
    """A packed case's reference: each sequence's own (its unpacked case, through the spec's index map),
    put back on its packed rows (:func:`attnformal.features.varlen.pack`). No probabilities."""
    from attnformal.features import varlen

    parts = []
    for b, (q_rows, k_rows) in enumerate(varlen.sequence_rows(spec, case.q.device)):
        one = spec.sequence(b)
        kwargs = {name: getattr(one, name) for name in case.kwargs if name not in ("cu_seqlens_q", "cu_seqlens_k")}
        grad_out = None if case.grad_out is None else varlen.unpack(case.grad_out, q_rows)
        sub = case.with_(q=varlen.unpack(case.q, q_rows), k=varlen.unpack(case.k, k_rows),
                         v=varlen.unpack(case.v, k_rows), grad_out=grad_out, kwargs=kwargs)
        parts.append(expected_for(sub, backward=backward, use_certified=use_certified))
    first = parts[0]

    def packed(field: str) -> dict:
        return varlen.pack(spec, [{n: torch.broadcast_to(torch.as_tensor(getattr(e, field)[n], dtype=torch.float64),
                                                         e.values[n].shape) for n in first.values} for e in parts])

    return Expected(packed("values"), packed("magnitude"), packed("radius"), first.dtypes, first.source)


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _underflow_floor(q, k, v, grad_out, spec) -> float:
    """A bound on the factors that multiply one underflowed term (P, or P times a score error). Only allowed
    pairs have terms: a masked key's score, however large, is no term of a correct kernel."""
    def top(t):
        return float(t.abs().max()) if t is not None and t.numel() else 0.0

    scores = spec.scale * (q.abs() @ k[:, spec.kv_heads()].abs().transpose(-1, -2))
    return (1 + top(v)) * (1 + top(grad_out)) * (1 + top(scores[spec.allowed()]))


def _underflow_share(dtype, terms, floor) -> float:
    """Underflow, in ``dtype`` units: each term may flush to 0 below the compute precision's smallest
    normal number, and the stored result below the dtype's subnormal spacing."""
    compute, stored = torch.finfo(_lse_dtype(dtype)), torch.finfo(dtype)
    return (compute.tiny * terms * floor + stored.tiny * stored.eps) / tolerance_for(dtype).atol


def _compute_share(dtype) -> float:
    """``atol_compute / atol_dtype``: the weight of the compute precision's errors in ``dtype`` units."""
    return tolerance_for(_lse_dtype(dtype)).atol / tolerance_for(dtype).atol


def _on_cpu(spec: AttentionSpec) -> AttentionSpec:
    """The spec with its tensor-valued features on the CPU, where the references run."""
    from attnformal.features import FEATURES

    return spec.replace(**{f.name: getattr(spec, f.name).cpu() for f in FEATURES
                           if f.tensor and getattr(spec, f.name) is not None})


def _oracle_values(spec, q, k, v, grad_out) -> tuple[dict, torch.Tensor]:
    """The oracle's values (gradients through autograd, the sinks' and bias's too) and its probabilities P."""
    backward = grad_out is not None
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    parameters = {kw: getattr(spec, kw).detach().double().requires_grad_(backward)
                  for kw in PARAMETER_GRADIENTS.values() if getattr(spec, kw) is not None}
    spec = spec.replace(**parameters)
    p, lse = oracle_probabilities(spec, *leaves[:2])
    out = oracle_output(spec, p, leaves[2])
    values = {"out": out.detach(), "lse": lse.detach()}
    if backward:
        names = ["dq", "dk", "dv"] + [f"d{kw}" for kw in parameters]
        values.update(zip(names, torch.autograd.grad(out, [*leaves, *parameters.values()], grad_out)))
    return values, p.detach()


def _certified(case, q, k, v, grad_out):
    """Values and rigorous radii from the certified reference, or Nones when it is absent or fails."""
    try:
        from attnformal.reference import certified_attention
    except ImportError:
        return None, None, "fp64 oracle (certified reference not installed)"
    kwargs = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in case.kwargs.items()}
    try:
        result = certified_attention(q, k, v, grad_out, **kwargs)
    except Exception as err:  # the battery must still run; the report names the fallback and why
        return None, None, f"fp64 oracle (certified reference failed: {type(err).__name__}: {err})"
    names = FORWARD + (GRADIENTS + tuple(n for n in PARAMETER_GRADIENTS if getattr(result, n) is not None)
                       if grad_out is not None else ())
    values = {name: getattr(result, name) for name in names}
    radius = {name: getattr(result, f"{name}_radius") for name in names}
    return values, radius, f"certified ({result.tier})"


def _accumulation(spec: AttentionSpec) -> dict[str, int]:
    """Terms summed per element: keys for out/lse/dQ, query rows of the whole group for dK/dV."""
    per_key = spec.len_q * spec.group
    terms = {"out": spec.len_k, "lse": spec.len_k, "dq": spec.len_k, "dk": per_key, "dv": per_key,
             "dsinks": spec.batch * spec.len_q}
    if spec.bias is not None:  # d bias sums dS over the dimensions the bias was broadcast along
        terms["dbias"] = spec.batch * spec.heads_q * spec.len_q * spec.len_k // max(1, spec.bias.numel())
    return terms


def _group_sum(t, spec: AttentionSpec):
    """Sum a ``[B, Hq, ...]`` tensor over the query heads that share each KV head."""
    out = torch.zeros(t.shape[0], spec.heads_kv, *t.shape[2:], dtype=t.dtype)
    return out.index_add_(1, spec.kv_heads(), t)


def dropout_weights(spec: AttentionSpec):
    """The keep-mask scaled by ``1 / (1 - p)``, or 1 without dropout replay."""
    if spec.dropout_mask is None:
        return 1.0
    return spec.dropout_mask.double() / (1.0 - spec.dropout_p)


def _term_sizes(spec, q, k, v, p, out, lse, grad_out) -> tuple[dict, dict]:
    """Per element: the root-sum-square of the summed terms (each term rounded once, and its score
    rounded once) and their abs-sum with a bound on the score errors. In float32, unless an input is so
    large that the squares and products of its terms would overflow there (values near the dtype's range)."""
    largest = max((float(t.abs().max()) for t in (q, k, v, grad_out) if t is not None and t.numel()), default=0.0)
    work = torch.float64 if largest > WIDE_TERMS else torch.float32
    q, k, v, p, out, lse = (t.to(work) for t in (q, k, v, p, out, lse))
    heads = spec.kv_heads()
    kx, vx = k[:, heads], v[:, heads]
    score_size = spec.scale * (q.abs() @ kx.abs().transpose(-1, -2))  # bounds |s_ij|, so its error
    bias = spec.dense_score_bias(torch.float32)
    if bias is not None:  # the biased score is rounded again after the bias is added
        score_size = score_size + bias.abs()
    p_sink = None
    if spec.sinks is not None:  # the sink's share of the denominator, exactly 0 for a -inf sink
        sink = spec.sinks.detach().float()[None, :, None]
        p_sink = torch.where(torch.isfinite(sink), (sink - torch.where(torch.isfinite(lse), lse, 0.0)).exp(), 0.0)
    # The scores themselves, from s = lse + log P where P > 0 (elsewhere the term is 0 anyway).
    score_sq = torch.where(p > 0, lse[..., None] + p.clamp(min=torch.finfo(p.dtype).tiny).log(), 0.0) ** 2
    w = dropout_weights(spec)
    w = w.float() if isinstance(w, torch.Tensor) else w
    pw = p * w
    pw_sq = pw * pw
    rss = {"out": (pw_sq * (1 + 2 * score_sq) @ (vx * vx) + 2 * (pw_sq * score_sq).sum(-1, keepdim=True) * out * out)
           .sqrt(),
           "lse": torch.ones_like(lse)}
    abs_sum = {"out": (pw * (1 + score_size)) @ vx.abs() + (pw * score_size).sum(-1, keepdim=True) * out.abs(),
               "lse": 1 + (p * score_size).sum(-1)}
    if p_sink is not None:
        abs_sum["lse"] = abs_sum["lse"] + p_sink * torch.where(torch.isfinite(sink), sink, 0.0).abs()
    if grad_out is not None:
        do = grad_out.to(work)
        ds_terms = p * ((w * (do.abs() @ vx.abs().transpose(-1, -2))) + (do.abs() * out.abs()).sum(-1, keepdim=True))
        ds_sq, ds_abs = ds_terms * ds_terms * (1 + score_sq), ds_terms * (1 + score_size)
        rss["dq"] = spec.scale * (ds_sq @ (kx * kx)).sqrt()
        rss["dk"] = spec.scale * _group_sum(ds_sq.transpose(-1, -2) @ (q * q), spec).sqrt()
        rss["dv"] = _group_sum((pw_sq * (1 + score_sq)).transpose(-1, -2) @ (do * do), spec).sqrt()
        abs_sum["dq"] = spec.scale * ds_abs @ kx.abs()
        abs_sum["dk"] = spec.scale * _group_sum(ds_abs.transpose(-1, -2) @ q.abs(), spec)
        abs_sum["dv"] = _group_sum((pw * (1 + score_size)).transpose(-1, -2) @ do.abs(), spec)
        if spec.bias is not None:  # d bias = dS, summed to the bias's shape
            shape = tuple(spec.bias.shape)
            rss["dbias"] = ds_sq.sum_to_size(shape).sqrt()
            abs_sum["dbias"] = ds_abs.sum_to_size(shape)
        if p_sink is not None:  # d sink = -sum_{b, i} p_sink D, D = rowsum(dO * out)
            # Its own accumulation: each term carries the rounding of out in the dtype (rss); p_sink = exp(sink - lse)
            # carries lse's error, of lse's size, in the compute precision (abs_sum) -- not the dtype's.
            delta_terms = p_sink * (do.abs() * out.abs()).sum(-1)
            rss["dsinks"] = (delta_terms * delta_terms).sum(dim=(0, 2)).sqrt()
            abs_sum["dsinks"] = (delta_terms * (1 + lse.abs().nan_to_num(posinf=0.0))).sum(dim=(0, 2))
    return ({n: t.double() for n, t in rss.items()}, {n: t.double() for n, t in abs_sum.items()})


def naive_for(case, *, backward: bool) -> dict[str, torch.Tensor]:
    """Dense attention computed in the case's own dtype (flash-attention's ``upcast=False`` control)."""
    spec = _on_cpu(case.spec)
    dtype = case.dtype
    leaves = [t.detach().cpu().clone().requires_grad_(backward) for t in (case.q, case.k, case.v)]
    out, lse = oracle_from_spec(spec, *leaves, dtype=dtype)
    values = {"out": out.detach(), "lse": lse.detach()}
    if backward:
        dq, dk, dv = torch.autograd.grad(out, leaves, case.grad_out.detach().cpu().to(dtype))
        values.update(dq=dq, dk=dk, dv=dv)
    return values
