"""flash_attn_triton's forward kernel (examples/flash_attn_triton.py) proven from its TTIR: what it gets right for
every shape and stride, and its known defects refuted with their lines, and bugs planted in copies refuted.

Each check runs in a child Python without ``TRITON_INTERPRET`` (lowering needs Triton's compiler: attnformal.ttir.child).
"""

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")
from attnformal.ttir import child  # noqa: E402

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "flash_attn_triton.py"
GENERAL, EVEN = 0, 7  # FLASH_ATTN_TRITON.configs: EVEN_M, EVEN_N, EVEN_HEADDIM all False / all True, not causal
CAUSAL = 8  # the same as GENERAL with IS_CAUSAL


def _prove(theorems, config, launch="FLASH_ATTN_TRITON", source=EXAMPLE):
    (answer,) = child.prove([child.Request(launch, f"{source}:_fwd_kernel", tuple(theorems.split(",")), (config,))])
    return [[p.status, p.claim, p.detail, p.countermodel] for _, proofs in answer for p in proofs]


def _line(needle, text=None):
    lines = (text or EXAMPLE.read_text()).splitlines()
    found = [k + 1 for k, line in enumerate(lines) if needle in line]
    assert len(found) == 1, needle
    return f"flash_attn_triton.py:{found[0]}"


@pytest.mark.parametrize("config", [GENERAL, EVEN])
def test_addresses_bounds_and_writes_are_proved_for_every_stride(config):
    proofs = _prove("address,bounds,writes", config)
    assert proofs and all(status == "proved" for status, *_ in proofs), proofs
    claims = " ".join(claim for _, claim, *_ in proofs)
    for tensor in ("load of Q", "load of K", "load of V", "store of Out", "store of Lse", "store of TMP"):
        assert f"address: {tensor}" in claims and f"bounds: {tensor}" in claims
    assert "writes: no two programs or lanes store the same Out element" in claims


def test_int32_offsets_wrap_for_a_tensor_over_2_to_the_31_elements():
    """``off_b * stride_qb`` is an i32 product (as is every offset the kernel computes): it wraps once the batch
    offset reaches 2**31 elements, a launch the description admits (a 4 GiB fp16 q)."""
    proofs = _prove("no-wrap", GENERAL)
    refuted = {claim.split(" at ")[1]: model for status, claim, _, model in proofs if status == "refuted"}
    batch_offset = _line("Q + off_b * stride_qb + off_h * stride_qh")
    assert batch_offset in refuted, proofs
    assert any(status == "proved" for status, *_ in proofs)  # the i64 pointer additions do not wrap


def test_its_causal_mask_is_top_left_not_flash_attn_funcs_bottom_right():
    """Held to bottom-right (flash_attn_func's causal): the mask at the ``where`` refutes it with a launch of
    fewer queries than keys, and the loop's ``end_n`` misses keys; held to top-left both are proved."""
    bottom_right = _prove("masking,coverage", CAUSAL)
    assert [status for status, *_ in bottom_right] == ["refuted"] * 3, bottom_right
    causal_mask = _line("qk += tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], 0, float(\"-inf\"))")
    assert all(causal_mask in claim for _, claim, *_ in bottom_right[:2])
    assert all(int(model["Sq"]) < int(model["Sk"]) for *_, model in bottom_right)
    top_left = _prove("masking,coverage", CAUSAL, launch="FLASH_ATTN_TRITON_TOP_LEFT")
    assert [status for status, *_ in top_left] == ["proved"] * 3, top_left
    assert [status for status, *_ in _prove("masking,coverage", GENERAL)] == ["proved"] * 3


@pytest.mark.parametrize("config", [GENERAL, CAUSAL])
def test_its_log_sum_exp_merge_means_the_spec_merge(config):
    """The kernel carries (acc_o, lse_i, m_i) and reads acc's rescale back from TMP: its state stands for the spec's
    (m, exp(lse - m), acc), and each iteration means the spec's merge (real arithmetic, TMP read back assumed)."""
    unit, step = _prove("merge", config)
    loop = _line("for start_n in range(0, end_n, BLOCK_N):")
    assert unit[0] == "proved" and "starts from the unit (acc, lse, m: iter_args" in unit[1], unit
    assert step[0] == "proved" and f"after an iteration of the loop at {loop} means what" in step[1], step


