"""Kernels that run the spec's schedule and merge: a torch tiled executor and a Triton kernel.

Installed as ``attnformal.kernels``. Each kernel's ``attention`` follows the
implementation protocol of :mod:`attnformal.verify`.
"""
