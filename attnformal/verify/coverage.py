"""Coverage: which features and shape classes the cases that ran exercised, and what was refused.

Each case contributes its protocol features (:func:`.calls.case_features`: masks, lse,
backward, GQA, ...), its shape classes (:data:`SHAPE_CLASSES`), what was adapted so that
the implementation accepts it, and, when refused, the features it refused. A check sums
its cases (:func:`check_coverage`), a run sums its checks (:func:`run_coverage`), and the
report prints what was exercised, what was not, and a warning when coverage is thin.
"""

from __future__ import annotations

from collections import Counter

from attnformal.verify.calls import FEATURES

SHAPE_CLASSES = ("Sq < Sk", "Sq = Sk", "Sq > Sk", "ragged lengths", "several key blocks (Sk > 256)",
                 "long (Sk >= 4096)", "MQA (Hkv = 1)", "head dim not a power of 2")  # GQA, Dv != D: in FEATURES
# Shape regimes a kernel may choose its path by (a decoding or split-KV path for few query rows or many key
# blocks): bands of Sq and of Sk, as (largest length, label).
SQ_BANDS = ((0, "0"), (1, "1"), (2, "2"), (16, "3-16"), (127, "17-127"), (None, ">= 128"))
SK_BANDS = ((0, "0"), (1, "1"), (128, "2-128"), (1024, "129-1024"), (None, "> 1024"))
REGIMES = tuple(f"Sq {q} x Sk {k}" for _, q in SQ_BANDS[1:] for _, k in SK_BANDS[1:])  # the empty ones aside
THIN_CASES = 30  # fewer cases than this in a whole run is thin, whatever they cover
RAN = ("pass", "FAIL")


def shape_classes(case) -> tuple[str, ...]:
    s = case.spec
    found = ["Sq < Sk" if s.len_q < s.len_k else "Sq > Sk" if s.len_q > s.len_k else "Sq = Sk"]
    if any(n % 16 for n in (s.len_q, s.len_k)):
        found.append("ragged lengths")
    if s.len_k > 256:
        found.append("several key blocks (Sk > 256)")
    if s.len_k >= 4096:
        found.append("long (Sk >= 4096)")
    if s.group > 1 and s.heads_kv == 1:
        found.append("MQA (Hkv = 1)")
    if s.head_dim & (s.head_dim - 1):
        found.append("head dim not a power of 2")
    return tuple(found)


def regime(case) -> str:
    """The shape regime of ``case``: ``"Sq 3-16 x Sk 129-1024"`` (:data:`SQ_BANDS`, :data:`SK_BANDS`)."""
    def band(n, bands):
        return next(label for top, label in bands if top is None or n <= top)

    return f"Sq {band(case.spec.len_q, SQ_BANDS)} x Sk {band(case.spec.len_k, SK_BANDS)}"


def case_coverage(case, status: str, features, refused) -> dict:
    return {"status": status, "features": tuple(features), "classes": shape_classes(case),
            "adapted": tuple(case.adapted), "refused": tuple(sorted(refused)), "regime": regime(case)}


def check_coverage(cases: list[dict]) -> dict:
    """A check's cases summed: counts, what the cases that ran exercised, what the others refused."""
    ran = [c for c in cases if c["status"] in RAN]
    return {"run": len(ran), "refused": len(cases) - len(ran), "adapted": sum(bool(c["adapted"]) for c in ran),
            "adaptations": dict(Counter(note for c in ran for note in c["adapted"])),
            "features": sorted({f for c in ran for f in c["features"]}),
            "paths": _paths(ran),
            "classes": sorted({k for c in ran for k in c["classes"]}),
            "regimes": sorted({c["regime"] for c in ran}),
            "refused_features": dict(Counter(f for c in cases if c["status"] == "unsupported" for f in c["refused"]))}


PATHS = ("lse", "backward")  # the ways a case is judged beyond its output: the columns of the feature matrix


def _paths(ran) -> dict:
    """Per feature a case exercised: how many cases ran with it, with lse judged, through the backward."""
    paths = {}
    for c in ran:
        for f in c["features"]:
            if f in PATHS:
                continue
            row = paths.setdefault(f, {"cases": 0, **dict.fromkeys(PATHS, 0)})
            row["cases"] += 1
            for path in PATHS:
                row[path] += path in c["features"]
    return paths


def feature_matrix(results) -> dict:
    """``{feature: {check: {"cases", "lse", "backward"}}}`` (case counts over the dtypes): which (feature, check)
    pairs ran, and how many of those cases judged lse and went through the backward."""
    matrix = {}
    for r in results:
        for f, row in (r.coverage or {}).get("paths", {}).items():
            total = matrix.setdefault(f, {}).setdefault(r.check, {"cases": 0, **dict.fromkeys(PATHS, 0)})
            for key, n in row.items():
                total[key] += n
    return {f: matrix[f] for f in FEATURES if f in matrix}


def run_coverage(results, *, selected_all: bool) -> dict:
    """A run's checks summed, with what was not exercised and whether coverage is thin."""
    parts = [r.coverage for r in results if r.coverage]
    total = {"run": sum(p["run"] for p in parts), "refused": sum(p["refused"] for p in parts),
             "adapted": sum(p["adapted"] for p in parts)}
    adaptations, refused = Counter(), Counter()
    for p in parts:
        adaptations.update(p["adaptations"])
        refused.update(p["refused_features"])
    features = {f for p in parts for f in p["features"]}
    classes = {k for p in parts for k in p["classes"]}
    regimes = {k for p in parts for k in p.get("regimes", ())}
    total.update(adaptations=dict(adaptations.most_common()), refused_features=dict(refused.most_common()),
                 features=[f for f in FEATURES if f in features], classes=[k for k in SHAPE_CLASSES if k in classes],
                 missing_features=[f for f in FEATURES if f not in features],
                 missing_classes=[k for k in SHAPE_CLASSES if k not in classes],
                 regimes=[k for k in REGIMES if k in regimes], missing_regimes=[k for k in REGIMES if k not in regimes],
                 matrix=feature_matrix(results))
    missing = len(total["missing_features"]) + len(total["missing_classes"])
    total["thin"] = selected_all and (total["run"] < THIN_CASES or missing > (len(FEATURES) + len(SHAPE_CLASSES)) // 2)
    return total
