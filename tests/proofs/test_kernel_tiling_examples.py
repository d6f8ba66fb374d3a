"""The shipped kernel tilings: each one's verdict per mask family, its wrong variants, its int32 limit."""

from __future__ import annotations

import re

import pytest

from attnformal.logic import PROVED, REFUTED, Budget
from attnformal.tiling import MASK_FAMILIES, TilingControl, check_family, int32_limit, waste
from attnformal.tilings import EXAMPLES
from attnformal.tilings.fa2 import FA2Forward
from attnformal.tilings.fa3 import FA3Forward
from attnformal.tilings.flash_attn_triton import FlashAttnTriton, FlashAttnTritonAsBottomRight
from attnformal.tilings.triton_tutorial import TritonTutorialForward

# What the transcriptions prove and refute (docs/kernel-tilings.md): (tiling, family) -> the refuted obligations.
FA2_WINDOWS = {"window": {"complete", "mask-safe"}, "window_left": {"complete"}, "window_right": {"mask-safe"}}
REFUTED_OBLIGATIONS = {
    **{("FA2Forward", family): refuted for family, refuted in FA2_WINDOWS.items()},
    **{("FA2SplitKV", family): refuted for family, refuted in FA2_WINDOWS.items()},
    ("TritonTutorialStages64x128", "dense"): {"in bounds", "mask-safe"},
    ("TritonTutorialStages64x128", "top_left"): {"in bounds", "mask-safe", "splits"},
    ("FlashAttnTritonAsBottomRight", "bottom_right"): {"complete", "mask-safe", "backward complete"},
}
# int32 (wrapping) changes a bound of these at some shape in every family they claim, always past 2**29
# (FA2: cute::ceil_div(seqlen_k, kBlockN) from Sk = 2**31 - 63 on); the others stay exact
INT32_REFUTED = {"FA2Forward", "FA2SplitKV", "FA3Forward", "FA3SplitKV", "FA3PackGQA", "FlashAttnTriton",
                 "FlashAttnTritonAsBottomRight"}
CASES = [(cls, family) for cls in EXAMPLES for family in cls.masks]


@pytest.mark.parametrize("cls, family", CASES, ids=[f"{c.__name__}-{f}" for c, f in CASES])
def test_each_example_is_proved_or_refuted_as_documented(cls, family):
    proofs = check_family(cls(), MASK_FAMILIES[family], Budget())  # rlimit decides; the wall clock is only a net
    assert proofs, "no obligation applied"
    refuted = {name for name, proof, _ in proofs if proof.status == REFUTED}
    int32 = {"int32"} if cls.__name__ in INT32_REFUTED else set()
    assert refuted == REFUTED_OBLIGATIONS.get((cls.__name__, family), set()) | int32
    assert all(proof.status in (PROVED, REFUTED) for _, proof, _ in proofs)  # nothing unknown or vacuous
    for name, proof, _ in proofs:
        if proof.status == REFUTED:
            shown = proof.countermodel
            lengths = [int(shown["Sq"]), int(shown["Sk"]), *map(int, re.findall(r"\d+", shown.get("window", "")))]
            assert max(lengths) >= 2**29 if name == "int32" else int(shown["Sq"]) < 1000


def test_fa2_masks_no_more_than_the_kernel():
    # apply_mask</*Causal_mask=*/false> (Is_even_MN left true) outside the masking steps: a ragged length alone
    # masks only the last block, so the smallest mask-safety counterexample is ragged (it was Sq=128, Sk=64)
    proof = next(p for name, p, _ in check_family(FA2Forward(), MASK_FAMILIES["window"], Budget())
                 if name == "mask-safe")
    shown = proof.countermodel
    assert (shown["Sq"], shown["Sk"], shown["window"], shown["tile"]) == ("68", "65", "(65, 65)", "0")
    i, j = int(shown["i"]), int(shown["j"])
    assert j > i + 65 - 68 + 65 and j < 64  # outside the documented window, in the first (unmasked) block


def test_fa2_one_sided_window_loses_keys_when_queries_outnumber_keys():
    proof = next(p for name, p, _ in check_family(FA2Forward(), MASK_FAMILIES["window_left"], Budget())
                 if name == "complete")
    # set_params_fprop turns the unbounded right side into seqlen_k: rows i < Sq - Sk - 1 lose key 0
    assert {k: proof.countermodel[k] for k in ("Sq", "Sk", "window", "j")} == \
        {"Sq": "130", "Sk": "1", "window": "(0, -)", "j": "0"}
    assert int(proof.countermodel["i"]) < 130 - 1 - 1


CONTROLS = [(cls, variant) for cls in EXAMPLES for variant in cls.controls]


@pytest.mark.parametrize("cls, variant", CONTROLS, ids=[v.__name__ for _, v in CONTROLS])
def test_every_shipped_wrong_variant_is_refuted(cls, variant):
    assert variant.breaks
    proof = TilingControl(variant, cls, f"{variant.__module__}:{variant.__name__}", None).run(None, Budget())
    assert proof.status == REFUTED and proof.countermodel


def test_every_example_ships_a_wrong_variant_or_shares_its_parents():
    assert all(cls.controls or any(base.controls for base in cls.__mro__[1:-2]) for cls in EXAMPLES)
    assert FlashAttnTritonAsBottomRight.masks == ("bottom_right",)  # top-left kernel asked for bottom-right
    assert FlashAttnTritonAsBottomRight not in FlashAttnTriton.controls  # refuted where its base is not proved


def test_int32_limits_of_the_cuda_kernels():
    fa2 = int32_limit(FA2Forward(), MASK_FAMILIES["bottom_right"], Budget())
    fa3 = int32_limit(FA3Forward(), MASK_FAMILIES["bottom_right"], Budget())
    # (m_block + 1) * kBlockM + seqlen_k - seqlen_q + window_size_right, then + kBlockN in ceil_div
    assert "Sq = 2, Sk = 2147483458" in fa2.detail and "in kv_blocks" in fa2.detail
    assert "Sq = 1, Sk = 2147483393" in fa3.detail


def test_the_tutorials_causal_loop_visits_every_tile_above_the_diagonal():
    assert waste(TritonTutorialForward(), MASK_FAMILIES["top_left"], Budget()).detail == "waste: unbounded"
    assert waste(FA3Forward(), MASK_FAMILIES["bottom_right"], Budget()).detail.startswith("waste: 0 ")
