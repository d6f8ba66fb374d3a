"""The conformance battery: point it at any attention implementation, learn whether it is right.

``python -m attnformal.verify --impl MODULE:FUNC`` runs every check (:mod:`.checks`) on the
implementation protocol, for each dtype, and prints a table of pass / FAIL / unsupported,
what the cases covered, the details of each failure (worst errors, where they sit, a
reproducer), the most likely bug class, and a verdict that is never a PASS for a run that
verified nothing. The same battery runs as pytest tests (:mod:`.pytest_plugin`).

Layout:

* :mod:`.cases` -- seeded problems; :mod:`.calls` -- calling an implementation, contract checks;
* :mod:`.capabilities` -- what the implementation accepts (probed), and cases adapted to it;
* :mod:`.reference` -- expected values (certified or fp64 oracle), error magnitudes;
* :mod:`.tolerances` -- the profiles that judge a result (default, naive, ascend);
* :mod:`.checks` -- the battery; :mod:`.runner` -- running one check; :mod:`.battery` -- all, and the verdict;
* :mod:`.execute` -- tasks, run in this process or isolated in a worker (crashes and hangs become FAILs);
* :mod:`.coverage` -- what the cases exercised; :mod:`.diagnosis` -- localisation and bug classes;
* :mod:`.options`, :mod:`.outputs` -- the option vocabulary, the output folders;
* :mod:`.report`, :mod:`.baseline`, :mod:`.replay`.
"""

import importlib

__all__ = ["BatteryReport", "CheckResult", "Settings", "run_battery"]
_HOMES = {"BatteryReport": "battery", "run_battery": "battery", "CheckResult": "runner", "Settings": "runner"}

# The tolerance profiles (:mod:`.tolerances` defines what each allows): named here, where the command line
# and the pytest plugin read them to parse their options without importing torch.
PROFILES = ("default", "naive", "ascend")


def __getattr__(name):
    """The battery's API, imported on first use: parsing options (the CLI, the pytest plugin) needs no torch."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
