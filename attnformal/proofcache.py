"""The prover's verdict cache: nothing paid twice.

A passing part of an obligation (its checks, or its negative controls) is stored under a key
that hashes everything its verdict can depend on:

* the text of the obligation's module and of every project module it imports, followed
  through their imports (:func:`dependencies`; a module's parent packages count by their own
  text: ``from attnformal.proofs import gqa`` does not make every obligation a dependency);
* the modules an obligation names in ``DEPENDS_ON`` (a kernel it lowers in a child Python, never importing it),
  with their imports;
* for an obligation that proves schedules, the kernels' schedule modules and the schedules
  named on the command line;
* the Python, Z3, SymPy, torch, triton and numpy versions and the budget (``--budget``: an
  unknown under a smaller budget may be proved under a larger one, and the resources used
  are part of the result).

An unchanged obligation is then reported *proved (cached, key ...)* in milliseconds. What
is not keyed: a change made in memory (a monkeypatched definition) -- which is why the test
suite runs with the cache off (``ATTNFORMAL_PROVE_CACHE=off``), and ``--no-cache`` re-proves
everything. Failures are never stored. The folder is ``$ATTNFORMAL_PROVE_CACHE``, else
``$XDG_CACHE_HOME/attnformal/prove`` (``~/.cache/attnformal/prove``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import os
import pickle
import platform
import sys
from pathlib import Path

PROJECT = "attnformal"
OFF = "off"
VERSIONED = ("z3-solver", "sympy", "torch", "triton", "numpy")  # packages whose versions are part of every key
FORMAT = "1"  # of the stored values (prove.py's result classes): raise it when they change


def folder_from_environment() -> Path | None:
    """Where verdicts are kept: ``$ATTNFORMAL_PROVE_CACHE`` (``off``: nowhere), else the user's cache."""
    chosen = os.environ.get("ATTNFORMAL_PROVE_CACHE")
    if chosen == OFF:
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / PROJECT / "prove"


def dependencies(module_name: str) -> dict[str, Path]:
    """``{module: source file}`` of ``module_name`` and every project module it imports, transitively."""
    files: dict[str, Path] = {}
    followed: set[str] = set()
    stack = [(module_name, True)]
    while stack:
        name, follow = stack.pop()
        origin = _origin(name)
        if origin is None or name in followed or (not follow and name in files):
            continue
        files[name] = origin
        stack += [(parent, False) for parent in _parents(name)]  # run on import: their own text counts
        if follow:
            followed.add(name)
            stack += [(imported, True) for imported in _imports(name, origin)]
    return dict(sorted(files.items()))


def _origin(name: str) -> Path | None:
    if name != PROJECT and not name.startswith(PROJECT + "."):
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def _imports(name: str, origin: Path) -> list[str]:
    """The project modules a file imports anywhere in it (function bodies too). ``from package import
    x`` names the submodule ``package.x`` when there is one, else the package itself."""
    package = name if origin.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for base, names in _import_statements(package, origin.read_text()):
        if names is None:
            out.append(base)
        else:
            out += [submodule if _origin(submodule := f"{base}.{alias}") is not None else base for alias in names]
    return out


@functools.lru_cache(maxsize=None)  # keyed by the text: every obligation shares the spec's modules, parse each once
def _import_statements(package: str, text: str) -> tuple:
    """``(module, None)`` for each ``import module``, ``(base, names)`` for each ``from base import names``."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((_absolute(node, package), tuple(alias.name for alias in node.names)))
    return tuple(out)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


@functools.lru_cache(maxsize=None)  # installed packages do not change under a running process
def versions() -> dict[str, str]:
    """The versions that are part of every key (read from the installed metadata: nothing is imported)."""
    out = {"python": platform.python_version(), "implementation": sys.implementation.name}
    for package in VERSIONED:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "absent"
    return out


class VerdictCache:
    """Passing parts of obligations on disk, content-addressed (see the module docstring)."""

    def __init__(self, folder: Path, kernel_modules=()):
        self.folder = Path(folder)
        self.kernel_modules = tuple(kernel_modules)  # the modules of the kernels' schedules

    def key(self, part: str, module, settings) -> str | None:
        """The hex key of ``part`` of obligation ``module`` under ``settings``; None if it is not a
        module of the project (a kernel's own tiling obligation: not cached)."""
        if not inspect.ismodule(module) or _origin(module.__name__) is None:
            return None
        digest = hashlib.sha256()
        named = [module.__name__, *getattr(module, "DEPENDS_ON", ())]  # modules it reads without importing them
        schedules = []
        if getattr(module, "PROVES_SCHEDULES", False):
            named += list(self.kernel_modules)
            for label, schedule in settings.schedules:
                schedules.append((label, repr(schedule), type(schedule).__module__, type(schedule).__qualname__))
                named.append(type(schedule).__module__)
        files = {name: path for named_module in named for name, path in dependencies(named_module).items()}
        for name, path in sorted(files.items()):
            text = path.read_bytes()
            digest.update(f"{name}\n{len(text)}\n".encode() + text)
        digest.update(repr((FORMAT, part, versions(), settings.budget, schedules,
                            [_source(type(s)) for _, s in settings.schedules])).encode())
        return digest.hexdigest()

    def get(self, key: str):
        try:
            with open(self.folder / key, "rb") as handle:
                return pickle.load(handle)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            return None  # not there, or from another version of the result classes: prove it again

    def put(self, key: str, value) -> None:
        """Store atomically (a concurrent run sees the old entry or the new one); a cache that cannot
        be written is no error -- the run just proves again next time."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            partial = self.folder / f".{key}.{os.getpid()}"
            with open(partial, "wb") as handle:
                pickle.dump(value, handle)
            os.replace(partial, self.folder / key)
        except OSError:
            pass


def _source(cls) -> str:
    """A schedule class's own source (a user's subclass may live outside the project)."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return cls.__qualname__
