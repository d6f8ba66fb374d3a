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
