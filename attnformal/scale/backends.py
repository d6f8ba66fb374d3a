"""Which backend actually ran: read from the operators the profiler saw, not assumed.

One ``scaled_dot_product_attention`` call dispatches to a different kernel depending on
shape, dtype, mask and device, and falls back silently. Each dispatch target is a distinct
aten operator, so the operators recorded during the call name the backend that ran. On
CUDA the device kernel names are recorded as well (``flash_fwd_kernel``, ``fmha_cutlass``,
``cudnn`` ...). The project's kernels have no such dispatch: their backend is the schedule
they were launched with, which the harness passes in and records.
"""

from __future__ import annotations

# aten operator (the dispatch target) -> backend name.
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (out-of-tree device)",
}
# Ascend: torch_npu's fused attention operators (names as the profiler records them).
NPU_MARKERS = ("npu_fusion_attention", "npu_flash_attention", "npu_prompt_flash_attention",
               "npu_incre_flash_attention")
# Substrings of CUDA kernel names that identify an attention kernel.
KERNEL_MARKERS = ("flash", "fmha", "cudnn", "attention", "sdpa")


def backend_from_ops(ops, kernels=()) -> str:
    """The attention backend(s) among host operator names ``ops`` and device ``kernels``."""
    found = [name for op, name in SDPA_OPS.items() if op in ops]
    found += sorted({op for op in ops if any(m in op for m in NPU_MARKERS)})
    found += sorted({_short(k) for k in kernels if any(m in k.lower() for m in KERNEL_MARKERS)})
    return " + ".join(found) if found else "no SDPA/fused attention op (composed of aten ops)"


def _short(kernel: str, width: int = 48) -> str:
    """A device kernel name without its template arguments."""
    name = kernel.split("<", 1)[0].split("(", 1)[0]
    return name if len(name) <= width else name[:width - 3] + "..."
