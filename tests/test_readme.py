"""The README's code blocks run, in order, in one empty folder: they cannot rot.

A fenced block's info string says what it is: its language, then optional words:

* ``file=NAME``   write the block to NAME (a kernel, a test file, a pyproject.toml) instead of running it;
* ``exit=N``      the status the block must end with (default 0; a failing verify exits 1);
* ``gpu``         needs a CUDA GPU: skipped without one, with that reason;
* ``skip: WHY``   never run here, for the reason given (``make test`` would run itself);
* ``output``      on a ``text`` block: an excerpt of the previous block's output, every line of it verbatim.

``sh``/``bash`` blocks run in bash (``-e -o pipefail``) with the venv's ``python`` first on PATH, ``python``
blocks through the venv's Python; other blocks without ``file=`` are prose (a signature, a report). A block's
stderr must carry no third-party noise (:data:`NOISE`: the profiler's USDT lines, library warnings).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attnformal.cli import README_PATHS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELLS = ("sh", "bash")
BLOCK_TIMEOUT_S = 1200  # a hang guard, not a speed limit: a loaded machine may be many times slower
NOISE = ("USDT", "Warning", "warnings.warn")  # third-party lines a user would have to learn to ignore
# The blocks not run here, each for its reason; a new skip must be added here on purpose.
DELIBERATE_SKIPS = {"make prove   # the proofs: python -m attnformal.prove": "the suite",
                    "make prove-triton   # one claim a line: python -m attnformal.prove --triton "
                    "attnformal.kernels.triton_flash:_attn_fwd --triton ...:_attn_bwd_dq "
                    "--triton ...:_attn_bwd_dkdv": "the suite",
                    "python3 -m venv  .venv": "make -n"}


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    file: str | None = None
    exit: int = 0
    gpu: bool = False
    skip: str | None = None
    output: bool = False

    @property
    def runs(self) -> bool:
        return self.file is None and self.skip is None and (self.lang in SHELLS or self.lang == "python")


def parse_info(line: int, info: str) -> dict:
    """The block's fields from its info string; a word the grammar does not know is an error."""
    if "`" in info:  # CommonMark: then the line is no fence, and GitHub shows the block as text
        raise ValueError(f"README.md:{line}: a backtick in the info string {info!r}")
    lang, _, rest = info.partition(" ")
    rest, _, skip = rest.partition("skip:")
    fields: dict = {"line": line, "lang": lang, "skip": skip.strip() or None}
    if "skip:" in info and not fields["skip"]:
        raise ValueError(f"README.md:{line}: 'skip:' without a reason")
    for word in rest.split():
        key, _, value = word.partition("=")
        if key == "file" and value:
            fields["file"] = value
        elif key == "exit" and value.isdigit():
            fields["exit"] = int(value)
        elif word in ("gpu", "output"):
            fields[word] = True
        else:
            raise ValueError(f"README.md:{line}: unknown word {word!r} in the info string {info!r}")
    return fields


def blocks(text: str) -> list[Block]:
    """Every fenced block of ``text``, with its info string read."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^```(\S.*)?$", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{i + 1}: a fence that is never closed")
        found.append(Block(text="\n".join(lines[i + 1:end]) + "\n", **parse_info(i + 1, (fence[1] or "").strip())))
        i = end + 1
    return found


def environment() -> dict:
    """The venv's python and pytest first on PATH; no inherited pytest or coverage state."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "120"
    return env


def run_block(block: Block, folder: Path) -> subprocess.CompletedProcess:
    if block.lang == "python":
        argv = [sys.executable, "-"]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-s"]
    return subprocess.run(argv, input=block.text, cwd=folder, env=environment(), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)


def run_all(document: list[Block], folder: Path) -> list[str]:
    """Run ``document``'s blocks in order in ``folder``; what went wrong, one entry per failing block
    (empty: everything ran as the README says). Skipped blocks are returned by :func:`skipped`."""
    problems, previous = [], None
    for block in document:
        if block.file is not None:
            (folder / block.file).write_text(block.text)
        elif block.output:
            problems += excerpt_problems(block, previous)
        elif block.runs and not skipped(block):
            previous = run_block(block, folder)
            if previous.returncode != block.exit:
                problems.append(f"README.md:{block.line}: exit {previous.returncode}, expected {block.exit}\n"
                                f"{block.text}--- stdout\n{previous.stdout[-3000:]}--- stderr\n"
                                f"{previous.stderr[-3000:]}")
            problems += [f"README.md:{block.line}: noise on stderr: {line!r}" for line in previous.stderr.splitlines()
                         if any(word in line for word in NOISE)]
    return problems


