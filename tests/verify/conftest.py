"""Shared fixtures of the battery's tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The battery's cases are small: one thread is faster and keeps timings stable on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
