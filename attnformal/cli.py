"""What every ``python -m attnformal.*`` command line (and the pytest plugin) shares: one grammar,
one-line errors, short help.

* A usage error is one line, ``error: argument --x: what was expected, got what`` (exit 2),
  not argparse's usage block; ``--help`` fits a screen and ends with an example and the docs
  page it belongs to. Values are checked before any work starts, output paths included.
* A list option takes its items separated by spaces, commas or both, in one argument or
  several (``--mask dense,causal``, ``--mask dense causal``, ``--mask "dense, causal"``).
* A number is finite and within its bounds (:func:`number`, :func:`integer`): a tolerance or a
  radius that is NaN, infinite or negative would pass anything.
* An output file is written under a temporary name in its own folder and renamed over the
  target when complete (:func:`atomic_path`): a cancelled run leaves no partial file, and a
  symlink is replaced, never its target.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import textwrap
from pathlib import Path

DOCS = "docs/references-and-scale.md"


# Names a --dtype option takes, to torch's names: parsing them needs no torch (DTYPES gives the dtypes).
DTYPE_NAMES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
               "fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


def __getattr__(name):
    """``DTYPES`` (names to torch dtypes), built on first use: `prove` uses this module without torch."""
    if name != "DTYPES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch

    return {short: getattr(torch, long) for short, long in DTYPE_NAMES.items()}


# Every command's exit status by verdict: the same words and codes everywhere; an internal error (a defect,
# a full disk) has its own code, never FAIL's.
EXIT_CODES = {"PASS": 0, "FAIL": 1, "USAGE": 2, "NOTHING VERIFIED": 3, "INCOMPLETE": 3, "INTERNAL ERROR": 4,
              "INTERRUPTED": 130}


class InternalError(RuntimeError):
    """A defect of attnformal itself (not of the arguments, nor of the implementation under test)."""


def internal_error(err: Exception) -> int:
    """Say, in one line, that attnformal itself failed; :data:`EXIT_CODES`' code for it (never FAIL's)."""
    text = str(err).strip().splitlines()
    print(f"internal error: {type(err).__name__}: {text[0] if text else ''} (a defect of attnformal, or of this "
          "machine: please report it)", file=sys.stderr)
    return EXIT_CODES["INTERNAL ERROR"]


class UsageError(ValueError):
    """A wrong option value; the message starts with ``argument <option>:``."""

    def __init__(self, option: str, text: str):
        super().__init__(f"argument {option}: {text}")


# The README's three paths; each command's --help names the one it belongs to (tests/test_readme.py
# checks that the README has that section).
README_PATHS = ("I have a kernel", "I review merge logic", "I need references")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line naming the argument (exit 2); its help
    ends with an example, the README path (one of :data:`README_PATHS`) and the docs page."""

    def __init__(self, *args, guide: str, example: str | None = None, docs: str = DOCS, **kwargs):
        if guide not in README_PATHS:
            raise ValueError(f"argument 'guide': expected one of {README_PATHS}, got {guide!r}")
        page = docs.removeprefix("docs/").removesuffix(".md")  # also installed: `attnformal docs PAGE` prints it
        epilog = "\n".join(filter(None, [f"example:\n  {example}" if example else None,
                                         f'readme: README.md, "{guide}" (installed: attnformal docs readme)',
                                         f"docs: {docs} (installed: attnformal docs {page})"]))
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, epilog=epilog, **kwargs)
        # argparse takes "-1,5" (--window -1,5) for an option: it knows negative numbers, not lists of them
        self._negative_number_matcher = re.compile(f"{self._negative_number_matcher.pattern}|^-\\d+(,\\s*-?\\d+)+$")

    def error(self, message: str):
        self.exit(2, f"error: {message} (see: {self.prog} --help)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Options one per line where they fit; text wrapped by line, example lines kept as written."""

    def __init__(self, prog, **kwargs):
        super().__init__(prog, max_help_position=30, width=min(100, _terminal_width()), **kwargs)

    def _fill_text(self, text, width, indent):
        return "\n".join(line if line.startswith("  ") else textwrap.fill(line, width, initial_indent=indent,
                                                                           subsequent_indent=indent)
                         for line in text.splitlines())

    def _format_args(self, action, default_metavar):
        if action.nargs == "+":  # a list option: its metavar says the form, without argparse's "[X ...]"
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)


def _terminal_width() -> int:
    return max(60, shutil.get_terminal_size().columns - 2)


