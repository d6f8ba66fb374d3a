"""GPU benchmark: the Triton kernel against SDPA's flash backend.

    python benchmarks/bench_triton_gpu.py [--lengths 1024 4096 16384] [--reps 20] [--warmup 5]

For fp16 and bf16, head dim 128, causal and not, and each sequence length N (queries =
keys = N), it times the forward and forward+backward of
``attnformal.kernels.triton_flash.attention`` (its default schedule) and of
``torch.nn.functional.scaled_dot_product_attention`` restricted to the flash backend.
The batch shrinks as N grows (B = max(1, 16384 // N), H = 16) so every row does similar
work. Times are CUDA-event medians over ``--reps`` calls after ``--warmup`` calls; each call
is synchronised on its own, so the Triton times include the host work of a call (spec
validation, the cached schedule tables, the split-KV merge and finalisation in torch).
TFLOP/s counts 4 B H N^2 D per forward (half of it when causal) and 2.5 times that for
the backward, the convention of the Triton tutorial. Peak memory is the largest
allocation above the inputs during one forward+backward.

Without a CUDA device it prints why and exits with status 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

HEAD_DIM = 128
HEADS = 16
TOKENS = 16384  # batch x length, kept constant across lengths


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="calls before timing (includes Triton's compile)")
    return parser.parse_args()


def cuda_time_ms(fn, warmup, reps):
    """Median wall time of ``fn`` on the GPU, in ms, from CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mib(fn):
    """Largest allocation above what was live before ``fn``, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def implementations(causal):
    """name -> attention(q, k, v) for the two contenders."""
    from attnformal.kernels import triton_flash  # after the CUDA check: a CPU-only machine may lack triton

    def sdpa_flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)  # top-left, = bottom-right at Sq == Sk

    def triton_kernel(q, k, v):
        return triton_flash.attention(q, k, v, causal="top_left" if causal else None)

    return {"triton_flash": triton_kernel, "sdpa_flash": sdpa_flash}


def measure(attention, q, k, v, grad_out, args):
    """(forward ms, forward+backward ms, peak MiB) of one implementation, or None if it cannot run."""
    def forward():
        with torch.no_grad():
            attention(q, k, v)

    def forward_backward():
        torch.autograd.grad(attention(q, k, v), (q, k, v), grad_out)

    try:
        return (cuda_time_ms(forward, args.warmup, args.reps), cuda_time_ms(forward_backward, args.warmup, args.reps),
                peak_mib(forward_backward))
    except RuntimeError as error:  # no flash kernel for this GPU, or out of memory
        print(f"    skipped: {str(error).splitlines()[0]}", file=sys.stderr)
        return None


def tflops(ms, batch, length, causal, passes):
    forward_flops = 4 * batch * HEADS * length * length * HEAD_DIM * (0.5 if causal else 1.0)
    return passes * forward_flops / (ms * 1e-3) / 1e12


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        print("bench_triton_gpu: no CUDA device on this machine; it times the Triton kernel on a GPU. Nothing run.")
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_triton_gpu: TRITON_INTERPRET is set, so the kernels would run in the CPU interpreter; unset it.")
        return 1
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, D={HEAD_DIM}, H={HEADS}, "
          f"B=max(1, {TOKENS}//N), median of {args.reps} after {args.warmup} warm-up calls")
    print(f"{'dtype':9} {'causal':6} {'N':>6} {'B':>3} {'impl':13} {'fwd ms':>8} {'TFLOP/s':>8} "
          f"{'fwd+bwd ms':>10} {'TFLOP/s':>8} {'peak MiB':>9} {'max|out-sdpa|':>14}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            contenders = implementations(causal)
            for length in args.lengths:
                batch = max(1, TOKENS // length)
                q, k, v, grad_out = (torch.randn(batch, HEADS, length, HEAD_DIM, generator=gen, device="cuda",
                                                 dtype=dtype) for _ in range(4))
                for t in (q, k, v):
                    t.requires_grad_(True)
                with torch.no_grad():  # any SDPA backend: the flash one may not exist on this GPU
                    reference = scaled_dot_product_attention(q, k, v, is_causal=causal)
                for name, attention in contenders.items():
                    result = measure(attention, q, k, v, grad_out, args)
                    if result is None:
                        continue
                    fwd_ms, step_ms, peak = result
                    with torch.no_grad():
                        diff = (attention(q, k, v).float() - reference.float()).abs().max().item()
                    print(f"{str(dtype).removeprefix('torch.'):9} {str(causal):6} {length:6d} {batch:3d} {name:13} "
                          f"{fwd_ms:8.3f} {tflops(fwd_ms, batch, length, causal, 1):8.1f} "
                          f"{step_ms:10.3f} {tflops(step_ms, batch, length, causal, 3.5):8.1f} {peak:9.1f} "
                          f"{diff:14.2e}", flush=True)
                del q, k, v, grad_out, reference
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
