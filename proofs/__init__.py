"""Proof obligations, one per module; installed as ``attnformal.proofs``.

Each module states its theorem in its docstring and checks it on the spec's own
definitions (mask predicate, tile classification, merge step, schedule block sizes).
"""
