"""The sweep as a PNG: log-log time and memory with fitted lines and predicted slopes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from attnformal.cli import atomic_path  # noqa: E402
from attnformal.scale.sweep import MaskRun, Series  # noqa: E402

# Each implementation its own colour and marker (the --vs one: red squares), each mask its own line style.
IMPL_COLOURS = ("#1f77b4", "#d62728")
MARKERS = ("o", "s")
MASK_STYLES = ("-", "--", "-.")  # dotted is the schedule's predicted slope


def plot_sweep(path, runs: list[MaskRun], param: str, title: str, overhead_factor: float):
    with_ratio = any(len(run.series) == 2 for run in runs)
    fig, axes = plt.subplots(1, 3 if with_ratio else 2, figsize=(19 if with_ratio else 13, 6.2))
    ratio_colours = plt.rcParams["axes.prop_cycle"].by_key()["color"][2:]  # not the implementations' two
    for index, run in enumerate(runs):
        style = MASK_STYLES[index % len(MASK_STYLES)]
        for color, marker, series in zip(IMPL_COLOURS, MARKERS, run.series):
            _time_panel(axes[0], series, color, style, marker, overhead_factor)
            _memory_panel(axes[1], series, color, style, marker)
        if len(run.series) == 2:
            _ratio_panel(axes[2], run, ratio_colours[index % len(ratio_colours)])
    _memory_guides(axes[1], runs)
    axes[0].set_title("time: median + IQR, fit (line), schedule's slope (dotted);\n"
                      "hollow = under the overhead line (faint, per series)", fontsize=10)
    axes[0].set_ylabel("seconds per call")
    axes[1].set_title("peak allocated memory (x: reserved pool)", fontsize=10)
    axes[1].set_ylabel("bytes above inputs")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(param)
        ax.grid(True, which="both", alpha=0.25)
        if ax.get_legend_handles_labels()[0]:  # a series that measured nothing draws nothing
            ax.legend(fontsize=7, loc="upper left")
    if with_ratio:
        axes[2].axhline(1.0, color="grey", lw=0.8)
        axes[2].set_xscale("log", base=2)
        axes[2].set_yscale("log")
        axes[2].set_xlabel(param)
        names = next(run.series for run in runs if len(run.series) == 2)
        axes[2].set_title(f"time ratio {names[0].candidate.label} / {names[1].candidate.label} "
                          "(per-repeat, median + IQR)", fontsize=10)
        axes[2].grid(True, which="both", alpha=0.25)
        if axes[2].get_legend_handles_labels()[0]:
            axes[2].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as partial:
        fig.savefig(partial, dpi=110, format="png")
    plt.close(fig)


def _time_panel(ax, series: Series, color, style, marker, overhead_factor):
    points = series.measured()
    if not points:
        return
    xs = np.array([p.x for p in points], float)
    med = np.array([p.samples.median for p in points])
    iqr = np.array([p.samples.iqr for p in points]).T
    analysis = series.analysis
    label = f"{series.candidate.label} {series.mask.label}: "
    if analysis.time is None:
        label += "fit refused"
    else:
        fit = analysis.time
        label += f"exponent {fit.slope:.2f}±{fit.half_width():.2f} (schedule {analysis.predicted['schedule']:.2f})"
    ax.errorbar(xs, med, yerr=[med - iqr[0], iqr[1] - med], fmt="none", ecolor=color, alpha=0.6, lw=1)
    flagged = np.array([p.x in analysis.flagged for p in points])
    ax.plot(xs[~flagged], med[~flagged], marker, color=color, ms=5, label=label)
    ax.plot(xs[flagged], med[flagged], marker, mfc="none", color=color, ms=5)
    ax.axhline(overhead_factor * series.floor, color=color, ls=":", lw=0.7, alpha=0.4)
    if analysis.time is not None:
        _fit_and_prediction(ax, analysis.time, analysis.predicted["schedule"], color, style)


def _fit_and_prediction(ax, fit, predicted_slope, color, style):
    """The fitted line over its valid range, and the predicted slope through the same middle."""
    lo, hi = fit.x_range()
    span = np.geomspace(lo, hi, 20)
    ax.plot(span, fit.predict(span), style, color=color, lw=1.6)
    middle = np.sqrt(lo * hi)
    ax.plot(span, fit.predict(middle) * (span / middle) ** predicted_slope, ":", color=color, lw=2.2, alpha=0.5)


def _memory_panel(ax, series: Series, color, style, marker):
    points = series.measured()
    if not points:
        return
    xs = np.array([p.x for p in points], float)
    allocated = np.array([max(p.memory.allocated, 1) for p in points], float)
    analysis = series.analysis
    label = f"{series.candidate.label} {series.mask.label}: " + (
        f"exponent {analysis.memory.slope:.2f}" if analysis.memory else "fit refused")
    ax.plot(xs, allocated, marker, color=color, ms=5, label=label)
    reserved = [p.memory.reserved for p in points]
    if all(r is not None for r in reserved):
        ax.plot(xs, np.maximum(reserved, 1), "x", color=color, ms=5)
    if analysis.memory is not None:
        lo, hi = analysis.memory.x_range()
        span = np.geomspace(lo, hi, 20)
        ax.plot(span, analysis.memory.predict(span), style, color=color, lw=1.4)


def _memory_guides(ax, runs: list[MaskRun]):
    """Grey lines with the slopes of the two memory models, from the smallest measured peak."""
    fitted = [s for run in runs for s in run.series if s.analysis.memory is not None]
    if not fitted:
        return
    xs = [p.x for p in fitted[0].measured()]
    start = min(p.memory.allocated for s in fitted for p in s.measured() if p.memory.allocated > 0)
    span = np.geomspace(xs[0], xs[-1], 20)
    for model, ls in (("state", "-."), ("scores", ":")):
        slope = fitted[0].analysis.memory_predicted[model]
        ax.plot(span, start * (span / xs[0]) ** slope, ls, color="grey", lw=1,
                label=f"slope of {model} model ({slope:.2f})")


def _ratio_panel(ax, run: MaskRun, color):
    xs = [p.x for p, r in zip(run.series[0].points, run.ratios) if r is not None]
    ratios = [r for r in run.ratios if r is not None]
    if not ratios:
        return
    med = np.array([r.median for r in ratios])
    iqr = np.array([r.iqr for r in ratios]).T
    fit = run.ratio_analysis.fit
    label = f"{run.mask.label}: " + (f"ratio exponent {fit.slope:+.2f}±{fit.half_width():.2f}" if fit else "fit refused")
    ax.errorbar(xs, med, yerr=[med - iqr[0], iqr[1] - med], fmt="o-", color=color, ms=4, lw=1, label=label)
