"""Bad inputs of the commands that call a user's kernel (docs/verify.md, "Reliability"): each row of that
table is one test here -- the command, its exit code and its one-line message."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from attnformal.reference.__main__ import main as reference_main
from attnformal.spec import SpecError
from attnformal.testing import reference_attention
from attnformal.verify.__main__ import main as verify_main

KERNELS = '''
import sys
import torch
from attnformal.adapters import resolve

tiled = resolve("torch-tiled")


def exits(q, k, v, **kwargs):
    sys.exit(0)


def no_grad(q, k, v, **kwargs):
    with torch.no_grad():
        return tiled(q, k, v, **kwargs)


def no_lse(q, k, v, *, return_lse=False, **kwargs):
    if return_lse:
        raise NotImplementedError("no lse")
    return tiled(q, k, v, **kwargs)


def first_protocol(q, k, v, *, scale=None, causal=None, window=None, attn_mask=None, kv_lens=None, softcap=None,
                   dropout_p=0.0, dropout_mask=None, return_lse=False):
    """Written to the first protocol: no keyword for any feature added later (chunk_size, sinks, ...)."""
    kwargs = {"causal": causal, "window": window, "attn_mask": attn_mask, "kv_lens": kv_lens, "softcap": softcap,
              "dropout_mask": dropout_mask}
    return tiled(q, k, v, scale=scale, dropout_p=dropout_p, return_lse=return_lse,
                 **{name: value for name, value in kwargs.items() if value is not None})
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernels") / "kernels.py"
    path.write_text(KERNELS)
    return str(path)


@pytest.fixture(scope="module")
def golden_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "case.npz"
    assert reference_main(["generate", "--shape", "1,2,1,9,11,8", "--dtype", "fp32", "--causal", "bottom_right",
                           "--window", "5,2", "--seed", "1", "--out", str(path)]) == 0
    return str(path)


def check(capsys, golden_file, kernels, name, *extra):
    code = reference_main(["check", golden_file, "--impl", f"{kernels}:{name}", *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_reference_check_fails_a_kernel_that_calls_sys_exit(capsys, golden_file, kernels):
    code, text = check(capsys, golden_file, kernels, "exits")
    assert code == 1
    assert "FAIL: the implementation called sys.exit(0)" in text
    assert "Traceback" not in text


def test_reference_check_is_incomplete_when_no_gradient_was_checked(capsys, golden_file, kernels):
    code, text = check(capsys, golden_file, kernels, "no_grad")
    assert code == 3
    assert "INCOMPLETE: dq, dk, dv not checked" in text
    assert check(capsys, golden_file, kernels, "no_grad", "--forward-only")[0] == 0  # asked for less: PASS


def test_reference_check_is_incomplete_when_the_lse_was_not_checked(capsys, golden_file, kernels):
    code, text = check(capsys, golden_file, kernels, "no_lse")
    assert code == 3
    assert "INCOMPLETE: lse not checked" in text
    assert check(capsys, golden_file, kernels, "no_lse", "--no-lse")[0] == 0


def test_reference_check_passes_only_active_features_to_a_first_protocol_kernel(capsys, golden_file, kernels):
    code, text = check(capsys, golden_file, kernels, "first_protocol")
    assert "unexpected keyword" not in text
    assert code == 0, text


def test_reference_attention_refuses_dropout_without_its_mask():
    q = k = v = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    for certified in (False, True):
        with pytest.raises(SpecError, match="dropout_mask"):
            reference_attention(q, k, v, dropout_p=0.3, certified=certified)
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)  # the control: with its keep-mask it is honoured
    assert reference_attention(q, k, v, dropout_p=0.3, dropout_mask=keep).values["out"].shape == (1, 1, 4, 8)


class _RunsCode:
    """Unpickling this calls ``os.system``: what a crafted reproducer would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_replay_refuses_a_reproducer_that_would_run_code(capsys, tmp_path):
    marker = tmp_path / "ran"
    crafted = tmp_path / "crafted.pt"
    torch.save({"case": _RunsCode(marker)}, crafted)
    assert pickle.loads(pickle.dumps(_RunsCode(marker))) == 0 and marker.exists()  # the control: it does run
    marker.unlink()
    with pytest.raises(SystemExit) as exited:
        verify_main(["--impl", "sdpa-math", "--replay", str(crafted), "--repro-dir", str(tmp_path)])
    text = capsys.readouterr().err
    assert exited.value.code == 2
    assert "is refused: it holds more than tensors and plain values" in text
    assert not marker.exists()
