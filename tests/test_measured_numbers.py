"""Numbers that cannot go stale: what README.md states comes from docs/measured.json, whose counts are the code's.

The Measured table's key numbers are the JSON's (and each appears in the page its row links, where it was
measured); a count in the prose ("53 checks", "17 obligations", "37 buggy implementations") is the JSON's; and
the JSON's counts are the lengths of the code's own lists.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = json.loads((ROOT / "docs" / "measured.json").read_text())
COUNTED = {"checks": "checks per dtype", "obligations": "obligations", "controls": "controls",
           "buggy implementations": "zoo specimens"}
TIMING = re.compile(r"\d[\d.,–-]* ?(?:s|min|ms)\b")


def readme_table(text: str) -> dict[str, str]:
    table = text.split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    return dict(tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows)


def stale(text: str, measured: dict) -> list[str]:
    """What ``text`` (a README) states that ``measured`` does not: table cells, counts, free-floating timings."""
    problems = []
    table = readme_table(text)
    if table != measured["readme table"]:
        problems.append(f"the Measured table differs from docs/measured.json: {table}")
    prose = re.sub(r"(```[^\n]*\n).*?```", r"\1", text.split("\n## Measured\n", 1)[0], flags=re.S)  # info strings stay
    for number, word in re.findall(rf"(\d+) ({'|'.join(COUNTED)})\b", text):
        if int(number) != measured["counts"][COUNTED[word]]:
            problems.append(f"README says {number} {word}; docs/measured.json: {measured['counts'][COUNTED[word]]}")
    problems += [f"a timing outside the Measured table: {t!r}" for t in TIMING.findall(prose)]
    return problems


def code_counts() -> dict[str, int]:
    from attnformal.proofs import OBLIGATIONS
    from attnformal.verify.checks import CHECKS

    sys.path.insert(0, str(ROOT / "tests" / "verify"))
    import zoo

    return {"checks per dtype": sum(not c.full_only and c.fixed_dtype is None for c in CHECKS),  # the quick run's
            "obligations": len(OBLIGATIONS), "controls": sum(len(m.CONTROLS) for m in OBLIGATIONS),
            "zoo specimens": len(zoo.ZOO)}


def test_the_measured_counts_are_the_codes_own():
    assert MEASURED["counts"] == code_counts()


def test_the_readme_states_only_the_measured_numbers():
    assert stale((ROOT / "README.md").read_text(), MEASURED) == []


def test_each_table_number_is_in_the_page_where_it_was_measured():
    for row, cell in MEASURED["readme table"].items():
        pages = re.findall(r"\]\((docs/[^)#]+)", row) or ["docs/measured.md"]
        text = "".join((ROOT / page).read_text() for page in pages)
        for number in re.findall(r"\d+(?:\.\d+)?", cell):  # a rounded number keeps its leading digits
            assert number in text, f"{row}: {number!r} is not in {pages}"


def test_a_stale_number_is_caught():
    text = (ROOT / "README.md").read_text()
    checks = MEASURED["counts"]["checks per dtype"]
    assert any("README says 45 checks" in p for p in stale(text.replace(f"{checks} checks", "45 checks"), MEASURED))
    assert stale(text.replace("## The two commands", "The proofs take about 10 s.\n\n## The two commands"), MEASURED)
    obligations = MEASURED["counts"]["obligations"]
    edited = text.replace(f"{obligations} obligations,", f"{obligations - 1} obligations,")
    assert edited != text
    assert any("Measured table differs" in p for p in stale(edited, MEASURED))