def split_list(values) -> list[str]:
    """Items of a list option: a string or strings, split on spaces and commas."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part for value in values for part in re.split(r"[,\s]+", value) if part]


class IntList(argparse.Action):
    """``nargs="+"`` ints, separated by spaces and/or commas: ``--window 40,5`` or ``--window -1 5``.

    ``form`` is what the error message says was expected; ``count`` an int or a tuple of the
    accepted lengths; ``minimum`` the smallest accepted item.
    """

    def __init__(self, option_strings, dest, *, form="ints", count=None, minimum=None, **kwargs):
        self.form, self.minimum = form, minimum
        self.counts = (count,) if isinstance(count, int) else count
        super().__init__(option_strings, dest, nargs="+", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        text = " ".join(values)
        try:
            ints = [int(part) for part in split_list(values)]
        except ValueError:
            ints = None
        if ints is None or (self.counts is not None and len(ints) not in self.counts):
            raise argparse.ArgumentError(self, f"expected {self.form}, got {text!r}")
        if self.minimum is not None and ints and min(ints) < self.minimum:
            raise argparse.ArgumentError(self, f"expected {self.form}, got {text!r} ({min(ints)} < {self.minimum})")
        setattr(namespace, self.dest, ints)


class FloatList(argparse.Action):
    """``nargs="+"`` floats (``inf``, ``-inf`` included), separated by spaces and/or commas; ``count``: the
    accepted length (None: any); ``form`` is what the error message says was expected."""

    def __init__(self, option_strings, dest, *, form="floats", count=None, **kwargs):
        self.form, self.count = form, count
        super().__init__(option_strings, dest, nargs="+", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            floats = [float(part) for part in split_list(values)]
        except ValueError:
            floats = None
        wrong_count = floats is not None and self.count is not None and len(floats) != self.count
        if floats is None or any(math.isnan(x) for x in floats) or wrong_count:
            raise argparse.ArgumentError(self, f"expected {self.form}, got {' '.join(values)!r}")
        setattr(namespace, self.dest, floats)


def number(*, minimum: float = -math.inf, above: float | None = None, maximum: float = math.inf,
           what: str | None = None):
    """An argparse ``type``: a finite float ``>= minimum`` (or ``> above``) and ``<= maximum``;
    ``what`` names what was expected in the error (default: the bounds)."""
    bounds = [f"> {above:g}" if above is not None else f">= {minimum:g}" if minimum > -math.inf else "",
              f"<= {maximum:g}" if maximum < math.inf else ""]
    expected = what or " ".join(["a finite number", " and ".join(filter(None, bounds))]).strip()

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and minimum <= value <= maximum and (above is None or value > above)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


tolerance = number(minimum=0.0)  # rtol, atol, radii: NaN, infinities and negatives would pass anything
seconds = number(above=0, what="a finite number of seconds > 0")  # a timeout


def integer(*, minimum: int | None = None, below: int | None = None, what: str | None = None):
    """An argparse ``type``: an int ``>= minimum`` and ``< below``; ``what`` names what was expected."""
    expected = what or " ".join(filter(None, ["an int", f">= {minimum}" if minimum is not None else "",
                                              f"< {below}" if below is not None else ""]))

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (minimum is not None and value < minimum) or (below is not None and value >= below):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


def check_device(device: str, option: str = "--device") -> str:
    """``device`` can hold a tensor here, or a :class:`UsageError` naming ``option``."""
    import torch

    try:
        torch.empty(0, device=device)
    except Exception as err:  # RuntimeError, or AssertionError from a torch built without CUDA
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UsageError(option, f"{device!r} is not usable here ({first})") from None
    return device


def impl_slug(target: str) -> str:
    """A folder name for an implementation: ``examples/bug.py:attention`` -> ``bug.attention``."""
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        where = Path(where).stem
    text = f"{where}.{name}" if where else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "impl"


def human_bytes(n: float | None) -> str:
    """Bytes for a person: ``1.4 GiB`` (``-`` for None)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


class WriteError(OSError):
    """An output that could not be written (a full disk, a lost mount, ...): an internal error, exit
    :data:`EXIT_CODES` ``["INTERNAL ERROR"]``, never FAIL's; the message names the file and the cause."""

    def __init__(self, path, err: OSError):
        self.path, self.reason = Path(path), getattr(err, "reason", None) or err.strerror or str(err)
        super().__init__(err.errno, f"cannot write {str(path)!r}: {self.reason}")

    def __str__(self):
        return self.strerror


