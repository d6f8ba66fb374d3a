"""No claim checks a function against itself.

* The meaning modules (``proofs/mask_meaning.py``, ``proofs/meaning.py``) import nothing of
  attnformal: the spec's text is stated there a second time, in Z3 and SymPy alone.
* An obligation's ``STATED_WITHOUT`` names the functions under test that its claims must not be
  written with; none of them is referenced in the module's code before its negative controls
  (where broken variants may call the real one). Each name must exist, so a rename cannot make
  the rule vacuous; a planted self-reference (issue 24's ``in_sequence``) is caught.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from attnformal.proofs import OBLIGATIONS

PROOFS = Path(__file__).resolve().parents[2] / "proofs"
CONTROLS_MARKER = "# ---- negative controls"
DECLARING = [m for m in OBLIGATIONS if hasattr(m, "STATED_WITHOUT")]


def imported_modules(source: str) -> set[str]:
    tree = ast.parse(source)
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def references(source: str) -> set[str]:
    """The dotted names (``attnformal.features.varlen.sequence_start``) the code uses, imports resolved (an
    import alone is no use: a control may import what it calls)."""
    tree = ast.parse(source)
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({alias.asname or alias.name: alias.name for alias in node.names})
        elif isinstance(node, ast.ImportFrom):
            bound.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    found = set()
    for node in ast.walk(tree):
        attributes = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in bound:
            dotted = bound[node.id]
            found.add(dotted)
            for attribute in reversed(attributes):
                dotted += f".{attribute}"
                found.add(dotted)
    return found


def statements(module) -> str:
    """The module's source before its negative controls."""
    source = Path(module.__file__).read_text()
    assert CONTROLS_MARKER in source, f"{module.__name__} has no '{CONTROLS_MARKER}' section"
    return source.split(CONTROLS_MARKER)[0]


def resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(dotted)


@pytest.mark.parametrize("path", ["mask_meaning.py", "meaning.py"])
def test_the_meaning_modules_import_nothing_of_attnformal(path):
    assert imported_modules((PROOFS / path).read_text()) <= {"__future__", "z3", "sympy"}


def test_the_obligations_that_compare_kernel_code_with_a_meaning_declare_what_they_state_without():
    assert {m.__name__.rsplit(".", 1)[-1] for m in DECLARING} >= {"varlen", "sinks", "splits", "head_tensors",
                                                                  "score_bias"}


@pytest.mark.parametrize("module", DECLARING, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_claim_is_written_with_the_function_under_test(module):
    for name in module.STATED_WITHOUT:
        resolve(name)  # exists
    used = references(statements(module))
    assert not [name for name in module.STATED_WITHOUT if name in used]


def test_a_self_reference_is_found():
    # Issue 24: proofs/varlen.py stated the sequence bounds with the function under test.
    planted = ("from attnformal.features import varlen\n\n"
               "def in_sequence(cu, b, row):\n"
               "    return z3.And(varlen.sequence_start(cu, b) <= row, row < varlen.sequence_start(cu, b + 1))\n")
    assert "attnformal.features.varlen.sequence_start" in references(planted)
    assert "attnformal.merge.initial_state" in references("from attnformal import merge as spec\n"
                                                          "state = spec.initial_state(e, s)\n")
    assert "attnformal.merge.initial_state" in references("from attnformal.merge import initial_state\n"
                                                          "state = initial_state(e, s)\n")
    assert not references("from attnformal.merge import initial_state\n")
