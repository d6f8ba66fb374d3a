"""What a sweep will cost, before its first point: memory and time per point, refused or announced first.

Two checks, in order (the swept sizes only grow, so the largest point is the costliest):

* **arithmetic**, before anything is allocated: the bytes every implementation must hold at each point
  (q, k, v, the output's gradient, the output and, with ``--backward``, dq, dk, dv) against the memory
  available (:func:`attnformal.reference.cost.available_memory`). ``--sweep N=10000000..20000000`` is
  refused here in well under a second.
* **sampled** (CPU): the implementation itself on the largest point's first query rows (every key), through
  :func:`attnformal.reference.cost.estimate` -- the estimator ``reference generate`` uses -- extended to
  all rows: time per call and peak memory. A peak above the memory available is refused; a long point
  is announced. Not for a user's file or module swept in a worker process: its calls run there alone. Rows of attention are independent, so time and memory grow linearly in them at fixed keys.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace

from attnformal.cli import human_bytes
from attnformal.execution import Exited, guarded
from attnformal.reference import cost
from attnformal.scale.sweep import timed_call

ANNOUNCED_ABOVE_S = 2.0  # a point whose calls take longer than this is announced before the sweep


class SweepRefused(ValueError):
    """A point that cannot fit; the message names it, the estimate and the memory available."""


def point_bytes(problem, itemsize: int, backward: bool) -> int:
    """Bytes any implementation holds at ``problem``: q, k, v, dO, out (and dq, dk, dv with ``backward``)."""
    q_side = problem.batch * problem.heads * problem.seq * problem.head_dim
    kv_side = problem.batch * problem.heads_kv * problem.seq * problem.head_dim
    tensors = 3 * q_side + 2 * kv_side + (q_side + 2 * kv_side if backward else 0)
    return tensors * itemsize


def check_sweep(candidates, masks, base, sweep, settings, log=None, sample: bool = True) -> None:
    """Refuse (:class:`SweepRefused`) or announce the sweep's largest point, for every mask and candidate;
    the sampled check only with ``sample`` (not for an isolated user's kernel: it runs in its worker alone)."""
    log = log or (lambda text: print(text, file=sys.stderr, flush=True))
    memory = cost.available_memory()
    for mask in masks:
        first = replace(base, mask=mask)
        for x in sweep.values:  # the first point that cannot fit is named: the sweep's top must go below it
            need = point_bytes(first.at(sweep.param, x), settings.dtype.itemsize, settings.backward)
            if memory is not None and need > memory:
                raise SweepRefused(f"argument --sweep: the point {sweep.param}={x} (mask {mask.label}) needs at "
                                   f"least {human_bytes(need)} for its inputs and outputs alone, "
                                   f"{human_bytes(memory)} are available: lower the sweep's top, --batch or --heads")
        problem = first.at(sweep.param, sweep.values[-1])
        point = f"{sweep.param}={sweep.values[-1]} (mask {mask.label})"
        if settings.device.name != "cpu" or not sample:
            continue  # the sampled peak is the process's resident memory: the host's, not a device's
        for candidate in candidates:
            estimate = sampled(candidate.fn, problem, settings, memory)
            if estimate is not None:
                judge(estimate, point, candidate.label, memory, log)


def sampled(fn, problem, settings, memory) -> cost.Estimate | None:
    """The cost of one call of ``fn`` at ``problem``, from calls on its first query rows; None when cheap,
    or when ``fn`` cannot run them (the sweep then records the point's failure itself)."""
    q, k, v, grad_out = problem.inputs("cpu", settings.dtype, settings.seed, settings.backward)
    block = settings.schedule.block_m

    def run(rows, progress):
        rows_q = q.detach()[:, :, :rows].clone().requires_grad_(settings.backward)
        guarded(timed_call(fn, problem, rows_q, k, v, grad_out[:, :, :rows], settings.backward))
        progress(-(-rows // block), -(-rows // block))  # rows come in blocks of the schedule's block_m

    # an exit (Exited) too: the sweep then meets it in its own call and names it as the run's FAIL
    with contextlib.suppress(Exception, Exited):
        return cost.estimate(run, problem.seq, memory)
    return None


def judge(estimate: cost.Estimate, point: str, label: str, memory: int | None, log) -> None:
    """Refuse a point whose sampled peak exceeds ``memory``; announce one whose calls are long."""
    peak = estimate.peak_bytes
    if peak is not None and memory is not None and peak > memory:
        raise SweepRefused(f"argument --sweep: the point {point} needs about {human_bytes(peak)} at its peak with "
                           f"{label} ({estimate.describe()}), {human_bytes(memory)} are available: lower the "
                           "sweep's top, --batch or --heads")
    if estimate.seconds > ANNOUNCED_ABOVE_S:
        peak_text = "" if peak is None else f", peak memory about {human_bytes(peak)}"
        log(f"estimated: one call of {label} at {point} takes about {estimate.seconds:.1f} s{peak_text} "
            f"({estimate.describe()}); the sweep makes at least warmup + repeats calls there (Ctrl-C cancels)")
