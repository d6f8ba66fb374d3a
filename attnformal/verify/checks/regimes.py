"""Shape regimes: every path a kernel may choose by shape, met under every feature.

Kernels switch paths on the shape: a decoding or split-KV path for a few query rows or many key
blocks, another block configuration for long sequences. :func:`sweep` runs each feature (none,
causal, dropout, masks, and the backward of none, causal and dropout) at every (Sq, Sk) of the
grid -- Sq in {1, 2, 13, 128} against Sk from 1 to thousands -- so a path that is wrong only under
one feature is met. When a feature fails on some cells only, and the same cells pass without it,
the failure is named ``shape_regime`` with the cells.
"""

from __future__ import annotations

from attnformal.verify.cases import generator, random_dropout_mask, shape
from attnformal.verify.checks import check
from attnformal.verify.diagnosis import PATTERN

SQ = (1, 2, 13, 128)  # one query (decoding), two, one partial query block, many query blocks
SK = (129, 1031)  # a few key blocks, many key blocks (where split-KV heuristics split)
FULL_SK = (1, 17, 4099)  # full adds these (one key: fwd.lengths and bwd.lengths have it in quick), and the largest
                         # cells
QUICK_MAX_SCORES = 2**15  # Sq * Sk of the largest cell in quick (128 x 1031 is in full only)
P = 0.2
FAR = 10.0  # times the tolerance: a failing cell's error at least this, to name a shape regime
VARIANTS = {  # name -> (keyword arguments given the shape and a generator, backward)
    "no feature": (lambda sh, gen: {}, False),
    "causal": (lambda sh, gen: {"causal": "bottom_right"}, False),
    "dropout": (lambda sh, gen: {"dropout_p": P, "dropout_mask": random_dropout_mask(gen, sh, P)}, False),
    "window + kv_lens": (lambda sh, gen: {"window": (100, 8), "kv_lens": [sh.len_k - sh.len_k // 8]}, False),
    "backward": (lambda sh, gen: {}, True),
    "causal backward": (lambda sh, gen: {"causal": "bottom_right"}, True),
    "dropout backward": (lambda sh, gen: {"dropout_p": P, "dropout_mask": random_dropout_mask(gen, sh, P)}, True),
}


def cells(quick: bool) -> list[tuple[int, int]]:
    """The (Sq, Sk) grid of a profile; full's contains quick's."""
    if not quick:
        return [(sq, sk) for sq in SQ for sk in sorted(SK + FULL_SK)]
    return [(sq, sk) for sq in SQ for sk in SK if sq * sk <= QUICK_MAX_SCORES]


@check("regimes.sweep")
def sweep(run):
    """Sq in {1, 2, 13, 128} against Sk 129 and 1031 (1 ... 4099 in full), under causal, dropout, masks and in the
    backward: every path a split-KV or decoding heuristic can choose, under every feature."""
    records = {}  # variant -> {(Sq, Sk): its record}
    for name, (make_kw, backward) in VARIANTS.items():
        for sq, sk in cells(run.quick):
            sh = shape(1, 1, 1, sq, sk, 16)
            label = f"{name}, Sq={sq} Sk={sk}"
            case = run.random_case(label, sh, grad=backward, **make_kw(sh, generator(run.seed("keep", label))))
            record = run.against_reference(case, backward=backward)
            if record is not None:
                records.setdefault(name, {})[(case.spec.len_q, case.spec.len_k)] = record
    ran = sorted({cell for grid in records.values() for cell in grid})
    run.note("regimes run (Sq x Sk): " + ", ".join(f"{sq}x{sk}" for sq, sk in ran))
    run.metrics["regimes"] = {name: [f"{sq}x{sk}" for sq, sk in sorted(grid)] for name, grid in records.items()}
    _explain_regimes(run, records)


def _explain_regimes(run, records):
    """A feature that fails far outside the tolerance on some cells only, where the same cells pass without
    any feature. (A wrong path is wrong by far; an error near the tolerance passes and fails by chance.)"""
    plain = records.get("no feature", {})
    for name, grid in records.items():
        failing = sorted(cell for cell, record in grid.items() if record.status == "FAIL")
        if name == "no feature" or not failing or len(failing) == len(grid):
            continue
        if all(grid[cell].worst_ratio >= FAR and cell in plain and plain[cell].status == "pass" for cell in failing):
            where = ", ".join(f"Sq={sq} Sk={sk}" for sq, sk in failing)
            run.find("shape_regime", PATTERN, f"{name} fails only at {where} (it passes at the other "
                                              f"{len(grid) - len(failing)} shapes, and these shapes pass without "
                                              f"it): the path the kernel takes there is wrong under {name}")
