"""The shipped kernel tilings: each one's verdict per mask family, its wrong variants, its int32 limit."""

from __future__ import annotations

import pytest

from attnformal.logic import PROVED, REFUTED, Budget
from attnformal.tiling import MASK_FAMILIES, TilingControl, check_family, int32_limit, waste
from attnformal.tilings import EXAMPLES
from attnformal.tilings.fa2 import FA2Forward
from attnformal.tilings.fa3 import FA3Forward
from attnformal.tilings.flash_attn_triton import FlashAttnTritonAsBottomRight
from attnformal.tilings.triton_tutorial import TritonTutorialForward

# What the transcriptions prove and refute (docs/kernel-tilings.md): (tiling, family) -> the refuted obligations.
FA2_WINDOWS = {"window": {"complete", "mask-safe"}, "window_left": {"complete"}, "window_right": {"mask-safe"}}
REFUTED_OBLIGATIONS = {
    **{("FA2Forward", family): refuted for family, refuted in FA2_WINDOWS.items()},
    **{("FA2SplitKV", family): refuted for family, refuted in FA2_WINDOWS.items()},
    ("TritonTutorialStages64x128", "dense"): {"in bounds", "mask-safe"},
    ("TritonTutorialStages64x128", "top_left"): {"in bounds", "mask-safe", "splits"},
}
CASES = [(cls, family) for cls in EXAMPLES for family in cls.masks]


@pytest.mark.parametrize("cls, family", CASES, ids=[f"{c.__name__}-{f}" for c, f in CASES])
def test_each_example_is_proved_or_refuted_as_documented(cls, family):
    proofs = check_family(cls(), MASK_FAMILIES[family], Budget(60))
    assert proofs, "no obligation applied"
    refuted = {name for name, proof, _ in proofs if proof.status == REFUTED}
    assert refuted == REFUTED_OBLIGATIONS.get((cls.__name__, family), set())
    assert all(proof.status in (PROVED, REFUTED) for _, proof, _ in proofs)  # nothing unknown or vacuous
    for name, proof, _ in proofs:
        if proof.status == REFUTED:
            assert {"Sq", "Sk"} <= set(proof.countermodel) and int(proof.countermodel["Sq"]) < 1000


def test_fa2_one_sided_window_loses_keys_when_queries_outnumber_keys():
    proof = next(p for name, p, _ in check_family(FA2Forward(), MASK_FAMILIES["window_left"], Budget(60))
                 if name == "complete")
    # set_params_fprop turns the unbounded right side into seqlen_k: rows i < Sq - Sk - 1 lose key 0
    assert {k: proof.countermodel[k] for k in ("Sq", "Sk", "window", "j")} == \
        {"Sq": "130", "Sk": "1", "window": "(0, -)", "j": "0"}
    assert int(proof.countermodel["i"]) < 130 - 1 - 1


CONTROLS = [(cls, variant) for cls in EXAMPLES for variant in cls.controls]


@pytest.mark.parametrize("cls, variant", CONTROLS, ids=[v.__name__ for _, v in CONTROLS])
def test_every_shipped_wrong_variant_is_refuted(cls, variant):
    assert variant.breaks
    proof = TilingControl(variant, f"{variant.__module__}:{variant.__name__}", None).run(None, Budget(60))
    assert proof.status == REFUTED and proof.countermodel


def test_every_example_ships_a_wrong_variant_or_shares_its_parents():
    assert all(cls.controls or any(base.controls for base in cls.__mro__[1:-2]) for cls in EXAMPLES)
    assert FlashAttnTritonAsBottomRight.masks == ("bottom_right",)  # top-left kernel asked for bottom-right


def test_int32_limits_of_the_cuda_kernels():
    fa2 = int32_limit(FA2Forward(), MASK_FAMILIES["bottom_right"], Budget(60))
    fa3 = int32_limit(FA3Forward(), MASK_FAMILIES["bottom_right"], Budget(60))
    # (m_block + 1) * kBlockM + seqlen_k - seqlen_q + window_size_right, then + kBlockN in ceil_div
    assert "Sq = 2, Sk = 2147483458" in fa2.detail and "in kv_blocks" in fa2.detail
    assert "Sq = 1, Sk = 2147483393" in fa3.detail


def test_the_tutorials_causal_loop_visits_every_tile_above_the_diagonal():
    assert waste(TritonTutorialForward(), MASK_FAMILIES["top_left"], Budget(60)).detail == "waste: unbounded"
    assert waste(FA3Forward(), MASK_FAMILIES["bottom_right"], Budget(60)).detail.startswith("waste: 0 ")
