"""Calling a user's implementation: the one layer every command that runs one shares (``verify``,
the pytest plugin, ``reference check``, ``scale``).

* :func:`guarded` makes one call of the implementation in this process: ``sys.exit`` and
  ``os._exit`` inside it raise :class:`Exited`, so a kernel that ends the process is its FAIL,
  never the command's exit 0 (a segfault or a hang cannot be caught here: that is what a
  worker is for).
* :class:`Worker` runs jobs in a child process. A job is a picklable value that a module-level
  ``handler(state, job, channel)`` turns into a result there; the handler says when a call of
  the implementation starts and ends (:class:`Channel`). A call that runs past ``timeout`` (a
  hang), or a child that dies (a segfault, an abort, an exit from C), comes back as
  :class:`Lost`; a fresh child takes the next job.
* :func:`isolated_by_default`: ``FILE.py:FUNC`` and ``MODULE:FUNC`` targets run in a worker,
  the built-in adapters (aliases) in this process.

The words are the same everywhere (:attr:`Lost.message`, :class:`Exited`): "the implementation
crashed: signal SIGSEGV", "the implementation timed out after 2 s (--case-timeout)", "the
implementation exited the process (status 0: os._exit(0))"; the exit codes are
:data:`attnformal.cli.EXIT_CODES`'s.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait


class Exited(BaseException):
    """The implementation tried to end the process. A ``BaseException``, as ``SystemExit`` is: the
    generic ``except Exception`` of a caller must not take it for an ordinary error of one case."""

    def __init__(self, status, how: str):
        self.status = status
        super().__init__(f"the implementation exited the process (status {status}: {how})")


def _exit_status(code) -> int:
    """The status ``sys.exit(code)`` ends a process with (Python's rule: None is 0, a message is 1)."""
    return 0 if code is None else code if isinstance(code, int) else 1


def guarded(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``sys.exit`` and ``os._exit`` turned into :class:`Exited`."""
    real_exit, owner = os._exit, os.getpid()

    def exit_here(status):
        if os.getpid() != owner:  # a process the implementation forked ends for real, as it meant to
            real_exit(status)
        raise Exited(status, f"os._exit({status!r})")

    os._exit = exit_here
    try:
        return fn(*args, **kwargs)
    except SystemExit as err:
        raise Exited(_exit_status(err.code), f"sys.exit({err.code!r})") from None
    finally:
        os._exit = real_exit


def isolated_by_default(target: str | None) -> bool:
    """Whether a target runs in a worker unless told otherwise: yes for a user's file or module."""
    from attnformal.aliases import FUNCTIONS  # not the adapters: no torch while the arguments are read

    return target is not None and target not in FUNCTIONS


def start_server(handler_module: str, preload: tuple[str, ...] = ()) -> None:
    """Start the process server that :class:`Worker`'s children fork from, now: it imports the
    handler's module (and torch) while this process goes on with its own imports, on another core."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        _context(_preload(handler_module, preload))
        forkserver.ensure_running()


@dataclass
class Call:
    """The implementation call a worker is in: what it runs, and (optional) what reproduces it."""

    label: str
    seed: int | None
    payload: bytes | None
    started: float


@dataclass
class Lost:
    """A job whose worker died (``kind`` "crash") or whose call ran past the timeout ("hang")."""

    kind: str
    running: Call | None  # the call that was running; None: the worker died outside one
    code: int | None = None  # the worker's exit code: < 0 a signal
    timeout: float | None = None
    option: str = ""  # the option that sets the timeout
    detail: str = ""  # what else is known (a Dask worker that was lost)

    @property
    def message(self) -> str:
        who = "the implementation" if self.running is not None else "the worker process"
        if self.kind == "hang":
            return f"{who} timed out after {self.timeout:g} s ({self.option})"
        if self.detail:
            return f"{who} crashed: {self.detail}"
        if self.code is not None and self.code < 0:
            return f"{who} crashed: signal {_signal_name(-self.code)}"
        return f"{who} exited the process (status {self.code})" if self.running is not None else \
            f"{who} exited (status {self.code})"

    @property
    def where(self) -> str:
        """The message with the call it happened in."""
        return self.message + (f" while running {self.running.label}" if self.running is not None else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


@dataclass
class Outcome:
    """What a job came back as: its ``value``, the traceback ``error`` it raised, or ``lost``."""

    value: object = None
    error: str | None = None
    lost: Lost | None = None


class Channel:
    """In a worker: tells the parent which call of the implementation is running (it times that one)."""

    def __init__(self, conn):
        self.conn = conn

    def calling(self, label: str, seed: int | None = None, payload: bytes | None = None):
        self.conn.send(("call", label, seed, payload))

    def returned(self):
        self.conn.send(("called",))


class Worker:
    """Jobs in a child process, one at a time: ``handler(pickle.loads(state), job, channel)`` there.

    ``timeout`` bounds each call the handler announces (``None``: no bound); ``option`` names the
    option that sets it, for the message. ``preload``: modules the child's process server imports
    once (torch, the handler's), so a fresh child after a crash starts in milliseconds.
    """

    def __init__(self, handler, state: bytes, *, timeout: float | None, option: str, name: str,
                 preload: tuple[str, ...] = ()):
        self.handler, self.state, self.timeout, self.option, self.name = handler, state, timeout, option, name
        self.preload = _preload(handler.__module__, preload)
        self.process = self.conn = None
        self.busy = False

    def run(self, job) -> Outcome:
        if self.process is None:
            self._start()
        self.conn.send(job)
        self.busy = True
        running: Call | None = None
        while True:
            left = None if running is None or self.timeout is None else \
                max(running.started + self.timeout - time.monotonic(), 0.0)
            ready = wait([self.conn, self.process.sentinel], left)
            if self.conn in ready:  # messages first: a worker may have reported before it died
                try:
                    kind, *body = self.conn.recv()
                except (EOFError, OSError):
                    return self._lost("crash", running)
                if kind == "call":
                    running = Call(*body, time.monotonic())
                elif kind == "called":
                    running = None
                else:
                    self.busy = False
                    return Outcome(value=body[0]) if kind == "result" else Outcome(error=body[0])
            elif ready:
                return self._lost("crash", running)
            else:
                return self._lost("hang", running)

    def kill(self):
        """Stop the child at once; a :meth:`run` waiting on it (in another thread) returns it as lost."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()

    def _start(self):
        context = _context(self.preload)
        self.conn, child = context.Pipe()
        where = (list(sys.path), os.getcwd(), dict(os.environ))  # a forked server's may be older than ours
        self.process = context.Process(target=_serve, args=(child, where, self.handler, self.state), daemon=True,
                                       name=self.name)
        self.process.start()
        child.close()

    def _lost(self, kind: str, running: Call | None) -> Outcome:
        self._stop()
        lost = Lost(kind, running, code=self.process.exitcode, timeout=self.timeout, option=self.option)
        self.process, self.busy = None, False
        return Outcome(lost=lost)

    def _stop(self):
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.conn.close()

    def close(self):
        """Stop the child: at once when a job was cut short (Ctrl-C), else once it has finished."""
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


def _preload(handler_module: str, preload: tuple[str, ...]) -> tuple[str, ...]:
    return __name__, handler_module, *preload


def _context(preload):
    """Children forked from a server that has imported ``preload`` once; spawned where there is no
    fork. Never plain fork: torch's threads in this process would not survive it."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(dict.fromkeys(preload)))
    return context


def _serve(conn, where, handler, state):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops this child
    sys.path[:], cwd, environ = where
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    state, channel = pickle.loads(state), Channel(conn)
    while (job := conn.recv()) is not None:
        try:
            result = handler(state, job, channel)
            conn.send(("result", result))
        except BaseException:  # an exit outside a call, a failed import, a result that cannot travel
            conn.send(("error", traceback.format_exc()))
