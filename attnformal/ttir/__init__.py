"""Proofs over the TTIR a Triton kernel lowers to: the code that runs, not a transcription of it.

:mod:`.lower` compiles a ``@triton.jit`` function to TTIR on the CPU, :mod:`.parse` reads the
printed IR, :mod:`.interpret` executes it symbolically over Z3, :mod:`.launch` says which
argument is which tensor, :mod:`.folding` reads the float value trees as IEEE terms, and
:mod:`.theorems` states and decides bounds, address map, masking, coverage, writes and the merge for
every program of the grid and every runtime argument (docs/ttir.md).
"""