PLANTED = [  # (name, old, new, theorem, launch, config, what a refuted claim names: a line's text, or words)
    ("loop one block short", "tl.minimum((start_m + 1) * BLOCK_M, seqlen_k)", "tl.minimum(start_m * BLOCK_M, seqlen_k)",
     "coverage", "FLASH_ATTN_TRITON_TOP_LEFT", CAUSAL, "for start_n in range(0, end_n, BLOCK_N):"),
    ("finite -1e6 causal fill", "(start_n + offs_n)[None, :], 0, float(\"-inf\"))", "(start_n + offs_n)[None, :], 0, -1e6)",
     "masking", "FLASH_ATTN_TRITON_TOP_LEFT", CAUSAL, "qk += tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :]"),
    ("no column mask on a ragged key length", "        if not EVEN_N:  # Need to mask out", "        if False:  # Need",
     "masking", "FLASH_ATTN_TRITON", GENERAL, "m_ij = tl.maximum(tl.max(qk, 1) * softmax_scale, lse_i)"),
    ("Out without its batch offset", "        + off_b * stride_ob\n", "",
     "writes", "FLASH_ATTN_TRITON", GENERAL, "store the same Out element"),
    ("acc not rescaled", "acc_o = acc_o * acc_o_scale[:, None]", "acc_o = acc_o * 1.0",
     "merge", "FLASH_ATTN_TRITON", GENERAL, "for start_n in range(0, end_n, BLOCK_N):"),
    ("lse without its log", "lse_i = m_ij + tl.log(l_i_new)", "lse_i = m_ij + l_i_new",
     "merge", "FLASH_ATTN_TRITON", GENERAL, "for start_n in range(0, end_n, BLOCK_N):"),
]


@pytest.mark.parametrize("name, old, new, theorem, launch, config, named", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bug_is_refuted(tmp_path, name, old, new, theorem, launch, config, named):
    text = EXAMPLE.read_text()
    assert text.count(old) == 1, old
    planted = tmp_path / "flash_attn_triton.py"
    planted.write_text(text.replace(old, new))
    proofs = _prove(theorem, config, launch=launch, source=planted)
    failed = [(claim, detail) for status, claim, detail, _ in proofs if status != "proved"]
    where = _line(named, planted.read_text()) if named in planted.read_text() else named
    assert any(status == "refuted" and where in claim for status, claim, *_ in proofs), (where, proofs)
    if name == "finite -1e6 causal fill":
        assert all("-1e+06 is finite" in detail for _, detail in failed), failed


REPLAY_CHILD = """
import sys
from attnformal.ttir.cli import prove_triton
from attnformal.ttir.launch import FLASH_ATTN_TRITON
sys.exit(prove_triton(sys.argv[1], repro_dir=sys.argv[2], configs=[FLASH_ATTN_TRITON.configs[int(sys.argv[3])]]))
"""


def _run(command, cwd, interpreted):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"TRITON_INTERPRET": "1"} if interpreted else {"TRITON_DEFAULT_FP_FUSION": "1"})
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)


def test_the_causal_refutation_replays_as_a_failing_case_naming_the_alignment(tmp_path):
    """The masking refutation's launch (one query, keys past the first block) replays on the real kernel under the
    Triton interpreter as a FAIL that names ``causal_alignment``; control: the shipped kernel passes the same case."""
    root = EXAMPLE.parents[1]
    proved = _run([sys.executable, "-c", REPLAY_CHILD, str(EXAMPLE) + ":_fwd_kernel", str(tmp_path), str(CAUSAL)], root,
                  interpreted=False)
    assert proved.returncode == 1, proved.stdout + proved.stderr
    masking = [line for line in proved.stdout.splitlines() if "replay: " in line and "masking" in line]
    assert masking, proved.stdout
    command = [sys.executable, *masking[0].split("replay: ")[1].split()[1:]]
    replayed = _run(command, root, interpreted=True)
    assert replayed.returncode == 1 and "result: FAIL" in replayed.stdout, replayed.stdout + replayed.stderr
    assert "[causal_alignment]" in replayed.stdout and "causal=bottom_right" in replayed.stdout, replayed.stdout

    command[command.index("--impl") + 1] = "attnformal.kernels.triton_flash:attention"  # control
    control = _run(command, root, interpreted=True)
    assert control.returncode == 0 and "result: pass" in control.stdout, control.stdout + control.stderr