def excerpt_problems(block: Block, previous: subprocess.CompletedProcess | None) -> list[str]:
    if previous is None:
        return [f"README.md:{block.line}: an output excerpt with no command before it"]
    missing = [line for line in block.text.splitlines() if line.strip() and line not in previous.stdout.splitlines()]
    return [f"README.md:{block.line}: not in the output of the block before: {line!r}" for line in missing]


def skipped(block: Block) -> str | None:
    """Why ``block`` is not run here, or None."""
    if block.skip is not None:
        return block.skip
    if block.gpu and not torch.cuda.is_available():
        return "needs a CUDA GPU, and none is here"
    return None


# ---------------------------------------------------------------- the README itself


def test_every_block_of_the_readme_runs_as_shown(tmp_path):
    document = blocks(README.read_text())
    assert sum(block.runs for block in document) >= 10 and any(block.output for block in document)
    problems = run_all(document, tmp_path)
    assert not problems, "\n\n".join(problems)
    assert (tmp_path / "verify-repro" / "my_kernel.attention_head_1_unscaled").is_dir()  # the paths' own folders
    assert (tmp_path / "review.md").is_file() and (tmp_path / "case.npz").is_file()
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                               cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=600).stdout
    battery = [line.partition("attnformal-verify::")[2] for line in collected.splitlines()
               if "attnformal-verify::" in line]
    assert "mask.causal_top_left[float32]" in battery, collected  # pyproject.toml's addopts were read
    assert all(check.startswith("mask.") or check == "verdict" for check in battery)


def test_the_blocks_not_run_are_skipped_deliberately_and_say_why():
    document = blocks(README.read_text())
    skips = {block.text.splitlines()[0]: block.skip for block in document if block.skip is not None}
    assert skips.keys() == DELIBERATE_SKIPS.keys()
    assert all(DELIBERATE_SKIPS[first] in why for first, why in skips.items()), skips
    gpu = [block for block in document if block.gpu]
    assert gpu and all("--device cuda" in block.text for block in gpu)  # GPU-only, and nothing else is tagged so


def test_the_gpu_blocks_are_command_lines_their_tools_take(tmp_path, monkeypatch):
    from attnformal.scale.cli import build_parser
    from attnformal.verify.__main__ import parser

    monkeypatch.chdir(tmp_path)  # parsing checks the output folders, here
    parsers = {"attnformal.verify": parser(), "attnformal.scale": build_parser()}
    lines = [line for block in blocks(README.read_text()) if block.gpu for line in block.text.splitlines()]
    assert lines
    for line in lines:
        _, _, module, *argv = shlex.split(line)  # python -m MODULE ...
        assert parsers[module].parse_args(argv).device == "cuda"  # a wrong option would exit 2 here


def make_dry_run(*variables: str) -> str:
    """What ``make .venv/.installed`` would run, as a user's shell would print it (not as a sub-make of
    ``make test``, which would add its Entering/Leaving directory lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    return subprocess.run(["make", "-n", "-B", ".venv/.installed", *variables], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout


def test_the_setup_block_is_what_make_runs():
    document = blocks(README.read_text())
    shown = next(block for block in document if block.text.startswith("python3 -m venv"))
    assert shown.text == make_dry_run()
    system = make_dry_run("TORCH=system")
    assert "--system-site-packages" in system and "torch==" not in system  # the installed torch is kept
    assert "TORCH=system" in README.read_text()


def test_each_path_is_a_section_and_the_first_screen_links_them():
    text = README.read_text()
    first_screen = "\n".join(text.splitlines()[:40])
    for path in README_PATHS:
        assert f"\n## {path}\n" in text
        assert f"(#{path.lower().replace(' ', '-')})" in first_screen
    assert "make prove" in first_screen and "make test" in first_screen


def test_every_linked_docs_page_exists_except_the_announced_one():
    linked = set(re.findall(r"\]\((docs/[^)#]+)", README.read_text()))
    missing = {page for page in linked if not (ROOT / page).is_file()}
    assert linked and not missing


# ---------------------------------------------------------------- the protocol section is the registry's

SUPPORT_TABLE = "<!-- support table: generated from the SUPPORTS declarations, checked by tests/test_readme.py -->"


def declared_support() -> dict[str, frozenset]:
    """What each implementation of the README's table computes, from its own declaration."""
    import importlib

    from attnformal import adapters
    from attnformal.features import FEATURES
    from attnformal.oracle import ORACLE_ROLES

    table = {"oracle": frozenset(f.name for f in FEATURES if f.role in ORACLE_ROLES)}
    for name in ("torch_tiled", "triton_flash", "ring"):
        table[name.replace("_", "-")] = importlib.import_module(f"attnformal.kernels.{name}").attention.SUPPORTS
    for alias in ("sdpa", "flex", "flash-attn", "flash-attn-varlen", "xformers", "npu"):
        table[alias] = adapters.ALIASES[alias].SUPPORTS
    return table


