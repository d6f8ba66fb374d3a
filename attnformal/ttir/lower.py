"""A ``@triton.jit`` function lowered to TTIR on the CPU (no GPU): Triton's own front end and ``ttir`` stage.

The signature gives every pointer its element type and every integer ``i32`` with no
specialisation (no "equal to 1", no divisibility attributes), so the IR is the one a launch
compiles for any value of its runtime arguments below 2**31; the constexprs are the configuration.
"""

from __future__ import annotations

import inspect
import re

from attnformal.ttir.parse import Function, parse_module

_POINTER = "*fp32"  # the element type matters to no theorem; float loads are value-opaque


# GPUTarget's arguments per target: any CUDA target lowers without a GPU, triton-ascend's front end without an NPU
DEVICES = {"cuda": ("cuda", 80, 32), "ascend": ("npu", "Ascend910B3", 0)}
TARGETS = tuple(DEVICES)


def ttir_text(fn, constexprs: dict, pointer_types: dict | None = None, target: str = "cuda") -> str:
    """The kernel's TTIR for one configuration, from the installed Triton's front end and ``ttir`` stage:
    ``"cuda"`` (sm_80), or ``"ascend"`` (Ascend 910B3: triton-ascend, which replaces the ``triton`` package)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    pointer_types = pointer_types or {}
    types = {name: "constexpr" if name in constexprs else
             pointer_types.get(name, _POINTER if _is_pointer(fn, name) else "i32") for name in fn.arg_names}
    device = GPUTarget(*DEVICES[target])
    backend = make_backend(device)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    stages = {}
    if "target" in inspect.signature(ASTSource.make_ir).parameters:  # Triton >= 3.3
        source = ASTSource(fn, types, constexprs)
        module = source.make_ir(device, options, backend.get_codegen_implementation(options),
                                backend.get_module_map(), context)
        backend.add_stages(stages, options, source.language)
    else:  # Triton 3.2 (triton-ascend 3.2.0): constexprs are not in the signature
        source = ASTSource(fn, {n: t for n, t in types.items() if t != "constexpr"}, dict(constexprs))
        module = source.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
        backend.add_stages(stages, options)
    return str(stages["ttir"](module, {"hash": "attnformal", "target": device, **options.__dict__}))


def _is_pointer(fn, name):
    """Triton's convention, as the kernels here follow it: tensor arguments are upper case."""
    return re.fullmatch(r'[A-Z][A-Z0-9_]*', name) is not None


def jitted(fn):
    """The ``@triton.jit`` function under ``@triton.heuristics`` / ``@triton.autotune`` (each keeps it as ``.fn``)."""
    from triton.runtime.jit import JITFunction

    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def lower(fn, constexprs: dict, pointer_types: dict | None = None, target: str = "cuda") -> Function:
    fn = jitted(fn)
    return parse_module(ttir_text(fn, constexprs, pointer_types, target),
                        [name for name in fn.arg_names if name not in constexprs])


__all__ = ["TARGETS", "lower", "ttir_text"]
