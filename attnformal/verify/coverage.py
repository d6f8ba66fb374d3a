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


def case_coverage(case, status: str, features, refused) -> dict:
    return {"status": status, "features": tuple(features), "classes": shape_classes(case),
            "adapted": tuple(case.adapted), "refused": tuple(sorted(refused))}


def check_coverage(cases: list[dict]) -> dict:
    """A check's cases summed: counts, what the cases that ran exercised, what the others refused."""
    ran = [c for c in cases if c["status"] in RAN]
    return {"run": len(ran), "refused": len(cases) - len(ran), "adapted": sum(bool(c["adapted"]) for c in ran),
            "adaptations": dict(Counter(note for c in ran for note in c["adapted"])),
            "features": sorted({f for c in ran for f in c["features"]}),
            "paths": _paths(ran),
            "classes": sorted({k for c in ran for k in c["classes"]}),
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
    total.update(adaptations=dict(adaptations.most_common()), refused_features=dict(refused.most_common()),
                 features=[f for f in FEATURES if f in features], classes=[k for k in SHAPE_CLASSES if k in classes],
                 missing_features=[f for f in FEATURES if f not in features],
                 missing_classes=[k for k in SHAPE_CLASSES if k not in classes], matrix=feature_matrix(results))
    missing = len(total["missing_features"]) + len(total["missing_classes"])
    total["thin"] = selected_all and (total["run"] < THIN_CASES or missing > (len(FEATURES) + len(SHAPE_CLASSES)) // 2)
    return total
