"""``attnformal``: one command for the tools, ``attnformal prove|verify|reference|scale|docs ...``.

Each subcommand is the ``python -m attnformal.<tool>`` command with the same arguments (both
forms keep working); ``attnformal docs [PAGE]`` prints the documentation that installs with the
package (README and ``docs/*.md``), so every ``--help`` points at something a plain
``pip install`` has.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import sys
from pathlib import Path

# subcommand -> (module whose main(argv) runs it, what it does)
TOOLS = {
    "prove": ("attnformal.prove", "machine-checked proofs of the tiled algorithm, or of a kernel's own tiling"),
    "verify": ("attnformal.verify.__main__", "the conformance battery on an attention implementation"),
    "reference": ("attnformal.reference.__main__", "golden files: generate certified references, check against them"),
    "scale": ("attnformal.scale.cli", "time and memory scaling against what the tiling schedule predicts"),
}
USAGE = "usage: attnformal {" + ",".join([*TOOLS, "docs"]) + "} [arguments]  (attnformal TOOL --help)"


def doc_pages() -> list[str]:
    """The documentation pages installed with the package: ``readme`` and each ``docs/<page>.md``."""
    docs = importlib.resources.files("attnformal.docs")
    return ["readme", *sorted(p.name.removesuffix(".md") for p in docs.iterdir() if p.name.endswith(".md"))]


def doc_text(page: str) -> str:
    """The text of an installed page; ``ValueError`` naming the pages there are."""
    if page == "readme":
        return _readme()
    path = importlib.resources.files("attnformal.docs") / f"{page.removesuffix('.md').removeprefix('docs/')}.md"
    if not path.is_file():
        raise ValueError(f"argument PAGE: expected one of {', '.join(doc_pages())}, got {page!r}")
    return path.read_text(encoding="utf-8")


def _readme() -> str:
    """The checkout's README when the package runs from one (an editable install), else the installed long
    description: the metadata is the install's copy, and the one ``importlib.metadata`` found first came
    back empty once in CI (pytest-xdist workers)."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "README.md").is_file():
        return (checkout / "README.md").read_text(encoding="utf-8")
    return importlib.metadata.metadata("attnformal").get_payload() or ""


def _docs(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: attnformal docs PAGE   (prints an installed page)\npages: " + ", ".join(doc_pages()))
        return 0
    try:
        print(doc_text(argv[0]), end="")
    except ValueError as error:
        print(f"error: {error} (see: attnformal docs --help)", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = [USAGE, ""] + [f"  {name:<10} {what}" for name, (_, what) in TOOLS.items()]
        print("\n".join([*lines, f"  {'docs':<10} print the installed README or a docs page"]))
        return 0 if argv else 2
    tool, rest = argv[0], argv[1:]
    if tool == "docs":
        return _docs(rest)
    if tool not in TOOLS:
        print(f"error: argument TOOL: expected one of {', '.join([*TOOLS, 'docs'])}, got {tool!r} "
              "(see: attnformal --help)", file=sys.stderr)
        return 2
    code = importlib.import_module(TOOLS[tool][0]).main(rest)
    return 0 if code is None else code


if __name__ == "__main__":
    sys.exit(main())
