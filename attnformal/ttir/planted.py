"""Bugs planted in a copy of a kernel's source: the TTIR theorems' negative controls.

A :class:`PlantedBug` is one textual edit of the kernel file and what must become of it: the named theorem
refuted, by a claim that names the line of the edit (a merge refutation names it where the kernel's value tree
first departs from the spec's). A refutation elsewhere, or none, fails the control.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import tempfile
from dataclasses import dataclass
from typing import Callable

from attnformal.logic import REFUTED, RLIMIT_UNIT, UNKNOWN, Proof
from attnformal.ttir import child
from attnformal.ttir.theorems import TOOL, Limits

FLASH = pathlib.Path(importlib.util.find_spec("attnformal.kernels").submodule_search_locations[0]) / "triton_flash.py"
COPY = "planted_flash.py"  # the copy's file name, which the refutation's lines name


def function_span(text: str, function: str) -> tuple[int, int]:
    """The span of a function in a kernel file (the helpers it calls come before it): to the next unindented line."""
    start = text.index(f"def {function}(")
    end = re.compile(r"\n(?=[^\s)])").search(text, start)
    return start, end.start() if end else len(text)


def plant(old: str, new, *, anywhere: bool = False, function: str = "_attn_fwd") -> Callable[[str], str]:
    """A textual edit: ``old`` (which must occur once, in ``function`` unless ``anywhere``) becomes ``new``, or
    ``new(old)``."""
    def edit(text):
        start, end = (0, len(text)) if anywhere else function_span(text, function)
        span = text[start:end]
        if span.count(old) != 1:
            raise ValueError(f"the planted edit's text occurs {span.count(old)} times, not once: {old!r}")
        return text[:start] + span.replace(old, new(old) if callable(new) else new) + text[end:]
    return edit


def line_of(text: str, marker: tuple[str, str, int]) -> int:
    """The 1-based line of a marker ``(function, text, occurrence)``: the occurrence-th line holding the text from
    the function's definition on."""
    function, needle, occurrence = marker
    first = text[:text.index(f"def {function}(")].count("\n") + 1
    lines = text.splitlines()
    return [k + 1 for k in range(first - 1, len(lines)) if needle in lines[k]][occurrence]


def statement_lines(text: str, line: int) -> range:
    """The lines of the statement that starts at ``line``: a call written over several lines is located at its
    first by Triton >= 3.3 and at its last by Triton 3.2 (triton-ascend)."""
    lines, depth = text.splitlines(), 0
    for k in range(line - 1, len(lines)):
        depth += lines[k].count("(") - lines[k].count(")")
        if depth <= 0:
            return range(line, k + 2)
    return range(line, line + 1)


@dataclass(frozen=True)
class PlantedBug:
    """``edit`` planted in a copy of ``source``; ``theorem`` must refute ``function`` there (in configuration
    ``config`` of the launch description ``launch``) by a claim starting with ``prefix`` that names the line of
    ``marker``."""

    name: str
    edit: Callable[[str], str]
    theorem: str
    prefix: str
    marker: tuple[str, str, int]
    config: int
    function: str = "_attn_fwd"
    launch: str = "FORWARD"
    source: pathlib.Path = FLASH
    expect: str = REFUTED

    @property
    def breaks(self) -> str:
        return f"{self.name}, planted in {self.function}"

    @property
    def replaces(self) -> str:
        return f"a copy of {self.source.name}"

    def run(self, settings=None, budget=None, target: str = "cuda") -> Proof:
        """The refutation that names the line, or the outcome that is not one (unknown, with what came instead)."""
        text = self.edit(self.source.read_text())
        with tempfile.TemporaryDirectory(prefix="attnformal-planted-") as folder:
            path = pathlib.Path(folder) / COPY
            path.write_text(text)
            limits = Limits() if settings is None else Limits(units=settings.budget * RLIMIT_UNIT)
            (answer,) = child.prove([child.Request(self.launch, f"{path}:{self.function}", (self.theorem,),
                                                   (self.config,), target)], limits,
                                    timeout=None if budget is None else budget.left())
        proofs = [proof for _, config_proofs in answer for proof in config_proofs]
        if budget is not None:
            budget.used += sum(proof.rlimit for proof in proofs)
        lines = statement_lines(text, line_of(text, self.marker))
        refuted = [p for p in proofs if p.status == REFUTED and p.claim.startswith(self.prefix)]
        named = next((p for p in refuted if _names_a_line(p, self.theorem, lines)), None)
        if named is not None:
            return named
        came = "; ".join(f"{p.status}: {p.claim}" for p in (refuted or proofs)) or "no claim"
        return Proof(f"{self.prefix} ... at {COPY}:{lines.start}", TOOL, UNKNOWN,
                     detail=f"not refuted at line {lines.start}: {came}")


def _names_a_line(proof: Proof, theorem: str, lines: range) -> bool:
    named = proof.claim + (proof.detail.split(": the kernel computes")[0] if theorem == "merge" else "")
    return any(re.search(rf"({re.escape(COPY)}:|line ){line}\b", named) for line in lines)
