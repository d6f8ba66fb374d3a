"""Executing the battery: tasks, and executors that run them here or in a worker process.

The unit of work is a :class:`Task` -- probe what the implementation accepts in one dtype,
run one check in one dtype, or replay one reproducer -- a small picklable value that
:func:`perform` turns into a result in whichever process runs it. An executor's ``map``
runs tasks and yields ``(task, result)`` as they complete:

* :class:`InProcess` calls :func:`perform` here: fast, but a segfault ends the whole run
  and a hung call is never interrupted;
* :class:`Isolated` runs each task in a worker process (:class:`attnformal.execution.Worker`,
  the layer every command that calls a user's kernel shares), ``--jobs`` of them at once, the
  results in task order. A worker that dies (segfault,
  abort, ``os._exit`` from C) or a call that runs past ``case_timeout`` becomes a FAIL of kind
  *crash* or *hang* for that task (:func:`lost_result`): the case that was running, its
  seed, a reproducer file and the command that replays it; a fresh worker takes the next task.

* :class:`Distributed` runs the tasks on a Dask cluster (``--workers N``: a local one of N
  worker processes; ``--cluster ADDRESS``: a running one), each worker as this process
  would (isolated in a child process of the worker when the settings say so); results come
  back in task order, so the report is the serial run's. A worker that dies fails its task
  as a *crash*.

Another executor implements the same ``map`` and ``close``; a task whose worker died must
come back as :func:`lost_result`.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import pickle
import queue
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attnformal.cli import DTYPES
from attnformal.distributed import open_executor
from attnformal.execution import Channel, Lost, Worker
from attnformal.verify.capabilities import probe
from attnformal.verify.checks import CHECKS
from attnformal.verify.diagnosis import DEFINITIVE, finding
from attnformal.verify.runner import CheckResult, Settings, replay_command, reproducer_data, \
    reproducer_path, rerun_command, run_check

CHECK_BY_NAME = {c.name: c for c in CHECKS}


@dataclass(frozen=True)
class Task:
    kind: str  # "probe" | "check" | "replay"
    name: str = ""  # the check's name, or the reproducer's path
    dtype: str = ""
    capabilities: dict | None = None  # dtype name -> Capabilities, for a check

    @property
    def label(self) -> str:
        return {"probe": f"probing {self.dtype}", "check": f"{self.name}[{self.dtype}]",
                "replay": f"replay of {self.name}"}[self.kind]


_IMPLS: dict[str, object] = {}  # in each process: implementations resolved from their targets


def implementation(settings: Settings, watch=None):
    """``settings.impl``, or the implementation its target names (imported once per process)."""
    if settings.impl is not None:
        return settings.impl
    if settings.target not in _IMPLS:
        from attnformal.adapters import resolve

        if watch is not None:
            watch.loading()
        try:
            _IMPLS[settings.target] = resolve(settings.target)
        finally:
            if watch is not None:
                watch.after()
    return _IMPLS[settings.target]


def perform(settings: Settings, task: Task, watch=None):
    """Run one task: a :class:`~.capabilities.Capabilities` for a probe, else a :class:`CheckResult`."""
    impl = implementation(settings, watch)
    if task.kind == "probe":
        return probe(impl, DTYPES[task.dtype], settings.device, watch=watch)
    if task.kind == "check":
        return run_check(settings, CHECK_BY_NAME[task.name], DTYPES[task.dtype], impl=impl,
                         capabilities=task.capabilities, watch=watch)
    from attnformal.verify.replay import replay_result

    return replay_result(settings, task.name, impl=impl, watch=watch)


def portable(settings: Settings) -> Settings:
    """``settings`` as a worker process receives them: the implementation travels as its target."""
    return replace(settings, impl=None) if settings.target else settings


def portable_blob(settings: Settings, option: str) -> bytes:
    """The pickled :func:`portable` settings, or a ``ValueError`` naming ``option`` when they cannot travel."""
    try:
        return pickle.dumps(portable(settings))
    except Exception as err:
        raise ValueError(f"argument '{option}': a worker process cannot receive this implementation "
                         f"({type(err).__name__}: {err}); pass it as MODULE:FUNC, FILE.py:FUNC or an alias") from None


class InProcess:
    """Every task in this process, in order."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def map(self, tasks):
        for task in tasks:
            yield task, perform(self.settings, task)

    def close(self):
        pass


