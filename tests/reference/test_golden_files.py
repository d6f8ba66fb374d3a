"""Golden files: round trip, validation of damaged files, and the CLI (generate, check, cancel)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch

from attnformal.reference import golden
from attnformal.reference.__main__ import main
from attnformal.reference.check import compare, ulp
from attnformal.testing import tolerance_for
from sigint import ctrl_c_reaches_python

BROKEN_IMPL = '''
from attnformal.kernels.torch_tiled import attention

def off_by_one_window(q, k, v, *, window=None, **kwargs):
    """A kernel bug: the left window edge is one key too narrow."""
    return attention(q, k, v, window=(window[0] - 1, window[1]), **kwargs)
'''


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "small.npz"
    argv = ["generate", "--shape", "2,4,2,37,45,16,8", "--dtype", "bf16", "--causal", "bottom_right",
            "--window", "20,3", "--kv-lens", "45,30", "--softcap", "15", "--dropout-p", "0.2",
            "--attn-mask-density", "0.9", "--seed", "5", "--out", str(path)]
    assert main(argv) == 0
    return path


def test_round_trip_keeps_the_exact_bits_and_the_reference(small_file):
    case = golden.load(small_file)
    x = golden.make_inputs((2, 4, 2, 37, 45, 16, 8), torch.bfloat16, 5, dropout_p=0.2, attn_mask_density=0.9)
    for name in golden.INPUTS:
        assert torch.equal(case.inputs[name].view(torch.int16), x[name].view(torch.int16))
    kwargs = case.protocol_kwargs()
    assert torch.equal(kwargs["dropout_mask"], x["dropout_mask"]) and torch.equal(kwargs["attn_mask"], x["attn_mask"])
    fresh = golden.generate(x, **{k: v for k, v in kwargs.items() if k not in ("attn_mask", "dropout_mask")})
    for name in ("out", "lse", "dq", "dk", "dv"):
        value, radius = case.reference[name]
        assert torch.equal(value, getattr(fresh, name)) and torch.equal(radius, getattr(fresh, f"{name}_radius"))
    assert case.meta["reference"]["tier"] == "float64" and case.spec.window == (20, 3)


def test_check_passes_a_correct_kernel_and_fails_a_broken_one(small_file, tmp_path, capsys):
    assert main(["check", str(small_file), "--impl", "attnformal.kernels.torch_tiled:attention"]) == 0
    good = capsys.readouterr().out
    assert good.strip().endswith("PASS") and "out    bfloat16" in good
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_IMPL)
    assert main(["check", str(small_file), "--impl", f"{broken}:off_by_one_window"]) == 1
    report = capsys.readouterr().out
    assert report.strip().endswith("FAIL")
    failing_out = next(line for line in report.splitlines() if line.startswith("out "))
    assert not failing_out.endswith(" 0/23680")  # out has failing elements, counted


def test_errors_are_reported_in_ulps_and_against_the_tolerance():
    ref = torch.tensor([1.0, 3.0, float("-inf"), 0.0], dtype=torch.float64)
    value = torch.tensor([1.0 + 2**-7, 3.0, float("-inf"), 2.0**-20], dtype=torch.bfloat16)
    zero = torch.zeros(4, dtype=torch.float64)
    strict = compare("x", value, ref, zero, rtol=0.0, atol=0.0)
    assert strict.failing == 2 and strict.worst_ratio == float("inf")  # -inf against -inf is exact
    assert strict.max_ulps == 0.5 and strict.max_error_at == (0,)  # 2^-7: half a bfloat16 ulp of max|ref| = 3
    assert compare("x", value[:1], ref[:1], zero[:1]).max_ulps == 1.0  # 1 + 2^-7: one bfloat16 ulp above 1
    allowed = compare("x", value, ref, zero, rtol=2.0**-7, atol=2.0**-21)  # atol counts in units of max|ref| = 3
    assert allowed.failing == 0 and 0.9 < allowed.worst_ratio < 1
    assert compare("x", value, ref, zero + 2.0**-7, rtol=0.0, atol=2.0**-21).failing == 0  # the golden radius counts
    assert float(ulp(torch.tensor([3.0], dtype=torch.float64), torch.float32)) == 2.0**-22


def damaged(path, tmp_path, how):
    out = tmp_path / f"{how}.npz"
    data = path.read_bytes()
    if how == "truncated":
        out.write_bytes(data[: len(data) // 2])
    elif how == "flipped_byte":
        raw = bytearray(data)
        raw[len(raw) // 3] ^= 0xFF
        out.write_bytes(bytes(raw))
    else:
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files}
        meta = json.loads(str(arrays.pop("meta")))
        if how == "edited_value":
            arrays["out"] = arrays["out"].copy()
            arrays["out"][0, 0, 0, 0] += 1e-3
        elif how == "mismatching_spec":
            meta["spec"]["window"] = [21, 3]
        elif how == "newer_version":
            meta["version"] = 2
        elif how == "missing_array":
            del arrays["dv_radius"]
            del meta["arrays"]["dv_radius"]
        np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    return out


@pytest.mark.parametrize("how, message", [
    ("truncated", "not a readable .npz archive"),
    ("flipped_byte", "not a readable .npz archive, or corrupt"),
    ("edited_value", "array 'out' does not match its SHA-256"),
    ("mismatching_spec", "the stored out does not match the stored spec and inputs at batch "),  # a sampled batch
    ("newer_version", "format version 2; this attnformal reads version 1"),
    ("missing_array", "'meta' lists no array 'dv_radius'"),
])
def test_a_damaged_file_gives_one_clear_error(small_file, tmp_path, capsys, how, message):
    path = damaged(small_file, tmp_path, how)
    with pytest.raises(golden.GoldenError, match="golden file .*: ") as err:
        golden.load(path)
    assert message in str(err.value)
    assert main(["check", str(path), "--impl", "attnformal.oracle:attention_oracle"]) == 2
    assert capsys.readouterr().err.startswith("error: golden file")


def test_an_unrelated_file_is_rejected(tmp_path):
    plain = tmp_path / "plain.npz"
    np.savez(plain, x=np.zeros(3))
    with pytest.raises(golden.GoldenError, match="no 'meta' entry"):
        golden.load(plain)
    with pytest.raises(golden.GoldenError, match="no such file"):
        golden.load(tmp_path / "absent.npz")
    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(golden.GoldenError, match="not a readable .npz archive"):
        golden.load(text)


@pytest.mark.parametrize("argv, message", [
    (["--shape", "1,2"], "argument --shape: expected B,Hq,Hkv,Sq,Sk,D[,Dv]"),
    (["--shape", "1,2,1,4,4,8", "--window", "3"], "argument --window: expected 2 comma-separated ints"),
    (["--shape", "1,2,1,4,4,8", "--kv-lens", "4,4"], "argument 'kv_lens': expected None or 1 ints"),
    (["--shape", "1,3,2,4,4,8"], "argument 'k': expected a KV head count that divides Hq=3"),
    (["--shape", "1,2,1,4,4,8", "--dropout-p", "1.5"], "argument 'dropout_p'"),
    (["--shape", "1,2,1,4,4,8", "--attn-mask-density", "2"], "argument --attn-mask-density: expected a fraction"),
    (["--shape", "1,2,1,4,4,8", "--prec", "8"], "argument 'prec'"),
])
def test_bad_generate_arguments_name_the_argument(tmp_path, capsys, argv, message):
    out = tmp_path / "never.npz"
    assert exit_code(["generate", *argv, "--dtype", "fp16", "--seed", "0", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def exit_code(argv) -> int:
    """``main``'s status, including argparse's own exit on a malformed option."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


