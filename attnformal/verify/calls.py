"""Calling an implementation: the protocol's contract, checked on every call.

:func:`call` runs the implementation on a case (forward, optionally lse and backward) and
returns what it produced, or raises

* :class:`Unsupported` when the implementation raised ``NotImplementedError`` (the features
  the case uses are named, with the implementation's own message);
* :class:`ContractError` when it broke the protocol: no tensor returned, wrong shape, dtype
  or device, a missing gradient, inputs modified in place, ``sys.exit`` or ``os._exit``
  (:func:`attnformal.execution.guarded`), or any other exception (with its type).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnformal.execution import Exited, guarded
from attnformal.features import FEATURES as REGISTERED

FIELDS = ("out", "lse", "dq", "dk", "dv", "dsinks", "dbias")
LAID_OUT = FIELDS[:5]  # the [B, H, S, ...] tensors the diagnosis localises (d sinks, d bias have other shapes)
DIFFERENTIABLE = ("sinks", "bias")  # keyword tensors whose gradients the protocol returns (d<name>)
# The protocol features a case can exercise (coverage, --require): the registered features, with causal
# by alignment and dropout as drawn by the implementation or replayed.
_SPLIT = ("causal", "dropout_p", "dropout_mask")
FEATURES = ("lse", "backward", "gqa", "causal_top_left", "causal_bottom_right",
            *(f.name for f in REGISTERED if f.name not in _SPLIT),
            "dropout", "dropout_replay", "head_dim_v", "empty", "noncontiguous", "fp64")


class Unsupported(Exception):
    def __init__(self, features, message):
        self.features = tuple(features)
        super().__init__(message)


class ContractError(Exception):
    """The implementation broke the protocol (or crashed) on a case."""


@dataclass
class Observed:
    out: torch.Tensor
    lse: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    dsinks: torch.Tensor | None = None
    dbias: torch.Tensor | None = None

    def get(self, name):
        return getattr(self, name)


def case_features(case, *, lse=False, backward=False) -> tuple[str, ...]:
    """The protocol features a call of ``case`` exercises (what ``--require`` names)."""
    spec, kw = case.spec, case.kwargs
    found = ["lse"] if lse else []
    found += ["backward"] if backward else []
    found += ["gqa"] if spec.heads_q != spec.heads_kv else []
    found += [f"causal_{spec.causal}"] if spec.causal else []
    found += [f.name for f in REGISTERED if f.name not in _SPLIT and f.active(kw.get(f.name))]
    if spec.dropout_p > 0:
        found.append("dropout_replay" if spec.dropout_mask is not None else "dropout")
    found += ["head_dim_v"] if spec.head_dim_v != spec.head_dim else []
    found += ["empty"] if 0 in (spec.len_q, spec.len_k) else []
    found += ["noncontiguous"] if not all(t.is_contiguous() for t in (case.q, case.k, case.v)) else []
    found += ["fp64"] if case.dtype == torch.float64 else []
    return tuple(found)


def call(impl, case, *, lse=False, backward=False, watch=None) -> Observed:
    """Run ``impl`` on ``case`` and check the protocol's contract on what comes back.

    ``watch`` (optional) is told when the implementation starts and stops running
    (``watch.before(case, lse, backward)``, ``watch.after()``): an isolated run uses it to
    know which case a crash or a hang belongs to.
    """
    leaves = [t.detach().requires_grad_(backward) for t in (case.q, case.k, case.v)]  # strides kept
    before = [t.detach().clone() for t in leaves]
    kwargs = dict(case.kwargs)
    if backward:  # the differentiable keywords are leaves too: their gradients are judged
        kwargs.update({n: kwargs[n].detach().clone().requires_grad_(True) for n in DIFFERENTIABLE
                       if kwargs.get(n) is not None})
    if watch is not None:
        watch.before(case, lse, backward)
    try:
        out, out_lse, grads = guarded(_run, impl, leaves, kwargs, case.grad_out, lse=lse, backward=backward)
    except NotImplementedError as err:
        raise Unsupported(case_features(case, lse=lse, backward=backward), str(err) or "NotImplementedError") from None
    except TypeError as err:
        unknown = _unknown_feature(err, case)
        if unknown is None:
            raise ContractError(f"raised TypeError: {err}") from None
        # An implementation written before a feature existed has no keyword for it: that is a refusal.
        raise Unsupported(case_features(case, lse=lse, backward=backward),
                          f"takes no keyword {unknown!r} (raised TypeError: {err})") from None
    except ContractError:
        raise
    except Exited as err:  # the battery must outlive a kernel that exits: a broken contract, not the end
        raise ContractError(str(err)) from None
    except Exception as err:  # a crash is a failure of the case, reported with its type
        raise ContractError(f"raised {type(err).__name__}: {err}") from None
    finally:
        if watch is not None:
            watch.after()
        _restore_inputs(leaves, before)
    observed = Observed(out.detach(), None if out_lse is None else out_lse.detach(), *grads)
    _check_contract(case, observed)
    return observed


def _run(impl, leaves, kwargs, grad_out, *, lse, backward):
    """``(out, lse or None, gradients)`` of one call of ``impl`` (its backward too, when asked)."""
    out, out_lse = _unpack(impl(*leaves, return_lse=lse, **kwargs), lse)
    return out, out_lse, _backward(out, leaves, grad_out, kwargs) if backward else ()


def _unknown_feature(err: TypeError, case) -> str | None:
    """The protocol feature keyword of ``case`` that a TypeError says the implementation does not take."""
    text = str(err)
    for name in case.kwargs:
        if name in {f.name for f in REGISTERED} and f"unexpected keyword argument '{name}'" in text:
            return name
    return None


def _unpack(result, want_lse):
    if want_lse:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ContractError(f"with return_lse=True expected (out, lse), got {type(result).__name__}")
        out, lse = result
    elif isinstance(result, tuple):
        raise ContractError("with return_lse=False expected a tensor, got a tuple")
    else:
        out, lse = result, None
    if not isinstance(out, torch.Tensor):
        raise ContractError(f"returned {type(out).__name__} as the output, expected a tensor")
    if want_lse and not isinstance(lse, torch.Tensor):
        raise ContractError(f"returned {type(lse).__name__} as lse, expected a tensor")
    return out, lse


def _backward(out, leaves, grad_out, kwargs):
    """``(dq, dk, dv, dsinks, dbias)``; the last two None when the case has no sinks or bias."""
    if not out.requires_grad:
        raise ContractError("the output does not require grad: no backward through autograd")
    out.backward(grad_out.to(out.dtype))
    named = dict(zip(("dq", "dk", "dv"), leaves))
    named.update({f"d{n}": kwargs[n] for n in DIFFERENTIABLE if kwargs.get(n) is not None})
    for name, t in named.items():
        if t.grad is None:
            raise ContractError(f"{name} is None: the backward does not reach that input")
    return tuple(named[n].grad if n in named else None for n in ("dq", "dk", "dv", "dsinks", "dbias"))


def _same(a, b) -> bool:
    """Equal element by element, NaN where NaN was included (an input with NaN is not changed by reading it)."""
    return torch.equal(a, b) or bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _restore_inputs(leaves, before):
    changed = [name for name, t, b in zip("qkv", leaves, before) if not _same(t.detach(), b)]
    if changed:
        for t, b in zip(leaves, before):
            t.detach().copy_(b)
        raise ContractError(f"modified its inputs in place: {', '.join(changed)}")


def _check_contract(case, observed: Observed):
    spec = case.spec
    dtype, device = case.dtype, case.q.device
    rows = (spec.len_q, spec.heads_q) if spec.packed else (spec.batch, spec.heads_q, spec.len_q)  # packed: [Tq, Hq]
    want = {"out": (*rows, spec.head_dim_v), "lse": rows,
            "dq": tuple(case.q.shape), "dk": tuple(case.k.shape), "dv": tuple(case.v.shape)}
    dtypes = {name: dtype for name in want}
    for n in DIFFERENTIABLE:
        if case.kwargs.get(n) is not None:
            want[f"d{n}"], dtypes[f"d{n}"] = tuple(case.kwargs[n].shape), case.kwargs[n].dtype
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for name in FIELDS:
        t = observed.get(name)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ContractError(f"{name} is a {type(t).__name__}, not a tensor")
        expected_dtype = lse_dtype if name == "lse" else dtypes[name]
        if tuple(t.shape) != want[name]:
            raise ContractError(f"{name} has shape {list(t.shape)}, expected {list(want[name])}")
        if t.dtype != expected_dtype:
            raise ContractError(f"{name} has dtype {t.dtype}, expected {expected_dtype}")
        if t.device != device:
            raise ContractError(f"{name} is on {t.device}, expected {device}")
