"""``python -m attnformal.reference`` as a new user meets it: bad input, the --impl grammar, the
implementation's failures, refusals before long work, and where and how the file is written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from attnformal.reference import cost, golden
from attnformal.reference.__main__ import _parser, main
from attnformal.reference.check import compare

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--shape", "1,2,1,9,11,8", "--dtype", "bf16", "--seed", "4"]
CASE = (1, 2, 1, 9, 11, 8, 8)  # TINY's shape (Dv = D)
IMPLS = '''
import torch
from attnformal.kernels.torch_tiled import attention

def returns_none(q, k, v, **kwargs):
    return None

def raises(q, k, v, **kwargs):
    raise RuntimeError("kernel exploded")

def wrong_shape(q, k, v, **kwargs):
    return torch.zeros(3)

def forward_only(q, k, v, **kwargs):
    with torch.no_grad():
        return attention(q, k, v, **kwargs)

def off_by_a_bit(q, k, v, **kwargs):
    out = attention(q, k, v, **kwargs)
    return (out[0] * 1.25, out[1]) if isinstance(out, tuple) else out * 1.25
'''


def run(argv) -> int:
    """``main``'s exit status, argparse's own exits included."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


def one_error_line(capsys, *fragments) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err  # one line, no traceback
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "tiny.npz"
    assert main(["generate", *TINY, "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def impls(tmp_path_factory):
    path = tmp_path_factory.mktemp("impls") / "impls.py"
    path.write_text(IMPLS)
    return path


# ---------------------------------------------------------------- check: tolerances and --impl


@pytest.mark.parametrize("option", ["--rtol", "--atol"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "x"])
def test_a_tolerance_that_would_pass_anything_is_a_usage_error(tiny_file, impls, capsys, option, value):
    assert run(["check", str(tiny_file), "--impl", f"{impls}:off_by_a_bit", f"{option}={value}"]) == 2
    one_error_line(capsys, f"argument {option}: expected a finite number >= 0")


def test_the_tolerance_arguments_still_judge(tiny_file, impls, capsys):
    """Negative control: the kernel off by 25 % fails under the defaults and under a finite tolerance."""
    assert run(["check", str(tiny_file), "--impl", f"{impls}:off_by_a_bit"]) == 1
    assert run(["check", str(tiny_file), "--impl", f"{impls}:off_by_a_bit", "--rtol", "0.01", "--atol", "0"]) == 1
    assert run(["check", str(tiny_file), "--impl", f"{impls}:off_by_a_bit", "--rtol", "1", "--atol", "1"]) == 0
    assert capsys.readouterr().out.count("FAIL") == 2


@pytest.mark.parametrize("rtol, atol", [(float("nan"), 0.0), (0.0, -1.0), (float("inf"), 0.0), (True, 0.0)])
def test_compare_rejects_tolerances_that_would_pass_anything(rtol, atol):
    ref = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="argument '(rtol|atol)': expected a finite number >= 0"):
        compare("out", ref.to(torch.float32) * 2, ref, torch.zeros(3, dtype=torch.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("target", ["torch-tiled", "sdpa", "attnformal.kernels.torch_tiled:attention",
                                    "kernels/torch_tiled.py:attention"])
def test_check_takes_the_impl_grammar_of_verify_and_scale(tiny_file, capsys, target):
    """Aliases, MODULE:FUNC and FILE.py:FUNC, through attnformal.adapters.resolve."""
    target = str(ROOT / target) if target.startswith("kernels/") else target
    no_lse = ["--no-lse"] if target == "sdpa" else []  # SDPA has no lse: unchecked lse is INCOMPLETE unless waived
    assert run(["check", str(tiny_file), "--impl", target, *no_lse]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("PASS") and "dq     bfloat16" in out
    if target == "sdpa":  # checked without it, and said so
        assert "lse    skipped: not supported (torch SDPA does not return the log-sum-exp)" in out


@pytest.mark.parametrize("fn, message", [
    ("returns_none", "FAIL: the implementation's out is NoneType, expected a tensor of shape [1, 2, 9, 8]"),
    ("raises", "FAIL: the implementation raised RuntimeError: kernel exploded"),
    ("wrong_shape", "FAIL: the implementation's out has shape [3], expected [1, 2, 9, 8]"),
])
def test_an_implementation_that_breaks_the_protocol_fails_in_one_line(tiny_file, impls, capsys, fn, message):
    assert run(["check", str(tiny_file), "--impl", f"{impls}:{fn}"]) == 1
    captured = capsys.readouterr()
    assert message in captured.out and "Traceback" not in captured.out + captured.err


def test_a_forward_only_implementation_is_checked_without_gradients(tiny_file, impls, capsys):
    assert run(["check", str(tiny_file), "--impl", f"{impls}:forward_only"]) == 3  # not asked: INCOMPLETE
    assert "INCOMPLETE: dq, dk, dv not checked" in capsys.readouterr().out
    assert run(["check", str(tiny_file), "--impl", f"{impls}:forward_only", "--forward-only"]) == 0
    out = capsys.readouterr().out
    assert "dq     skipped: the output is not differentiable (forward only)" in out
    assert "out    bfloat16" in out and out.rstrip().endswith("PASS")


@pytest.mark.parametrize("argv, fragments", [
    (["--impl", "sdpa-fastest"], ["argument '--impl': expected one of sdpa"]),
    (["--impl", "nosuch.module:f"], ["argument '--impl': cannot import"]),
    (["--impl", "torch-tiled", "--device", "nodevice"], ["argument --device: 'nodevice' is not usable here"]),
])
def test_bad_check_arguments_name_the_argument(tiny_file, capsys, argv, fragments):
    assert run(["check", str(tiny_file), *argv]) == 2
    one_error_line(capsys, *fragments)


def test_check_of_a_folder_or_a_missing_file(tmp_path, capsys):
    assert run(["check", str(tmp_path), "--impl", "torch-tiled"]) == 2
    one_error_line(capsys, "argument FILE:", "is a folder")
    assert run(["check", str(tmp_path / "absent.npz"), "--impl", "torch-tiled"]) == 2
    one_error_line(capsys, "no such file")


# ---------------------------------------------------------------- generate: arguments


@pytest.mark.parametrize("shape", ["0,2,1,9,11,8", "1,0,1,9,11,8", "1,2,1,0,11,8", "1,2,1,9,0,8", "1,2,1,9,11,0",
                                   "1,2,1,9,11,8,0"])
def test_a_zero_size_dimension_is_refused(tmp_path, capsys, shape):
    out = tmp_path / "zero.npz"
    assert run(["generate", "--shape", shape, "--dtype", "bf16", "--seed", "0", "--out", str(out)]) == 2
    one_error_line(capsys, "argument --shape: expected B,Hq,Hkv,Sq,Sk,D[,Dv] (6 or 7 sizes >= 1)", "(0 < 1)")
    assert not out.exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--seed", "99999999999999999999999"], "argument --seed: expected an int in [0, 2^64)"),
    (["--seed", "-1"], "argument --seed"),
    (["--input-scale", "nan"], "argument --input-scale: expected a finite number >= 0"),
    (["--input-scale", "-2"], "argument --input-scale: expected a finite number >= 0"),
    (["--max-radius", "inf"], "argument --max-radius: expected a finite number > 0"),
    (["--max-radius", "0"], "argument --max-radius: expected a finite number > 0"),
    (["--softcap", "-1"], "argument --softcap: expected a finite number > 0"),
    (["--scale", "nan"], "argument --scale: expected a finite number"),
    (["--dropout-p", "nan"], "argument --dropout-p"),
    (["--window", "1,2,3"], "argument --window: expected 2 comma-separated ints L,R"),
    (["--sinks", "0.5,x"], "argument --sinks: expected comma-separated floats"),
    (["--sinks", "0.5,0.5,0.5"], "argument 'sinks': expected shape [Hq=2]"),
    (["--alibi-slopes", "nan,1"], "argument --alibi-slopes: expected comma-separated floats"),
])
def test_bad_generate_values_get_one_line_naming_the_argument(tmp_path, capsys, argv, fragment):
    out = tmp_path / "never.npz"
    seed = [] if "--seed" in argv else ["--seed", "0"]
    assert run(["generate", "--shape", "1,2,1,9,11,8", "--dtype", "bf16", *seed, *argv, "--out", str(out)]) == 2
    one_error_line(capsys, fragment)
    assert not out.exists()


def test_lists_take_spaces_and_commas_alike():
    parse = _parser().parse_args
    commas = parse(["generate", "--shape", "1,2,1,9,11,8", "--window", "-1,5", "--kv-lens", "11", "--dtype", "bf16",
                    "--seed", "0", "--out", "x.npz"])
    spaces = parse(["generate", "--shape", "1", "2", "1", "9", "11", "8", "--window", "-1", "5", "--kv-lens", "11",
                    "--dtype", "bf16", "--seed", "0", "--out", "x.npz"])
    quoted = parse(["generate", "--shape", "1, 2, 1, 9, 11, 8", "--window", "-1 5", "--kv-lens", "11", "--dtype",
                    "bf16", "--seed", "0", "--out", "x.npz"])
    assert commas.shape == spaces.shape == quoted.shape == [1, 2, 1, 9, 11, 8]
    assert commas.window == spaces.window == quoted.window == [-1, 5]


# ---------------------------------------------------------------- generate: refusals before the work


@pytest.fixture
def no_generation(monkeypatch):
    """Fail the test if the reference is computed (a refusal must come first)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the reference was computed before the refusal")
    monkeypatch.setattr(golden, "generate", forbidden)


def test_a_case_whose_file_cannot_fit_is_refused_with_the_numbers(tmp_path, capsys, no_generation):
    out = tmp_path / "huge.npz"
    assert run(["generate", "--shape", "64,64,64,1000000,1000000,256", "--dtype", "bf16", "--seed", "0",
                "--out", str(out)]) == 2
    err = one_error_line(capsys, "argument --shape: the golden file's arrays alone take", "TiB of memory",
                         "are available")
    assert golden.file_bytes((64, 64, 64, 10**6, 10**6, 256, 256), torch.bfloat16, attn_mask=False,
                             dropout=False) > 2**40, err
    assert not out.exists()


def test_the_file_size_counts_every_array(tiny_file):
    with np.load(tiny_file) as archive:
        stored = sum(archive[name].nbytes for name in archive.files if name != "meta")
    assert golden.file_bytes(CASE, torch.bfloat16, attn_mask=False, dropout=False) == stored


def test_a_case_whose_sampled_peak_exceeds_the_memory_is_refused(tmp_path, capsys, monkeypatch):
    """The extrapolated peak of the sampled runs against what is available, before the full run."""
    estimate = cost.Estimate(3600.0, 50 * 2**30, (32, 64), None)
    monkeypatch.setattr(cost, "estimate", lambda run, len_q, memory: estimate)
    monkeypatch.setattr(cost, "available_memory", lambda: 8 * 2**30)
    out = tmp_path / "big.npz"
    assert run(["generate", *TINY, "--out", str(out)]) == 2
    one_error_line(capsys, "argument --shape: this case needs about 50.0 GiB of memory at its peak, 8.0 GiB are "
                           "available (and about 1.0 h; extended from runs of 32 and 64 query rows)")
    assert not out.exists()


def test_an_input_scale_that_makes_the_radii_useless_is_refused(tmp_path, capsys):
    out = tmp_path / "extreme.npz"
    assert run(["generate", *TINY, "--input-scale", "1e30", "--out", str(out)]) == 2
    one_error_line(capsys, "argument --input-scale: the radii are too loose to judge a bfloat16 kernel",
                   "Logits this large (--input-scale 1e+30)", "--max-radius")
    assert not out.exists()
    assert run(["generate", *TINY, "--input-scale", "10", "--out", str(out)]) == 0  # control: a large, useful one
    assert out.is_file()


# ---------------------------------------------------------------- generate: where the file goes


def test_out_never_replaces_a_device_or_a_folder(tmp_path, capsys, no_generation):
    assert run(["generate", *TINY, "--out", os.devnull]) == 2
    one_error_line(capsys, f"argument --out: '{os.devnull}' is not a regular file")
    assert Path(os.devnull).is_char_device()
    assert run(["generate", *TINY, "--out", str(tmp_path)]) == 2
    one_error_line(capsys, "is a folder, expected a file name")
    assert run(["generate", *TINY, "--out", str(tmp_path / "absent" / "x.npz")]) == 2
    one_error_line(capsys, "argument --out: the folder", "does not exist")
    (tmp_path / "plain").write_text("")
    assert run(["generate", *TINY, "--out", str(tmp_path / "plain" / "x.npz")]) == 2
    one_error_line(capsys, "is not a folder")


def test_out_in_a_folder_that_cannot_be_written_is_refused_first(tmp_path, capsys, no_generation, monkeypatch):
    def denied(*args, **kwargs):  # the test may run as root, for whom permission bits mean nothing
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("tempfile.mkstemp", denied)
    assert run(["generate", *TINY, "--out", str(tmp_path / "x.npz")]) == 2
    one_error_line(capsys, "argument --out: cannot create a file in", "Permission denied")


def test_out_replaces_a_symlink_never_its_target(tmp_path, tiny_file):
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    assert main(["generate", *TINY, "--out", str(link)]) == 0
    assert target.read_text() == "keep me"
    assert not link.is_symlink() and link.read_bytes() == tiny_file.read_bytes()  # the same seeded case


def test_out_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    out = tmp_path / "case.npz"
    out.write_bytes(b"the previous file")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez_compressed", disk_full)
    assert main(["generate", *TINY, "--out", str(out)]) == 4  # an internal error, not FAIL's 1 nor a traceback
    assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == b"the previous file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.npz"]  # no temporary file left behind


# ---------------------------------------------------------------- the estimate


class SyntheticClock:
    """The seconds a synthetic run says it took, whatever the machine's speed or load: the estimates
    below are judged against what the estimator measured, never against wall time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    synthetic = SyntheticClock()
    monkeypatch.setattr(cost, "clock", synthetic)
    return synthetic


def test_the_estimate_extends_the_linear_regime_not_the_cold_call(clock):
    """A synthetic case: a cold first call of 0.2 s, a fixed 2 ms per call, 1 ms and 64 KiB per row
    in blocks of 8 rows. The estimate must land near the truth, not near 0.2 s x Sq."""
    calls = []

    def run(rows, progress):
        cold = not calls
        calls.append(rows)
        data = bytearray(rows * 2**16)  # zero-filled, so resident
        clock.sleep(0.2 * cold + 0.002 + 0.001 * rows)
        blocks = -(-rows // 8)
        for done in range(1, blocks + 1):
            progress(done, blocks)
        return len(data)

    estimate = cost.estimate(run, 4096)
    assert len(calls) >= 4 and calls[:2] == [1, 1]  # a cold call, then warm ones
    assert estimate.rows[0] >= 16  # the line's lower sample spans at least two blocks
    assert 0.5 * 4.1 < estimate.seconds < 2 * 4.1  # truth: 2 ms + 4096 ms
    if estimate.peak_bytes is not None:
        # the peak is the process's own measured memory (the suite's other allocations come and go): 4x, not 2x
        assert 0.5 * 4096 * 2**16 < estimate.peak_bytes < 4 * 4096 * 2**16
    assert cost.estimate(run, 8) is None  # too few rows to sample


def test_an_estimate_from_rows_that_cost_nothing_extra_does_not_promise_a_quick_run(clock):
    """The certified reference's shape: 0.1 s per call, and the first 8 rows cost nothing extra
    (vector units absorb them), 1 ms per row beyond. Sampling 1 and 2 rows sees no growth; a
    line through them promised ~0.1 s for a 2 s case (seen on CI: a 36 s golden file announced
    as quick). The estimate must not fall below the truth."""
    def run(rows, progress):
        clock.sleep(0.1 + 0.001 * max(0, rows - 8))
        progress(1, 1)
        return rows

    estimate = cost.estimate(run, 2048)
    truth = 0.1 + 0.001 * 2040
    assert 0.8 * truth < estimate.seconds < 5 * truth, estimate
    assert "in proportion to a run of" in estimate.describe() or estimate.growing


def test_a_memory_refusal_rests_on_samples_spanning_two_blocks(monkeypatch):
    """Scratch memory grows with the rows only up to a block of 64 rows; sampling within one
    block would extend that growth to all 4096 rows. With no time budget at all, sampling
    stops at the first pair -- unless the memory available is exceeded, when it goes on until
    its smaller run spans two blocks."""
    def run(rows, progress):
        scratch = bytearray(min(rows, 64) * 2**18)  # zero-filled, so resident
        blocks = -(-rows // 64)
        for done in range(1, blocks + 1):
            progress(done, blocks)
        return len(scratch)

    monkeypatch.setattr(cost, "QUICK_S", 0.0)
    monkeypatch.setattr(cost, "SAMPLED_SHARE", 0.0)
    quick, careful = cost.estimate(run, 4096), cost.estimate(run, 4096, memory=2**20)
    assert quick.rows == (1, 2) and careful.rows == (128, 256)
    if careful.peak_bytes is not None:
        assert careful.peak_bytes < 4 * 64 * 2**18 < quick.peak_bytes


# ---------------------------------------------------------------- help


@pytest.mark.parametrize("argv", [[], ["generate"], ["check"]])
def test_help_fits_a_screen_with_an_example_and_the_docs_page(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert run([*argv, "--help"]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 40, text
    assert "example:\n  python -m attnformal.reference " in text
    assert "docs: docs/references-and-scale.md" in text and (ROOT / "docs" / "references-and-scale.md").is_file()


def test_generate_takes_sinks_and_alibi_slopes_and_check_judges_their_gradients(tmp_path, capsys):
    """--sinks and --alibi-slopes reach the golden file; torch-tiled passes it, including d sinks."""
    path = tmp_path / "sinks.npz"
    assert main(["generate", "--shape", "2,2,1,9,11,16", "--dtype", "fp32", "--seed", "3", "--causal", "bottom_right",
                 "--sinks", "0.5,-inf", "--alibi-slopes", "0.25,0.125", "--out", str(path)]) == 0
    case = golden.load(path)
    assert case.spec.sinks.tolist() == [0.5, float("-inf")] and case.spec.alibi_slopes[1].tolist() == [0.25, 0.125]
    assert "dsinks" in case.reference and "dbias" not in case.reference
    capsys.readouterr()
    assert main(["check", str(path), "--impl", "attnformal.kernels.torch_tiled:attention"]) == 0
    report = capsys.readouterr().out
    assert "dsinks" in report and report.strip().endswith("PASS")
