"""What a golden file will cost before it is computed: time and peak memory, from sampled runs.

The reference works through query rows in blocks whose size does not depend on the number
of rows ``Sq``, so past one block its time and memory grow linearly in ``Sq`` with every
other size held. :func:`estimate` runs the case itself with fewer rows (every batch, head
and key): a cold call of one row, then 1, 2, 4, ... rows until the smaller of the last two
samples spans at least two blocks (as the reference's ``progress`` counts them) and doubling
the rows has nearly doubled the time twice in a row -- the linear regime -- and extends the
line through those two samples to ``Sq``. One cold call would count one-time costs (first
use of a code path, fresh pages) and a whole block's cost as work per row; samples within
one block see its scratch memory grow with the rows, which the whole case does not.
Until one doubling has shown that growth, fixed costs still hide the cost per row (a
sample of 2 rows can cost what 1 row costs), so the line would extend almost nothing: the
time is then extended in proportion to the larger sample's rows instead, an upper bound for
fixed-plus-linear cost. Sampling stops earlier when it has cost a tenth of the estimated
total (unless the memory estimate, leaning high within one block, exceeds what is available),
or at samples of ``Sq / 8`` rows.

Peak memory is the process's resident-set high-water mark above its level before the call
(Linux: ``VmHWM`` in ``/proc/self/status``, reset through ``/proc/self/clear_refs``), so it
counts torch, NumPy and Arb allocations alike; elsewhere it is not measured (None).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

QUICK_S = 2.0  # a case whose one-row cold call, times Sq, is under this is just run
MIN_ROWS = 16  # below this many query rows, sampling would cost as much as the case
MAX_SHARE = 8  # a sample has at most Sq / MAX_SHARE rows
LINEAR = 1.6  # doubling the rows multiplies the time by at least this: past the fixed costs
SAMPLED_SHARE = 0.1  # stop sampling once it has cost this share of the estimated total


@dataclass(frozen=True)
class Estimate:
    """Extrapolated seconds and peak bytes (None: not measurable here) of the whole case."""

    seconds: float
    peak_bytes: int | None
    rows: tuple[int, int]  # the two sampled row counts the line goes through
    sample: object  # what the larger of them returned (its reference, for early checks)
    growing: bool = True  # False: the time is the larger run's, in proportion to the rows

    def describe(self) -> str:
        """How the numbers were obtained."""
        if not self.growing:
            return f"time in proportion to a run of {self.rows[1]} query rows, memory extended from it " \
                   f"and a run of {self.rows[0]}"
        return f"extended from runs of {self.rows[0]} and {self.rows[1]} query rows"


class Sample(NamedTuple):
    rows: int
    seconds: float
    peak: int | None  # bytes above the level before the run; None where not measurable
    blocks: int  # units of work the run reported through progress(done, total)
    result: object


def estimate(run: Callable[[int, Callable], object], len_q: int, memory: int | None = None) -> Estimate | None:
    """Time and peak memory of the whole case, from runs of ``run`` on fewer rows.

    ``run(rows, progress)`` must compute the case with ``rows`` query rows, calling
    ``progress(done, total)`` after each block of work. ``memory``: the bytes available; while
    the estimate exceeds it on samples within one block (where it leans high), sampling goes
    on past its time budget, so that a refusal rests on samples spanning two blocks where
    they fit in ``Sq / 8`` rows. None when the case is cheap (under :data:`QUICK_S` by its cold
    one-row call) or has fewer than :data:`MIN_ROWS` rows.
    """
    if len_q < MIN_ROWS:
        return None
    cold = measure(run, 1)  # one-time costs included: not part of the line
    if cold.seconds * len_q < QUICK_S:
        return None
    high, linear = measure(run, 1), 0
    spent = high.seconds  # beyond the one-time costs, which the whole run pays anyway
    while True:
        low, high = high, measure(run, 2 * high.rows)
        spent += high.seconds
        linear = linear + 1 if high.seconds >= LINEAR * low.seconds else 0
        result = _estimate(low, high, len_q, growing=linear >= 1)
        settled = linear >= 2 and low.blocks >= 2
        in_doubt = memory is not None and result.peak_bytes is not None and result.peak_bytes > memory \
            and low.blocks < 2
        over_budget = spent > SAMPLED_SHARE * result.seconds and not in_doubt
        if settled or over_budget or 2 * high.rows > len_q // MAX_SHARE:
            return result


def _estimate(low: Sample, high: Sample, len_q: int, *, growing: bool) -> Estimate:
    """The case's cost from two samples; ``growing``: the time has been seen to grow with the rows."""
    peak = None if low.peak is None or high.peak is None else \
        round(_extend(low.peak, high.peak, low.rows, len_q, when_falling="flat"))
    seconds = _extend(low.seconds, high.seconds, low.rows, len_q, when_falling="proportional") if growing \
        else high.seconds * len_q / high.rows
    return Estimate(seconds, peak, (low.rows, high.rows), high.result, growing)


def _extend(at_rows: float, at_twice: float, rows: int, len_q: int, *, when_falling: str) -> float:
    """The line through ``(rows, at_rows)`` and ``(2 rows, at_twice)`` at ``len_q``. Where the
    samples show no growth, ``"proportional"`` extends the larger one in proportion to the rows
    (for time: an upper bound, so that noise on tiny samples does not end sampling early) and
    ``"flat"`` keeps it (for memory: nothing was seen to grow)."""
    per_row = (at_twice - at_rows) / rows
    if per_row > 0:
        return max(at_rows - per_row * rows, 0.0) + per_row * len_q
    return at_twice * len_q / (2 * rows) if when_falling == "proportional" else at_twice


clock = time.perf_counter  # what a sample's seconds are read from (tests give a synthetic run its own)


def measure(run: Callable[[int, Callable], object], rows: int) -> Sample:
    """Time, peak memory, blocks and result of ``run(rows, progress)``."""
    totals = [1]
    gc.collect()
    _release_free_heap()
    with peak_memory() as peak:
        start = clock()
        result = run(rows, lambda done, total: totals.append(total))
        seconds = clock() - start
    return Sample(rows, seconds, peak.bytes, max(totals), result)


class _Peak:
    bytes: int | None = None


@contextlib.contextmanager
def peak_memory():
    """``with peak_memory() as p:`` -- afterwards ``p.bytes`` is the resident-set peak above the
    level at entry (None where the high-water mark cannot be reset)."""
    peak = _Peak()
    status, clear = Path("/proc/self/status"), Path("/proc/self/clear_refs")
    try:
        clear.write_text("5")  # resets VmHWM to the current resident set
        before = _status_kib(status, "VmRSS")
    except OSError:
        before = None
    yield peak
    if before is not None:
        peak.bytes = max(0, _status_kib(status, "VmHWM") - before) * 1024


def _status_kib(status: Path, key: str) -> int:
    for line in status.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"{key} missing from {status}")


def _release_free_heap():
    """Give freed heap pages back to the system (glibc), so an earlier run's leftovers do not
    hide this run's growth."""
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(name).malloc_trim(0)


def available_memory() -> int | None:
    """Bytes this process can still use: ``MemAvailable``, capped by a cgroup (v2) limit; None
    where neither is readable."""
    limits = []
    with contextlib.suppress(OSError, ValueError, StopIteration):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        limits.append(int(next(line for line in meminfo if line.startswith("MemAvailable:")).split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            limits.append(int(limit) - int((cgroup / "memory.current").read_text()))
    return min(limits) if limits else None
