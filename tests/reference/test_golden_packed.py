"""Golden files of packed batches (cu_seqlens_q/k): generate, load, check, and a mismatching spec caught."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnformal.oracle import attention_oracle, forward_backward
from attnformal.reference import golden
from attnformal.reference.__main__ import main

CU_Q, CU_K = [0, 0, 1, 10, 22], [0, 3, 3, 10, 19]  # empty query and key sequences, Sq != Sk


@pytest.fixture(scope="module")
def packed_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "packed.npz"
    argv = ["generate", "--shape", "4,2,1,22,19,16", "--dtype", "bf16", "--causal", "bottom_right",
            "--cu-seqlens-q", ",".join(map(str, CU_Q)), "--cu-seqlens-k", ",".join(map(str, CU_K)), "--seed", "3",
            "--out", str(path)]
    assert main(argv) == 0
    return path


def test_a_packed_golden_file_carries_cu_seqlens_and_the_packed_reference(packed_file):
    case = golden.load(packed_file)
    assert case.spec.cu_seqlens_q == tuple(CU_Q) and case.spec.cu_seqlens_k == tuple(CU_K)
    assert case.meta["spec"]["cu_seqlens_q"] == CU_Q
    assert tuple(case.inputs["q"].shape) == (22, 2, 16) and tuple(case.reference["lse"][0].shape) == (22, 2)
    # The stored balls contain the fp64 oracle's values (computed sequence by sequence, independently of the file).
    x = {name: t.double() for name, t in case.inputs.items()}
    oracle = forward_backward(attention_oracle, x["q"], x["k"], x["v"], x["grad_out"], **case.protocol_kwargs())
    for name, value in zip(("out", "lse", "dq", "dk", "dv"), oracle):
        stored, radius = case.reference[name]
        finite = torch.isfinite(value)
        assert torch.equal(finite, torch.isfinite(stored)), name
        assert bool(((stored - value)[finite].abs() <= radius[finite] + 1e-12).all()), name


def test_check_runs_a_kernel_on_the_packed_inputs(packed_file, capsys):
    assert main(["check", str(packed_file), "--impl", "torch-tiled"]) == 0
    assert capsys.readouterr().out.strip().endswith("PASS")


def test_a_packed_file_whose_spec_does_not_match_its_reference_is_rejected(packed_file, tmp_path):
    with np.load(packed_file) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(str(arrays.pop("meta")))
    meta["spec"]["causal"] = None  # the reference was computed with causal bottom-right
    out = tmp_path / "mismatch.npz"
    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(golden.GoldenError, match="does not match the stored spec and inputs at packed index"):
        golden.load(out)
    golden.load(packed_file)  # control: the file as written loads


def test_bad_cu_seqlens_name_the_argument(tmp_path, capsys):
    argv = ["generate", "--shape", "2,2,1,5,5,16", "--dtype", "bf16", "--cu-seqlens-q", "0,3,4",
            "--cu-seqlens-k", "0,2,5", "--seed", "1", "--out", str(tmp_path / "x.npz")]
    assert main(argv) == 2
    assert "argument 'cu_seqlens_q': expected non-decreasing ints from 0 to 5" in capsys.readouterr().err


# ---- sinks and ALiBi [B, Hq] (a different row per sequence) with a packed batch

SINKS = torch.tensor([0.75, -0.5], dtype=torch.float64)
SLOPES = torch.tensor([[0.5, 0.25], [0.125, 1.0], [1.0, 0.0625], [0.25, 0.5]], dtype=torch.float64)


@pytest.fixture(scope="module")
def scored_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "packed-scored.npz"
    shape = (4, 2, 1, CU_Q[-1], CU_K[-1], 16, 16)
    inputs = golden.make_inputs(shape, torch.bfloat16, 5, packed=True)
    result = golden.generate(inputs, cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K, causal="bottom_right", sinks=SINKS,
                             alibi_slopes=SLOPES)
    golden.save(path, inputs, result, seed=5, generator={"shape": list(shape), "how": "tests/reference"})
    return path


def oracle_of(case, **changes):
    """out, lse, dq, dk, dv and d sinks of the fp64 oracle on the file's inputs (sequence by sequence)."""
    x = {name: t.double() for name, t in case.inputs.items()}
    sinks = SINKS.clone().requires_grad_(True)
    found = forward_backward(attention_oracle, x["q"], x["k"], x["v"], x["grad_out"],
                             **{**case.protocol_kwargs(), "sinks": sinks, **changes})
    return dict(zip(("out", "lse", "dq", "dk", "dv"), found), dsinks=sinks.grad)