@contextlib.contextmanager
def atomic_path(path: Path):
    """``with atomic_path(path) as tmp:`` write ``tmp``; when the block completes, ``tmp`` is renamed
    over ``path`` (one atomic step, same folder); if it raises, ``tmp`` is removed and ``path`` is left as
    it was. An ``OSError`` on the way (``ENOSPC``...) becomes a :class:`WriteError` naming ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as err:
        raise WriteError(path, err) from err
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 -> what open() would have given
        os.replace(tmp, path)
    except WriteError:
        raise
    except OSError as err:
        raise WriteError(path, err) from err
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_failed(err: Exception, prog: str) -> int:
    """Print ``err`` as one line, ``error: <prog>: ... (internal error)``, and return the internal-error code."""
    print(f"error: {prog}: {err} (internal error)", file=sys.stderr)
    return EXIT_CODES["INTERNAL ERROR"]


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_atomic(path: Path, text: str):
    """Write ``text`` to ``path`` through :func:`atomic_path`: readers never see half a file."""
    with atomic_path(Path(path)) as partial:
        partial.write_text(text)


def output_file(path, option: str | None = None) -> Path:
    """``path`` as :func:`atomic_path` will write it, or ``ValueError`` saying why it cannot be
    (a :class:`UsageError` naming ``option`` when given).

    An existing regular file or symlink is replaced whole (a symlink's target is never
    written); a folder, a device, a pipe or a socket is refused, as is a folder that is
    missing or in which this process cannot create a file (tried, not read from permission bits).
    """
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise _refusal(option, f"expected a file name, got {str(path)!r}")
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            raise _refusal(option, f"{str(path)!r} is a folder, expected a file name")
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise _refusal(option, f"{str(path)!r} is not a regular file (a device, pipe or socket); it is never "
                                   "replaced")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise _refusal(option, f"the folder {str(folder)!r} {what}")
    _try_writing(folder, option)
    return path


def output_folder(path, option: str | None = None) -> Path:
    """``path`` as a folder this process can write in (created if missing), or ``ValueError``
    (a :class:`UsageError` naming ``option`` when given)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise _refusal(option, f"{str(path)!r} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _refusal(option, f"cannot create the folder {str(path)!r} ({err.strerror or err})") from None
    _try_writing(path, option)
    return path


def _try_writing(folder: Path, option: str | None):
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".attnformal.", suffix=".probe")
    except OSError as err:
        raise _refusal(option, f"cannot create a file in {str(folder)!r} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)


def _refusal(option: str | None, text: str) -> ValueError:
    return ValueError(text) if option is None else UsageError(option, text)


LOCK_NAME = ".attnformal.lock"


class FolderBusy(UsageError):
    """Another run holds the output folder (:func:`folder_lock`)."""


@contextlib.contextmanager
def folder_lock(folder: Path, option: str):
    """``with folder_lock(folder, "--out"):`` this run alone writes in ``folder``; a second run that tries
    gets a :class:`FolderBusy` naming ``option``, the folder and who holds it. The lock (``flock`` on
    ``folder/.attnformal.lock``) goes with the process: a killed run never leaves a stale one."""
    import fcntl

    handle = open(Path(folder) / LOCK_NAME, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise FolderBusy(option, f"{str(folder)!r} is in use by another run ({holder}): wait for it to end, "
                                     "or give another folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, {' '.join(sys.argv)[:200]}")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def replace_together(folder: Path, writers: dict, owned: tuple[str, ...] = ()) -> list[Path]:
    """Write a run's files into ``folder`` so that an earlier run's are replaced only at the end: each
    ``writers[name](path)`` writes its file under a temporary name first; when all are written they are
    renamed over the old ones, and the files of ``owned`` this run did not write (an earlier run's plot)
    are removed. A failure or Ctrl-C while writing leaves the earlier run's files as they were."""
    folder = Path(folder)
    with contextlib.ExitStack() as stack:
        for name, write in writers.items():
            partial = stack.enter_context(atomic_path(folder / name))
            try:
                write(partial)
            except WriteError as err:  # a writer's own temporary file: name the output instead
                raise WriteError(folder / name, err) from err
    for name in set(owned) - set(writers):
        (folder / name).unlink(missing_ok=True)
    return [folder / name for name in writers]
