"""Benchmark the project's kernels against PyTorch's SDPA (a script that prints numbers, not a test).

* CPU: the torch tiled executor against ``scaled_dot_product_attention`` at N = 1k .. 16k
  (one point per doubling), forward, dense and causal: median time, peak allocated memory
  and the fitted exponents, through the scaling harness (``python -m attnformal.scale``),
  which also says whether memory grows linearly. Output under ``out/bench_kernels``.
* CUDA: the Triton kernel against SDPA's flash backend (``bench_triton_gpu.py``).

Usage: ``python benchmarks/bench_kernels.py [extra arguments for the scaling harness]``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

from attnformal.scale.cli import main as scale

CPU_SWEEP = ["--impl", "torch-tiled", "--vs", "sdpa", "--sweep", "N=1024..16384", "--per-octave", "1",
             "--mask", "dense", "causal", "--heads", "2", "--head-dim", "64", "--clock", "process",
             "--repeats", "3", "--out", "out/bench_kernels"]

if __name__ == "__main__":
    if torch.cuda.is_available():
        runpy.run_path(str(Path(__file__).with_name("bench_triton_gpu.py")), run_name="__main__")
    else:
        sys.exit(scale(CPU_SWEEP + sys.argv[1:]))