class Isolated:
    """Each task in a worker process; ``jobs`` workers run tasks at once, and the results come in task
    order (the report is the serial run's). A crash or a hang fails that task only."""

    def __init__(self, settings: Settings, jobs: int = 1):
        self.settings = settings
        blob = portable_blob(settings, "--isolate")
        self.workers = [Worker(_perform_isolated, blob, timeout=settings.case_timeout, option="--case-timeout",
                               name="attnformal-verify-worker") for _ in range(jobs)]
        self.idle = queue.SimpleQueue()
        for worker in self.workers:
            self.idle.put(worker)
        # a thread per worker only waits on its pipe: the work is in the worker processes
        self.threads = ThreadPoolExecutor(jobs, thread_name_prefix="attnformal-verify-worker")

    def map(self, tasks):
        running = [(task, self.threads.submit(self.run, task)) for task in tasks]
        try:
            for task, future in running:
                yield task, future.result()
        finally:  # a --fail-fast stop or Ctrl-C: the tasks not started yet never start
            for _, future in running:
                future.cancel()

    def run(self, task: Task):
        worker = self.idle.get()
        try:
            return self._outcome(task, worker)
        finally:
            self.idle.put(worker)

    def _outcome(self, task: Task, worker: Worker):
        started = time.monotonic()
        outcome = worker.run(task)
        if outcome.lost is not None:
            result = lost_result(self.settings, task, outcome.lost)
            result.seconds = time.monotonic() - started
            return result
        if outcome.error is not None:  # the task itself raised in the worker
            return error_result(task, outcome.error)
        return outcome.value

    def close(self):
        """Stop every worker: a task still running (Ctrl-C) is cut short."""
        self.threads.shutdown(wait=False, cancel_futures=True)
        for worker in self.workers:
            if worker.busy:
                worker.kill()
        self.threads.shutdown(wait=True)
        for worker in self.workers:
            worker.close()


def lost_result(settings: Settings, task: Task, lost: Lost) -> CheckResult:
    """A task whose worker died or hung: a FAIL of ``lost.kind`` "crash" or "hang" that names the
    case that was running, with a reproducer of it when the worker had sent one."""
    result = CheckResult(task.name if task.kind == "check" else task.label, task.dtype or "-", "FAIL",
                         kind=lost.kind, seed=settings.seed)
    running = lost.running
    result.summary = lost.where if running is not None else f"{lost.message} while running {task.label}"
    result.command = rerun_command(settings, task.name, task.dtype) if task.kind == "check" else None
    if running is not None and running.seed is not None:
        result.details.append(f"case: {running.label} (seed {running.seed})")
        path = reproducer_path(settings, task.name, task.dtype) if task.kind == "check" else None
        if path is not None and running.payload is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(running.payload)
            result.reproducer = str(path)
            result.details.append(f"rerun the whole check: {result.command}")
            result.command = replay_command(settings, path)
    result.findings = [finding(lost.kind, DEFINITIVE, result.summary)]
    return result


def error_result(task: Task, text: str) -> CheckResult:
    lines = text.strip().splitlines()
    return CheckResult(task.name if task.kind == "check" else task.label, task.dtype or "-", "ERROR",
                       summary="the task raised in the worker process (a battery defect, or an exit while "
                               f"loading the implementation): {lines[-1] if lines else ''}", details=lines[-6:])


# ---------------------------------------------------------------- a Dask cluster

# A local cluster for the battery: a worker that dies fails the task it was running at once (Dask
# would otherwise retry it on up to 3 more workers, killing each), and only that task -- a worker
# holds one task at a time; and workers may start processes, for --isolate.
LOCAL_CLUSTER = {"distributed.scheduler.allowed-failures": 0, "distributed.scheduler.worker-saturation": 1.0,
                 "distributed.worker.daemon": False}


