"""Every obligation is proved and every negative control is refuted with a counterexample."""

import pytest

from attnformal.logic import PROVED, REFUTED, Budget, Settings
from attnformal.prove import KERNEL_SCHEDULES
from attnformal.proofs import OBLIGATIONS

SETTINGS = Settings(timeout=120, kernel_schedule_specs=KERNEL_SCHEDULES)


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


def test_the_kernels_schedules_are_among_the_proven_block_sizes():
    from attnformal.kernels import torch_tiled, triton_flash
    from attnformal.proofs.tile_classification import schedules

    blocks, note = schedules(SETTINGS)
    proven = {(bm, bn): label for label, bm, bn in blocks}
    for kernel in (torch_tiled, triton_flash):
        s = kernel.DEFAULT_SCHEDULE
        assert proven[(s.block_m, s.block_n)].startswith(kernel.__name__), (kernel.__name__, note)
    assert any(bm < bn for bm, bn in proven) and any(bm > bn for bm, bn in proven)


def test_a_kernel_whose_optional_dependency_is_missing_is_skipped_and_said(tmp_path, monkeypatch):
    from attnformal.proofs.tile_classification import load_schedules

    (tmp_path / "kernel_needing_a_dependency.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found, skipped = load_schedules(["kernel_needing_a_dependency:SCHEDULE"], optional=True)
    assert found == [] and "no_such_dependency_xyz" in skipped[0]
    with pytest.raises(ValueError, match="--schedule"):
        load_schedules(["kernel_needing_a_dependency:SCHEDULE"])
