"""The battery passes every correct implementation at hand, in fp32 and bf16, with no false alarm."""

import pytest

from attnformal.adapters import resolve
from attnformal.verify import Settings, run_battery
from attnformal.verify.report import render

# SDPA has no sinks and no lse (ALiBi and bias go in its float attn_mask): these need one of them.
SCORE_STATE = {"hand.sinks", "fwd.sinks", "metamorphic.sinks_alibi_bias"}
# (alias, checks that must be unsupported: the features the kernel lacks, no more)
CORRECT = [
    ("sdpa-math", {"fwd.softcap", "lse.values", "dropout.replay", "mask.packed"} | SCORE_STATE),
    # Its float32 finite-difference case runs once adapted to Dv = D (it refuses float64 and Dv != D).
    ("sdpa-flash", {"fwd.softcap", "lse.values", "dropout.replay", "dropout.statistics",
                    "dropout.own_mask_backward", "mask.packed"} | SCORE_STATE),
    ("torch-tiled", {"dropout.statistics", "dropout.own_mask_backward"}),
    ("torch-tiled-split", {"dropout.statistics", "dropout.own_mask_backward"}),  # 32 x 32 tiles, 3 KV splits
    ("torch-tiled-small", {"dropout.statistics", "dropout.own_mask_backward"}),  # 16 x 16 tiles
    ("flex", None),  # forward only on CPU: every backward and dropout check is unsupported
]


@pytest.mark.parametrize("alias, unsupported", CORRECT, ids=[c[0] for c in CORRECT])
def test_correct_implementation_passes_quick(alias, unsupported):
    report = run_battery(Settings(impl=resolve(alias), impl_name=alias))
    assert report.passed, render(report)
    lacking = {r.check for r in report.results if r.status == "unsupported"}
    if unsupported is not None:
        assert lacking == unsupported, render(report)
    assert report.count("pass") >= 60
