"""Obligation 20: the shipped forward, dQ and dK/dV Triton kernels proved from their TTIR, every configuration.

The obligation runs once (its checks take a minute: every theorem on 27 configurations); the tests read what it
proved per kernel and configuration. Its controls, the ten planted bugs, run in tests/ttir/test_theorems.py with
the others.
"""

import re

import pytest

pytest.importorskip("triton")

from attnformal.logic import Budget, Settings  # noqa: E402
from attnformal.proofs import triton_kernels  # noqa: E402
from attnformal.ttir import launch  # noqa: E402
from attnformal.ttir.cli import config_name  # noqa: E402

THEOREMS = {"no-wrap", "address", "bounds", "masking", "coverage", "writes", "merge"}
# claims per configuration: without features, with the softcap, with every feature (loading the softcap scalar adds
# its pointer's no-wrap and its bounds; every feature adds the data masks', the keep flags' and the bias's claims)
COUNTS = {"_attn_fwd": (86, 88, 118), "_attn_bwd_dq": (79, 81, 116), "_attn_bwd_dkdv": (93, 95, 125)}


@pytest.fixture(scope="module")
def proved():
    """``{(kernel, configuration name): [Proof]}`` from one run of the obligation's checks."""
    settings = Settings(timeout=1200)
    found = {}
    for proof in triton_kernels.checks(settings, Budget(settings.timeout)):
        kernel, config, claim = re.fullmatch(r"(\w+) \[([^]]*)] (.*)", proof.claim).groups()
        found.setdefault((kernel, config), []).append(proof.but(claim=claim))
    return found


def _configs(described):
    return [(index, config_name(config)) for index, config in enumerate(described.configs)]


def test_every_claim_of_every_configuration_is_proved(proved):
    expected = {(kernel, name) for described_name, kernel in triton_kernels.KERNELS
                for _, name in _configs(getattr(launch, described_name))}
    assert set(proved) == expected and len(expected) == 27
    left = [(key, p.claim, p.status, p.detail) for key, proofs in proved.items() for p in proofs if not p.ok]
    assert not left
    assert all(p.hypotheses for proofs in proved.values() for p in proofs), "each says what it assumed"
    # each asked Z3, or rests on lemmas that did (a bound from its access's address theorem and a layout lemma)
    assert all(p.queries > 0 or (p.by and all(lemma.queries > 0 for lemma in p.by))
               for proofs in proved.values() for p in proofs)


@pytest.mark.parametrize("described_name, kernel", triton_kernels.KERNELS)
def test_each_configuration_has_each_theorem(proved, described_name, kernel):
    for index, name in _configs(getattr(launch, described_name)):
        claims = [p.claim for p in proved[(kernel, name)]]
        assert len(claims) == COUNTS[kernel][2 if index >= 6 else 1 if index >= 3 else 0], (name, len(claims))
        assert {claim.split(":")[0] for claim in claims} == THEOREMS


def test_the_forward_merge_and_masking_name_what_they_prove(proved):
    """The unit, then m, l and acc; with every feature the dropout weights' keep flags are the pairs', and the
    masking claim includes the attn_mask's element."""
    for index, name in _configs(launch.FORWARD):
        claims = [p.claim for p in proved[("_attn_fwd", name)]]
        every = index >= 6
        assert sum(claim.startswith("merge:") for claim in claims) == 4 + every
        assert every == any(claim.startswith("merge: the keep flags") for claim in claims)
        assert every == all("and ATTN_MASK[b, h, i, j]" in claim for claim in claims if claim.startswith("masking:"))


@pytest.mark.parametrize("kernel, table, sums", [("_attn_bwd_dq", "KV_RANGES[b, bm, 0:2]", ("dq",)),
                                                 ("_attn_bwd_dkdv", "Q_RANGES[b, bn, 0:2]", ("dk", "dv"))])
def test_the_backward_masks_covers_and_sums_as_the_spec(proved, kernel, table, sums):
    """Masking at the exp that weighs the scores by the saved lse (the backward has no row max); each loop over its
    table's blocks; dK/dV's loop over the query heads of its group runs over exactly [0, G); each gradient sum starts
    from 0 and adds the spec's score_grads of each tile."""
    for _, name in _configs(launch.FORWARD):
        claims = [p.claim for p in proved[(kernel, name)]]
        assert any(claim.startswith("masking: scores weighed by the exp") for claim in claims)
        assert any(claim.startswith("coverage: the block loop") and table in claim for claim in claims)
        assert (kernel == "_attn_bwd_dkdv") == any("runs over [0, G)" in claim for claim in claims)
        assert [s for s in sums if any(claim.startswith(f"merge: {s} (stored to {s.upper()} at ")
                                       and "score_grads" in claim for claim in claims)] == list(sums)


def test_no_wrap_claims_proved_together_say_so(proved):
    """The no-wrap claims of a loop are proved in one query where Z3 manages; each says so (and the query's cost)."""
    together = [p for proofs in proved.values() for p in proofs if "in one query with" in p.detail]
    alone = [p for proofs in proved.values() for p in proofs if p.claim.startswith("no-wrap") and not p.detail]
    assert together and alone
    assert all(p.claim.startswith("no-wrap:") for p in together)


def test_without_triton_nothing_is_proved(monkeypatch):
    monkeypatch.setattr(triton_kernels.importlib.util, "find_spec", lambda name: None)
    (proof,) = triton_kernels.checks(Settings(), Budget())
    assert proof.status == "unknown" and "Triton is not installed" in proof.detail
