"""Precision references: values of attention whose own error is known.

* :func:`certified_attention` -- float64 values with a rigorous radius per element
  (float64 ball arithmetic, or Arb when more precision is asked for);
* :func:`mp_attention` -- a plain mpmath transcription of the spec at ``dps`` digits;
* :mod:`~attnformal.reference.golden` -- golden files (``python -m attnformal.reference``).
"""

from attnformal.reference.certified import CertificationError, CertifiedResult, certified_attention
from attnformal.reference.mp import MpResult, mp_attention

__all__ = ["CertificationError", "CertifiedResult", "MpResult", "certified_attention", "mp_attention"]
