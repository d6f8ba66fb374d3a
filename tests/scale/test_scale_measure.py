"""Timing, peak memory, backend detection, interleaving, and the SDPA adapter -- on CPU."""

import time

import pytest
import torch

from attnformal.oracle import attention_oracle
from attnformal.schedule import TileSchedule
from attnformal import adapters
from attnformal.scale.backends import backend_from_ops
from attnformal.scale.measure import Device, Samples
from attnformal.scale.problem import MaskFamily, Problem
from attnformal.scale.sweep import Settings, load_candidate, measure_point

MIB = 1 << 20


def test_samples_median_and_iqr():
    s = Samples((5.0, 1.0, 3.0, 2.0, 4.0))
    assert s.median == 3.0
    assert s.iqr == (2.0, 4.0)
    assert Samples((7.0,)).iqr == (7.0, 7.0)


def test_cpu_peak_memory_sees_what_is_live_at_once():
    cpu = Device("cpu")

    def holds_four_mib():
        return torch.empty(MIB, dtype=torch.float32)  # 4 MiB, alive until the call returns

    def two_in_sequence():
        a = torch.empty(MIB // 2, dtype=torch.float32)  # 2 MiB
        del a
        b = torch.empty(MIB // 2, dtype=torch.float32)  # reuses the budget: the peak stays 2 MiB
        return b

    assert 4 * MIB <= cpu.peak_memory(holds_four_mib).allocated < 5 * MIB
    assert 2 * MIB <= cpu.peak_memory(two_in_sequence).allocated < 3 * MIB
    assert cpu.peak_memory(lambda: None).allocated < 4096  # negative control: nothing allocated


def test_the_backend_that_ran_is_read_from_the_profiler():
    cpu = Device("cpu")
    q = torch.randn(1, 2, 64, 16)
    assert backend_from_ops(cpu.peak_memory(lambda: adapters.sdpa(q, q, q)).ops) == "flash (cpu)"
    assert backend_from_ops(cpu.peak_memory(lambda: adapters.sdpa_math(q, q, q)).ops) == "math"
    tiled = load_candidate("torch-tiled", TileSchedule(32, 32))
    assert backend_from_ops(cpu.peak_memory(lambda: tiled.fn(q, q, q)).ops).startswith("no SDPA")
    assert tiled.schedule == TileSchedule(32, 32)  # the project's kernel gets the schedule we predict from


def test_the_process_clock_does_not_count_time_spent_descheduled():
    wall, process = Device("cpu", "wall"), Device("cpu", "process")
    assert wall.time_once(lambda: time.sleep(0.05)) >= 0.05
    assert process.time_once(lambda: time.sleep(0.05)) < 0.01  # asleep: no CPU time used


def test_devices_that_are_not_there_are_refused_clearly():
    with pytest.raises(ValueError, match="argument '--device': expected cpu, cuda or npu"):
        Device("gpu")
    with pytest.raises(ValueError, match="argument '--clock'"):
        Device("cuda", "process")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="argument '--device': cuda is not available"):
            Device("cuda")


def test_two_implementations_are_interleaved_and_paired():
    order = []

    def recorder(name):
        def impl(q, k, v, **kwargs):
            order.append(name)
            return q
        return impl

    settings = Settings(Device("cpu"), torch.float32, False, TileSchedule(16, 16), repeats=4, warmup=1, min_time=0)
    problem = Problem(1, 1, 1, 32, 8, MaskFamily("dense"))
    results, ratios = measure_point([recorder("A"), recorder("B")], problem, 32, settings)
    timed = order[2:-2]  # after one warm-up each, before one profiled memory call each
    assert timed == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert [len(r.samples.values) for r in results] == [4, 4] and len(ratios.values) == 4
    assert ratios.values[0] == pytest.approx(results[0].samples.values[0] / results[1].samples.values[0])


def test_an_unsupported_family_is_reported_not_measured():
    def dense_only(q, k, v, window=None, **kwargs):
        if window is not None:
            raise NotImplementedError("no windows")
        return q

    settings = Settings(Device("cpu"), torch.float32, False, TileSchedule(16, 16), repeats=2, min_time=0)
    problem = Problem(1, 1, 1, 32, 8, MaskFamily("window", width=4))
    results, ratios = measure_point([dense_only], problem, 32, settings)
    assert results[0].samples is None and results[0].failure == "unsupported: no windows"


@pytest.mark.parametrize("kwargs", [{}, {"causal": "top_left"}, {"causal": "bottom_right"}, {"window": (3, 1)},
                                    {"window": (5, 0), "kv_lens": [20, 9]}])
def test_sdpa_adapter_computes_the_spec(kwargs):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 13, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 20, 8, generator=gen, dtype=torch.float64) for _ in range(2))  # GQA, Sq != Sk
    expected = attention_oracle(q, k, v, **kwargs)
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(adapters.sdpa(q, k, v, **kwargs), expected, rtol=1e-10, atol=1e-10)
    # negative control: the adapter's answer depends on the mask it was given
    if kwargs:
        assert not torch.allclose(adapters.sdpa(q, k, v), expected)


def test_sdpa_adapter_refuses_what_sdpa_cannot_do():
    q = torch.randn(1, 1, 4, 8)
    for kwargs in ({"softcap": 5.0}, {"return_lse": True}):
        with pytest.raises(NotImplementedError):
            adapters.sdpa(q, q, q, **kwargs)


def test_a_pinned_backend_that_cannot_run_is_unsupported_not_a_crash():
    q = torch.randn(1, 1, 8, 8)  # torch has no memory-efficient SDPA kernel for CPU tensors
    with pytest.raises(NotImplementedError, match="SDPA EFFICIENT_ATTENTION backend refuses these inputs"):
        adapters.sdpa_efficient(q, q, q)


class FakeAccelerator:
    """The slice of ``torch.cuda`` / ``torch.npu`` the harness uses, recording the calls it gets."""

    def __init__(self):
        self.log = []
        self.allocated, self.peak = 100, 100

    def synchronize(self):
        self.log.append("synchronize")

    def Event(self, enable_timing):  # noqa: N802  (the torch spelling)
        accelerator = self

        class Event:
            def record(self):
                accelerator.log.append("record")
                self.at = len(accelerator.log)

            def synchronize(self):
                accelerator.log.append("event-synchronize")

            def elapsed_time(self, end):
                return 250.0  # milliseconds, as torch reports them

        assert enable_timing
        return Event()

    def empty_cache(self):
        self.log.append("empty_cache")

    def reset_peak_memory_stats(self):
        self.peak = self.allocated

    def memory_allocated(self):
        return self.allocated

    def memory_reserved(self):
        return 2 * self.allocated

    def max_memory_allocated(self):
        return self.peak

    def max_memory_reserved(self):
        return 2 * self.peak


def test_accelerator_timing_is_event_bracketed_and_memory_is_reset_per_call():
    device = Device("cpu")
    device.backend = fake = FakeAccelerator()  # the CUDA/NPU code path, without the hardware

    def kernel():
        fake.log.append("kernel")
        fake.peak = fake.allocated + 4096  # the call's transient peak

    assert device.time_once(kernel) == 0.25  # read from the events, converted to seconds
    assert fake.log == ["synchronize", "record", "kernel", "record", "event-synchronize"]
    fake.peak = 10 ** 9  # a peak left over from an earlier point must not leak into this one
    peak = device.peak_memory(kernel)
    assert (peak.allocated, peak.reserved) == (4096, 8192)
