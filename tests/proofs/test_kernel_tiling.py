"""attnformal.tiling: the kernel-tiling DSL, its obligations, int32 limits, cases and ``prove --kernel``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch
import z3

from attnformal import ops, tiling
from attnformal.logic import PROVED, REFUTED, UNKNOWN, VACUOUS, Budget
from attnformal.prove import main as prove_main
from attnformal.tiling import (MASK_FAMILIES, KernelTiling, ReproFolders, TilingControl, check_family, family_of,
                               int32_limit, kernel_obligations, load_tilings, waste, window_size)
from attnformal.masks import MaskGeometry


def verdicts(tiling, family):
    return {name: proof for name, proof, _ in check_family(tiling, MASK_FAMILIES[family], Budget())}


class Causal(KernelTiling):
    """A small bottom-right causal kernel written the way FlashAttention writes it."""

    block_m, block_n = 16, 8
    masks = ("dense", "bottom_right")

    def kv_blocks(self, m_block, g):
        n_max = self.ceil_div(g.len_k, self.block_n)
        if g.causal:
            n_max = ops.minimum(n_max, self.ceil_div((m_block + 1) * self.block_m + g.len_k - g.len_q, self.block_n))
        return 0, n_max

    def masked(self, m_block, n_block, g):
        _, n_max = self.kv_blocks(m_block, g)
        return n_block >= n_max - self.ceil_div(self.block_m, self.block_n) - 1  # the diagonal and the ragged edge


# ---------------------------------------------------------------------------- ops for kernel arithmetic


@pytest.mark.parametrize("a", [-9, -8, -1, 0, 1, 7, 8, 23])
@pytest.mark.parametrize("b", [1, 3, 8])
def test_truncating_division_and_shifts_agree_everywhere(a, b):
    expected = int(a / b)  # C rounds toward zero
    assert ops.truncdiv(a, b) == expected
    assert ops.truncdiv(torch.tensor(a), b).item() == expected
    assert z3.simplify(ops.truncdiv(z3.IntVal(a), b)).as_long() == expected
    assert z3.simplify(ops.truncdiv(z3.BitVecVal(a, 32), b)).as_signed_long() == expected
    assert ops.truncdiv(sympy.Integer(a), b) == expected
    for family_value in (a, torch.tensor(a), sympy.Integer(a)):
        assert int(ops.shr(family_value, 2)) == math.floor(a / 4) and int(ops.shl(family_value, 2)) == a * 4
    assert z3.simplify(ops.shr(z3.IntVal(a), 2)).as_long() == math.floor(a / 4)


# ---------------------------------------------------------------------------- the description


@pytest.mark.parametrize("attribute, value", [("block_m", 0), ("division", "round"), ("int_bits", 16),
                                              ("masks", "dense"), ("masks", ("dense", "diagonal")),
                                              ("kv_unit", "rows"), ("num_splits", 2)])
def test_a_malformed_description_names_the_attribute(attribute, value):
    with pytest.raises(TypeError, match=f"Bad.{attribute}"):
        type("Bad", (Causal,), {attribute: value})


def test_family_of_a_concrete_geometry():
    assert family_of(MaskGeometry(4, 6)).name == "dense"
    assert family_of(MaskGeometry(4, 6, "bottom_right", (3, -1))).name == "bottom_right+window_left"
    assert family_of(MaskGeometry(4, 6, None, (-1, -1))).name == "dense"


MISTAKES = '''
from attnformal import ops
from attnformal.tiling import KernelTiling


class Base(KernelTiling):
    block_m, block_n = 16, 8
    masks = ("dense", "bottom_right")

    def kv_blocks(self, m_block, g):
        return 0, self.ceil_div(g.len_k, self.block_n)


class PythonIf(Base):
    def kv_blocks(self, m_block, g):
        return 0, g.len_k if g.len_k < g.len_q else g.len_q


class PythonMin(Base):
    def kv_blocks(self, m_block, g):
        return 0, min(self.ceil_div(g.len_k, 8), m_block + 1)


class Slash(Base):
    division = "trunc"

    def kv_blocks(self, m_block, g):
        return 0, (g.len_k + 7) / 8


class FloorSlash(Base):
    def kv_blocks(self, m_block, g):
        return 0, (g.len_k + 7) // 8


class OneValue(Base):
    def kv_blocks(self, m_block, g):
        return self.ceil_div(g.len_k, 8)


class UnpacksWindow(Base):
    def kv_blocks(self, m_block, g):
        left, right = g.window
        return 0, self.ceil_div(g.len_k + right, 8)


class NoLoop(KernelTiling):
    masks = ("dense",)


class MaskedInt(Base):
    def masked(self, m_block, n_block, g):
        return n_block
'''


@pytest.mark.parametrize("name, message", [
    ("PythonIf", "PythonIf.kv_blocks (mask family dense): a symbolic length or index met a Python if"),
    ("PythonMin", "PythonMin.kv_blocks (mask family dense): a symbolic length or index met a Python if/and/or/not, "
                  "min() or max()"),
    ("Slash", "Slash.kv_blocks (mask family dense): '/' on a kernel integer: write self.div(a, b)"),
    ("FloorSlash", "FloorSlash.kv_blocks (mask family dense): '//' on a kernel integer: write self.div(a, b)"),
    ("OneValue", "OneValue.kv_blocks (mask family dense): expected a pair (lo, hi), a half-open range; got one value"),
    ("UnpacksWindow", "UnpacksWindow.kv_blocks (mask family dense): g.window is None in a mask family without a "
                      "window"),
    ("NoLoop", "NoLoop must define kv_blocks"),  # the user's class, not its generated control NoLoopOneTileShort
    ("MaskedInt", "MaskedInt.masked (mask family dense): expected a condition"),
])
def test_each_transcription_mistake_is_one_line_naming_the_class_and_method(tmp_path, capsys, name, message):
    path = tmp_path / "mistakes.py"
    path.write_text(MISTAKES)
    with pytest.raises(SystemExit) as exit_info:
        prove_main(["--kernel", f"{path}:{name}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


# ---------------------------------------------------------------------------- obligations


def test_a_correct_kernel_is_proved_for_its_families():
    for family in Causal.masks:
        assert {name: p.status for name, p in verdicts(Causal(), family).items()} == \
            {"complete": PROVED, "in bounds": PROVED, "mask-safe": PROVED}


@pytest.mark.parametrize("breaks, obligation, attributes", [
    ("top-left n_max", "complete",
     {"kv_blocks": lambda self, m, g: (0, ops.minimum(self.ceil_div(g.len_k, 8), self.ceil_div((m + 1) * 16, 8)))}),
    ("no mask on the diagonal", "mask-safe", {"masked": lambda self, m, n, g: n >= self.kv_blocks(m, g)[1] - 1}),
    ("one block past the keys", "in bounds",
     {"kv_blocks": lambda self, m, g: (0, Causal.kv_blocks(self, m, g)[1] + 1)}),
])
def test_each_obligation_refutes_its_bug_with_the_smallest_shape(breaks, obligation, attributes):
    proof = verdicts(type("Wrong", (Causal,), attributes)(), "bottom_right")[obligation]
    assert proof.status == REFUTED, breaks
    shown = proof.countermodel
    assert int(shown["Sq"]) + int(shown["Sk"]) <= 2 * 16 + 8  # minimised: a block or two, not thousands


MISTAKEN_TOP_LEFT = type("TopLeft", (Causal,), {"kv_blocks": lambda self, m, g: (0, ops.minimum(
    self.ceil_div(g.len_k, 8), self.ceil_div((m + 1) * 16, 8)))})


def test_top_left_against_bottom_right_names_the_missed_tile_and_an_allowed_pair():
    shown = verdicts(MISTAKEN_TOP_LEFT(), "bottom_right")["complete"].countermodel
    len_q, len_k, i, j, n_block = (int(shown[k]) for k in ("Sq", "Sk", "i", "j", "n_block"))
    assert (len_q, len_k) == (1, 17) and (i, j, n_block) == (0, 16, 2)
    assert j <= i + len_k - len_q and j // 8 == n_block  # allowed, and in the missed tile


def test_division_semantics_are_the_kernels():
    def first_block(division):
        tiling = type("Signed", (Causal,), {"division": division, "kv_blocks": lambda self, m, g: (
            self.div(g.len_k - g.len_q, self.block_n), self.ceil_div(g.len_k, self.block_n))})()
        shown = verdicts(tiling, "dense")["in bounds"].countermodel
        return int(shown["Sq"]) - int(shown["Sk"])

    assert first_block("floor") == 1  # Sk - Sq = -1 floors to block -1
    assert first_block("trunc") == 8  # C rounds -1..-7 to block 0; -8 is the first negative block


def test_an_unsatisfiable_precondition_is_vacuous_not_proved():
    impossible = type("Impossible", (Causal,), {"requires": lambda self, g: g.len_q < 0})()
    assert verdicts(impossible, "dense")["complete"].status == VACUOUS


def test_splits_must_be_disjoint_and_cover():
    class Split(Causal):
        num_splits = 2

        def split(self, m_block, split_idx, g):
            _, n_max = self.kv_blocks(m_block, g)
            half = self.ceil_div(n_max, 2)
            return (0, half) if split_idx == 0 else (half, n_max)

    assert verdicts(Split(), "bottom_right")["splits"].status == PROVED
    overlapping = type("Overlap", (Split,), {"split": lambda self, m, s, g: (0, Split.split(self, m, s, g)[1])})
    assert verdicts(overlapping(), "bottom_right")["splits"].status == REFUTED


def test_waste_is_measured_against_the_schedule():
    everything = type("Everything", (Causal,), {"kv_blocks": lambda self, m, g: (0, self.ceil_div(g.len_k, 8)),
                                                 "masked": lambda self, m, n, g: True})()
    assert waste(everything, MASK_FAMILIES["bottom_right"], Budget()).detail == "waste: unbounded"
    assert waste(Causal(), MASK_FAMILIES["bottom_right"], Budget()).detail.startswith("waste: 0 ")
    one_extra = type("OneExtra", (Causal,), {"kv_blocks": lambda self, m, g: (
        0, ops.minimum(self.ceil_div(g.len_k, 8), Causal.kv_blocks(self, m, g)[1] + 1))})()
    assert waste(one_extra, MASK_FAMILIES["bottom_right"], Budget()).detail.startswith("waste: 1 ")


DOUBLED = type("Doubled", (Causal,), {"int_bits": 32, "kv_blocks": lambda self, m, g: (0, self.ceil_div(2 * g.len_k, 8))})


def test_int32_limit_finds_the_smallest_overflowing_shape():
    proof = int32_limit(DOUBLED(), MASK_FAMILIES["dense"], Budget())
    # ceil_div adds block_n first, as (a + b - 1) / b does in C: 2 * Sk + 8 leaves int32 from Sk = 2**30 - 4
    assert proof.status == PROVED and "Sq = 1, Sk = 1073741820" in proof.detail
    safe = type("Safe", (Causal,), {"int_bits": 32, "kv_blocks": lambda self, m, g: (0, 1)})()
    assert int32_limit(safe, MASK_FAMILIES["dense"], Budget()).detail.endswith("any int32 shape")
    assert int32_limit(Causal(), MASK_FAMILIES["dense"], Budget()) is None  # int_bits = None: not asked


def test_waste_and_int32_that_run_out_of_their_budget_are_unknown_never_an_answer(monkeypatch):
    # the negative control of the budgets: the same queries as above, with too few resource units
    starved = int32_limit(DOUBLED(), MASK_FAMILIES["dense"], Budget(rlimit=1))
    assert starved.status == UNKNOWN and "deterministic budget" in starved.detail and "Sk =" not in starved.claim
    assert waste(Causal(), MASK_FAMILIES["bottom_right"], Budget(rlimit=1)).status == UNKNOWN
    monkeypatch.setattr(tiling, "WASTE_RLIMIT", 1)  # the query's own budget, the obligation's left ample
    capped = waste(Causal(), MASK_FAMILIES["bottom_right"], Budget())
    assert capped.status == UNKNOWN and "the query's deterministic budget ran out" in capped.detail
    monkeypatch.setattr(tiling, "LEAST_STEP_RLIMIT", 1)
    capped = int32_limit(DOUBLED(), MASK_FAMILIES["dense"], Budget())
    assert capped.status == UNKNOWN and "the query's deterministic budget ran out" in capped.detail


def test_a_refutation_whose_least_counterexample_runs_out_is_still_refuted_and_says_so(monkeypatch):
    full = verdicts(MISTAKEN_TOP_LEFT(), "bottom_right")["complete"]
    assert full.status == REFUTED and "not shown to be the smallest" not in full.detail
    monkeypatch.setattr(tiling, "LEAST_STEP_RLIMIT", 1)
    starved = verdicts(MISTAKEN_TOP_LEFT(), "bottom_right")["complete"]
    assert starved.status == REFUTED and starved.countermodel  # the solver's own counterexample
    assert "not shown to be the smallest counterexample: the query's deterministic budget ran out" in starved.detail
    monkeypatch.setattr(tiling, "LEAST_STEP_RLIMIT", tiling.LEAST_RLIMIT)
    monkeypatch.setattr(tiling, "LEAST_WALL_S", 1e-3)  # the search's wall-clock net, its units left ample
    netted = verdicts(MISTAKEN_TOP_LEFT(), "bottom_right")["complete"]
    assert netted.status == REFUTED and netted.countermodel
    assert "not shown to be the smallest counterexample: interrupted by time: the search's wall-clock net" \
        in netted.detail


def _kernel_units(path, json_path):
    result = subprocess.run([sys.executable, "-m", "attnformal.prove", "--kernel", f"{path}:MyKernel", "--no-cache",
                             "--json", str(json_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(json_path.read_text())
    return ([(p["claim"], p["status"], p["rlimit"]) for o in data["obligations"] for p in o["checks"]],
            [(c["name"], c["proof"]["status"], c["proof"]["rlimit"]) for c in data["controls"]])


def test_the_units_each_kernel_query_uses_are_the_same_in_two_runs(tmp_path):
    # waste (z3.Optimize) and int32 (a bisection) included: their verdicts rest on resource units, not on time
    path = user_file(tmp_path)
    first, second = (_kernel_units(path, tmp_path / name) for name in ("first.json", "second.json"))
    assert first == second
    counted = {claim.split(":")[0]: units for claim, _, units in first[0]}
    assert counted["[bottom_right] waste"] > 0 and counted["[bottom_right] int32"] > 0, counted


# ---------------------------------------------------------------------------- the command line and replay

DOC = Path(__file__).resolve().parents[2] / "docs" / "kernel-tilings.md"


def user_file(tmp_path) -> Path:
    """The one-file example of docs/kernel-tilings.md, as a user would save it."""
    code = DOC.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my_kernel.py"
    path.write_text(code)
    return path


def test_the_documented_example_is_proved_from_its_file(tmp_path, monkeypatch, capsys):
    path = user_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert prove_main(["--kernel", f"{path}:MyKernel", "--json", "run.json", "--report", "run.md"]) == 0
    out = capsys.readouterr().out
    assert "kernel MyKernel" in out and "1/1 obligations proved" in out and "2/2 controls refuted" in out
    data = json.loads((tmp_path / "run.json").read_text())
    claims = [p["claim"] for p in data["obligations"][0]["checks"]]
    assert any(c.startswith("[bottom_right] int32") for c in claims) and any("waste" in c for c in claims)
    assert "## 1. kernel MyKernel -- proved" in (tmp_path / "run.md").read_text()
    control = next(c for c in data["controls"] if c["name"] == "MyKernelTopLeft")
    assert f"--impl {path}:MyKernelTopLeft --replay" in control["proof"]["detail"]
    assert "Sq = 1, Sk = 129, m_block = 0, n_block = 2, i = 0, j = 128" in out  # as the document shows


def test_a_refutation_becomes_a_case_the_battery_reproduces(tmp_path, monkeypatch, capsys):
    from attnformal.verify.__main__ import main as verify_main

    path = user_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "repro" / "my_kernel.MyKernelTopLeft"  # the implementation's own, as the battery's
    folder.mkdir(parents=True)
    (folder / "tiling-MyKernelTopLeft-old.pt").write_bytes(b"an earlier run's case")
    obligation = kernel_obligations([f"{path}:MyKernel"], tmp_path / "repro")[0][1]
    control = next(c for c in obligation.CONTROLS if c.name == "MyKernelTopLeft")
    proof = control.run(None, Budget())
    assert proof.status == REFUTED
    case = folder / "tiling-MyKernelTopLeft-bottom_right-complete.pt"
    assert [p.name for p in folder.glob("*.pt")] == [case.name]  # the old one moved aside, not mixed in
    assert (folder / "previous" / "tiling-MyKernelTopLeft-old.pt").exists()
    capsys.readouterr()
    assert verify_main(["--impl", f"{path}:MyKernelTopLeft", "--replay", str(case)]) == 1  # the bug shows
    assert "FAIL" in capsys.readouterr().out
    assert verify_main(["--impl", f"{path}:MyKernel", "--replay", str(case)]) == 0  # the right tiling passes
    assert verify_main(["--impl", "torch-tiled", "--replay", str(case)]) == 0
    rerun = kernel_obligations([f"{path}:MyKernel"], tmp_path / "repro")[0][1]  # a second run, same process
    assert next(c for c in rerun.CONTROLS if c.name == "MyKernelTopLeft").run(None, Budget()).status == REFUTED
    assert (folder / "previous" / case.name).exists()  # the first run's case moved aside in turn


@pytest.mark.parametrize("spec, message", [("no_colon", "--kernel"), ("attnformal.ops:maximum", "KernelTiling"),
                                           ("attnformal.no_such_module:X", "cannot import")])
def test_bad_kernel_arguments_give_one_clear_error(spec, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prove_main(["--kernel", spec])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------- what used to pass and must not


INT_MAX = 2**31 - 1


class IntMaxWindow(KernelTiling):
    """An FA2 port that writes an unbounded window side as INT_MAX, in C++ int (the issue's first tiling)."""

    block_m, block_n = 128, 64
    division = "trunc"
    int_bits = 32
    masks = ("window_left",)

    def kv_blocks(self, m_block, g):
        left, right = window_size(g)
        right = INT_MAX if right is None else right
        n_block_min = ops.maximum(0, self.div(m_block * self.block_m + g.len_k - g.len_q - left, self.block_n))
        n_block_max = ops.minimum(self.ceil_div(g.len_k, self.block_n), self.ceil_div(
            (m_block + 1) * self.block_m + g.len_k - g.len_q + right, self.block_n))
        return n_block_min, n_block_max


def test_an_int32_overflow_that_changes_a_bound_is_refuted_at_the_smallest_shape():
    unbounded = type("Unbounded", (IntMaxWindow,), {"int_bits": None, "requires": lambda self, g: g.len_q <= INT_MAX})
    assert {p.status for p in verdicts(unbounded(), "window_left").values()} == {PROVED}  # right on exact integers
    proof = verdicts(IntMaxWindow(), "window_left")["int32"]
    assert proof.status == REFUTED
    shown = proof.countermodel
    assert (shown["Sq"], shown["Sk"], shown["window"]) == ("1", "0", "(0, -)")
    wrapped = int(((128 + 0 - 1 + INT_MAX + 63 + 2**31) % 2**32 - 2**31) / 64)  # C: wraps, then truncates
    assert shown["kv_blocks hi"] == f"0 (int32: {wrapped})"


def test_an_overflow_that_wraps_back_is_not_a_refutation():
    # (m_block + 1) * block_m + len_k passes 2**31 before - len_q brings it back: int32 wraps to the exact value
    launched = type("Launched", (Causal,), {"int_bits": 32, "requires": lambda self, g: g.len_k < 2**30})()
    assert verdicts(launched, "bottom_right")["int32"].status == PROVED
    assert "kv_blocks" in int32_limit(launched, MASK_FAMILIES["bottom_right"], Budget()).detail  # yet it overflows


@pytest.mark.parametrize("body, message", [
    ({"mask": ("dense", "bottom_right")}, "Bad.mask: KernelTiling has no attribute 'mask'; did you mean `masks`?"),
    ({"divison": "trunc"}, "Bad.divison: KernelTiling has no attribute 'divison'; did you mean `division`?"),
    ({"kv_block": lambda self, m, g: (0, 1)}, "Bad.kv_block: KernelTiling has no method 'kv_block'; did you mean "
                                              "`kv_blocks`?"),
    ({"masks": lambda self: ()}, "Bad.masks"),
    ({"masked": ("dense",)}, "Bad.masked: is a method of KernelTiling"),
])
def test_an_unknown_name_is_refused_with_the_closest_known_one(body, message):
    with pytest.raises(TypeError) as error:
        type("Bad", (Causal,), body)
    assert message in str(error.value)


def test_a_name_set_after_the_class_is_checked_too():
    late = type("Late", (Causal,), {})
    with pytest.raises(TypeError, match="did you mean `controls`"):
        late.control = ()


def test_a_helper_method_of_the_transcription_is_allowed():
    helper = type("Helper", (Causal,), {"get_n_block_min_max": lambda self, m, g: (0, 1)})
    assert "get_n_block_min_max" in vars(helper)


def test_the_doc_table_does_not_write_ceil_div_with_slash():
    assert "(a + b - 1) / b" not in DOC.read_text() and "(a + b - 1) / b" not in KernelTiling.ceil_div.__doc__


class HalfRight(Causal):
    """Right for dense, top-left (wrong) for bottom_right."""

    def kv_blocks(self, m_block, g):
        n_max = self.ceil_div(g.len_k, self.block_n)
        if g.causal:
            n_max = ops.minimum(n_max, self.ceil_div((m_block + 1) * self.block_m, self.block_n))
        return 0, n_max


class SameAsHalfRight(HalfRight):
    breaks = "nothing: the base tiling itself"


class DenseOneShort(HalfRight):
    breaks = "the dense range one block short"

    def kv_blocks(self, m_block, g):
        lo, hi = HalfRight.kv_blocks(self, m_block, g)
        return lo, hi - (0 if g.causal else 1)


def test_a_control_refuted_only_where_its_base_fails_is_not_a_control():
    vacuous = TilingControl(SameAsHalfRight, HalfRight, "tests:SameAsHalfRight", None).run(None, Budget())
    assert vacuous.status == UNKNOWN and vacuous.countermodel is None
    assert vacuous.detail.startswith("not a control: refuted only where HalfRight is not proved either: "
                                     "[bottom_right] complete (the base tiling: refuted)")
    real = TilingControl(DenseOneShort, HalfRight, "tests:DenseOneShort", None).run(None, Budget())
    assert real.status == REFUTED and real.case == "dense"


def test_a_vacuous_control_fails_the_run(tmp_path, monkeypatch, capsys):
    path = tmp_path / "vacuous.py"
    path.write_text(MISTAKES + "\n\nclass Same(Base):\n    breaks = 'nothing'\n\n\nBase.controls = (Same,)\n")
    monkeypatch.chdir(tmp_path)
    assert prove_main(["--kernel", f"{path}:Base"]) == 1  # Base itself is proved; its control is not one
    out = capsys.readouterr().out
    assert "proved for dense, bottom_right" in out and "control 'Same' of obligation 1 was NOT refuted" in out
    assert "not a control: no check refuted it" in out


def test_an_in_bounds_refutation_replays_as_a_failing_read(tmp_path, monkeypatch, capsys):
    from attnformal.verify.__main__ import main as verify_main

    path = user_file(tmp_path)
    with path.open("a") as handle:
        handle.write("\n\nclass OnePast(MyKernel):\n    breaks = 'one block past the keys'\n\n"
                     "    def kv_blocks(self, m_block, g):\n        lo, hi = MyKernel.kv_blocks(self, m_block, g)\n"
                     "        return lo, hi + 1\n")
    monkeypatch.chdir(tmp_path)
    one_past = load_tilings(f"{path}:OnePast")[0]
    proof = TilingControl(one_past, one_past.__mro__[1], f"{path}:OnePast", ReproFolders(tmp_path / "repro")).run(
        None, Budget())
    assert proof.status == REFUTED and "in bounds" in proof.claim and "replay:" in proof.detail
    case = proof.detail.split("--replay ")[1]
    capsys.readouterr()
    assert verify_main(["--impl", f"{path}:OnePast", "--replay", case]) == 1
    assert "raised OutOfBoundsRead: OnePast: query block 0 reads keys [0, 64) outside [0, 0)" in capsys.readouterr().out
    assert verify_main(["--impl", f"{path}:MyKernel", "--replay", case]) == 0


def test_an_unsupported_replay_exits_3_and_says_requires(tmp_path, monkeypatch, capsys):
    from attnformal.verify.__main__ import main as verify_main

    path = user_file(tmp_path)
    with path.open("a") as handle:
        handle.write("\n\nclass Square(MyKernel):\n    def requires(self, g):\n        return g.len_q == g.len_k\n")
    monkeypatch.chdir(tmp_path)
    obligation = kernel_obligations([f"{path}:MyKernel"], tmp_path / "repro")[0][1]
    proof = next(c for c in obligation.CONTROLS if c.name == "MyKernelTopLeft").run(None, Budget())
    case = proof.detail.split("--replay ")[1]  # Sq = 1, Sk = 129
    capsys.readouterr()
    assert verify_main(["--impl", f"{path}:Square", "--replay", case]) == 3
    out = capsys.readouterr().out
    assert "requires(g) rejects len_q=1, len_k=129" in out and "refused: lse" not in out


class OwnMask(Causal):
    """FA2's element-wise causal mask (mask.h: col_idx_limit_right = min(max_seqlen_k, row_idx + 1 +
    max_seqlen_k - max_seqlen_q)) instead of the spec's, on the tiles the kernel masks."""

    def element_mask(self, i, j, g):
        right = ops.minimum(g.len_k, i + 1 + g.len_k - g.len_q) if g.causal else g.len_k
        return j < right


class OwnMaskTopLeft(OwnMask):
    breaks = "the element-wise mask aligned top-left (row_idx + 1, the max_seqlen_k - max_seqlen_q dropped)"

    def element_mask(self, i, j, g):
        return j < (ops.minimum(g.len_k, i + 1) if g.causal else g.len_k)


def test_a_kernels_own_element_mask_is_proven_against_the_spec(tmp_path):
    assert verdicts(OwnMask(), "bottom_right")["mask-safe"].status == PROVED
    proof = verdicts(OwnMaskTopLeft(), "bottom_right")["mask-safe"]
    assert proof.status == REFUTED
    shown = proof.countermodel
    i, j, len_q, len_k = (int(shown[k]) for k in ("i", "j", "Sq", "Sk"))
    allowed, kept = j <= i + len_k - len_q and j < len_k, j < min(len_k, i + 1)
    assert allowed != kept and len_q + len_k == 3  # the smallest shapes where the alignments differ


def test_the_executor_applies_the_kernels_element_mask():
    q, k, v = (torch.randn(1, 1, n, 8, generator=torch.Generator().manual_seed(n)) for n in (20, 5, 5))
    right = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(20, 5).tril(5 - 20).bool())
    assert torch.allclose(OwnMask(q, k, v, causal="bottom_right")[:, :, 15:], right[:, :, 15:], atol=1e-5)
    assert not torch.allclose(OwnMaskTopLeft(q, k, v, causal="bottom_right")[:, :, 15:], right[:, :, 15:], atol=1e-3)
