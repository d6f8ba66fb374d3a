"""``attnformal TOOL ...``: the python -m commands under one name, and what a plain install of it has."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnformal.command import TOOLS, doc_pages, doc_text

ROOT = Path(__file__).resolve().parents[1]


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    return subprocess.run(argv, capture_output=True, text=True, env={**env, "COLUMNS": "100", **kwargs.pop("env", {})},
                          **kwargs)


def attnformal() -> str:
    return str(Path(sys.executable).parent / "attnformal")


def test_each_tool_is_its_python_m_command():
    for argv in (["verify", "--list"], ["reference", "check", "--help"]):
        module = TOOLS[argv[0]][0].removesuffix(".__main__")
        assert run([attnformal(), *argv]).stdout == run([sys.executable, "-m", module, *argv[1:]]).stdout != ""
    usage = run([attnformal(), "prove", "--only", "nothing-matches"])
    assert usage.returncode == 2 and "argument '--only'" in usage.stderr


def test_an_unknown_tool_is_one_line_naming_the_choices():
    result = run([attnformal(), "proof"])
    assert result.returncode == 2
    assert result.stderr == ("error: argument TOOL: expected one of prove, verify, reference, scale, docs, got 'proof' "
                             "(see: attnformal --help)\n")
    assert run([attnformal()]).returncode == 2 and run([attnformal(), "--help"]).returncode == 0


def test_docs_prints_the_pages_help_names():
    assert set(doc_pages()) == {"readme", *(p.stem for p in (ROOT / "docs").glob("*.md"))}
    assert doc_text("verify") == (ROOT / "docs" / "verify.md").read_text()
    assert "\n## I have a kernel\n" in doc_text("readme")
    bad = run([attnformal(), "docs", "nope"])
    assert bad.returncode == 2 and "argument PAGE: expected one of readme, " in bad.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """attnformal built as a wheel and installed, without the checkout, into a folder of its own."""
    folder = tmp_path_factory.mktemp("installed")
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                 str(folder / "wheel"), str(ROOT)])
    assert built.returncode == 0, built.stderr
    (wheel,) = (folder / "wheel").glob("attnformal-*.whl")
    target = folder / "site"
    done = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)])
    assert done.returncode == 0, done.stderr
    return wheel, target


def test_the_wheel_holds_the_docs_the_examples_and_the_command(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"attnformal/docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= set(names)
    assert "attnformal/examples/causal_alignment_bug.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "attnformal = attnformal.command:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_from_a_plain_install_help_points_at_what_is_there_and_verify_runs(installed, tmp_path):
    _, target = installed
    env = {"env": {"PYTHONPATH": str(target)}, "cwd": tmp_path}  # outside the checkout: only the install
    command = [sys.executable, str(target / "bin" / "attnformal")]
    where = run([sys.executable, "-c", "import attnformal; print(attnformal.__file__)"], **env).stdout
    assert where.startswith(str(target)), where
    for tool in TOOLS:
        text = run([*command, tool, *(["check"] if tool == "reference" else []), "--help"], **env).stdout
        page = re.search(r"\(installed: attnformal docs ([\w-]+)\)\n?$", text).group(1)
        shown = run([*command, "docs", page], **env)
        assert shown.returncode == 0 and shown.stdout.startswith("# "), (tool, page)
        example = text.split("example:\n  ")[1].split()
        assert not any(Path(word.split(":")[0]).suffix == ".py" for word in example)  # no file of the checkout
    readme = run([*command, "docs", "readme"], **env).stdout  # the wheel's long description: no checkout here
    assert readme.startswith("# attnformal") and "\n## I have a kernel\n" in readme
    battery = run([*command, "verify", "--impl", "attnformal.examples.causal_alignment_bug:attention", "--only",
                   "mask.causal_bottom_right", "--dtypes", "float32"], **env)
    assert battery.returncode == 1 and "[causal_alignment]" in battery.stdout, battery.stdout + battery.stderr
