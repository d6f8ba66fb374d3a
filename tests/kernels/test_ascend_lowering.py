"""The triton-ascend lowering gate (tools/ascend_check.py) fails when a kernel cannot be lowered.

Runs under ``make ascend-check``, in the environment that has triton-ascend (it replaces the
``triton`` package, so elsewhere this module is skipped). Each negative control edits one line
of the real kernel module into a construct triton-ascend cannot lower, writes the edited copy
next to the test, and runs the gate's command line on it for one configuration: the gate must
fail and show the compiler's message. The unedited module, on the same configurations, passes.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.ascend.compiler",
                    reason="triton-ascend is not installed here: this module runs under `make ascend-check`")
if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    pytest.skip("TRITON_INTERPRET is set: the kernels would be interpreted, not compiled", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import ascend_check  # noqa: E402

KERNELS = ROOT / "kernels" / "triton_flash.py"

# (id, the line as shipped, the edit, a configuration that reaches it, what the gate must print)
EDITS = [
    # CUDA's default tl.dot precision: triton-ascend's front end refuses it.
    ("tf32_dot", 'return tl.dot(a, b, input_precision="ieee")', 'return tl.dot(a, b, input_precision="tf32")',
     "plain/float32/16x16", "input_precision == tf32 or tf32x3 is invalid"),
    # A GPU idiom, clamping masked-off pointers to the base with tl.where: triton-adapter-opt aborts.
    ("pointer_select",
     "flags = tl.load(base + offsets, mask=inside, other=0)",
     "flags = tl.load(tl.where(inside, base + offsets, base))",
     "mask_full/float16/16x16", "ttadapter (triton-adapter-opt) failed"),
    # PTX inline assembly on a row vector: triton-adapter-opt passes it through (on a 2-D tile it
    # aborts), so the gate's own CUDA-only check must catch it.
    ("ptx_exp2", "alpha = tl.exp(m_a - shift)",
     'alpha = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=f,f", [1.4426950408889634 * (m_a - shift)], '
     "dtype=tl.float32, is_pure=True, pack=1)",
     "plain/float32/16x16", "CUDA-only constructs survive: inline assembly"),
]


def gate(*args):
    out = io.StringIO()
    status = ascend_check.main(list(args), out=out)
    return status, out.getvalue()


@pytest.mark.parametrize("shipped, edit, config, message", [edit[1:] for edit in EDITS], ids=[e[0] for e in EDITS])
def test_an_edited_kernel_that_cannot_lower_fails_the_gate(tmp_path, shipped, edit, config, message):
    source = KERNELS.read_text()
    assert source.count(shipped) == 1, f"the line to edit is no longer in {KERNELS.name}: {shipped}"
    edited = tmp_path / "triton_flash_edited.py"
    edited.write_text(source.replace(shipped, edit))
    status, report = gate("--kernels", str(edited), "--config", config)
    assert status == 1, report
    assert message in report, report
    assert " 0 failed" not in report, report


def test_the_unedited_kernel_passes_on_the_controls_configurations():
    """The controls' positive twin: same configurations, the shipped module, a passing gate."""
    configs = sorted({edit[3] for edit in EDITS})
    status, report = gate(*(arg for config in configs for arg in ("--config", config)))
    assert status == 0, report
    assert f"ascend-check: {3 * len(configs)} passed, 0 failed" in report, report


def test_the_gate_refuses_to_run_on_interpreted_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    status, report = gate("--config", EDITS[0][3])
    assert status == 1 and "TRITON_INTERPRET is set" in report, report