def inside(case, name, value) -> bool:
    stored, radius = case.reference[name]
    finite = torch.isfinite(value)
    return torch.equal(finite, torch.isfinite(stored)) and bool(((stored - value)[finite].abs()
                                                                 <= radius[finite] + 1e-12).all())


def test_a_packed_file_with_sinks_and_alibi_holds_d_sinks_summed_over_the_sequences(scored_file):
    case = golden.load(scored_file)
    assert torch.equal(case.spec.alibi_slopes, SLOPES) and torch.equal(case.spec.sinks, SINKS)
    assert tuple(case.reference["dsinks"][0].shape) == (2,)
    oracle = oracle_of(case)
    assert [name for name, value in oracle.items() if not inside(case, name, value)] == []
    # Controls: the last sequence's d sinks alone, and every sequence on row 0 of the slopes, lie outside.
    assert not inside(case, "dsinks", last_sequence_d_sinks(case))
    assert not inside(case, "out", oracle_of(case, alibi_slopes=SLOPES[:1].expand_as(SLOPES))["out"])


def last_sequence_d_sinks(case):
    """d sinks of the last sequence alone, run padded (batch 1, its own slopes row) through the oracle."""
    queries, keys = slice(CU_Q[-2], CU_Q[-1]), slice(CU_K[-2], CU_K[-1])
    x = {name: t.double()[queries if name in ("q", "grad_out") else keys].transpose(0, 1)[None]
         for name, t in case.inputs.items()}
    sinks = SINKS.clone().requires_grad_(True)
    forward_backward(attention_oracle, x["q"], x["k"], x["v"], x["grad_out"], causal="bottom_right", sinks=sinks,
                     alibi_slopes=SLOPES[-1])
    return sinks.grad


def test_a_packed_file_whose_d_sinks_is_one_sequence_short_is_rejected(scored_file, tmp_path):
    with np.load(scored_file) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(str(arrays.pop("meta")))
    case = golden.load(scored_file)  # control: the file as written loads
    arrays["dsinks"] = arrays["dsinks"] - last_sequence_d_sinks(case).numpy()  # the last sequence left out
    meta["arrays"]["dsinks"] = golden._describe(arrays["dsinks"])
    out = tmp_path / "short.npz"
    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(golden.GoldenError, match="the stored dsinks does not match"):
        golden.load(out)


def test_check_passes_torch_tiled_and_fails_a_kernel_that_ignores_the_sinks(scored_file):
    from attnformal.kernels import torch_tiled
    from attnformal.reference.check import run_check

    case = golden.load(scored_file)
    report = run_check(case, torch_tiled.attention)
    assert report.passed and {t.name for t in report.tensors} == {"out", "lse", "dq", "dk", "dv", "dsinks"}

    def without_sinks(q, k, v, *, sinks, return_lse=False, **kwargs):
        out, lse = torch_tiled.attention(q, k, v, return_lse=True, **kwargs)
        out = out + 0 * sinks.sum()  # d sinks 0: the sink ignored, its gradient present
        return (out, lse) if return_lse else out

    failed = {t.name for t in run_check(case, without_sinks).tensors if not t.passed}
    assert {"out", "lse", "dsinks"} <= failed


def test_both_certified_tiers_take_a_packed_batch_with_sinks_alibi_and_empty_sequences():
    """Both tiers take a packed batch with an empty query and an empty key sequence: the float64 balls enclose the
    oracle's out, lse and summed d sinks, and the Arb tier's far smaller balls (below the oracle's own error)."""
    from attnformal.reference import certified_attention

    gen = torch.Generator().manual_seed(9)
    q, grad_out = (torch.randn(CU_Q[-1], 2, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(CU_K[-1], 1, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    keywords = dict(cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K, causal="bottom_right", alibi_slopes=SLOPES)
    tiers = {tier: certified_attention(q, k, v, grad_out, sinks=SINKS, prec=prec, **keywords)
             for tier, prec in (("float64", None), ("arb", 128))}
    sinks = SINKS.clone().requires_grad_(True)
    oracle = forward_backward(attention_oracle, q, k, v, grad_out, sinks=sinks, **keywords)
    fp64, arb = tiers["float64"], tiers["arb"]
    for name, value in (("out", oracle[0]), ("lse", oracle[1]), ("dsinks", sinks.grad)):
        finite = torch.isfinite(value)
        assert bool(fp64.contains(name, value)[finite].all()), name
        assert bool(fp64.contains(name, getattr(arb, name)).all()), name
    assert arb.tier == "arb-128" and arb.enclosure_radius < 1e-30 < fp64.enclosure_radius  # before rounding
    assert bool((arb.dsinks_radius < fp64.dsinks_radius).all())
    assert not bool(fp64.contains("dsinks", sinks.grad + 1e-9).any())  # control: a nearby value is outside
