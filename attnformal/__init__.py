"""attnformal: proofs, precision references and a conformance battery for FlashAttention-style kernels.

The spec (:mod:`attnformal.spec`, :mod:`attnformal.masks`), the tiling schedule
(:mod:`attnformal.schedule`) and the merge step (:mod:`attnformal.merge`) are written once
against :mod:`attnformal.ops`; the prover, the references and the kernels all read them.
"""

from attnformal.spec import AttentionSpec, SpecError

__all__ = ["AttentionSpec", "SpecError"]
__version__ = "0.1.0"
