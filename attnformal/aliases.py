"""The adapters' aliases (``--impl sdpa``, ``torch-tiled``, ...) by name, without importing torch: each
command line lists and checks them while parsing; :mod:`attnformal.adapters` maps them to its functions."""

# alias -> the function of attnformal.adapters that it names
FUNCTIONS = {
    "sdpa": "sdpa",
    "sdpa-math": "sdpa_math",
    "sdpa-flash": "sdpa_flash",
    "sdpa-efficient": "sdpa_efficient",
    "sdpa-cudnn": "sdpa_cudnn",
    "flex": "flex_eager",
    "flex-compiled": "flex_compiled",
    "torch-tiled": "torch_tiled",
    "torch-tiled-small": "torch_tiled_small",
    "torch-tiled-split": "torch_tiled_split",
    "ring": "ring",
    "triton-flash": "triton_flash",
    "flash-attn": "flash_attn",
    "flash-attn-varlen": "flash_attn_varlen",
    "xformers": "xformers",
    "npu": "npu_fusion_attention",
}
NAMES = tuple(FUNCTIONS)
