"""docs/proofs.md names only code that exists: every code name it puts in backquotes (``masks.may_attend``,
``_schedule_tables``, ``TileSchedule.split_ranges``) is defined in the package, every file path exists."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "proofs.md"
CODE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\(\))?")
PATH = re.compile(r"[\w./-]+/[\w.-]+(\.py|\.md|/)")


def defined_names() -> set[str]:
    """Every module, class, function, argument and assigned name in attnformal/, proofs/, kernels/."""
    names = set(dir(builtins)) | {"attnformal", "proofs", "kernels", "torch", "triton", "z3", "sympy", "numpy"}
    for path in (p for part in ("attnformal", "proofs", "kernels") for p in (ROOT / part).rglob("*.py")):
        names.update(path.parent.relative_to(ROOT).parts)
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return names


def code_names(text: str) -> set[str]:
    """Backquoted spans that look like code names: dotted, snake_case or CamelCase identifiers."""
    spans = set(re.findall(r"`([^`\n]+)`", text))
    return {s for s in spans if CODE_NAME.fullmatch(s) and ("." in s or "_" in s or s[1:] != s[1:].lower())}


def missing(text: str, names: set[str]) -> list[str]:
    files = {p.name for part in ("attnformal", "proofs", "kernels") for p in (ROOT / part).rglob("*.py")}
    absent = [s for s in sorted(code_names(text)) if not (s in files if s.endswith(".py") else
                                                         all(p in names for p in s.removesuffix("()").split(".")))]
    spans = sorted(set(re.findall(r"`([^`\n]+)`", text)))
    return absent + [s for s in spans if PATH.fullmatch(s) and not (ROOT / s).exists()]


def test_every_code_name_docs_proofs_mentions_exists():
    assert not missing(DOC.read_text(), defined_names())


def test_a_stale_name_is_found():
    # Issue 24: docs/proofs.md named helpers that had been removed.
    assert missing("`_window_args` clamps; `masks.may_attend`; see `proofs/no_such.py`", defined_names()) == [
        "_window_args", "proofs/no_such.py"]
