"""Error maps: where a failing battery check's error sits -- the picture behind its "where:" line.

For the worst failing tensor of the worst case, ``|actual - expected| / allowed`` (the comparison's own
elementwise ratio: above 1 fails) on a log scale, in two panels: its largest value over each
(batch, head), and the whole (rows x head dim) map of the worst head. The data is taken where the
check ran (:func:`error_map_data`, small and picklable: it travels back from a worker process or a
Dask worker with the result) and drawn where the run writes its files (:func:`write_error_map`),
as ``<check>-<dtype>.png`` next to the reproducer.
"""

from __future__ import annotations

import math

from attnformal.pictures import PicturesUnavailable, require_matplotlib, save

MAX_ROWS, MAX_COLS = 512, 256  # a larger map is max-pooled down to this (the worst element stays visible)
SHOWN_UP_TO = 4.0  # log10 of the ratio: past 10^4 (and NaN/Inf) the colour saturates
ROWS = {"out": "query row", "lse": "query row", "dq": "query row", "dk": "key row", "dv": "key row"}


def _pool(matrix, rows: int, cols: int):
    """Max-pool a ``[R, C]`` tensor to at most ``rows x cols``; also the pooling steps."""
    import torch

    step_r, step_c = math.ceil(matrix.shape[0] / rows), math.ceil(matrix.shape[1] / cols)
    if step_r == step_c == 1:
        return matrix, 1, 1
    pooled = torch.nn.functional.max_pool2d(matrix[None, None], (step_r, step_c), ceil_mode=True)
    return pooled[0, 0], step_r, step_c


def error_map_data(record, laid_out) -> dict | None:
    """The maps of a failing case record's worst failing ``[B, H, S, ...]`` tensor (None without one)."""
    import torch

    failing = [c for c in record.comparisons if not c.passed and c.name in laid_out and c.ratio is not None
               and c.numel and c.ratio.dim() >= 3]
    if not failing or record.case.spec.packed:
        return None
    worst = max(failing, key=lambda c: c.worst_ratio)
    ratio = worst.ratio.detach().double().cpu()
    ratio = torch.where(torch.isnan(ratio), math.inf, ratio)
    if ratio.dim() == 3:  # lse: one value per row
        ratio = ratio[..., None]
    per_head = ratio.flatten(2).amax(2)  # [B, H]
    b, h = divmod(int(per_head.argmax()), per_head.shape[1])
    matrix, step_r, step_c = _pool(ratio[b, h], MAX_ROWS, MAX_COLS)
    return {"tensor": worst.name, "shape": list(worst.ratio.shape), "batch": b, "head": h,
            "per_head": _log(per_head), "matrix": _log(matrix), "steps": [step_r, step_c],
            "over": int(worst.mismatched), "numel": int(worst.numel), "worst_ratio": worst.worst_ratio}


def _log(tensor) -> list:
    """log10 of the ratios, as lists; 0 where the ratio is 0 would be -inf: shown as the floor."""
    return tensor.clamp(min=1e-6).log10().clamp(max=SHOWN_UP_TO + 0.5).tolist()


def draw(data: dict, title: str, path) -> str:
    """The two-panel error map of :func:`error_map_data` as a PNG at ``path``."""
    plt = require_matplotlib()
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    rows = ROWS.get(data["tensor"], "row")
    cols = "(one value per row)" if data["shape"][-1:] == data["shape"][2:3] and len(data["shape"]) == 3 \
        else "head dim"
    norm = TwoSlopeNorm(vmin=-3.0, vcenter=0.0, vmax=SHOWN_UP_TO)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [1, 2.2]})
    style = {"cmap": "coolwarm", "norm": norm, "interpolation": "nearest", "aspect": "auto"}
    left.imshow(data["per_head"], **style)
    left.add_patch(Rectangle((data["head"] - 0.5, data["batch"] - 0.5), 1, 1, fill=False, edgecolor="black",
                             linewidth=2.5))
    left.set(xlabel="head", ylabel="batch", title="worst over each (batch, head)")
    _integer_ticks(left, len(data["per_head"]), len(data["per_head"][0]))
    step_r, step_c = data["steps"]
    matrix = data["matrix"]
    image = right.imshow(matrix, extent=(0, len(matrix[0]) * step_c, len(matrix) * step_r, 0), **style)
    pooled = f" (max over {step_r} x {step_c} blocks)" if step_r * step_c > 1 else ""
    right.set(xlabel=cols, ylabel=rows, title=f"batch {data['batch']}, head {data['head']} (boxed left){pooled}")
    bar = figure.colorbar(image, ax=right, extend="both")
    bar.set_label("log10(|actual - expected| / allowed)\n> 0 fails; 4: 10^4 or more, NaN, Inf", fontsize=8)
    figure.suptitle(f"{title}: {data['tensor']} {list(data['shape'])} fails at {data['over']}/{data['numel']} "
                    f"elements", fontsize=10)
    figure.tight_layout()
    return save(figure, path)


def _integer_ticks(ax, rows: int, cols: int):
    ax.set_xticks(range(0, cols, max(1, cols // 16)))
    ax.set_yticks(range(0, rows, max(1, rows // 16)))


def write_error_map(settings, result) -> None:
    """Draw a failing result's error map next to its reproducer (``result.picture``), then drop the data.

    Without matplotlib, a note in the result's details says how to get the picture."""
    data, result.error_map = result.error_map, None
    if data is None or settings.repro_dir is None:
        return
    try:
        from attnformal.verify.runner import reproducer_path

        path = reproducer_path(settings, result.check, result.dtype).with_suffix(".png")
        result.picture = draw(data, result.label, path)
    except PicturesUnavailable as error:
        result.details.append(f"no error map: {error}")
