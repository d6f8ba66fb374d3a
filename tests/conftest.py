"""Test-suite settings shared by every test module."""

from __future__ import annotations

import os

import torch

# Triton picks its CPU interpreter when a kernel is decorated, i.e. when a kernel module is
# imported: without a GPU, set it before any test module imports one. With a GPU, the real kernels run.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
