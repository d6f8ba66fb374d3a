"""Executors: where independent tasks run -- in this process, or on a Dask cluster.

An executor has one method, ``map(fn, shared, items)``: the results of ``fn(shared, item)``
for every item, **in item order** (so a caller that reduces them in that order gets the same
result wherever they ran). ``shared`` is sent to each worker once, not once per task.

* :class:`InProcess` runs the tasks here, one after the other;
* :class:`DaskExecutor` runs them on a ``distributed`` cluster: a local one of N worker
  processes (``workers=N``), or one already running (``cluster="tcp://host:8786"``), whose
  workers must have attnformal installed.

Why Dask and not Ray: the tasks are coarse numerical functions over torch tensors; Dask's
``distributed`` is pure Python (pip-light: no compiled core, no object store, no dashboard
server to start), a ``LocalCluster`` of 2 processes starts in a few seconds (what the tests
need) and the same ``Client`` connects to a cluster of many machines. Ray brings a large
native runtime whose start-up alone exceeds a typical test. Dask is an optional extra:
``pip install 'attnformal[distributed]'``; without it :func:`open_executor` raises
:class:`EngineMissing` with that line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

INSTALL_HINT = "pip install 'attnformal[distributed]'"


class EngineMissing(RuntimeError):
    """The distributed engine (Dask's ``distributed``) is not installed."""

    def __init__(self, what: str):
        super().__init__(f"{what} needs Dask's distributed engine, which is not installed: {INSTALL_HINT}")


def require_engine(what: str = "--workers/--cluster"):
    """Dask's ``distributed`` module, or :class:`EngineMissing` naming ``what`` needs it."""
    try:
        import distributed
    except ImportError:
        raise EngineMissing(what) from None
    return distributed


class InProcess:
    """Tasks run in this process, in order."""

    workers = 1

    def map(self, fn: Callable, shared, items: Iterable) -> Iterator:
        return (fn(shared, item) for item in items)


class DaskExecutor:
    """Tasks run on the workers of a Dask ``distributed`` client; results come back in item order."""

    def __init__(self, client):
        self.client = client

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info()["workers"])

    def map(self, fn: Callable, shared, items: Iterable, *, on_error: Callable | None = None) -> Iterator:
        """``on_error(item, error)``, when given, is the result of an item whose task raised or
        whose worker died (Dask's ``KilledWorker``); otherwise that error ends the iteration."""
        items = list(items)
        [handle] = self.client.scatter([shared], broadcast=True, hash=False)  # one object, even a list
        futures = self.client.map(fn, [handle] * len(items), items, pure=False)
        return self._in_order(items, futures, handle, on_error)

    @staticmethod
    def _in_order(items, futures, handle, on_error):
        try:
            for item, future in zip(items, futures):
                try:
                    result = future.result()
                except Exception as error:
                    if on_error is None:
                        raise
                    result = on_error(item, error)
                future.release()  # the worker may drop it: only the running reduction holds results
                yield result
        finally:
            for future in futures:
                future.release()
            handle.release()


@contextmanager
def open_executor(workers: int | None = None, cluster: str | None = None, *, what: str = "--workers/--cluster",
                  config: dict | None = None):
    """An executor for the duration of a ``with`` block.

    Neither argument: :class:`InProcess`. ``workers=N``: a local Dask cluster of N worker
    processes with one thread each, started here and stopped at the end, under the Dask
    settings ``config`` as well as ours; Dask's log lines are silenced (the caller reports what
    went wrong: a lost worker, a task that raised). ``cluster=ADDRESS``: a client of the Dask
    scheduler at ADDRESS (configured by whoever started it). ``what`` names the caller's option
    in errors.
    """
    if workers is not None and cluster is not None:
        raise ValueError(f"{what}: give --workers or --cluster, not both")
    if workers is None and cluster is None:
        yield InProcess()
        return
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"argument '--workers': expected an int >= 1, got {workers!r}")
    engine = require_engine(what)
    if cluster is not None:
        try:
            client = engine.Client(cluster)
        except (OSError, ValueError) as err:  # unreachable (after Dask's connect timeout), or not an address
            raise ValueError(f"argument '--cluster': cannot connect to a Dask scheduler at {cluster!r} ({err})") \
                from None
        with client:
            yield DaskExecutor(client)
        return
    import dask

    # Dask gives its workers MALLOC_TRIM_THRESHOLD_, which turns off glibc's adaptive mmap threshold:
    # every tile-sized temporary is then a fresh mmap with page faults (measured: 3.5x the CPU of
    # the same task in this process). Local workers go without it. The scheduler's HTTP server takes
    # any free port (None would mean 8787, and a warning whenever another cluster holds it).
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None, **(config or {})}), \
            engine.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                                memory_limit=0, silence_logs=logging.CRITICAL) as local, engine.Client(local) as client:
        yield DaskExecutor(client)
