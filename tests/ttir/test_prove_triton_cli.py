"""``prove --triton`` refuses a kernel it has no launch description for, in one line naming the argument."""

from attnformal.prove import main


def test_unknown_kernel_is_refused(capsys):
    assert main(["--triton", "nosuch:thing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument '--triton'" in err[0] and "_attn_fwd" in err[0]


def test_a_file_is_matched_by_its_name_then_by_the_kernel_name():
    from attnformal.ttir.cli import launch_for
    from attnformal.ttir.launch import FORWARD, TRITON_TUTORIAL

    assert launch_for("/anywhere/06-fused-attention.py:_attn_fwd") is TRITON_TUTORIAL
    assert launch_for("/tmp/planted_flash.py:_attn_fwd") is FORWARD  # a copy of the project's kernel


def test_a_module_that_does_not_import_here_gives_its_jit_functions_alone(tmp_path):
    """The Triton tutorial asks for a GPU driver at import: its kernels still lower, and no host code runs."""
    import pytest

    pytest.importorskip("triton")
    from attnformal.ttir.theorems import load_attr

    path = tmp_path / "needs_gpu.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef helper(x):\n    return x + 1\n\n\n"
                    "raise RuntimeError('no GPU here')\n\n\n@triton.autotune([], key=[])\n@triton.jit\n"
                    "def kernel(X, n):\n    tl.store(X, helper(n))\n")
    kernel = load_attr(f"{path}:kernel")  # a JITFunction, or an InterpretedFunction under TRITON_INTERPRET=1
    assert kernel.arg_names == ["X", "n"] and kernel.fn.__globals__["helper"].arg_names == ["x"]
