"""Where a run's files go: one folder per implementation, results written as they complete.

``verify-repro/<implementation>/`` (``--repro-dir`` chooses the parent) holds this run's
reproducers ``<check>-<dtype>.pt``, their error maps ``<check>-<dtype>.png`` and ``results.json``, rewritten after every check, so a
Ctrl-C or a kill leaves everything finished so far. When a run starts, the files of the
run before move to ``previous/`` (replacing what was there): an old reproducer is never
mistaken for a new one, and nothing is deleted that the last run wrote.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from attnformal.cli import write_atomic

RESULTS = "results.json"
PREVIOUS = "previous"


def start_folder(folder: Path) -> int:
    """Move the previous run's files of ``folder`` into ``folder/previous``; return how many moved."""
    folder.mkdir(parents=True, exist_ok=True)
    old = [p for p in folder.iterdir() if p.is_file() and (p.suffix in (".pt", ".png") or p.name == RESULTS)]
    if not old:
        return 0
    previous = folder / PREVIOUS
    if previous.exists():
        shutil.rmtree(previous)
    previous.mkdir()
    for path in old:
        path.rename(previous / path.name)
    return len(old)


class ResultsStream:
    """A run's JSON in ``paths``, rewritten after every check; each result is encoded once, so a run of n
    checks costs n small encodings, not n encodings of everything so far."""

    def __init__(self, paths, to_json):
        self.paths, self.to_json, self.encoded = list(paths), to_json, []

    def __call__(self, report):
        for result in report.results[len(self.encoded):]:
            self.encoded.append(json.dumps(result.to_json(), default=str))
        head = json.dumps(self.to_json(report, results=False), indent=1, default=str)  # ends with "\n}"
        text = head[:-2] + ',\n "results": [\n' + ",\n".join(self.encoded) + "\n]\n}\n"
        for path in self.paths:
            write_atomic(path, text)
