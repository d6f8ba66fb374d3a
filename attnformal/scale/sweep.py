"""Running a sweep: each implementation on each point, interleaved, timed and weighed.

With two implementations (``--vs``) every point runs both on the same inputs, alternating
their order from one repeat to the next (A B, B A, ...), so a slow spell of a shared
machine lands on both; the per-repeat ratio A/B is kept as well as each time.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from attnformal.adapters import resolve
from attnformal.execution import Exited, guarded
from attnformal.schedule import TileSchedule
from attnformal.scale.backends import backend_from_ops
from attnformal.scale.measure import Device, MemoryPeak, Samples, timer_floor
from attnformal.scale.problem import MaskFamily, Problem, Sweep
from attnformal.scale.work import Work, predict_work

FLOOR_REPEATS = 20  # the trivial call is cheap: many samples make its median solid
UNSUPPORTED = "unsupported: "  # how a point the implementation refused (NotImplementedError) says so


@dataclass(frozen=True)
class Candidate:
    """An implementation under test, and the schedule it is launched with if it takes one."""

    label: str
    fn: Callable
    schedule: TileSchedule | None  # passed as ``schedule=``; None: the impl picks its own tiling

    def describe_schedule(self) -> str:
        if self.schedule is None:
            return "own tiling (prediction uses the reference schedule)"
        return f"schedule {self.schedule.block_m}x{self.schedule.block_n} (passed as schedule=)"


def load_candidate(target: str, schedule: TileSchedule) -> Candidate:
    """``target`` as every command line reads ``--impl`` (:func:`attnformal.adapters.resolve`): an alias
    (``torch-tiled``, ``sdpa``, ...), ``MODULE:FUNC`` or ``FILE.py:FUNC``. One that takes ``schedule=``
    (``torch-tiled``) is launched with the schedule the work is predicted from."""
    fn = resolve(target)
    try:
        takes_schedule = "schedule" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins may have no signature
        takes_schedule = False
    if takes_schedule:
        return Candidate(target, functools.partial(fn, schedule=schedule), schedule)
    return Candidate(target, fn, None)


@dataclass(frozen=True)
class Settings:
    """How every point is measured (the fixed part of the command line)."""

    device: Device
    dtype: torch.dtype
    backward: bool
    schedule: TileSchedule  # the reference schedule the work is predicted from
    repeats: int = 5
    warmup: int = 1
    min_time: float = 0.2  # seconds of samples per point: fast points get more repeats
    seed: int = 0

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        mode = "forward+backward" if self.backward else "forward"
        return f"{dtype} {self.device.name} {mode}"


@dataclass
class PointResult:
    x: int
    problem: Problem
    work: Work
    samples: Samples | None = None
    memory: MemoryPeak | None = None
    failure: str | None = None  # unsupported feature, out of memory

    @property
    def backend(self) -> str:
        return backend_from_ops(self.memory.ops, self.memory.kernels) if self.memory else ""


@dataclass
class Series:
    """One implementation under one mask family, over the sweep."""

    candidate: Candidate
    mask: MaskFamily
    floor: float = math.nan  # fixed per-call cost, seconds
    floor_memory: int = 0  # peak bytes of that trivial call
    points: list[PointResult] = field(default_factory=list)
    analysis: Any = None  # its fits, set by attnformal.scale.analysis.analyse

    def measured(self) -> list[PointResult]:
        return [p for p in self.points if p.samples is not None]


@dataclass
class MaskRun:
    """All series of one mask family; ``ratios[i]`` are the per-repeat A/B time ratios at point i."""

    mask: MaskFamily
    series: list[Series]
    ratios: list[Samples | None] = field(default_factory=list)
    ratio_analysis: Any = None  # the ratio's exponent, set by attnformal.scale.analysis.analyse_ratio


class Watch:
    """How the sweep calls an implementation: :func:`~attnformal.execution.guarded` (a process exit
    raises :class:`~attnformal.execution.Exited`, the run's FAIL), and announced on a worker's
    ``channel`` so a call that hangs or crashes is named. Both happen outside the timed region."""

    def __init__(self, channel=None):
        self.channel = channel
        self.label = ""  # the call running, or the last one

    def __call__(self, label: str, fn, *args):
        self.label = label
        if self.channel is not None:
            self.channel.calling(label)
        try:
            return guarded(fn, *args)
        finally:
            if self.channel is not None:
                self.channel.returned()


def run_sweep(candidates: list[Candidate], masks: list[MaskFamily], base: Problem, sweep: Sweep,
              settings: Settings, log=None, watch: Watch | None = None) -> list[MaskRun]:
    """Measure every candidate at every point of ``sweep`` for every mask family."""
    log = log or functools.partial(print, file=sys.stderr, flush=True)
    watch = watch or Watch()
    timing_floor = timer_floor(settings.device)
    runs = []
    for mask in masks:
        first = replace(base, mask=mask).at(sweep.param, sweep.values[0])
        series = [_floor_series(c, first.trivial(), settings, timing_floor, watch) for c in candidates]
        run = MaskRun(mask, series)
        for x in sweep.values:
            problem = first.at(sweep.param, x)
            labels = [f"{c.label} at {sweep.param}={x} (mask {mask.label})" for c in candidates]
            results, ratio = measure_point([c.fn for c in candidates], problem, x, settings, labels=labels,
                                           watch=watch)
            for s, result in zip(series, results):
                s.points.append(result)
            run.ratios.append(ratio)
            log(_progress_line(mask, sweep.param, x, series))
        runs.append(run)
    return runs


def measure_point(fns: list[Callable], problem: Problem, x: int, settings: Settings, *, labels=None,
                  watch: Watch | None = None):
    """``([PointResult per fn], ratio samples or None)`` for one problem, the fns interleaved;
    ``labels`` name the fns' calls for ``watch``."""
    device, watch = settings.device, watch or Watch()
    labels = labels or [getattr(fn, "__name__", "the implementation") for fn in fns]
    work = predict_work(problem.spec(), settings.schedule, backward=settings.backward)
    q, k, v, grad_out = problem.inputs(device.torch_device(), settings.dtype, settings.seed, settings.backward)
    calls = [timed_call(fn, problem, q, k, v, grad_out, settings.backward) for fn in fns]
    results = [PointResult(x, problem, work) for _ in fns]
    estimates = {}
    for i, call in enumerate(calls):
        estimates[i], results[i].failure = _warm_up(call, settings.warmup, device, labels[i], watch)
    live = [i for i in estimates if results[i].failure is None]
    if live:
        estimate = max(estimates[i] for i in live)
        repeats = min(10 * settings.repeats, max(settings.repeats, math.ceil(settings.min_time / estimate)))
        times = {i: [] for i in live}
        for r in range(repeats):
            for i in live if r % 2 == 0 else reversed(live):  # A B, B A, ...: drift hits both
                times[i].append(watch(labels[i], device.time_once, calls[i]))
        for i in live:
            results[i].samples = Samples(tuple(times[i]))
            results[i].memory = watch(labels[i], device.peak_memory, calls[i])
    ratio = None
    if len(fns) == 2 and live == [0, 1]:
        ratio = Samples(tuple(a / b for a, b in zip(times[0], times[1])))
    del q, k, v, grad_out, calls
    if device.backend is not None:
        device.backend.empty_cache()
    return results, ratio


def _floor_series(candidate: Candidate, trivial: Problem, settings: Settings, timing_floor: float,
                  watch: Watch) -> Series:
    """A series whose floor is the candidate's cost on a 1-token problem of the same family."""
    device = settings.device
    q, k, v, grad_out = trivial.inputs(device.torch_device(), settings.dtype, settings.seed, settings.backward)
    call = timed_call(candidate.fn, trivial, q, k, v, grad_out, settings.backward)
    label = f"{candidate.label} on a 1-token problem (mask {trivial.mask.label})"
    series = Series(candidate, trivial.mask)
    if _warm_up(call, 3, device, label, watch)[1] is not None:
        return series  # unsupported family: every point will say so
    samples = Samples(tuple(watch(label, device.time_once, call) for _ in range(FLOOR_REPEATS)))
    series.floor = max(samples.median, timing_floor)
    series.floor_memory = watch(label, device.peak_memory, call).allocated
    return series


def timed_call(fn, problem: Problem, q, k, v, grad_out, backward: bool):
    """The call of ``fn`` on these inputs that a point times: forward, or forward and backward."""
    kwargs = problem.kwargs()
    if not backward:
        return lambda: fn(q, k, v, **kwargs)

    def forward_backward():
        out = fn(q, k, v, **kwargs)
        torch.autograd.grad(out, (q, k, v), grad_out)
    return forward_backward


def _warm_up(call, times: int, device: Device, label: str, watch: Watch) -> tuple[float, str | None]:
    """Run ``call`` ``times`` (>= 1) times: ``(last time, None)``, or ``(nan, why it cannot run)``.

    The implementation's own exceptions become the point's failure (one line in the table),
    so one bad point -- out of memory, or a bug at one size -- does not end the sweep.
    """
    try:
        for _ in range(times):
            last = watch(label, device.time_once, call)
    except NotImplementedError as err:
        return math.nan, f"{UNSUPPORTED}{err}"
    except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError on every device since torch 2.5
        return math.nan, "out of memory"
    except Exception as err:  # e.g. the CPU allocator's "can't allocate memory", or a bug at this size
        first = (str(err).strip().splitlines() or [""])[0]
        return math.nan, f"failed: {type(err).__name__}: {first}"
    return last, None


def _progress_line(mask: MaskFamily, param: str, x: int, series: list[Series]) -> str:
    parts = [f"{s.candidate.label} " + (f"{s.points[-1].samples.median * 1e3:.3g} ms"
                                        if s.points[-1].samples else s.points[-1].failure) for s in series]
    return f"[{mask.label}] {param}={x}: " + ", ".join(parts)


def sweep_in_worker(threads: int, job: tuple, channel) -> list[MaskRun] | str:
    """:func:`run_sweep` in a worker process (:class:`attnformal.execution.Worker`'s handler):
    ``job`` is ``(targets, masks, base, sweep, settings)``. The runs come back without the
    implementations (a function from a user's file cannot travel), or the FAIL message of one that exited."""
    targets, masks, base, sweep, settings = job
    torch.set_num_threads(threads)
    watch = Watch(channel)
    try:
        candidates = [watch(f"loading {target}", load_candidate, target, settings.schedule) for target in targets]
        runs = run_sweep(candidates, masks, base, sweep, settings, watch=watch)
    except Exited as err:
        return f"{err} while running {watch.label}"
    for run in runs:
        for series in run.series:
            series.candidate = replace(series.candidate, fn=None)
    return runs

