"""attnformal.execution: guarded calls and the worker process every command runs a user's kernel in.

The handler below stands for a command's (verify's, reference check's, scale's): it announces a call,
then makes it. Hanging calls sleep an hour and meet a timeout of TIMEOUT seconds."""

import ctypes
import os
import pickle
import sys
import time

import pytest

from attnformal.execution import Exited, Lost, Worker, guarded, isolated_by_default

TIMEOUT = 1.0


def behave(how):
    if how == "segfault":
        ctypes.string_at(0)
    if how == "sleep":
        time.sleep(3600)
    if how == "os._exit":
        os._exit(7)
    if how == "sys.exit":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("a defect")
    return f"{how} done"


def handler(prefix, how, channel):
    if how == "outside a call":  # the worker dies while no call of the implementation runs
        os._exit(5)
    channel.calling(f"{prefix} {how}")
    try:
        return behave(how)
    finally:
        channel.returned()


@pytest.fixture
def worker():
    w = Worker(handler, pickle.dumps("case"), timeout=TIMEOUT, option="--case-timeout", name="test-worker")
    yield w
    w.close()


def test_guarded_turns_a_process_exit_into_exited_and_leaves_os_exit_as_it_was():
    real = os._exit
    for how, status, text in (("sys.exit", 3, "sys.exit(3)"), ("os._exit", 7, "os._exit(7)")):
        with pytest.raises(Exited) as exited:
            guarded(behave, how)
        assert exited.value.status == status
        assert str(exited.value) == f"the implementation exited the process (status {status}: {text})"
    assert os._exit is real and guarded(behave, "nothing") == "nothing done"
    with pytest.raises(RuntimeError, match="a defect"):  # an ordinary error stays what it was
        guarded(behave, "raise")


def test_guarded_lets_a_process_the_implementation_forked_exit_for_real():
    def fork_and_exit():
        child = os.fork()
        if child == 0:
            os._exit(9)  # in the child: must end it, not raise into a copy of the parent's stack
        return os.waitpid(child, 0)[1]

    assert os.waitstatus_to_exitcode(guarded(fork_and_exit)) == 9


def test_a_worker_returns_values_and_errors_and_takes_the_next_job_after_a_crash(worker):
    assert worker.run("ok").value == "ok done"
    crashed = worker.run("segfault").lost
    assert crashed.kind == "crash"
    assert crashed.where == "the implementation crashed: signal SIGSEGV while running case segfault"
    assert worker.run("ok").value == "ok done"  # a fresh worker
    error = worker.run("raise").error
    assert "RuntimeError: a defect" in error.splitlines()[-1]


def test_a_worker_names_a_hang_an_exit_and_a_death_outside_a_call(worker):
    start = time.monotonic()
    hung = worker.run("sleep").lost
    assert hung.kind == "hang" and hung.message == f"the implementation timed out after {TIMEOUT:g} s (--case-timeout)"
    assert TIMEOUT <= time.monotonic() - start < 60  # stopped at the timeout, not after the hour
    # the commands' handlers guard their calls; this one does not: its exit is the job's error, the worker lives on
    assert "SystemExit: 3" in worker.run("sys.exit").error.splitlines()[-1]
    exited = worker.run("os._exit").lost  # an exit the layer cannot catch (from C, or unguarded): the worker ends
    assert exited.kind == "crash" and exited.where == "the implementation exited the process (status 7) while running " \
                                                      "case os._exit"
    died = worker.run("outside a call").lost
    assert died.running is None and died.message == "the worker process exited (status 5)"


def test_lost_messages():
    assert Lost("crash", None, detail="the Dask worker tcp://x was lost").message == \
        "the worker process crashed: the Dask worker tcp://x was lost"


def test_user_files_and_modules_are_isolated_by_default_and_adapters_are_not():
    assert isolated_by_default("kernel.py:attention") and isolated_by_default("package.module:attention")
    assert not isolated_by_default("torch-tiled") and not isolated_by_default(None)
