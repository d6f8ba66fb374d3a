"""SIGINT as a terminal gives it, for the tests that send a Ctrl-C to a child process."""

import signal


def ctrl_c_reaches_python():
    """A child started from a shell's background job inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt: give the child the default disposition, as a terminal would (``preexec_fn``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