def test_ctrl_c_cancels_a_long_generation_and_writes_nothing(tmp_path):
    out = tmp_path / "big.npz"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "attnformal.reference", "generate", "--shape",
                             "1,32,32,1024,1024,64", "--dtype", "fp32", "--seed", "1", "--out", str(out)],
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=ctrl_c_reaches_python)
    first_line = proc.stderr.readline()  # the estimate comes before any work on the case
    assert first_line.startswith("estimated time:"), first_line
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=600)[1]  # generous: a loaded machine is slow to unwind
    assert proc.returncode == 130
    assert "cancelled: nothing was written" in rest
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_format_is_a_plain_npz_with_json_meta(small_file):
    with zipfile.ZipFile(small_file) as archive:
        names = set(archive.namelist())
    assert {"meta.npy", "q_bits.npy", "out.npy", "out_radius.npy", "dropout_mask.npy"} <= names
    with np.load(small_file) as archive:
        meta = json.loads(str(archive["meta"]))
        assert archive["q_bits"].dtype == np.uint16 and meta["dtype"] == "bfloat16"
    assert meta["spec"]["kv_lens"] == [45, 30] and meta["seed"] == 5


def test_a_golden_file_carries_sinks_alibi_and_bias_and_their_gradients(tmp_path):
    """Saved and loaded with the features' tensors and d sinks, d bias; the torch-tiled kernel passes it,
    a kernel that leaves the sinks out fails it."""
    from reference_cases import sinks_alibi_bias

    x = golden.make_inputs((2, 2, 1, 9, 13, 16, 16), torch.float32, 7)
    features = sinks_alibi_bias(2, 2, 9, 13)
    result = golden.generate(x, causal="bottom_right", kv_lens=[13, 4], **features)
    path = tmp_path / "features.npz"
    golden.save(path, x, result, seed=7, generator={"test": "sinks_alibi_bias"})
    case = golden.load(path)
    kwargs = case.protocol_kwargs()
    assert set(case.reference) == {"out", "lse", "dq", "dk", "dv", "dsinks", "dbias"}
    assert torch.equal(kwargs["sinks"], features["sinks"].double()) and kwargs["bias"].dtype == torch.float64
    from attnformal.kernels.torch_tiled import attention
    from attnformal.reference.check import run_check

    report = run_check(case, attention)
    assert report.passed and {t.name for t in report.tensors} >= {"dsinks", "dbias"}, report
    without_sinks = run_check(case, lambda *a, sinks=None, **kw: attention(*a, **kw))
    assert not without_sinks.passed


