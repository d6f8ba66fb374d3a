"""Loading an implementation of the protocol from a ``MODULE:FUNC`` or ``FILE.py:FUNC`` string."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from attnformal.execution import Exited, guarded


def load_impl(target: str, argument: str = "--impl"):
    """The attribute named by ``target``: ``package.module:func`` or ``path/to/file.py:func``.

    ``argument`` is the command-line option that errors name.
    """
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"argument '{argument}': expected MODULE:FUNC or FILE.py:FUNC, got {target!r}")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"argument '{argument}': no such file {where!r}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module  # dataclasses and pickling look the module up by name
        sys.path.insert(0, str(path.parent.resolve()))  # so the file can import its neighbours
        try:
            guarded(module_spec.loader.exec_module, module)
        except (Exception, Exited) as err:  # a syntax error, a failed import, an exit: one line, not a traceback
            del sys.modules[module_spec.name]
            raise ValueError(f"argument '{argument}': {where} failed to import: {_one_line(err)}") from None
        finally:
            sys.path.remove(str(path.parent.resolve()))
    else:
        try:
            module = guarded(importlib.import_module, where)
        except (Exception, Exited) as err:
            raise ValueError(f"argument '{argument}': cannot import {where!r}: {_one_line(err)}") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(f"argument '{argument}': {where!r} has no attribute {name!r}") from None


def _one_line(err: BaseException) -> str:
    """``SyntaxError: invalid syntax (kernel.py, line 3)``: the exception's type and first line."""
    if isinstance(err, Exited):  # sys.exit or os._exit at import: the module never finished loading
        return str(err).replace("the implementation ", "", 1)
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
