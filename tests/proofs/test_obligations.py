"""Every obligation is proved and every negative control is refuted with a counterexample."""

import pytest

from attnformal.logic import PROVED, REFUTED, Budget, Settings
from attnformal.proofs import OBLIGATIONS

SETTINGS = Settings(timeout=120, schedule_specs=("attnformal.kernels.torch_tiled:DEFAULT_SCHEDULE",))


def name(module):
    return module.__name__.rsplit(".", 1)[-1]


@pytest.mark.parametrize("module", OBLIGATIONS, ids=name)
def test_obligation_is_proved(module):
    proofs = list(module.checks(SETTINGS, Budget(SETTINGS.timeout)))
    assert proofs, "an obligation must check something"
    failures = [(p.claim, p.status, p.case, p.countermodel, p.detail) for p in proofs if p.status != PROVED]
    assert not failures
    assert all(p.queries > 0 for p in proofs)


CONTROLS = [(module, control) for module in OBLIGATIONS for control in module.CONTROLS]


@pytest.mark.parametrize("module, control", CONTROLS, ids=[f"{name(m)}: {c.name}" for m, c in CONTROLS])
def test_negative_control_is_refuted_with_a_counterexample(module, control):
    proof = control.run(SETTINGS, Budget(SETTINGS.timeout))
    assert proof.status == REFUTED, (proof.status, proof.detail)
    assert proof.countermodel


def test_every_obligation_ships_a_negative_control():
    assert all(module.CONTROLS for module in OBLIGATIONS)


def test_the_kernel_schedule_is_among_the_proven_block_sizes():
    from attnformal.kernels.torch_tiled import DEFAULT_SCHEDULE
    from attnformal.proofs.tile_classification import schedules

    proven = {(bm, bn) for _, bm, bn in schedules(SETTINGS)}
    assert (DEFAULT_SCHEDULE.block_m, DEFAULT_SCHEDULE.block_n) in proven
    assert any(bm < bn for bm, bn in proven) and any(bm > bn for bm, bn in proven)


def test_the_kernels_start_from_the_state_the_base_case_proves():
    """Obligation 3's base case is about (NEG_INF, 0, 0); merge.empty_state builds exactly that."""
    import torch

    from attnformal.merge import NEG_INF, empty_state

    state = empty_state((2,), 3, dtype=torch.float32)
    assert torch.equal(state.m, torch.full((2, 1), NEG_INF))
    assert not state.l.any() and not state.acc.any()