class Distributed:
    """Tasks on the workers of a Dask cluster: ``settings.workers`` local worker processes, or the
    scheduler at ``settings.cluster``. Each worker runs them as this process would (isolated in a
    child process when ``settings.isolate``); results come back in task order, reproducers as
    bytes that are written here. A worker that dies fails its task as a *crash*."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.blob = portable_blob(settings, "--workers" if settings.workers else "--cluster")
        self.stack = contextlib.ExitStack()
        self.cluster = self.stack.enter_context(open_executor(settings.workers, settings.cluster,
                                                              what="--workers/--cluster", config=LOCAL_CLUSTER))
        if settings.isolate and not all(self.cluster.client.run(_may_start_processes).values()):
            self.close()
            raise ValueError("argument '--cluster': its workers cannot start the processes --isolate needs (they are "
                             "daemonic): start them with DASK_DISTRIBUTED__WORKER__DAEMON=False, or use --no-isolate")

    def map(self, tasks):
        tasks = list(tasks)
        done = self.cluster.map(_perform_on_worker, self.blob, tasks, on_error=self._failed)
        for task, (result, reproducer) in zip(tasks, done):
            if reproducer is not None:
                path = reproducer_path(self.settings, task.name, task.dtype)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(reproducer)
                result.reproducer, result.command = str(path), replay_command(self.settings, path)
            yield task, result

    def _failed(self, task: Task, error: Exception):
        from distributed import KilledWorker

        if isinstance(error, KilledWorker):
            lost = Lost("crash", None, detail=f"the Dask worker {error.last_worker.address} was lost")
            return lost_result(self.settings, task, lost), None
        return error_result(task, "".join(traceback.format_exception_only(error))), None

    def close(self):
        self.stack.close()


def _may_start_processes() -> bool:
    return not multiprocessing.current_process().daemon


_ON_WORKER: dict = {}  # in a Dask worker: the settings blob of the run it serves -> (settings, executor, folder)


def _perform_on_worker(blob: bytes, task: Task):
    """``(result, reproducer bytes or None)`` of one task on a Dask worker. Reproducers are written
    in a folder of the worker's own and sent back, so none is left on a remote machine."""
    if blob not in _ON_WORKER:
        for _, old, folder in _ON_WORKER.values():  # those of an earlier run on the same cluster
            old.close()
            folder.cleanup()
        _ON_WORKER.clear()
        settings, folder = pickle.loads(blob), tempfile.TemporaryDirectory(prefix="attnformal-verify-")
        if settings.repro_dir is not None:
            settings = replace(settings, repro_dir=Path(folder.name))
        if settings.threads:
            torch.set_num_threads(settings.threads)
        _ON_WORKER[blob] = settings, (Isolated if settings.isolate else InProcess)(settings), folder
    settings, executor, _ = _ON_WORKER[blob]
    _, result = next(executor.map([task]))
    reproducer = None
    if isinstance(result, CheckResult) and result.reproducer is not None:
        path = Path(result.reproducer)
        reproducer = path.read_bytes()
        path.unlink()
    return result, reproducer


# ---------------------------------------------------------------- the worker process


class _PipeWatch:
    """Tells the parent which call is running, with the reproducer bytes of its case."""

    def __init__(self, channel: Channel, settings: Settings, task: Task):
        self.channel, self.settings, self.task = channel, settings, task

    def before(self, case, lse, backward):
        data = reproducer_data(self.settings, case, lse=lse, backward=backward, check=self.task.name or "probe",
                               dtype=self.task.dtype)
        buffer = io.BytesIO()
        torch.save(_on_cpu(data), buffer)
        self.channel.calling(case.describe(), case.seed, buffer.getvalue())

    def loading(self):
        self.channel.calling(f"loading {self.settings.target}")

    def after(self):
        self.channel.returned()


def _on_cpu(data):
    if isinstance(data, torch.Tensor):
        return data.detach().cpu()
    if isinstance(data, dict):
        return {key: _on_cpu(value) for key, value in data.items()}
    return data


def _perform_isolated(settings: Settings, task: Task, channel: Channel):
    """One task in the worker process (:class:`attnformal.execution.Worker`'s handler)."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    return perform(settings, task, watch=_PipeWatch(channel, settings, task))