BROKEN_CHUNK_IMPL = '''
from attnformal.kernels.torch_tiled import attention

def no_chunk(q, k, v, *, chunk_size=None, **kwargs):
    """A kernel bug: the chunk is dropped."""
    return attention(q, k, v, **kwargs)
'''


@pytest.mark.parametrize("flags, stored", [
    (["--chunk-size", "7", "--causal", "bottom_right", "--kv-lens", "23,17"], {"chunk_size": 7}),
    (["--prefix-lens", "0,23", "--causal", "top_left"], {"prefix_lens": [0, 23]}),
], ids=["chunk", "prefix"])
def test_golden_files_carry_the_chunk_and_the_prefix(tmp_path, capsys, flags, stored):
    """reference generate takes each feature's flag, the file stores it, check replays it: torch-tiled passes,
    a kernel that drops the feature fails (the negative control)."""
    path = tmp_path / "case.npz"
    assert main(["generate", "--shape", "2,2,1,19,23,8", "--dtype", "fp32", "--seed", "3", "--out", str(path),
                 *flags]) == 0
    case = golden.load(path)
    assert {name: case.meta["spec"][name] for name in stored} == stored
    assert main(["check", str(path), "--impl", "attnformal.kernels.torch_tiled:attention"]) == 0
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_CHUNK_IMPL.replace("chunk_size=None", f"{next(iter(stored))}=None"))
    assert main(["check", str(path), "--impl", f"{broken}:no_chunk"]) == 1
    capsys.readouterr()


def forged(path, tmp_path, name: str, edit) -> "Path":
    """A copy of the golden file with the array ``name`` replaced by ``edit(array, arrays)`` and its SHA-256
    recomputed, as a forger would: the hashes then say nothing."""
    with np.load(path) as archive:
        arrays = {n: archive[n] for n in archive.files}
    meta = json.loads(str(arrays.pop("meta")))
    arrays[name] = edit(arrays[name].copy(), arrays)
    meta["arrays"][name] = golden._describe(arrays[name])
    out = tmp_path / f"forged-{name}.npz"
    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    return out


def allowed_times(factor: float, name: str):
    """An edit setting ``name``'s radii to ``factor`` times what the check allows beyond them (bfloat16)."""
    def edit(radius, arrays):
        return golden.allowance(torch.from_numpy(arrays[name]), *tolerance_for(torch.bfloat16)).numpy() * factor
    return edit


def test_radii_looser_than_generate_accepts_are_refused(small_file, tmp_path, capsys):
    path = forged(small_file, tmp_path, "dv_radius", allowed_times(4, "dv"))
    with pytest.raises(golden.GoldenError, match="the radii are too loose to judge a bfloat16 kernel: dv's radius"):
        golden.load(path, verify=False)  # the rule alone, before any recomputation
    assert main(["check", str(path), "--impl", "torch-tiled"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generate refuses such radii" in err
    golden.load(small_file, verify=False)  # control: the file as written meets the rule


@pytest.mark.parametrize("name, edit, message", [
    ("dk", lambda dk, _: dk + 1e-2 * np.abs(dk).max(), "the stored dk does not match the stored spec and inputs at "
                                                       "batch "),
    ("out_radius", allowed_times(0.5, "out"), "the stored out's radius at batch "),  # within generate's rule
])
def test_a_forged_reference_is_refused_by_the_recomputation(small_file, tmp_path, capsys, name, edit, message):
    path = forged(small_file, tmp_path, name, edit)
    if name.endswith("_radius"):
        golden.load(path, verify=False)  # the rule alone lets it through: only the recomputation catches it
    with pytest.raises(golden.GoldenError, match=message):
        golden.load(path, sample_seed=11)
    assert main(["check", str(path), "--impl", "torch-tiled"]) == 2  # any seed: every group was edited
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: golden file") and message in err


def test_the_sample_is_seeded_and_printed_and_reaches_every_group(small_file, tmp_path, capsys):
    """One group's dk shifted: refused by the seeds that draw it, loaded by those that do not (the sample is
    what finds it); the seed is printed, and a genuine file passes under every seed."""
    spec = golden.load(small_file, verify=False).spec
    draws = {seed: golden.sampled_groups(spec, seed) for seed in range(40)}
    assert {group for groups in draws.values() for group in groups} == {(0, 0), (0, 1), (1, 0), (1, 1)}

    def shift_one_group(dk, _):
        dk[1, 0] += 1e-2 * np.abs(dk).max()
        return dk
    path = forged(small_file, tmp_path, "dk", shift_one_group)
    drawing = next(seed for seed, groups in draws.items() if (1, 0) in groups)
    missing = next(seed for seed, groups in draws.items() if (1, 0) not in groups)
    with pytest.raises(golden.GoldenError, match=r"the stored dk .* at batch 1, KV head 0"):
        golden.load(path, sample_seed=drawing)
    assert golden.load(path, sample_seed=missing).sample == (missing, draws[missing])
    assert main(["check", str(small_file), "--impl", "torch-tiled", "--sample-seed", str(drawing)]) == 0
    out = capsys.readouterr().out
    assert f"(--sample-seed {drawing})" in out and str(draws[drawing][0]) in out
