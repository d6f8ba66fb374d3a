"""Precision references: values of attention whose own error is known.

* :func:`certified_attention` -- float64 values with a rigorous radius per element
  (float64 ball arithmetic, or Arb when more precision is asked for);
* :func:`mp_attention` -- a plain mpmath transcription of the spec at ``dps`` digits;
* :mod:`~attnformal.reference.golden` -- golden files (``python -m attnformal.reference``).
"""

import importlib

_HOMES = {"CertificationError": "certified", "CertifiedResult": "certified", "certified_attention": "certified",
          "MpResult": "mp", "mp_attention": "mp"}

__all__ = ["CertificationError", "CertifiedResult", "MpResult", "certified_attention", "mp_attention"]


def __getattr__(name):
    """The references, imported on first use: ``python -m attnformal.reference`` parses its options first."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
