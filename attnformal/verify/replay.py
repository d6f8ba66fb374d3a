"""Replaying a saved reproducer: the exact failing case, run again and explained.

A reproducer (written by the battery for every failing check, and for the case a crashed or
hung worker was running) holds the inputs bit for bit, the keyword arguments (masks
included), dO, the flags of the call and the spec as JSON. The format is a ``torch.save``
dict with the keys ``case`` (see :meth:`.cases.Case.to_payload`), ``lse``, ``backward``,
``check``, ``dtype``, ``tolerance``, ``impl``, ``run_seed``, ``spec`` and ``rerun``.

Reproducers are shared between teams, so loading one must never run code: it is read with
``torch.load(weights_only=True)``, whose unpickler admits only tensors and plain containers,
numbers and strings; a file that names anything else (``os.system``, a class) is refused.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import torch

from attnformal.cli import DTYPES
from attnformal.verify.cases import Case, non_contiguous
from attnformal.verify.checks import Check
from attnformal.verify.runner import CheckResult, Settings, run_check


def load_reproducer(path) -> tuple[Case, dict]:
    try:
        data = torch.load(Path(path), weights_only=True, map_location="cpu")
        case = Case.from_payload(data["case"])
        missing = [key for key in ("check", "lse", "backward", "impl", "run_seed", "rerun") if key not in data]
        if missing or data.get("dtype") not in DTYPES:
            raise KeyError(", ".join(missing) or "dtype")
    except pickle.UnpicklingError as err:  # weights_only refused a global: the file would have run code
        first = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(f"argument '--replay': {path} is refused: it holds more than tensors and plain values "
                         f"(loading it could run code; {first})") from None
    except (OSError, KeyError, RuntimeError, TypeError, EOFError, AttributeError) as err:
        raise ValueError(f"argument '--replay': {path} is not a reproducer written by the battery: {err}") from None
    if any(stride != list(getattr(case, n).stride()) for n, stride in data["case"]["strides"].items()):
        case = case.with_(q=non_contiguous(case.q), k=non_contiguous(case.k), v=non_contiguous(case.v))
    return case, data


def replay_result(settings: Settings, path, *, impl=None, watch=None) -> CheckResult:
    """Run the reproducer's case again with ``settings``' implementation and device."""
    case, data = load_reproducer(path)
    to = settings.device
    case = case.with_(q=case.q.to(to), k=case.k.to(to), v=case.v.to(to),
                      grad_out=None if case.grad_out is None else case.grad_out.to(to),
                      kwargs={key: (val.to(to) if isinstance(val, torch.Tensor) else val)
                              for key, val in case.kwargs.items()})

    def rerun(run):
        run.against_reference(case, lse=data["lse"], backward=data["backward"])

    settings = replace(settings, tolerance=data.get("tolerance", settings.tolerance), repro_dir=None)
    return run_check(settings, Check(f"replay:{data['check']}", rerun, "replay"), DTYPES[data["dtype"]],
                     impl=impl, watch=watch)


def describe_replay(path, result: CheckResult) -> str:
    case, data = load_reproducer(path)
    lines = [f"replaying {path}: check {data['check']} [{data['dtype']}] of impl {data['impl']} "
             f"(run seed {data['run_seed']})", f"case: {case.describe()} (seed {case.seed})",
             f"result: {result.status}{' (' + result.kind + ')' if result.kind else ''} -- {result.summary}"]
    lines += [f"    {line}" for d in result.details for line in d.splitlines()]
    lines += [f"    -> {'[' + f.bug + '] ' if f.bug else ''}{f.evidence}" for f in result.findings]
    lines.append(f"rerun the whole check: {data['rerun']}")
    return "\n".join(lines)


def write_reproducer(path, case: Case, *, impl: str, check: str, dtype: str = "float32", tolerance: str = "default",
                     lse: bool = False, backward: bool = False, run_seed: int = 0, env: str = "") -> Path:
    """Save ``case`` in the format :func:`load_reproducer` reads, for ``--impl IMPL --replay PATH``.

    For cases built outside the battery (e.g. a kernel tiling's counterexample shape); ``env``: the shell
    assignments the implementation needs (``NAME=value ``), put before the rerun command.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rerun = f"{env}python -m attnformal.verify --impl {impl} --replay {path}"
    torch.save({"case": case.to_payload(), "lse": lse, "backward": backward, "check": check, "dtype": dtype,
                "tolerance": tolerance, "impl": impl, "run_seed": run_seed, "spec": case.spec.to_json(),
                "rerun": rerun}, path)
    return path
