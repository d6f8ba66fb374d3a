"""Bad inputs of the commands that call a user's kernel (docs/verify.md, "Reliability"): each row of that
table is one test here -- the command, its exit code and its one-line message. Kernels that hang run under a
timeout of TIMEOUT seconds; they sleep an hour, so only the timeout ends them."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from attnformal.reference.__main__ import main as reference_main
from attnformal.scale.cli import main as scale_main
from attnformal.spec import SpecError
from attnformal.testing import reference_attention
from attnformal.verify.__main__ import main as verify_main

pytest_plugins = ["pytester"]
TIMEOUT = 1.0  # seconds; a sleeping kernel is stopped after it (a loaded machine may add a little)

KERNELS = '''
import ctypes
import os
import sys
import time
import torch
from attnformal.adapters import resolve

tiled = resolve("torch-tiled")


def exits(q, k, v, **kwargs):
    sys.exit(0)


def os_exits(q, k, v, **kwargs):
    os._exit(0)


def segfaults(q, k, v, **kwargs):
    ctypes.string_at(0)


def sleeps(q, k, v, **kwargs):
    time.sleep(3600)


def supports_nothing(q, k, v, **kwargs):
    raise NotImplementedError("nothing")


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


@pytest.mark.parametrize("isolate", ["--isolate", "--no-isolate"])
@pytest.mark.parametrize("name, how", [("exits", "sys.exit(0)"), ("os_exits", "os._exit(0)")])
def test_reference_check_fails_a_kernel_that_exits_the_process(capsys, golden_file, kernels, name, how, isolate):
    code, text = check(capsys, golden_file, kernels, name, isolate)
    assert code == 1, text
    assert f"FAIL: the implementation exited the process (status 0: {how})" in text
    assert "Traceback" not in text


def test_a_module_that_exits_while_it_is_imported_is_a_usage_error(capsys, tmp_path, golden_file):
    module = tmp_path / "exits_at_import.py"
    module.write_text("import sys\nsys.exit(0)\n\ndef attention(q, k, v, **kwargs):\n    pass\n")
    message = f"argument '--impl': {module} failed to import: exited the process (status 0: sys.exit(0))"
    assert reference_main(["check", golden_file, "--impl", f"{module}:attention"]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        verify_main(["--impl", f"{module}:attention", "--repro-dir", str(tmp_path)])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_reference_check_of_a_kernel_that_supports_nothing_verified_nothing(capsys, golden_file, kernels):
    code, text = check(capsys, golden_file, kernels, "supports_nothing")
    assert code == 3 and "NOTHING VERIFIED: the implementation does not support this case (nothing)" in text


def test_reference_check_fails_a_kernel_that_crashes_or_hangs(capsys, golden_file, kernels):
    code, text = check(capsys, golden_file, kernels, "segfaults")  # isolated: the default for FILE.py:FUNC
    assert code == 1 and "FAIL: the implementation crashed: signal SIGSEGV while running the implementation" in text
    code, text = check(capsys, golden_file, kernels, "sleeps", "--case-timeout", str(TIMEOUT))
    assert code == 1 and f"FAIL: the implementation timed out after {TIMEOUT:g} s (--case-timeout)" in text
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


def scale(capsys, tmp_path, impl, *extra):
    out = tmp_path / "scale"
    code = scale_main(["--impl", impl, "--sweep", "N=32,64", "--block-m", "32", "--block-n", "32", "--head-dim", "8",
                       "--repeats", "2", "--min-time", "0", "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err, out


@pytest.mark.parametrize("name, isolate, message", [
    ("exits", "--no-isolate", "the implementation exited the process (status 0: sys.exit(0)) while running"),
    ("os_exits", "--no-isolate", "the implementation exited the process (status 0: os._exit(0)) while running"),
    ("os_exits", "--isolate", "the implementation exited the process (status 0: os._exit(0)) while running"),
    ("segfaults", "--isolate", "the implementation crashed: signal SIGSEGV while running"),
    ("sleeps", "--isolate", f"the implementation timed out after {TIMEOUT:g} s (--case-timeout) while running"),
])
def test_scale_fails_a_kernel_that_exits_crashes_or_hangs_and_writes_nothing(capsys, tmp_path, kernels, name,
                                                                              isolate, message):
    code, text, out = scale(capsys, tmp_path, f"{kernels}:{name}", isolate, "--case-timeout", str(TIMEOUT))
    assert code == 1, text
    assert f"FAIL: {message}" in text and "on a 1-token problem (mask dense)" in text
    assert "Traceback" not in text and not (out / "sweep.json").exists()


def test_scale_of_a_kernel_that_supports_nothing_verified_nothing(capsys, tmp_path, kernels):
    code, text, out = scale(capsys, tmp_path, f"{kernels}:supports_nothing")
    assert code == 3 and "every point was refused (unsupported: nothing)" in text, text  # not FAIL's 1, nor 0


def verify(capsys, impl, tmp_path, *extra):
    code = verify_main(["--impl", impl, "--dtypes", "float32", "--repro-dir", str(tmp_path), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_verify_fails_a_kernel_that_exits_or_hangs(capsys, tmp_path, kernels):
    for isolate in ("--isolate", "--no-isolate"):
        code, text = verify(capsys, f"{kernels}:os_exits", tmp_path, "--only", "hand.uniform_logits", isolate)
        assert code == 1 and "the implementation exited the process (status 0: os._exit(0))" in text
    code, text = verify(capsys, f"{kernels}:sleeps", tmp_path, "--only", "hand.uniform_logits", "--case-timeout",
                        str(TIMEOUT))
    assert code == 1 and f"the implementation timed out after {TIMEOUT:g} s (--case-timeout) while running" in text


def test_the_pytest_plugin_keeps_its_verdict_under_k(pytester, kernels):
    from test_pytest_plugin import load_plugin

    args = (*load_plugin(), "-p", "no:cacheprovider", "--attn-dtypes", "float32", "--attn-impl",
            f"{kernels}:supports_nothing")
    result = pytester.runpytest_inprocess(*args, "-k", "fwd.random")
    assert result.ret == 1, result.stdout.str()  # was: "1 skipped, 54 deselected", exit 0
    result.assert_outcomes(skipped=1, failed=1, deselected=result.parseoutcomes()["deselected"])
    assert "verdict: NOTHING VERIFIED" in result.stdout.str()
    result = pytester.runpytest_inprocess(*args, "-k", "verdict")  # no check selected: nothing runs, never a PASS
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


FIRST_PROTOCOL_CHECKS = ("hand.uniform_logits", "mask.window", "mask.kv_lens", "fwd.softcap")


def test_every_command_passes_only_active_features_to_a_first_protocol_kernel(capsys, pytester, tmp_path, kernels,
                                                                               golden_file):
    impl = f"{kernels}:first_protocol"
    code, text = check(capsys, golden_file, kernels, "first_protocol")
    assert code == 0 and "unexpected keyword" not in text, text
    code, text = verify(capsys, impl, tmp_path, *(f"--only={name}" for name in FIRST_PROTOCOL_CHECKS))
    assert code == 0 and "verdict: PASS" in text and "unexpected keyword" not in text, text
    code, text, out = scale(capsys, tmp_path, impl, "--mask", "dense", "causal", "window:16", "--overhead-factor", "0",
                            "--sweep", "N=32..256", "--per-octave", "1")  # four points: enough for a fit
    assert code == 0 and "unexpected keyword" not in text and (out / "sweep.json").exists(), text
    from test_pytest_plugin import load_plugin

    result = pytester.runpytest_inprocess(*load_plugin(), "-p", "no:cacheprovider", "--attn-dtypes", "float32",
                                          "--attn-impl", impl, "--attn-only", ",".join(FIRST_PROTOCOL_CHECKS))
    assert result.ret == 0 and "unexpected keyword" not in result.stdout.str(), result.stdout.str()
    result.assert_outcomes(passed=len(FIRST_PROTOCOL_CHECKS) + 1)  # and the verdict


def test_an_internal_error_exits_4_not_1(capsys, monkeypatch, golden_file, tmp_path):
    def defect(*args, **kwargs):
        raise RuntimeError("a defect")

    monkeypatch.setattr("attnformal.reference.check.format_report", defect)
    code = reference_main(["check", golden_file, "--impl", "torch-tiled"])
    text = capsys.readouterr().err
    assert code == 4 and "internal error: RuntimeError: a defect" in text and "Traceback" not in text
    monkeypatch.setattr("attnformal.scale.sweep.run_sweep", defect)
    code, text, _ = scale(capsys, tmp_path, "torch-tiled")
    assert code == 4 and "internal error: RuntimeError: a defect" in text and "Traceback" not in text
    monkeypatch.setattr("attnformal.verify.runner._conclude", defect)  # inside a check here (--jobs 1): an ERROR
    code, text = verify(capsys, "sdpa-math", tmp_path, "--only", "hand.uniform_logits", "--jobs", "1")
    assert code == 4 and "verdict: INTERNAL ERROR" in text and "the battery itself raised in" in text
