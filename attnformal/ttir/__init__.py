"""Proofs over the TTIR a Triton kernel lowers to: the code that runs, not a transcription of it.

:mod:`.lower` compiles a ``@triton.jit`` function to TTIR on the CPU, :mod:`.parse` reads the
printed IR, :mod:`.interpret` executes it symbolically over Z3, :mod:`.launch` says which
argument is which tensor, and :mod:`.theorems` states and decides bounds, address map, masking,
coverage and writes for every program of the grid and every runtime argument (docs/ttir.md).
"""
