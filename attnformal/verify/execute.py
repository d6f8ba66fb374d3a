"""Executing the battery: tasks, and executors that run them here or in a worker process.

The unit of work is a :class:`Task` -- probe what the implementation accepts in one dtype,
run one check in one dtype, or replay one reproducer -- a small picklable value that
:func:`perform` turns into a result in whichever process runs it. An executor's ``map``
runs tasks and yields ``(task, result)`` as they complete:

* :class:`InProcess` calls :func:`perform` here: fast, but a segfault ends the whole run
  and a hung call is never interrupted;
* :class:`Isolated` runs each task in a worker process. A worker that dies (segfault,
  abort, ``os._exit``) or a call that runs past ``case_timeout`` becomes a FAIL of kind
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
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path

import torch

from attnformal.cli import DTYPES
from attnformal.distributed import open_executor
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


@dataclass
class Call:
    """The implementation call a worker is in: what it runs, and the reproducer bytes of that case."""

    label: str
    seed: int | None
    payload: bytes | None
    started: float


class Isolated:
    """Each task in a worker process (one at a time); a crash or a hang fails that task only."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.blob = portable_blob(settings, "--isolate")
        self.process = self.conn = None
        self.busy = False

    def map(self, tasks):
        for task in tasks:
            yield task, self.run(task)

    def run(self, task: Task):
        if self.process is None:
            self._start()
        self.conn.send(task)
        self.busy, self.task_started = True, time.monotonic()
        running: Call | None = None
        while True:
            timeout = None if running is None else running.started + self.settings.case_timeout - time.monotonic()
            ready = wait([self.conn, self.process.sentinel], None if timeout is None else max(timeout, 0.0))
            if self.conn in ready:  # messages first: a worker may have reported before it died
                try:
                    kind, *body = self.conn.recv()
                except (EOFError, OSError):
                    return self._lost(task, running, "crash")
                if kind == "call":
                    running = Call(*body, time.monotonic())
                elif kind == "called":
                    running = None
                elif kind == "result":
                    self.busy = False
                    return body[0]
                else:  # "error": the task itself raised in the worker
                    self.busy = False
                    return error_result(task, body[0])
            elif ready:
                return self._lost(task, running, "crash")
            else:
                return self._lost(task, running, "hang")

    def _start(self):
        context = _context()
        self.conn, child = context.Pipe()
        where = (list(sys.path), os.getcwd(), dict(os.environ))  # a forked server's may be older than ours
        self.process = context.Process(target=_worker, args=(child, where, self.blob), daemon=True,
                                       name="attnformal-verify-worker")
        self.process.start()
        child.close()

    def _lost(self, task: Task, running: Call | None, kind: str) -> CheckResult:
        self._stop()
        code = self.process.exitcode
        self.process = None
        if kind == "hang":
            detail = f"over --case-timeout {self.settings.case_timeout:g} s"
        elif code is not None and code < 0:
            detail = f"signal {signal.Signals(-code).name}"
        else:
            detail = f"exit status {code}"
        result = lost_result(self.settings, task, kind, detail, running)
        result.seconds = time.monotonic() - self.task_started
        return result

    def _stop(self):
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.conn.close()

    def close(self):
        """Stop the worker: at once when a task was cut short (Ctrl-C), else once it has finished."""
        if self.process is None:
            return
        if not self.busy:
            try:
                self.conn.send(None)
                self.process.join(5)
            except OSError:
                pass
        self._stop()
        self.process = None


def _context():
    """Worker processes forked from a server that has imported the battery once (a fresh worker after a
    crash then starts in milliseconds); spawned where there is no fork. Never plain fork: torch's
    threads in this process would not survive it."""
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def lost_result(settings: Settings, task: Task, kind: str, detail: str, running: Call | None) -> CheckResult:
    """A task whose worker died or hung: a FAIL of ``kind`` "crash" or "hang" that names the case
    that was running, with a reproducer of it when the worker had sent one."""
    check = task.name if task.kind == "check" else task.label
    result = CheckResult(check, task.dtype or "-", "FAIL", kind=kind, seed=settings.seed)
    what = running.label if running is not None else "the task"
    verb = "the process died" if kind == "crash" else "the call did not return"
    result.summary = f"{kind}: {verb} ({detail}) while running {what}"
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
    result.findings = [finding(kind, DEFINITIVE, result.summary)]
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
            lost = f"the Dask worker {error.last_worker.address} was lost"
            return lost_result(self.settings, task, "crash", lost, None), None
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

    def __init__(self, conn, settings: Settings, task: Task):
        self.conn, self.settings, self.task = conn, settings, task

    def before(self, case, lse, backward):
        data = reproducer_data(self.settings, case, lse=lse, backward=backward, check=self.task.name or "probe",
                               dtype=self.task.dtype)
        buffer = io.BytesIO()
        torch.save(_on_cpu(data), buffer)
        self.conn.send(("call", case.describe(), case.seed, buffer.getvalue()))

    def loading(self):
        self.conn.send(("call", f"loading {self.settings.target}", None, None))

    def after(self):
        self.conn.send(("called",))


def _on_cpu(data):
    if isinstance(data, torch.Tensor):
        return data.detach().cpu()
    if isinstance(data, dict):
        return {key: _on_cpu(value) for key, value in data.items()}
    return data


def _worker(conn, where, blob):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops this worker
    sys.path[:], cwd, environ = where
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    settings = pickle.loads(blob)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    while (task := conn.recv()) is not None:
        try:
            result = perform(settings, task, watch=_PipeWatch(conn, settings, task))
        except BaseException:  # SystemExit outside a call, a failed import: this task's error, not the worker's end
            conn.send(("error", traceback.format_exc()))
        else:
            conn.send(("result", result))

