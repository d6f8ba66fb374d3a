"""Synchronised timing and isolated peak memory on CPU, CUDA and Ascend NPU.

Timing: CPU kernels return when their work is done, so a wall clock around the call is
the time. On a machine shared with other jobs the wall clock also counts the time this
process sat descheduled; ``clock="process"`` reads the process's CPU time instead (all
its threads together: with one thread, the time the kernel actually ran). CUDA and NPU
calls return at launch; there each sample is bracketed by device events recorded on the
stream and read after the end event has completed, so a sample is always completion
time, never launch-return time.

Peak memory of one call, above what was live before it:

* CUDA / NPU: ``max_memory_allocated`` (live tensors) and ``max_memory_reserved`` (the
  caching allocator's pool) after ``empty_cache`` and ``reset_peak_memory_stats``.
* CPU: torch keeps no peak counter, so the call runs under ``torch.profiler`` with
  ``profile_memory=True`` and the peak of the running sum of its allocation and free
  events is taken. This counts every tensor allocated through torch's CPU allocator
  (the analogue of ``max_memory_allocated``); it does not see the glibc heap's cached
  pages, Python objects, or scratch space a library allocates with its own malloc, and
  there is no reserved pool to report.

The same profiled call records the aten operators that ran, which is how the backend an
SDPA call picked is read (:mod:`attnformal.scale.backends`). The profiler's own
``USDT: ... profiler_start/stop`` lines are dropped from stderr; nothing else is.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

CPU_MEMORY_DEVICES = ("CPU", "MKLDNN", "IDEEP")  # the device types torch's profiler counts as host memory
CPU_CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


@dataclass(frozen=True)
class Samples:
    """Repeat timings of one call, in seconds."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def iqr(self) -> tuple[float, float]:
        """25th and 75th percentiles (inclusive method, well defined from 2 samples)."""
        if len(self.values) < 2:
            return self.values[0], self.values[0]
        q1, _, q3 = statistics.quantiles(self.values, n=4, method="inclusive")
        return q1, q3


@dataclass(frozen=True)
class MemoryPeak:
    allocated: int  # bytes above what was live before the call
    reserved: int | None  # caching-allocator pool growth (None on CPU: no pool)
    ops: tuple[str, ...]  # host-side events: aten operators (the dispatch decisions)
    kernels: tuple[str, ...]  # device kernels that ran (CUDA only; empty elsewhere)


class Device:
    """One torch device and how to time and weigh a call on it."""

    def __init__(self, name: str, clock: str = "wall"):
        if name not in ("cpu", "cuda", "npu"):
            raise ValueError(f"argument '--device': expected cpu, cuda or npu, got {name!r}")
        if clock not in CPU_CLOCKS or (clock != "wall" and name != "cpu"):
            raise ValueError(f"argument '--clock': expected wall, or process with --device cpu, got {clock!r} "
                             f"with --device {name}")
        self.name, self.clock_name = name, clock
        self.backend = None if name == "cpu" else _accelerator_module(name)
        self.clock = CPU_CLOCKS[clock]
        self.timer = {"wall": "wall clock (time.perf_counter; CPU ops are synchronous)",
                      "process": "process CPU time (time.process_time: all threads, descheduled time excluded)",
                      }[clock] if name == "cpu" else \
            f"torch.{name}.Event pairs on the current stream, read after the end event completes"
        self.memory_method = (
            "torch.profiler allocation events (profile_memory=True): peak of live tensor bytes "
            "allocated through torch's CPU allocator during the call; no reserved pool on CPU"
            if name == "cpu" else
            f"torch.{name}.max_memory_allocated / max_memory_reserved after empty_cache and "
            "reset_peak_memory_stats, minus the level before the call")

    def __reduce__(self):  # to a worker process as its arguments (the backend module cannot travel)
        return Device, (self.name, self.clock_name)

    def torch_device(self) -> torch.device:
        return torch.device(self.name)

    def synchronize(self):
        if self.backend is not None:
            self.backend.synchronize()

    def time_once(self, fn) -> float:
        """Seconds from before ``fn`` starts to after all of its device work has completed."""
        if self.backend is None:
            start = self.clock()
            fn()
            return self.clock() - start
        self.backend.synchronize()  # nothing queued earlier may land inside the bracket
        start, end = self.backend.Event(enable_timing=True), self.backend.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def peak_memory(self, fn) -> MemoryPeak:
        """Peak memory of one call of ``fn`` above the level before it, and the ops it ran."""
        activities = [ProfilerActivity.CPU]
        if self.name == "cuda":
            activities.append(ProfilerActivity.CUDA)  # device kernel names
        if self.backend is None:
            with _profiled(activities, profile_memory=True) as prof:
                fn()
            events = prof.profiler.kineto_results.events()
            return MemoryPeak(_cpu_peak(events), None, *_names(events))
        self.synchronize()
        self.backend.empty_cache()
        self.backend.reset_peak_memory_stats()
        allocated, reserved = self.backend.memory_allocated(), self.backend.memory_reserved()
        with _profiled(activities) as prof:
            fn()
            self.synchronize()
        events = prof.profiler.kineto_results.events()
        return MemoryPeak(self.backend.max_memory_allocated() - allocated,
                          self.backend.max_memory_reserved() - reserved, *_names(events))


# What torch's profiler (kineto) prints to the C-level stderr at every start and stop, e.g.
# "USDT:2026-12-01 05:31:28 12648:12648 SyncActivityProfilerHandler.cpp:52] profiler_start".
PROFILER_NOISE = re.compile(r"USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def _profiled(activities, **options):
    """``torch.profiler.profile`` whose start and stop lines on stderr are dropped.

    Only the profiler's own start and stop run with file descriptor 2 captured (the
    measured call does not), and every captured line that is not :data:`PROFILER_NOISE`
    is written back to stderr: an error the profiler reports is still seen.
    """
    prof = profile(activities=activities, **options)
    with _stderr_without(PROFILER_NOISE):
        prof.start()
    try:
        yield prof
    finally:
        with _stderr_without(PROFILER_NOISE):
            prof.stop()


@contextlib.contextmanager
def _stderr_without(noise: re.Pattern):
    """Capture file descriptor 2 (C and Python writes alike); pass on every line but ``noise``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not noise.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _accelerator_module(name: str):
    if name == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            raise ValueError("argument '--device': npu needs the torch_npu package (pip install torch-npu)") from None
    module = getattr(torch, name)
    if not module.is_available():
        raise ValueError(f"argument '--device': {name} is not available on this machine")
    return module


def _cpu_peak(events) -> int:
    """Peak of the running sum of host allocation (+) and free (-) events, in time order."""
    memory = sorted((e for e in events if e.name() == "[memory]" and e.device_type().name in CPU_MEMORY_DEVICES),
                    key=lambda e: e.start_ns())
    running = peak = 0
    for event in memory:
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def _names(events) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(host op names, device kernel names)`` among profiler events."""
    named = [e for e in events if e.name() != "[memory]"]
    on_device = {e.name() for e in named if e.device_type().name == "CUDA"}
    return tuple(sorted({e.name() for e in named} - on_device)), tuple(sorted(on_device))


def timer_floor(device: Device, repeats: int = 20) -> float:
    """Median cost of timing an empty call: the resolution every sample includes."""
    return Samples(tuple(device.time_once(lambda: None) for _ in range(repeats))).median
