"""Third-party kernels' tilings, transcribed from their public source and proven by :mod:`attnformal.tiling`.

Each module cites the repository, path and commit its arithmetic was read from, and ships the
wrong variants the prover must refute. ``EXAMPLES`` lists every shipped tiling:
``python -m attnformal.prove --kernel attnformal.tilings:EXAMPLES``.
"""
