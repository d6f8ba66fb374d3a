"""A ``@triton.jit`` function lowered to TTIR on the CPU (no GPU): Triton's own front end and ``ttir`` stage.

The signature gives every pointer its element type and every integer ``i32`` with no
specialisation (no "equal to 1", no divisibility attributes), so the IR is the one a launch
compiles for any value of its runtime arguments below 2**31; the constexprs are the configuration.
"""

from __future__ import annotations

import re

from attnformal.ttir.parse import Function, parse_module

_POINTER = "*fp32"  # the element type matters to no theorem; float loads are value-opaque


def ttir_text(fn, constexprs: dict, pointer_types: dict | None = None) -> str:
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    pointer_types = pointer_types or {}
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = pointer_types.get(name, _POINTER if _is_pointer(fn, name) else "i32")
    source = ASTSource(fn, signature, constexprs)
    target = GPUTarget("cuda", 80, 32)  # any CUDA target lowers without a GPU
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                            backend.get_module_map(), context)
    stages = {}
    backend.add_stages(stages, options, source.language)
    return str(stages["ttir"](module, {}))


def _is_pointer(fn, name):
    """Triton's convention, as the kernels here follow it: tensor arguments are upper case."""
    return re.fullmatch(r'[A-Z][A-Z0-9_]*', name) is not None


def lower(fn, constexprs: dict, pointer_types: dict | None = None) -> Function:
    return parse_module(ttir_text(fn, constexprs, pointer_types))


__all__ = ["lower", "ttir_text"]