def readme_support(text: str) -> dict[str, frozenset]:
    lines = text.split(SUPPORT_TABLE + "\n", 1)[1].split("\n\n", 1)[0].splitlines()
    columns = [cell.strip() for cell in lines[0].strip("|").split("|")][1:]
    table = {column: set() for column in columns}
    for row in lines[2:]:
        feature, *cells = [cell.strip() for cell in row.strip("|").split("|")]
        for column, cell in zip(columns, cells, strict=True):
            if cell == "✓":
                table[column].add(feature.strip("`"))
    return {column: frozenset(features) for column, features in table.items()}


def test_the_support_table_is_what_the_implementations_declare():
    assert readme_support(README.read_text()) == declared_support()


def test_a_support_table_that_claims_too_much_is_caught():
    text = README.read_text().replace("| `sinks` | ✓ | ✓ | ✓ | · |", "| `sinks` | ✓ | ✓ | ✓ | ✓ |")
    assert text != README.read_text()
    assert readme_support(text) != declared_support()


def test_the_protocol_signature_names_every_registered_feature():
    from attnformal.features import FEATURES

    signature = README.read_text().split("```text\nimpl(", 1)[1].split("```", 1)[0]
    keywords = re.findall(r"(\w+)=", signature)
    assert keywords == ["scale", *(f.name for f in FEATURES), "return_lse"]


# ---------------------------------------------------------------- the runner can fail


def test_a_broken_block_fails_the_run(tmp_path):
    broken = blocks("```python\nraise SystemExit('no')\n```\n"
                    "```sh\npython -m attnformal.verify --impl no_such_module:attention\n```\n"
                    "```sh exit=1\ntrue\n```\n"
                    "```sh\necho one\n```\n```text output\ntwo\n```\n"
                    "```sh\necho 'USDT probe profiler_start' >&2\n```\n")
    problems = run_all(broken, tmp_path)
    assert [p.split(":")[1] for p in problems] == ["1", "4", "7", "13", "16"], problems
    assert "argument '--impl'" in problems[1] and "'two'" in problems[3] and "noise on stderr" in problems[4]


def test_the_info_string_grammar_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match="unknown word 'gpus'"):
        blocks("```sh gpus\nls\n```\n")
    with pytest.raises(ValueError, match="without a reason"):
        blocks("```sh skip:\nls\n```\n")
    with pytest.raises(ValueError, match="a backtick"):
        blocks("```sh skip: `make test` runs it\nls\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        blocks("```sh\nls\n")
    assert skipped(Block(1, "sh", "ls\n", gpu=True)) == (None if torch.cuda.is_available()
                                                         else "needs a CUDA GPU, and none is here")


# ---------------------------------------------------------------- every command's --help


HELPS = [("attnformal.prove", [], "I review merge logic", "docs/proofs.md"),
         ("attnformal.verify", [], "I have a kernel", "docs/verify.md"),
         ("attnformal.scale", [], "I have a kernel", "docs/references-and-scale.md"),
         ("attnformal.reference", ["generate"], "I need references", "docs/references-and-scale.md"),
         ("attnformal.reference", ["check"], "I need references", "docs/references-and-scale.md")]


@pytest.mark.parametrize("module, command, path, page", HELPS, ids=[" ".join([h[0], *h[1]]) for h in HELPS])
def test_help_fits_a_screen_shows_an_example_and_names_its_readme_path(module, command, path, page):
    result = subprocess.run([sys.executable, "-m", module, *command, "--help"], capture_output=True, text=True,
                            env={**environment(), "COLUMNS": "80"}, cwd=ROOT)
    assert result.returncode == 0 and not result.stderr, result.stderr
    text = result.stdout
    assert len(text.splitlines()) <= 40, text
    example = text.split("example:\n")[1].splitlines()[0]
    assert shlex.split(example)[:3] == ["python", "-m", module]
    assert f'readme: README.md, "{path}"' in text and f"\n## {path}\n" in README.read_text()
    assert f"docs: {page}" in text and (ROOT / page).is_file()
